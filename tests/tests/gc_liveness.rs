//! GC liveness from mark bits (issue #4): `memprof run --heap gc` must know,
//! at each collection, which Boehm GC objects the collector kept, exactly as
//! the collector itself says.
//!
//! - verdicts: the `gc_verdicts` fixtures (C with libgc.so and with libgc.a;
//!   Crystal debug, static and stripped) ask the GC in process, after their
//!   last collection, about each of their 200,000 objects
//!   (`GC_base(p) == p && GC_is_marked(p)`) and write `<hex address> <1|0>
//!   <maker>` lines; memprof's hidden `--gc-verdicts FILE` writes
//!   `<collection> <hex address> <live|dead>` for each object it judged. They
//!   must agree on every object, and the report's per-stack counts must
//!   follow (collected = the GC's 0s of make_dropped, live = the 1s of
//!   make_kept).
//! - leak: `gc_leak` leaks 1,000 objects a round among 25,000 garbage ones;
//!   `--leaks` puts leak_some first, and next to no garbage is marked at the
//!   end (what the conservative collector keeps, at most 1% of a round).
//! - binary-trees (crystal-samples, `--release`): memprof's `gc.marked_bytes`
//!   within 5% of libgc's own "In-use heap" figure of its last collection
//!   (`GC_PRINT_STATS=1`, logged to a file with `GC_LOG_FILE`).

use std::collections::HashMap;
use std::path::Path;

use memprof_tests::*;

/// One object of a gc_verdicts fixture's output.
#[derive(Debug, Clone)]
struct Object {
    address: u64,
    /// The GC's verdict: marked at the last collection.
    live: bool,
    /// `kept`, `chained` or `dropped`: allocated by `make_<maker>`.
    maker: String,
}

const MAKERS: [&str; 3] = ["kept", "chained", "dropped"];
/// Objects each gc_verdicts fixture allocates.
const OBJECTS: usize = 200_000;

fn hex(text: &str) -> u64 {
    let digits = text.trim_start_matches("0x");
    u64::from_str_radix(digits, 16).unwrap_or_else(|e| panic!("not hex: {text:?}: {e}"))
}

/// The fixture's file: `<hex address> <1|0> <maker>` per object.
fn read_fixture(path: &Path) -> Vec<Object> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(
            |line| match line.split(' ').collect::<Vec<_>>().as_slice() {
                [address, live @ ("0" | "1"), maker] if MAKERS.contains(maker) => Object {
                    address: hex(address),
                    live: *live == "1",
                    maker: maker.to_string(),
                },
                _ => panic!("bad fixture line {line:?} in {}", path.display()),
            },
        )
        .collect()
}

/// memprof's `--gc-verdicts` file, `<collection> <hex address> <live|dead> <why>`
/// per object judged at a collection, reduced to the verdict at the last
/// collection that judged each address. (An address may have held an
/// object of the Crystal runtime that died at an earlier collection, before
/// the fixture's object was allocated there: only the last verdict is about
/// the fixture's object.) Returns the verdicts and the last collection.
fn read_memprof_verdicts(path: &Path) -> (HashMap<u64, (u64, bool)>, u64) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut verdicts: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut last = 0;
    for line in text.lines() {
        let (collection, address, live) = match line.split_whitespace().collect::<Vec<_>>()[..] {
            [collection, address, verdict @ ("live" | "dead"), ..] => (
                collection
                    .parse::<u64>()
                    .unwrap_or_else(|e| panic!("bad collection in {line:?}: {e}")),
                hex(address),
                verdict == "live",
            ),
            _ => panic!("bad verdict line {line:?} in {}", path.display()),
        };
        last = last.max(collection);
        let verdict = verdicts.entry(address).or_insert((collection, live));
        if collection >= verdict.0 {
            *verdict = (collection, live);
        }
    }
    (verdicts, last)
}

/// The GC groups (any `gc*` kind) with a frame of function `function`.
fn gc_groups_with<'a>(json: &'a Value, function: &str) -> Vec<&'a Value> {
    groups(json)
        .iter()
        .filter(|g| g["kind"].as_str().is_some_and(|k| k.starts_with("gc")))
        .filter(|g| {
            g["frames"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f["function"].as_str() == Some(function))
        })
        .collect()
}

