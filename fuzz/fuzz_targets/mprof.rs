//! A `.mprof` file as `memprof report` reads it (`memprof::profile::parse`),
//! then written as every format (`memprof::report::render`), with
//! `--leaks`, and as a diff against itself: the files people send each
//! other. Each input is read as a whole file, and as the JSON of a file
//! whose header and end line (length, checksum) are right, where
//! mutations reach the profile itself. A profile that was read is
//! written back, and reads again.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::profile::{self, Profile};
use memprof::report::{self, Count, Format, Options};

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = profile::parse(data) {
        reports(&profile);
    }
    if let Ok(profile) = profile::parse(&framed(data)) {
        reports(&profile);
    }
});

const FORMATS: [Format; 9] = [
    Format::Markdown,
    Format::Tsv,
    Format::Json,
    Format::Types,
    Format::Folded,
    Format::Flamegraph,
    Format::Pprof,
    Format::Timeline,
    Format::Html,
];

fn reports(profile: &Profile) {
    let mut out = Vec::new();
    for format in FORMATS {
        out.clear();
        let _ = report::render(profile, format, &Options::default(), &mut out);
    }
    // The other ways of the flags.
    let options = Options {
        min_bytes: Some(0),
        depth: Some(2),
        skip: 1,
        top: Some(3),
        skip_runtime: false,
        count: Count::Objects,
        total: true,
        inverted: true,
        filters: Some("--function 'x'".to_string()),
        keep_order: false,
    };
    for format in [Format::Markdown, Format::Folded, Format::Flamegraph, Format::Json] {
        out.clear();
        let _ = report::render(profile, format, &options, &mut out);
    }
    out.clear();
    let _ = report::leaks::write(profile, &Options::default(), &mut out);
    let leaking = report::leaks::leaking(profile.clone());
    out.clear();
    let _ = report::render(&leaking, Format::Markdown, &options, &mut out);
    for json in [false, true] {
        out.clear();
        let _ = report::diff::write(
            profile,
            &leaking,
            ["before", "after"],
            json,
            &Options::default(),
            &mut out,
        );
    }
    // What memprof writes, it reads.
    let mut written = Vec::new();
    profile::write(profile, &mut written).expect("a profile that was read is written");
    if let Err(e) = profile::parse(&written) {
        panic!("a profile memprof wrote does not read back: {e}");
    }
}

/// `json` between a version-3 header and the end line that fits it.
fn framed(json: &[u8]) -> Vec<u8> {
    let header = format!("{} {}\n", profile::MAGIC, profile::VERSION);
    let mut file = header.into_bytes();
    file.extend_from_slice(json);
    let crc = crc32fast::hash(&file);
    file.extend_from_slice(format!("\nMEMPROF-END crc32={crc:08x} bytes={}\n", json.len()).as_bytes());
    file
}
