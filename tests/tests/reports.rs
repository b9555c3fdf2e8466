//! The report formats of issue #5 on real profiles, with the numbers read
//! back from each output by its own reader: folded sums, the flamegraph
//! SVG's frame titles, pprof through `go tool pprof`, the HTML page through
//! headless Chromium's DOM; filters and lifetime views; `--diff` of two
//! `--snapshot-every` snapshots of `fixtures/c/grow.c` (250 × 64 B per step,
//! one step per line on its stdin); `--interval` tables; the timeline.
//!
//! `basic` (fixtures/c/basic.c): 1,000 × malloc(48) in make_foo, the first
//! 400 freed at once: live 600 / 28,800 B, total 1,000 / 48,000 B.

use memprof_tests::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `memprof run` of the basic fixture; the profile lives as long as the dir.
fn basic(test: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(test);
    let path = dir.join("basic.mprof");
    profile_run(&path, &[fixture::BASIC]);
    (dir, path)
}

/// `memprof report PROFILE --format FORMAT -o OUT EXTRA...`; returns OUT's bytes.
fn report_file(profile: &Path, format: &str, out: &Path, extra: &[&str]) -> Vec<u8> {
    let mut args = vec![
        OsStr::new("report"),
        profile.as_os_str(),
        OsStr::new("--format"),
        OsStr::new(format),
        OsStr::new("-o"),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run_ok(args);
    std::fs::read(out).unwrap_or_else(|e| panic!("cannot read {}: {e}", out.display()))
}

/// Folded stacks as (frames root first, value).
fn folded(profile: &Path, extra: &[&str]) -> Vec<(Vec<String>, u64)> {
    report(profile, "folded", extra)
        .lines()
        .map(|line| {
            let (stack, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a value: {line:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("folded value is not a number: {line:?}"));
            (stack.split(';').map(str::to_string).collect(), value)
        })
        .collect()
}

/// The sum of the folded stacks whose innermost frame is `leaf`.
fn folded_sum(profile: &Path, leaf: &str, extra: &[&str]) -> u64 {
    folded(profile, extra)
        .iter()
        .filter(|(frames, _)| frames.last().map(String::as_str) == Some(leaf))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn folded_sums_are_the_fixture_numbers() {
    let (_dir, profile) = basic("folded");
    let stacks = folded(&profile, &[]);
    let at_make_foo: Vec<_> = stacks
        .iter()
        .filter(|(f, _)| f.last().map(String::as_str) == Some("make_foo"))
        .collect();
    assert_eq!(at_make_foo.len(), 1, "{stacks:?}");
    let (frames, bytes) = at_make_foo[0];
    assert_eq!(*bytes, 28_800);
    // Root first: main calls make_foo.
    assert_eq!(frames[frames.len() - 2], "main", "{frames:?}");
    assert_eq!(
        folded_sum(&profile, "make_foo", &["--count", "objects"]),
        600
    );
    assert_eq!(folded_sum(&profile, "make_foo", &["--total"]), 48_000);
    assert_eq!(
        folded_sum(&profile, "make_foo", &["--total", "--count", "objects"]),
        1_000
    );
}

#[test]
fn flamegraph_svg_names_the_function_and_its_bytes() {
    let (dir, profile) = basic("flamegraph");
    let svg = String::from_utf8(report_file(
        &profile,
        "flamegraph",
        &dir.join("live.svg"),
        &[],
    ))
    .unwrap();
    assert!(svg.contains("<svg"), "not an SVG:\n{svg}");
    assert!(
        svg.contains("make_foo (28,800 bytes, "),
        "no make_foo frame with 28,800 bytes in the SVG"
    );
    assert!(svg.contains("memprof: live bytes by stack"), "title");
    assert!(svg.contains(fixture::BASIC), "the target is not named");
    let objects = String::from_utf8(report_file(
        &profile,
        "flamegraph",
        &dir.join("objects.svg"),
        &["--count", "objects", "--total", "--inverted"],
    ))
    .unwrap();
    assert!(objects.contains("make_foo (1,000 objects, "), "objects");
    assert!(objects.contains("memprof: allocated objects by stack"));
}

/// `go tool pprof -top -sample_index=INDEX [-unit=B] FILE`: the flat value
/// of `function`'s line.
fn pprof_flat(file: &Path, index: &str, function: &str) -> String {
    pprof_flat_with(file, index, function, &[])
}

/// [`pprof_flat`] with more `go tool pprof` options (`-tagfocus`).
fn pprof_flat_with(file: &Path, index: &str, function: &str, extra: &[&str]) -> String {
    let mut command = Command::new("go");
    command.args(["tool", "pprof", "-top", &format!("-sample_index={index}")]);
    command.args(extra);
    if index.ends_with("space") {
        command.arg("-unit=B");
    }
    let output = command
        .arg(file)
        .output()
        .expect("cannot run go tool pprof (cargo xtask setup installs golang-go)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "go tool pprof failed:\n{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .unwrap_or_else(|| panic!("no {function} in go tool pprof -top:\n{text}"));
    line.split_whitespace().next().unwrap().to_string()
}

#[test]
fn pprof_reads_back_with_go_tool_pprof() {
    let (dir, profile) = basic("pprof");
    let file = dir.join("basic.pb.gz");
    let bytes = report_file(&profile, "pprof", &file, &[]);
    assert_eq!(bytes[..2], [0x1f, 0x8b], "not gzip");
    assert_eq!(pprof_flat(&file, "inuse_space", "make_foo"), "28800B");
    assert_eq!(pprof_flat(&file, "inuse_objects", "make_foo"), "600");
    assert_eq!(pprof_flat(&file, "alloc_space", "make_foo"), "48000B");
    assert_eq!(pprof_flat(&file, "alloc_objects", "make_foo"), "1000");
    // Functions carry file and line, mappings the module.
    let raw = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&file)
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&raw.stdout);
    assert!(
        raw.lines()
            .any(|l| l.contains(" make_foo ") && l.contains("basic.c:")),
        "no make_foo location with basic.c:LINE:\n{raw}"
    );
    assert!(
        raw.contains(fixture::BASIC),
        "no mapping of the fixture:\n{raw}"
    );
}

/// Headless Chromium: the DOM after load, and a screenshot.
fn chromium(page: &Path, dir: &TempDir) -> (String, Vec<u8>) {
    let url = format!("file://{}", page.display());
    let common = ["--headless", "--no-sandbox", "--disable-gpu"];
    let dom = Command::new("chromium")
        .args(common)
        .args(["--dump-dom", &url])
        .stderr(Stdio::null())
        .output()
        .expect("cannot run chromium (cargo xtask setup installs it)");
    assert!(dom.status.success(), "chromium --dump-dom failed");
    let png = dir.join("page.png");
    let shot = Command::new("chromium")
        .args(common)
        .args(["--window-size=1280,2000"])
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .stderr(Stdio::null())
        .output()
        .expect("cannot run chromium");
    assert!(shot.status.success(), "chromium --screenshot failed");
    (
        String::from_utf8_lossy(&dom.stdout).into_owned(),
        std::fs::read(&png).expect("chromium wrote no screenshot"),
    )
}

/// Text of an HTML fragment, tags removed.
fn text_of(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn html_renders_in_chromium_with_the_top_stack() {
    let (dir, profile) = basic("html");
    let page = dir.join("report.html");
    let html = String::from_utf8(report_file(&profile, "html", &page, &[])).unwrap();
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "the page loads something from the network"
    );
    let (dom, png) = chromium(&page, &dir);
    // The top stacks table, as the browser parsed it.
    let stacks = dom
        .split("id=\"stacks\"")
        .nth(1)
        .and_then(|s| s.split("</table>").next())
        .unwrap_or_else(|| panic!("no stacks table in the DOM:\n{dom}"));
    let row = text_of(stacks.split("<tr>").nth(2).expect("no first row"));
    assert!(
        row.starts_with("600 28,800 1,000 48,000 libc ") && row.contains("in 'make_foo'"),
        "first row: {row}"
    );
    let summary = text_of(dom.split("id=\"summary\"").nth(1).unwrap());
    assert!(summary.contains("Lost events 0"), "{summary}");
    assert!(
        summary.contains("Live at the end 600 blocks, 28,800 bytes"),
        "{summary}"
    );
    // The flamegraph and the timeline are in the page.
    assert!(dom.contains("make_foo (28,800 bytes, "), "no flamegraph");
    assert!(dom.contains("data:image/svg+xml;base64,"), "no timeline");
    assert_eq!(png[1..4], *b"PNG");
    assert!(png.len() > 20_000, "screenshot is nearly empty");
}

#[test]
fn timeline_is_sampled_and_drawn() {
    let (dir, profile) = basic("timeline");
    let json = report_json(&profile);
    let samples = json["timeline"]["samples"].as_array().expect("no timeline");
    let last = samples.last().expect("no samples");
    assert_eq!(
        last["live"]["libc"],
        serde_json::json!([600, 28800]),
        "{last}"
    );
    let svg = String::from_utf8(report_file(
        &profile,
        "timeline",
        &dir.join("heap.svg"),
        &[],
    ))
    .unwrap();
    for text in [
        "time since start (s)",
        "live (KiB)",
        "libc",
        "memprof: live memory over time",
    ] {
        assert!(svg.contains(text), "no {text:?} in the timeline SVG");
    }
}

#[test]
fn filters_apply_to_every_format() {
    let (dir, profile) = basic("filters");
    let sum = |extra: &[&str]| folded_sum(&profile, "make_foo", extra);
    assert_eq!(sum(&["--function", "^make_f"]), 28_800);
    assert_eq!(sum(&["--function", "^nothing$"]), 0);
    assert_eq!(sum(&["--exclude-function", "make_foo"]), 0);
    assert_eq!(sum(&["--source", "basic\\.c:[0-9]+$"]), 28_800);
    assert_eq!(sum(&["--source", "elsewhere\\.c"]), 0);
    assert_eq!(sum(&["--size-min", "48", "--size-max", "48"]), 28_800);
    assert_eq!(sum(&["--size-min", "49"]), 0);
    assert_eq!(sum(&["--size-max", "47"]), 0);
    assert_eq!(sum(&["--kind", "mmap,gc"]), 0);
    assert_eq!(sum(&["--kind", "libc"]), 28_800);
    assert_eq!(sum(&["--leaked"]), 28_800);
    assert_eq!(sum(&["--min-bytes", "28801"]), 0);
    // The 400 freed right after their allocation are the temporaries. (The
    // first of them lives while the other 999 are allocated under probes:
    // ~6 ms here, more on a loaded machine, so "soon" is 1 s, not 10 ms.)
    let temporary = ["--temporary", "--temporary-ms", "1000"];
    assert_eq!(sum(&temporary), 400 * 48);
    assert_eq!(
        sum(&[&temporary[..], &["--count", "objects"]].concat()),
        400
    );
    let table = report(&profile, "markdown", &temporary);
    assert!(
        table.contains("|             400 |                19,200 |"),
        "{table}"
    );
    // pprof and json see the same rows.
    let file = dir.join("f.pb.gz");
    report_file(&profile, "pprof", &file, &["--function", "make_foo"]);
    assert_eq!(pprof_flat(&file, "inuse_space", "make_foo"), "28800B");
    let json = report(&profile, "json", &["--kind", "mmap"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(groups(&json).len(), 0);
    // Nothing left to draw is an error, not an empty picture.
    let empty = run([
        OsStr::new("report"),
        profile.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("flamegraph"),
        OsStr::new("--function"),
        OsStr::new("^nothing$"),
    ]);
    assert_one_line_error(&empty, &["nothing to draw"]);
}

#[test]
fn bad_filters_are_one_line_errors() {
    let (_dir, profile) = basic("bad-filters");
    let fails = |extra: &[&str], words: &[&str]| {
        let mut args = vec![OsStr::new("report"), profile.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        assert_one_line_error(&run(args), words);
    };
    fails(
        &["--function", "(unclosed"],
        &["--function", "bad regular expression"],
    );
    fails(&["--exclude-function", "*"], &["--exclude-function"]);
    fails(&["--kind", "heap"], &["unknown kind", "heap"]);
    fails(&["--size-min", "10", "--size-max", "5"], &["--size-min"]);
}

/// `fixtures/c/grow.c`, started with its stdin and stdout piped.
struct Grow {
    child: ChildGuard,
    stdout: Lines,
    steps: u32,
}

impl Grow {
    fn start() -> Grow {
        let child = Command::new(fixture::GROW)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot start grow");
        let mut child = ChildGuard(child);
        let mut stdout = Lines::new("grow stdout", child.0.stdout.take().unwrap());
        stdout.wait_for("ready", timeout());
        Grow {
            child,
            stdout,
            steps: 0,
        }
    }

    /// One step: 250 more blocks of 64 bytes at grow().
    fn step(&mut self) {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        self.steps += 1;
        self.stdout
            .wait_for(&format!("grown {}", self.steps), timeout());
    }
}

/// Waits for the snapshot after the next one memprof writes (the next one
/// may have started reading before the last step ended); returns its path.
fn settled_snapshot(stderr: &mut Lines) -> PathBuf {
    stderr.wait_for("snapshot written to", timeout());
    let line = stderr.wait_for("snapshot written to", timeout());
    PathBuf::from(line.rsplit("snapshot written to ").next().unwrap())
}

#[test]
fn snapshots_diff_shows_exactly_the_growth() {
    let dir = TempDir::new("diff");
    let output = dir.join("snap.mprof");
    let mut grow = Grow::start();
    let pid = grow.child.pid().to_string();
    let child = memprof([
        OsStr::new("attach"),
        OsStr::new("--pid"),
        OsStr::new(&pid),
        OsStr::new("-o"),
        output.as_os_str(),
        OsStr::new("--snapshot-every"),
        OsStr::new("0.3"),
        OsStr::new("--interval"),
        OsStr::new("0.4"),
        OsStr::new("--sample-period"),
        OsStr::new("20"),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("cannot start memprof attach");
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof attach stderr", memprof.0.stderr.take().unwrap());
    stderr.wait_for("attached", timeout());

    grow.step();
    let first = settled_snapshot(&mut stderr);
    // The table reprinted by --interval shows the first step.
    stderr.wait_for("|             250 |                16,000 |", timeout());
    grow.step();
    let second = settled_snapshot(&mut stderr);
    assert_ne!(first, second);
    assert!(
        first
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("snap-0"),
        "{}",
        first.display()
    );
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    assert!(
        status.success(),
        "memprof attach: {status}\n{}",
        stderr.all().join("\n")
    );

    let at_grow = |profile: &Path| Counts::of(group_at(&report_json(profile), "libc", "grow"));
    assert_eq!(
        (at_grow(&first).live_count, at_grow(&first).live_bytes),
        (250, 16_000)
    );
    assert_eq!(
        (at_grow(&second).live_count, at_grow(&second).live_bytes),
        (500, 32_000)
    );

    // Markdown: one changed stack, the growth of one step.
    let diff = String::from_utf8(
        run_ok([
            OsStr::new("report"),
            OsStr::new("--diff"),
            first.as_os_str(),
            second.as_os_str(),
        ])
        .stdout,
    )
    .unwrap();
    let rows: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" in '"))
        .collect();
    assert_eq!(rows.len(), 1, "{diff}");
    assert!(
        rows[0].starts_with("|          +250 |    +16,000 |     16,000 |     32,000 | libc | `")
            && rows[0].contains("in 'grow'"),
        "{diff}"
    );
    // JSON: the same, exactly.
    let json: Value = serde_json::from_slice(
        &run_ok([
            OsStr::new("report"),
            OsStr::new("--diff"),
            first.as_os_str(),
            second.as_os_str(),
            OsStr::new("--format"),
            OsStr::new("json"),
        ])
        .stdout,
    )
    .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{json:#}");
    assert_eq!(rows[0]["kind"], "libc");
    assert_eq!(rows[0]["count_growth"], 250);
    assert_eq!(rows[0]["bytes_growth"], 16_000);
    assert_eq!(rows[0]["frames"][0]["function"], "grow");
    assert_eq!(json["bytes_growth"], 16_000);

    // The final profile's timeline went through both steps.
    let json = report_json(&output);
    let samples: Vec<&Value> = json["timeline"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let libc: Vec<Value> = samples.iter().map(|s| s["live"]["libc"].clone()).collect();
    assert!(libc.contains(&serde_json::json!([250, 16000])), "{libc:?}");
    assert_eq!(libc.last().unwrap(), &serde_json::json!([500, 32000]));
    assert!(samples.len() >= 20, "{} samples at 20 ms", samples.len());

    // Incompatible inputs are one-line errors.
    let (_basic_dir, basic_profile) = basic("diff-basic");
    assert_one_line_error(
        &run([
            OsStr::new("report"),
            OsStr::new("--diff"),
            basic_profile.as_os_str(),
            second.as_os_str(),
        ]),
        &["different executables"],
    );
    assert_one_line_error(
        &run([
            OsStr::new("report"),
            OsStr::new("--diff"),
            first.as_os_str(),
            second.as_os_str(),
            OsStr::new("--format"),
            OsStr::new("flamegraph"),
        ]),
        &["--diff", "markdown or json"],
    );
    drop(grow);
}

#[test]
fn crystal_folded_flamegraph_pprof_timeline_html() {
    use memprof_tests::fixture::crystal::ALLOCS_DEBUG;
    let dir = TempDir::new("crystal-reports");
    let profile = dir.join("allocs.mprof");
    profile_run(&profile, &[ALLOCS_DEBUG, "foos"]);
    // 100,000 Foo of 32 bytes, all kept: their stacks end in Foo.new, then
    // the class read from the objects.
    assert_eq!(folded_sum(&profile, "[Foo]", &["--kind", "gc"]), 3_200_000);
    let at_new: u64 = folded(&profile, &["--kind", "gc"])
        .iter()
        .filter(|(frames, _)| frames.ends_with(&["Foo.new".to_string(), "[Foo]".to_string()]))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(at_new, 3_200_000);
    let svg = String::from_utf8(report_file(
        &profile,
        "flamegraph",
        &dir.join("foos.svg"),
        &[],
    ))
    .unwrap();
    assert!(
        svg.contains("Foo.new (3,200,000 bytes, "),
        "no Foo.new frame"
    );
    let file = dir.join("foos.pb.gz");
    report_file(&profile, "pprof", &file, &[]);
    assert_eq!(pprof_flat(&file, "inuse_space", "Foo.new"), "3200000B");
    assert_eq!(pprof_flat(&file, "inuse_objects", "Foo.new"), "100000");
    // The class label: what pprof users filter by.
    assert_eq!(
        pprof_flat_with(&file, "inuse_objects", "Foo.new", &["-tagfocus=class=Foo"]),
        "100000"
    );

    // The timeline has the GC kinds and the collector's heap size, its
    // last sample the profile's end figures.
    let json = report_json(&profile);
    let last = json["timeline"]["samples"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["gc_heap_bytes"], json["gc"]["heap_size"], "{last}");
    assert!(last["gc_heap_bytes"].as_u64() > Some(3_200_000), "{last}");
    let gc_live: u64 = groups(&json)
        .iter()
        .filter(|g| g["kind"] == "gc")
        .map(|g| uint(g, "/live_bytes"))
        .sum();
    assert_eq!(last["live"]["gc"][1], gc_live);
    let svg =
        String::from_utf8(report_file(&profile, "timeline", &dir.join("t.svg"), &[])).unwrap();
    assert!(
        svg.contains(">GC heap size</text>") && svg.contains(">gc</text>"),
        "timeline lines"
    );

    // The HTML page shows the Foo.new stack with its numbers.
    let page = dir.join("foos.html");
    report_file(&profile, "html", &page, &["--kind", "gc"]);
    let (dom, _) = chromium(&page, &dir);
    let stacks = dom.split("id=\"stacks\"").nth(1).unwrap();
    let rows: Vec<String> = stacks
        .split("</table>")
        .next()
        .unwrap()
        .split("<tr>")
        .map(text_of)
        .collect();
    assert!(
        rows.iter()
            .any(|r| r.starts_with("100,000 3,200,000 100,000 3,200,000 gc ")
                && r.contains("in 'Foo.new'")),
        "{rows:#?}"
    );
    let summary = text_of(dom.split("id=\"summary\"").nth(1).unwrap());
    assert!(summary.contains("GC liveness mark bits"), "{summary}");
    assert!(summary.contains("Filtered --kind gc"), "{summary}");
}

#[test]
fn timeline_samples_come_from_the_kernels_per_kind_totals() {
    let dir = TempDir::new("timeline-big");
    let output = dir.join("grow.mprof");
    let mut grow = Grow::start();
    let pid = grow.child.pid().to_string();
    let child = memprof([
        OsStr::new("attach"),
        OsStr::new("--pid"),
        OsStr::new(&pid),
        OsStr::new("-o"),
        output.as_os_str(),
        OsStr::new("--sample-period"),
        OsStr::new("20"),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("cannot start memprof attach");
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof attach stderr", memprof.0.stderr.take().unwrap());
    stderr.wait_for("attached", timeout());
    // 45 steps: 11,250 live blocks; every sample is exact (the kernel's
    // per-kind totals, never a walk of the live table).
    for _ in 0..45 {
        grow.step();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    assert!(
        status.success(),
        "memprof attach: {status}\n{}",
        stderr.all().join("\n")
    );
    let json = report_json(&output);
    let samples = json["timeline"]["samples"].as_array().unwrap();
    let want = serde_json::json!([11_250, 720_000]);
    assert!(
        samples.iter().all(|s| s["estimated"] == false),
        "an estimated sample: {samples:?}"
    );
    assert!(
        samples.iter().any(|s| s["live"]["libc"] == want),
        "no sample with {want}: {samples:?}"
    );
    assert!(
        samples
            .iter()
            .any(|s| s["live"]["libc"][0].as_u64() < Some(4_096)),
        "no sample below 4,096 blocks"
    );
    assert_eq!(samples.last().unwrap()["live"]["libc"], want);
}