/// The sum of an unsigned field over groups.
fn sum(groups: &[&Value], field: &str) -> u64 {
    groups.iter().map(|g| uint(g, &format!("/{field}"))).sum()
}

/// Runs a gc_verdicts fixture under `memprof run --heap gc --gc-verdicts`
/// and checks memprof's verdicts and report against the fixture's own.
fn verdicts(name: &str, fixture: &str) {
    verdicts_with(name, fixture, &[]);
}

/// [`verdicts`], with more options for memprof.
fn verdicts_with(name: &str, fixture: &str, options: &[&str]) {
    let dir = TempDir::new(&format!("gc-verdicts-{name}"));
    let profile = dir.join("profile.mprof");
    let memprof_verdicts = dir.join("memprof-verdicts.txt");
    let gc_verdicts = dir.join("gc-verdicts.txt");
    let mut args = vec![
        OsStr::new("run"),
        OsStr::new("--heap"),
        OsStr::new("gc"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--gc-verdicts"),
        memprof_verdicts.as_os_str(),
    ];
    args.extend(options.iter().map(OsStr::new));
    args.extend([
        OsStr::new("--"),
        OsStr::new(fixture),
        gc_verdicts.as_os_str(),
    ]);
    let output = run_ok(args);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("done"),
        "the fixture did not finish\n{}",
        describe(&output)
    );
    if options.contains(&"--snapshot-every") {
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("snapshot written to"),
            "no snapshot was written\n{}",
            describe(&output)
        );
    }
    let objects = read_fixture(&gc_verdicts);
    assert_eq!(objects.len(), OBJECTS);
    let count = |maker: &str, live: bool| {
        objects
            .iter()
            .filter(|o| o.maker == maker && o.live == live)
            .count() as u64
    };
    // The fixture's own sanity: what it keeps is marked; what it drops is
    // mostly not (conservative stack scanning may keep a few).
    assert_eq!(count("kept", false), 0, "the GC dropped kept objects");
    assert_eq!(count("chained", false), 0, "the GC dropped chained objects");
    assert!(
        count("dropped", true) < 100,
        "{} dropped objects still marked",
        count("dropped", true)
    );

    // Every object: memprof's verdict is the GC's.
    // No fixture object dies before the last collection, so each must be
    // judged at it (one judged dead earlier would be missing there).
    let (judged, last) = read_memprof_verdicts(&memprof_verdicts);
    let mut missing = Vec::new();
    let mut mismatches = Vec::new();
    for object in &objects {
        match judged.get(&object.address) {
            Some(&(collection, live)) if collection == last => {
                if live != object.live {
                    mismatches.push((object, live));
                }
            }
            _ => missing.push(object),
        }
    }
    eprintln!(
        "{name}: {} objects, {} marked by the GC, {} addresses judged by memprof, {} missing, {} mismatches",
        objects.len(),
        objects.iter().filter(|o| o.live).count(),
        judged.len(),
        missing.len(),
        mismatches.len()
    );
    assert!(
        missing.is_empty(),
        "{} fixture objects not judged by memprof at the last collection (#{last}); first: {:#x?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        mismatches.is_empty(),
        "{} objects where memprof's verdict differs from the GC's; first (object, memprof says live): {:#x?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );

    // The report.
    let json = report_json(&profile);
    let gc = &json["gc"];
    assert_eq!(gc["liveness"], "mark bits", "{gc:#}");
    assert!(uint(gc, "/collections") >= 1, "{gc:#}");
    // GC objects are in memprof's copy, not the kernel's live table:
    // nothing lost, whatever its size.
    assert_eq!(uint(gc, "/events_lost"), 0, "{gc:#}");
    assert_eq!(uint(&json, "/lost_events"), 0, "{:#}", json["counters"]);
    assert_eq!(uint(&json, "/counters/live_map_full"), 0);
    // Most of the fixture's 200,000 small objects are recorded at the
    // entry of GC_malloc, their result read from the thread's free list
    // (every build here: shared, static and stripped libgc), after the
    // first 4,096 predictions matched their returns; none wrong, and every
    // verdict above exact with them (on a kernel with uprobe sessions).
    if let Some((predicted, _)) = assert_predictions_right(&json) {
        assert!(predicted >= 100_000, "{:#}", json["counters"]);
    }
    for field in [
        "last_collection",
        "marked_count",
        "marked_bytes",
        "heap_size",
        "free_bytes",
        "unmapped_bytes",
    ] {
        assert!(gc[field].is_u64(), "gc.{field} missing: {gc:#}");
    }
    assert!(uint(gc, "/heap_size") > 0, "{gc:#}");
    let marked = objects.iter().filter(|o| o.live).count() as u64;
    assert!(
        uint(gc, "/marked_count") >= marked,
        "gc.marked_count below the fixture's {marked} marked objects: {gc:#}"
    );

    let made = |maker: &str| {
        let groups = gc_groups_with(&json, &format!("make_{maker}"));
        assert!(
            !groups.is_empty(),
            "no gc group with a make_{maker} frame; all groups:\n{}",
            list_groups(&json)
        );
        for group in &groups {
            for field in [
                "collected_count",
                "collected_bytes",
                "marked_count",
                "marked_bytes",
                "live_count",
            ] {
                assert!(group[field].is_u64(), "group lacks {field}: {group:#}");
            }
            assert!(
                !group["lifetimes"].is_null(),
                "group lacks lifetimes: {group:#}"
            );
        }
        groups
    };
    let (kept, chained, dropped) = (made("kept"), made("chained"), made("dropped"));
    let all = |maker| count(maker, true) + count(maker, false);
    for (maker, groups) in [
        ("kept", &kept),
        ("chained", &chained),
        ("dropped", &dropped),
    ] {
        assert_eq!(
            sum(groups, "total_count"),
            all(maker),
            "make_{maker} allocations; groups:\n{}",
            list_groups(&json)
        );
        assert_eq!(
            sum(groups, "collected_count"),
            count(maker, false),
            "make_{maker}: collected_count is not the GC's unmarked count"
        );
        assert_eq!(
            sum(groups, "live_count"),
            count(maker, true),
            "make_{maker}: live_count is not the GC's marked count"
        );
        assert_eq!(
            sum(groups, "marked_count"),
            count(maker, true),
            "make_{maker}: marked_count is not the GC's marked count"
        );
    }
    assert!(sum(&dropped, "collected_bytes") > 0);
    assert_eq!(sum(&kept, "collected_bytes"), 0);
}

