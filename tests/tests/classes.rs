//! Every GC object named by its class, read from the object itself (its
//! first word is its class's type id), in the builds a Crystal developer
//! ships: debug, release (where `Widget.new` is the compiler's own,
//! inlined into its caller), static and stripped; under `run` and `attach`.
use memprof_tests::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// What `fixtures/crystal/classes.cr` keeps, by class.
const KEPT: [(&str, u64); 5] = [
    ("Widget", 12_345),
    ("Gadget", 1_000),
    ("Holder", 55),
    ("Array(Gadget)", 77),
    ("Hash(String, Gadget)", 1),
];

/// Live objects per class in the profile's groups (JSON `type_name`).
fn live_by_class(profile: &std::path::Path) -> BTreeMap<String, u64> {
    let json = report_json(profile);
    let mut classes = BTreeMap::new();
    for g in groups(&json) {
        if let Some(name) = g["type_name"].as_str() {
            *classes.entry(name.to_string()).or_default() += g["live_count"].as_u64().unwrap();
        }
    }
    classes
}

/// Each kept class with its exact count: in the groups, in `--format
/// types`, and as a markdown row of its own.
fn assert_classes(profile: &std::path::Path, build: &str) {
    let classes = live_by_class(profile);
    let types = report(profile, "types", &[]);
    let markdown = report(profile, "markdown", &["--top", "100", "--min-bytes", "0"]);
    let folded = report(profile, "folded", &["--count", "objects"]);
    for (class, count) in KEPT {
        assert_eq!(
            classes.get(class).copied(),
            Some(count),
            "{build}: live {class} objects; by class: {classes:?}"
        );
        let line = format!(" {} |", thousands(count));
        assert!(
            types
                .lines()
                .any(|l| l.contains(&line) && l.ends_with(&format!("| {class} |"))),
            "{build}: no `types` row {class} {count}:\n{types}"
        );
        // The class heads a row of its own, whose live count is all of them.
        let heading = format!("**{class}**");
        let rows: Vec<&str> = markdown.lines().filter(|l| l.contains(&heading)).collect();
        let live: u64 = rows
            .iter()
            .map(|l| {
                l.split('|')
                    .nth(1)
                    .unwrap()
                    .trim()
                    .replace(',', "")
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(
            live, count,
            "{build}: markdown rows of {class}:\n{markdown}"
        );
        // Folded stacks (and the flamegraphs drawn from them) end in the class.
        let leaf = format!(";[{class}] ");
        let objects: u64 = folded
            .lines()
            .filter_map(|l| Some(l.split_once(&leaf)?.1.parse::<u64>().unwrap()))
            .sum();
        assert_eq!(
            objects, count,
            "{build}: folded stacks of {class}:\n{folded}"
        );
    }
}

#[test]
fn run_names_every_class_in_debug_release_and_static_builds() {
    let dir = TempDir::new("classes-run");
    for (build, exe) in [
        ("debug", fixture::crystal::CLASSES_DEBUG),
        ("release", fixture::crystal::CLASSES_RELEASE),
        ("static", fixture::crystal::CLASSES_STATIC),
        // No DWARF: the constructors' names from `.dynsym` alone.
        ("stripped", fixture::crystal::CLASSES_STRIPPED),
    ] {
        let profile = dir.join(&format!("{build}.mprof"));
        profile_run(&profile, &[exe]);
        assert_classes(&profile, build);
    }
}

#[test]
fn attach_names_every_class_made_while_attached() {
    let dir = TempDir::new("classes-attach");
    for (build, exe) in [
        ("debug", fixture::crystal::CLASSES_DEBUG),
        ("release", fixture::crystal::CLASSES_RELEASE),
        ("static", fixture::crystal::CLASSES_STATIC),
    ] {
        let profile = dir.join(&format!("{build}.mprof"));
        let child = Command::new(exe)
            .arg("wait")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
        let mut target = ChildGuard(child);
        let mut stdin = target.0.stdin.take().unwrap();
        let mut stdout = Lines::new("classes stdout", target.0.stdout.take().unwrap());
        stdout.wait_for("ready", TIMEOUT);
        let (mut memprof, mut stderr) = attach(target.pid(), &profile, &[]);
        writeln!(stdin, "go").unwrap();
        stdin.flush().unwrap();
        stdout.wait_for("made", TIMEOUT);
        memprof.signal(libc::SIGINT);
        let status = memprof.wait_timeout(TIMEOUT);
        let stderr = stderr.all();
        assert!(
            status.success(),
            "{build}: memprof attach ended with {status}; stderr:\n{}",
            stderr.join("\n")
        );
        assert!(target.is_running(), "{build}: the fixture died");
        drop(stdin);
        assert_classes(&profile, build);
    }
}

/// What `fixtures/crystal/collected.cr` printed the collector did, by
/// class: (allocated, collected, live).
fn collector_says(stdout: &str) -> BTreeMap<String, [u64; 3]> {
    stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i)?.parse::<u64>().ok();
            Some((f.first()?.to_string(), [n(1)?, n(2)?, n(3)?]))
        })
        .filter(|(class, _)| ["Widget", "Gadget", "Sprocket"].contains(&class.as_str()))
        .collect()
}

