//! `attach` profiles carry a census of the whole GC heap by type at the
//! first held collection and at the first one after Ctrl-C, on
//! `fixtures/crystal/attach_census.cr`:
//! 4,000 Early objects kept before memprof attaches, 2,500 Late objects
//! kept after. The start census must list exactly the 4,000 Earlies (with
//! the collector's bytes for them) as live before attach and no Late; the
//! end census, at the collection the fixture makes while memprof waits
//! after Ctrl-C, the Earlies still before attach and exactly the 2,500
//! Lates as tracked, none before attach. With `--census periodic` and no
//! collection while memprof waits, the last census taken (the fixture's
//! collection after the Lates) stands for the end, and the profile says so.
//! Under `run` there is none by default; with `--census periodic` no start
//! census (nothing was live before), and the end's has both classes tracked.

use memprof_tests::*;
use std::ffi::OsStr;
use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};

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
fn row(census: &Value, id: u64) -> Option<&Value> {
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

fn say(stdin: &mut ChildStdin, line: &str) {
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
}

/// The fixture's figures, read as it runs under `attach EXTRA`.
struct Attached {
    early_id: u64,
    early_bytes: u64,
    late_id: u64,
    late_bytes: u64,
    /// `GC_gc_no` after the collection that follows the Lates.
    last: u64,
}

/// Starts the fixture, attaches with `extra`, lets it make the Lates and
/// collect; then Ctrl-C. `at_end`: whether to have the fixture collect
/// once memprof says it waits for the end census (the collection number
/// it printed), or to let the wait run out. Returns the figures, the
/// end collection, and memprof's stderr.
fn attach_and_stop(
    profile: &std::path::Path,
    extra: &[&str],
    at_end: bool,
) -> (Attached, Option<u64>, Vec<String>) {
    let exe = fixture::crystal::ATTACH_CENSUS_DEBUG;
    let child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let mut target = ChildGuard(child);
    let mut stdin = target.0.stdin.take().unwrap();
    let mut stdout = Lines::new("attach_census stdout", target.0.stdout.take().unwrap());
    let [early_id, early_bytes] = numbers(&stdout.wait_for("ready ", timeout()))[..] else {
        panic!("bad ready line")
    };

    let (mut memprof, mut stderr) = attach(target.pid(), profile, extra);
    say(&mut stdin, "go");
    let [late_id, late_bytes] = numbers(&stdout.wait_for("made ", timeout()))[..] else {
        panic!("bad made line")
    };
    let [last] = numbers(&stdout.wait_for("collected ", timeout()))[..] else {
        panic!("bad collected line")
    };
    memprof.signal(libc::SIGINT);
    stderr.wait_for("for the end census", timeout());
    let end = at_end.then(|| {
        say(&mut stdin, "collect");
        let [end] = numbers(&stdout.wait_for("collected ", timeout()))[..] else {
            panic!("bad collected line")
        };
        end
    });
    let status = memprof.wait_timeout(timeout());
    let stderr = stderr.all();
    assert!(
        status.success(),
        "memprof attach ended with {status}; stderr:\n{}",
        stderr.join("\n")
    );
    assert!(target.is_running(), "attach_census died");
    let figures = Attached {
        early_id,
        early_bytes,
        late_id,
        late_bytes,
        last,
    };
    (figures, end, stderr)
}

#[test]
fn attach_profile_lists_what_was_live_before_attach_and_at_the_end() {
    let dir = TempDir::new("attach-census");
    let profile = dir.join("attach.mprof");
    // The defaults: a census at the start and at the end.
    let (f, end_no, _) = attach_and_stop(&profile, &[], true);
    let end_no = end_no.unwrap();
    assert_eq!(end_no, f.last + 1);

    let json = report_json(&profile);
    let census = &json["census"];
    assert!(census["note"].is_null(), "{census}");
    let start = &census["start"];
    assert!(start.is_object(), "no start census: {census}");
    // The first held collection is the one after "go": the Lates came later.
    assert!(uint(start, "/collection") < f.last, "{census}");
    let early = row(start, f.early_id).unwrap_or_else(|| panic!("no Early in {start}"));
    assert_eq!(early["name"], "Early");
    assert_eq!(early["kind"], "atomic");
    assert_eq!(split(early), [4_000, f.early_bytes, 0, 0]);
    assert!(
        row(start, f.late_id).is_none(),
        "a Late before it was made: {start}"
    );

    // The end census: at the collection made after Ctrl-C (not the
    // fixture's collection before it: no census in between by default).
    let end = &census["end"];
    assert_eq!(uint(end, "/collection"), end_no, "{census}");
    let early = row(end, f.early_id).unwrap_or_else(|| panic!("no Early in {end}"));
    assert_eq!(split(early), [4_000, f.early_bytes, 0, 0]);
    let late = row(end, f.late_id).unwrap_or_else(|| panic!("no Late in {end}"));
    assert_eq!(late["name"], "Late");
    assert_eq!(late["kind"], "normal");
    assert_eq!(split(late), [0, 0, 2_500, f.late_bytes]);
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
        thousands(f.early_bytes)
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

#[test]
fn periodic_census_stands_for_the_end_when_no_collection_comes() {
    let dir = TempDir::new("attach-census-periodic");
    let profile = dir.join("attach.mprof");
    let (f, _, stderr) = attach_and_stop(
        &profile,
        &["--census", "periodic", "--census-wait", "1"],
        false,
    );
    assert!(
        stderr.iter().any(|l| l.contains("no collection came")),
        "{stderr:?}"
    );
    let json = report_json(&profile);
    let census = &json["census"];
    assert!(uint(&census["start"], "/collection") < f.last, "{census}");
    // The fixture's collection after the Lates, censused in between.
    let end = &census["end"];
    assert_eq!(uint(end, "/collection"), f.last, "{census}");
    let late = row(end, f.late_id).unwrap_or_else(|| panic!("no Late in {end}"));
    assert_eq!(split(late), [0, 0, 2_500, f.late_bytes]);
    let note = census["note"].as_str().unwrap_or_default();
    assert_eq!(
        note,
        format!(
            "no collection came while memprof waited for the end census: the last census, at collection {}, stands for the end",
            f.last
        ),
        "{census}"
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