#[test]
fn verdicts_c_shared_libgc() {
    verdicts("c-shared", fixture::GC_VERDICTS);
}

/// 200,000 GC objects, a live table of 1,000 entries: the GC objects are
/// in memprof's copy, so the table's size does not matter (nothing lost,
/// every verdict and count exact).
#[test]
fn verdicts_past_max_live() {
    verdicts_with(
        "past-max-live",
        fixture::GC_VERDICTS,
        &["--max-live", "1000"],
    );
}

/// Snapshots and reprinted tables every 50 ms: published while the
/// collections are held and judged, every verdict and count still exact.
#[test]
fn verdicts_while_snapshots_are_published() {
    verdicts_with(
        "snapshots",
        fixture::GC_VERDICTS,
        &["--snapshot-every", "0.05", "--interval", "0.05"],
    );
}

#[test]
fn verdicts_c_static_libgc() {
    verdicts("c-static", fixture::GC_VERDICTS_STATIC);
}

#[test]
fn verdicts_crystal_debug() {
    verdicts("crystal-debug", fixture::crystal::GC_VERDICTS_DEBUG);
}

#[test]
fn verdicts_crystal_static() {
    verdicts("crystal-static", fixture::crystal::GC_VERDICTS_STATIC);
}

#[test]
fn verdicts_crystal_stripped() {
    verdicts("crystal-stripped", fixture::crystal::GC_VERDICTS_STRIPPED);
}