/// Per class in the profile's groups: objects [allocated, collected,
/// live] and their bytes.
fn figures_by_class(profile: &std::path::Path) -> BTreeMap<String, ([u64; 3], [u64; 3])> {
    let json = report_json(profile);
    let mut classes: BTreeMap<String, ([u64; 3], [u64; 3])> = BTreeMap::new();
    for g in groups(&json) {
        let Some(name) = g["type_name"].as_str() else {
            continue;
        };
        let n = |field: &str| g[field].as_u64().unwrap_or(0);
        let c = classes.entry(name.to_string()).or_default();
        for (i, (count, bytes)) in [
            ("total_count", "total_bytes"),
            ("collected_count", "collected_bytes"),
            ("live_count", "live_bytes"),
        ]
        .into_iter()
        .enumerate()
        {
            c.0[i] += n(count);
            c.1[i] += n(bytes);
        }
    }
    classes
}

#[test]
fn run_counts_collected_objects_under_their_class() {
    let dir = TempDir::new("classes-collected");
    for (build, exe) in [
        ("debug", fixture::crystal::COLLECTED_DEBUG),
        ("release", fixture::crystal::COLLECTED_RELEASE),
    ] {
        let profile = dir.join(&format!("{build}.mprof"));
        let output = profile_run(&profile, &[exe]);
        let truth = collector_says(&String::from_utf8_lossy(&output.stdout));
        // The fixture's own counts: what it made, and (nearly) what it dropped.
        let made = [
            ("Widget", 20_000, 500),
            ("Gadget", 5_000, 100),
            ("Sprocket", 3_000, 0),
        ];
        for (class, allocated, kept) in made {
            let [a, c, l] = truth[class];
            assert!(
                a == allocated && c + l == a && l >= kept && l <= kept + 10,
                "{build}: the fixture says {class} {truth:?}"
            );
        }
        let found = figures_by_class(&profile);
        let types = report(&profile, "types", &[]);
        for (class, [allocated, collected, live]) in &truth {
            let (objects, bytes) = found
                .get(class)
                .unwrap_or_else(|| panic!("{build}: no {class} group; by class: {found:?}"));
            assert_eq!(
                *objects,
                [*allocated, *collected, *live],
                "{build}: {class} [allocated, collected, live]; by class: {found:?}"
            );
            // One size per class: every figure's bytes are its objects'.
            let size = bytes[0] / allocated;
            assert!(size > 0, "{build}: {class} {bytes:?}");
            assert_eq!(*bytes, objects.map(|n| n * size), "{build}: {class} bytes");
            // `--format types`: live objects, bytes, allocated, collected.
            let row = format!(
                "| {} | {} | {} | {} | {class} |",
                thousands(*live),
                thousands(live * size),
                thousands(*allocated),
                thousands(*collected)
            );
            assert!(
                types.lines().any(|l| {
                    let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                    let want: Vec<&str> = row.split('|').map(str::trim).collect();
                    cells == want
                }),
                "{build}: no `types` row {row}:\n{types}"
            );
        }
    }
}
