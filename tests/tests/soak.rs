//! `memprof attach --all` left running: ten minutes of a short program
//! started 20 times a second (12,000 processes). What memprof keeps of
//! ended processes is bounded (the last 1,000, the older ones let go and
//! counted), so its memory is flat once that many have ended: the build
//! that kept every one grew by ~16 KB a process, linearly (17 MB to
//! 223 MB in ten minutes), and the one that kept 20,000 of them kept each
//! one's stacks even after letting it go.

use memprof_tests::every_process::*;
use memprof_tests::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the soak lasts, and how many programs start a second.
const SOAK: Duration = Duration::from_secs(600);
const RATE: u32 = 20;

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// Ten minutes at 20 new processes a second: memprof's resident memory
/// is flat over the last minutes (the median of its last minute within
/// 8 MB of the median of the eighth; a process kept each would add
/// ~75 MB over those two minutes, a leak of 3.5 KB a process 8 MB), and
/// the profile holds the last processes exact, the ones before counted
/// as let go. Flat from the eighth minute, not the fifth: on CI it rose
/// in steps until about 410 s (95, 107, then 127 MB) and stayed there.
#[test]
fn ten_minutes_of_short_processes_keep_memory_flat() {
    let dir = TempDir::new("soak");
    let program = dir.join("soaky");
    std::fs::copy(fixture::BASIC, &program).unwrap();
    let profile = dir.join("soak.mprof");
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);

    let start = Instant::now();
    let mut running: Vec<Child> = Vec::new();
    let mut pids: Vec<u32> = Vec::new();
    // (seconds, KiB) every 10 s.
    let mut curve: Vec<(u64, u64)> = Vec::new();
    let interval = Duration::from_secs(1) / RATE;
    while start.elapsed() < SOAK {
        let due = interval * pids.len() as u32;
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let child = Command::new(&program)
            .stdout(Stdio::null())
            .spawn()
            .expect("cannot start the program");
        pids.push(child.id());
        running.push(child);
        running.retain_mut(|c| match c.try_wait().unwrap() {
            Some(status) => {
                assert!(status.success(), "the program failed: {status}");
                false
            }
            None => true,
        });
        let at = start.elapsed().as_secs();
        if at >= 10 * (curve.len() as u64 + 1) {
            curve.push((at, rss_kib(memprof.pid())));
        }
    }
    for mut c in running {
        assert!(c.wait().unwrap().success());
    }
    let json = stop(memprof, stderr, &profile);
    let shown: Vec<String> = curve
        .iter()
        .map(|(s, k)| format!("{s} s {} MB", k / 1024))
        .collect();
    eprintln!("memprof's resident memory: {}", shown.join(", "));

    let in_minute = |m: u64| -> Vec<u64> {
        curve
            .iter()
            .filter(|(s, _)| *s > (m - 1) * 60 && *s <= m * 60)
            .map(|(_, k)| *k)
            .collect()
    };
    let (eighth, last) = (median(&in_minute(8)), median(&in_minute(10)));
    assert!(
        last <= eighth + (8 << 10),
        "resident memory grew from {eighth} KiB (eighth minute) to {last} KiB (tenth): {shown:?}"
    );

    // The last processes are there, exact; those before them let go and
    // counted.
    let absent = assert_first_let_go(&json, &pids);
    let kept = &pids[absent..];
    let exact = kept
        .iter()
        .filter(|&&pid| {
            let mine: Vec<&serde_json::Value> = groups(&json)
                .iter()
                .filter(|g| uint(g, "/pid") == u64::from(pid) && uint(g, "/pid_reuse") == 0)
                .collect();
            sum_at(&mine, "make_foo") == MAKE_FOO
        })
        .count();
    assert_eq!(exact, kept.len(), "of the processes kept, exact");
}
