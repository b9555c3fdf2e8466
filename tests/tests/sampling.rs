//! Sampling (`--sample-bytes`): estimates within 5 % of the truth.
//! `fixtures/c/sampling.c` allocates known bytes at three freed sites
//! (50/30/20 %) and one leaking site; with a sample point every 4,096 bytes
//! on average each has 10,000+ samples, so its estimate's standard
//! deviation is about 1 %: 5 % is five of them.
use memprof_tests::*;

/// (function, blocks, block size, still live at the end)
const SITES: [(&str, u64, u64, bool); 4] = [
    ("share_a", 114_000, 2048, false),
    ("share_b", 273_000, 512, false),
    ("share_c", 91_000, 1024, false),
    ("leak", 160_000, 256, true),
];

fn within_5_percent(what: &str, estimate: u64, truth: u64) {
    let error = (estimate as f64 - truth as f64).abs() / truth as f64;
    assert!(
        error <= 0.05,
        "{what}: estimated {estimate}, truth {truth} ({:.1} % off)",
        error * 100.0
    );
}

/// `memprof run --heap libc --sample-bytes 4096` of `exe`, profile in
/// `dir`: the profile's path and memprof's output.
fn run_sampled(dir: &TempDir, exe: &str) -> (std::path::PathBuf, std::process::Output) {
    run_sampled_at(dir, exe, "4096")
}

/// `memprof run --heap libc --sample-bytes BYTES` of `exe`.
fn run_sampled_at(
    dir: &TempDir,
    exe: &str,
    bytes: &str,
) -> (std::path::PathBuf, std::process::Output) {
    let profile = dir.join("sampled.mprof");
    let output = run_ok([
        OsStr::new("run"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--heap"),
        OsStr::new("libc"),
        OsStr::new("--sample-bytes"),
        OsStr::new(bytes),
        OsStr::new("--"),
        OsStr::new(exe),
    ]);
    (profile, output)
}

#[test]
fn sampled_estimates_are_within_5_percent_per_stack() {
    let dir = TempDir::new("sampling");
    let (profile, output) = run_sampled(&dir, fixture::SAMPLING);
    let json = report_json(&profile);
    let c = |name: &str| uint(&json, &format!("/counters/{name}"));
    // Every call is either followed or skipped by sampling; frees all seen.
    let calls: u64 = SITES.iter().map(|s| s.1).sum();
    assert_eq!(c("allocs") + c("unsampled_allocs"), calls, "{json:#}");
    assert!(c("unsampled_allocs") > calls / 2, "most are skipped");
    assert_eq!(c("frees"), calls - 160_000);
    // A uprobe session: only the followed calls' returns are probed (the
    // fixture has no realloc, no nested call), except those whose result
    // was read at the entry (a chunk in the thread's tcache). Without
    // sessions (Linux < 6.13), every call's.
    match json["kernel"]["uprobe_session"] == true {
        true => assert_eq!(c("returns_probed") + c("predicted"), c("allocs")),
        false => assert_eq!(c("returns_probed"), calls),
    }
    assert_eq!(uint(&json, "/lost_events"), 0);

    for (function, blocks, size, live) in SITES {
        // share_* allocate in churn(); leak() itself.
        let group = groups(&json)
            .iter()
            .find(|g| {
                let frames = functions(g);
                frames.first() == Some(&function)
                    || (frames.first() == Some(&"churn") && frames.get(1) == Some(&function))
            })
            .unwrap_or_else(|| panic!("no group for {function}:\n{}", list_groups(&json)));
        let n = Counts::of(group);
        within_5_percent(&format!("{function} bytes"), n.total_bytes, blocks * size);
        within_5_percent(&format!("{function} count"), n.total_count, blocks);
        if live {
            within_5_percent(
                &format!("{function} live bytes"),
                n.live_bytes,
                blocks * size,
            );
            within_5_percent(&format!("{function} live count"), n.live_count, blocks);
        } else {
            assert_eq!((n.live_count, n.live_bytes), (0, 0), "{function}");
        }
    }

    // Every report says the figures are estimates.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let markdown = report(&profile, "markdown", &[]);
    for text in [&*stderr, &markdown] {
        assert!(
            text.contains("Sampled: one allocation followed per 4,096 bytes allocated on average (--sample-bytes): the stacks' counts and bytes are estimates"),
            "{text}"
        );
    }
}

/// A realloc that sampling does not follow still runs its return when the
/// block it replaces was followed, and releases it: with uprobe sessions
/// an unfollowed call's return is otherwise never probed. Every block
/// `make()` allocated was realloc'd away: exactly none is live.
#[test]
fn unsampled_reallocs_release_sampled_blocks() {
    let dir = TempDir::new("sampled_realloc");
    let (profile, _) = run_sampled(&dir, fixture::SAMPLED_REALLOC);
    let json = report_json(&profile);
    assert_eq!(uint(&json, "/lost_events"), 0);
    let group = |function: &str| {
        groups(&json)
            .iter()
            .find(|g| g["frames"][0]["function"].as_str() == Some(function))
            .map(Counts::of)
            .unwrap_or_else(|| panic!("no group for {function}:\n{}", list_groups(&json)))
    };
    let make = group("make");
    assert_eq!((make.live_count, make.live_bytes), (0, 0));
    within_5_percent("make bytes", make.total_bytes, 20_000 * 1024);
    let grow = group("grow");
    within_5_percent("grow bytes", grow.total_bytes, 20_000 * 4096);
    within_5_percent("grow live bytes", grow.live_bytes, 10_000 * 4096);
}

/// glibc's malloc maps large blocks and each thread's arena itself. With
/// sampling, a malloc that is not followed must not have its `mmap`
/// drawn a second time: that counted the 1 MiB blocks again as mmap
/// blocks (13 % more bytes) and each thread's 64 MiB arena reservation as
/// live. Under the agent's default (`--sample-bytes 524288`) the fixture's
/// only mmap blocks are its 4 thread stacks, exactly.
#[test]
fn mmaps_inside_unsampled_mallocs_are_not_drawn_again() {
    let dir = TempDir::new("sampled_mmaps");
    let (profile, _) = run_sampled_at(&dir, fixture::SAMPLED_MMAPS, "524288");
    let json = report_json(&profile);
    assert_eq!(uint(&json, "/lost_events"), 0);
    let mmaps: Vec<&Value> = groups(&json)
        .iter()
        .filter(|g| g["kind"] == "mmap")
        .collect();
    for g in &mmaps {
        let frames = functions(g);
        assert!(
            frames.contains(&"pthread_create") && !frames.contains(&"malloc"),
            "an mmap block not of a thread stack: {frames:?}\n{}",
            list_groups(&json)
        );
    }
    // An 8 MiB stack is followed with probability 1 - exp(-16): each
    // stands for itself.
    let stacks: u64 = mmaps.iter().map(|g| Counts::of(g).live_count).sum();
    assert_eq!(stacks, 4, "{}", list_groups(&json));
    // The 1 MiB blocks are libc's, estimated from the ~86.5 of 100 followed
    // (one standard deviation: 4 %).
    let big = groups(&json)
        .iter()
        .find(|g| g["kind"] == "libc" && functions(g).first() == Some(&"big"))
        .map(Counts::of)
        .unwrap_or_else(|| panic!("no group for big:\n{}", list_groups(&json)));
    let error = (big.live_bytes as f64 - 100.0 * 1048576.0).abs() / (100.0 * 1048576.0);
    assert!(error <= 0.15, "big: {} live bytes", big.live_bytes);
}