/// gc_leak: 20 rounds of 1,000 leaked `Leaked` objects and 25,000
/// `Garbage` ones, a collection at the end of each round.
#[test]
fn leak_among_garbage() {
    const ROUNDS: u64 = 20;
    const LEAKS: u64 = 1_000;
    const GARBAGE: u64 = 25_000;
    let dir = TempDir::new("gc-leak");
    let profile = dir.join("leak.mprof");
    run_ok([
        OsStr::new("run"),
        OsStr::new("--heap"),
        OsStr::new("gc"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--"),
        OsStr::new(fixture::crystal::GC_LEAK_DEBUG),
    ]);

    let leaks = report(&profile, "json", &["--leaks"]);
    let leaks: Value = serde_json::from_str(&leaks)
        .unwrap_or_else(|e| panic!("--leaks report is not JSON ({e}):\n{leaks}"));
    let first = groups(&leaks)
        .first()
        .unwrap_or_else(|| panic!("--leaks report has no groups: {leaks:#}"));
    assert!(
        first["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["function"] == "leak_some"),
        "the first leak is not leak_some's; groups:\n{}",
        list_groups(&leaks)
    );

    let json = report_json(&profile);
    let gc = &json["gc"];
    assert_eq!(gc["liveness"], "mark bits", "{gc:#}");
    assert!(uint(gc, "/collections") >= ROUNDS, "{gc:#}");

    let leaked = gc_groups_with(&json, "leak_some");
    assert_eq!(
        sum(&leaked, "total_count"),
        ROUNDS * LEAKS,
        "{}",
        list_groups(&json)
    );
    assert_eq!(sum(&leaked, "live_count"), ROUNDS * LEAKS);
    assert_eq!(sum(&leaked, "marked_count"), ROUNDS * LEAKS);
    assert_eq!(sum(&leaked, "collected_count"), 0);

    // Garbage: all allocated before the last collection (the fixture's last
    // GC work is GC.collect), so all judged there: unmarked, but for what
    // the conservative collector keeps through stale stack words and the
    // chains they reach (measured in process: 13 to 65 objects of the last
    // round marked at the last collection, over runs of the debug build).
    // Still marked means still live; everything else was collected.
    let garbage = gc_groups_with(&json, "make_garbage");
    let total = sum(&garbage, "total_count");
    assert_eq!(total, ROUNDS * GARBAGE, "{}", list_groups(&json));
    let (marked, live) = (sum(&garbage, "marked_count"), sum(&garbage, "live_count"));
    eprintln!(
        "gc_leak: garbage {total}, collected {}, live {live}, marked at the last collection {marked} ({} bytes)",
        sum(&garbage, "collected_count"),
        sum(&garbage, "marked_bytes")
    );
    assert!(
        marked <= GARBAGE / 100,
        "{marked} garbage objects marked at the last collection"
    );
    assert_eq!(
        live, marked,
        "garbage live at the end vs marked at the last collection"
    );
    assert_eq!(sum(&garbage, "collected_count"), total - live);
}

/// The last `In-use heap: P% (X KiB pointers + Y KiB other)` line of a
/// libgc log, in bytes (X + Y KiB).
fn last_in_use(log: &str) -> u64 {
    let line = log
        .lines()
        .rev()
        .find(|l| l.starts_with("In-use heap:"))
        .unwrap_or_else(|| panic!("no In-use heap line in the GC log:\n{log}"));
    let kib: Vec<u64> = line
        .split(['(', ' '])
        .filter_map(|word| word.parse().ok())
        .collect();
    match kib.as_slice() {
        [pointers, other] => (pointers + other) * 1024,
        _ => panic!("unexpected line {line:?}"),
    }
}

/// crystal-samples' binary-trees: memprof's bytes of objects marked at the
/// last collection against libgc's own figure for that collection.
///
/// libgc 8.2.2 prints, with `GC_PRINT_STATS` set, after each collection's
/// `GC_start_reclaim` (alloc.c, `GC_finish_collection`):
/// `In-use heap: %d%% (%lu KiB pointers + %lu KiB other)`: the sums
/// `GC_composite_in_use` / `GC_atomic_in_use`, which `GC_reclaim_block`
/// recomputes per block: `hb_sz * hb_n_marks` for a block of small objects
/// (`hb_n_marks` may be off a little under parallel marking, bdwgc says),
/// `hb_sz` for a marked large object; KiB rounded to nearest. It counts
/// what no GC_malloc returned too (entries of thread-local free lists, which
/// are marked; the GC's own uncollectable objects), hence a tolerance.
/// Measured in process (an LD_PRELOAD shim recording every GC_malloc and
/// GC_malloc_atomic, judged with GC_base/GC_is_marked/GC_size at exit,
/// objects allocated after the last collection left out): depth 10, 39
/// collections, 264,528 bytes marked vs In-use 259 KiB (0.3% apart); depth
/// 12, 886,608 bytes vs 866 KiB (0.02%).
#[test]
fn binary_trees_marked_bytes_match_the_gc() {
    let dir = TempDir::new("gc-binary-trees");
    let profile = dir.join("binary-trees.mprof");
    let log = dir.join("gc.log");
    let mut command = memprof([
        OsStr::new("run"),
        OsStr::new("--heap"),
        OsStr::new("gc"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--"),
        OsStr::new(fixture::crystal::BINARY_TREES_RELEASE),
        OsStr::new("10"),
    ]);
    command.env("GC_PRINT_STATS", "1").env("GC_LOG_FILE", &log);
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(output.status.success(), "{}", describe(&output));
    let log = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("no GC log {}: {e}\n{}", log.display(), describe(&output)));
    let in_use = last_in_use(&log);

    let json = report_json(&profile);
    let gc = &json["gc"];
    assert_eq!(gc["liveness"], "mark bits", "{gc:#}");
    // (libgc's count includes the collection GC_init runs.)
    let collections = log
        .lines()
        .filter(|l| l.starts_with("In-use heap:"))
        .count();
    assert!(uint(gc, "/collections") >= 1, "{gc:#}");
    let marked = uint(gc, "/marked_bytes");
    let off = marked.abs_diff(in_use) as f64 / in_use as f64;
    eprintln!(
        "binary-trees 10: {collections} collections in the GC log, {} seen by memprof, memprof marked_bytes {marked}, libgc In-use {in_use} ({:.2}% apart)",
        uint(gc, "/collections"),
        off * 100.0
    );
    assert!(
        off <= 0.05,
        "gc.marked_bytes {marked} is {:.1}% away from libgc's In-use {in_use}",
        off * 100.0
    );
}

/// `--gc-liveness reuse`: no tracing, no passes, and the report says how
/// dead GC objects were found; the dropped objects still count as live.
#[test]
fn reuse_only_is_said_in_the_report() {
    let dir = TempDir::new("gc-reuse");
    let profile = dir.join("profile.mprof");
    let gc_verdicts = dir.join("gc-verdicts.txt");
    run_ok([
        OsStr::new("run"),
        OsStr::new("--heap"),
        OsStr::new("gc"),
        OsStr::new("--gc-liveness"),
        OsStr::new("reuse"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--"),
        OsStr::new(fixture::GC_VERDICTS),
        gc_verdicts.as_os_str(),
    ]);
    let json = report_json(&profile);
    let liveness = json["gc"]["liveness"].as_str().unwrap_or_default();
    assert!(
        liveness.starts_with("address reuse only (--gc-liveness reuse)"),
        "{liveness}"
    );
    assert_eq!(uint(&json, "/gc/collections"), 0);
    let dropped = gc_groups_with(&json, "make_dropped");
    assert_eq!(sum(&dropped, "collected_count"), 0);
    assert_eq!(sum(&dropped, "live_count"), sum(&dropped, "total_count"));
    let text = report(&profile, "markdown", &[]);
    assert!(text.contains("GC liveness: address reuse only"), "{text}");
}

/// 4 threads, each with its own free lists: every GC allocation counted
/// under its function with its exact bytes, all live, the results read
/// at the entry for most of them and never wrong.
#[test]
fn threads_each_with_their_free_lists() {
    let dir = TempDir::new("gc-threads");
    let profile = dir.join("threads.mprof");
    profile_run(&profile, &[fixture::GC_THREADS]);
    let json = report_json(&profile);
    assert_eq!(uint(&json, "/lost_events"), 0, "{:#}", json["counters"]);
    if let Some((predicted, _)) = assert_predictions_right(&json) {
        assert!(predicted >= 300_000, "{:#}", json["counters"]);
    }
    for (function, bytes) in [("alloc_scanned", 9_600_000), ("alloc_atomic", 9_599_936)] {
        let groups = gc_groups_with(&json, function);
        assert_eq!(sum(&groups, "total_count"), 200_000, "{function}");
        assert_eq!(sum(&groups, "total_bytes"), bytes, "{function}");
        assert_eq!(sum(&groups, "live_count"), 200_000, "{function}");
        assert_eq!(sum(&groups, "live_bytes"), bytes, "{function}");
    }
}
