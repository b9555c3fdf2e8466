//! `attach --census periodic` profiles carry a census of the whole GC heap
//! by type at the first and last held collections, on
//! `fixtures/crystal/attach_census.cr`:
//! 4,000 Early objects kept before memprof attaches, 2,500 Late objects
//! kept after. The start census must list exactly the 4,000 Earlies (with
//! the collector's bytes for them) as live before attach and no Late; the
//! end census, at the fixture's last collection, the Earlies still before
//! attach and exactly the 2,500 Lates as tracked, none before attach.
//! Under `run` there is none by default; with `--census periodic` no start
//! census (nothing was live before), and the end's has both classes tracked.

use memprof_tests::*;
use std::ffi::OsStr;
use std::io::Write;
use std::process::{Command, Stdio};

/// The numbers after the first word of a line the fixture printed.
fn numbers(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("bad fixture line: {line}"))
        })
        .collect()
}

/// The census row of type id `id` (None if the census has none).
fn row<'a>(census: &'a Value, id: u64) -> Option<&'a Value> {
    let rows: Vec<&Value> = census["types"]
        .as_array()
        .expect("census types")
        .iter()
        .filter(|t| t["type_id"].as_u64() == Some(id))
        .collect();
    assert!(rows.len() <= 1, "type {id} twice: {rows:?}");
    rows.first().copied()
}

/// (unseen count, unseen bytes, tracked count, tracked bytes) of a row.
fn split(row: &Value) -> [u64; 4] {
    [
        "unseen_count",
        "unseen_bytes",
        "tracked_count",
        "tracked_bytes",
    ]
    .map(|k| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}")))
}

#[test]
fn attach_profile_lists_what_was_live_before_attach() {
    let dir = TempDir::new("attach-census");
    let profile = dir.join("attach.mprof");
    let exe = fixture::crystal::ATTACH_CENSUS_DEBUG;
    let child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let mut target = ChildGuard(child);
    let mut stdin = target.0.stdin.take().unwrap();
    let mut stdout = Lines::new("attach_census stdout", target.0.stdout.take().unwrap());
    let [early_id, early_bytes] = numbers(&stdout.wait_for("ready ", TIMEOUT))[..] else {
        panic!("bad ready line")
    };

    let (mut memprof, mut stderr) = attach(target.pid(), &profile, &["--census", "periodic"]);
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let [late_id, late_bytes] = numbers(&stdout.wait_for("made ", TIMEOUT))[..] else {
        panic!("bad made line")
    };
    let [last] = numbers(&stdout.wait_for("collected ", TIMEOUT))[..] else {
        panic!("bad collected line")
    };
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(TIMEOUT);
    assert!(
        status.success(),
        "memprof attach ended with {status}; stderr:\n{}",
        stderr.all().join("\n")
    );
    assert!(target.is_running(), "attach_census died");

    let json = report_json(&profile);
    let census = &json["census"];
    let start = &census["start"];
    assert!(start.is_object(), "no start census: {census}");
    // The first held collection is the one after "go": the Lates came later.
    assert!(uint(start, "/collection") < last, "{census}");
    let early = row(start, early_id).unwrap_or_else(|| panic!("no Early in {start}"));
    assert_eq!(early["name"], "Early");
    assert_eq!(early["kind"], "atomic");
    assert_eq!(split(early), [4_000, early_bytes, 0, 0]);
    assert!(
        row(start, late_id).is_none(),
        "a Late before it was made: {start}"
    );

    let end = &census["end"];
    assert_eq!(uint(end, "/collection"), last, "{census}");
    let early = row(end, early_id).unwrap_or_else(|| panic!("no Early in {end}"));
    assert_eq!(split(early), [4_000, early_bytes, 0, 0]);
    let late = row(end, late_id).unwrap_or_else(|| panic!("no Late in {end}"));
    assert_eq!(late["name"], "Late");
    assert_eq!(late["kind"], "normal");
    assert_eq!(split(late), [0, 0, 2_500, late_bytes]);
    // What the census cost is said (and a small heap's is small).
    for c in [start, end] {
        let held = c["held_s"].as_f64().expect("held_s");
        assert!(held > 0.0 && held < 0.2, "held {held} s: {c}");
    }

    // `report --format types`: the Earlies, and nothing else of the
    // program's classes, live before attach.
    let text = report(&profile, "types", &[]);
    let section = text
        .split("## Live before attach, by type")
        .nth(1)
        .unwrap_or_else(|| panic!("no before-attach section:\n{text}"));
    let section = section.split("\n## ").next().unwrap();
    let line = format!(
        "| {} | {} | Early |",
        thousands(4_000),
        thousands(early_bytes)
    );
    assert!(
        section.lines().any(|l| squeeze(l) == line),
        "no `{line}` in:\n{section}"
    );
    // (The empty `Array(Late)` the program started with was there before.)
    assert!(
        !section.lines().any(|l| l.trim_end().ends_with("| Late |")),
        "a Late before attach:\n{section}"
    );
}

/// A table line with its cells' padding removed.
fn squeeze(line: &str) -> String {
    line.split('|')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" | ")
        .trim()
        .to_string()
}

#[test]
fn run_profile_has_no_start_census_and_tracks_everything() {
    let dir = TempDir::new("run-census");
    let profile = dir.join("run.mprof");
    // By default `run` takes no census (it saw every allocation).
    let plain = dir.join("plain.mprof");
    profile_run(&plain, &[fixture::crystal::ATTACH_CENSUS_DEBUG, "once"]);
    assert!(
        report_json(&plain)["census"].is_null(),
        "a census by default in run"
    );
    let output = run_ok(
        [
            "run",
            "--census",
            "periodic",
            "-o",
            profile.to_str().unwrap(),
            "--",
            fixture::crystal::ATTACH_CENSUS_DEBUG,
            "once",
        ]
        .map(OsStr::new)
        .to_vec(),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = |word: &str| {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(word))
            .unwrap_or_else(|| panic!("no {word} line in:\n{stdout}"));
        numbers(line)
    };
    let [early_id, early_bytes] = line("ready ")[..] else {
        panic!("bad ready line")
    };
    let [late_id, late_bytes] = line("made ")[..] else {
        panic!("bad made line")
    };
    let [last] = line("collected ")[..] else {
        panic!("bad collected line")
    };

    let json = report_json(&profile);
    let census = &json["census"];
    assert!(census["start"].is_null(), "a start census in run: {census}");
    assert!(
        census["note"]
            .as_str()
            .is_some_and(|n| n.contains("first instruction")),
        "{census}"
    );
    let end = &census["end"];
    assert_eq!(uint(end, "/collection"), last, "{census}");
    let early = row(end, early_id).unwrap_or_else(|| panic!("no Early in {end}"));
    assert_eq!(split(early), [0, 0, 4_000, early_bytes]);
    let late = row(end, late_id).unwrap_or_else(|| panic!("no Late in {end}"));
    assert_eq!(split(late), [0, 0, 2_500, late_bytes]);

    let text = report(&profile, "types", &[]);
    assert!(!text.contains("Live before attach"), "{text}");
    assert!(
        text.contains("## The GC heap by type at collection"),
        "no end census in:\n{text}"
    );
}
