//! `memprof attach` on `fixtures/c/attach_target.c`, a process that allocates
//! at make_before, says "ready", then allocates at make_during on each SIGUSR1.
//! memprof must see only what happens while attached, end on SIGINT,
//! `--duration` or the target's exit, and leave the target unharmed.

use memprof_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts attach_target and waits until it has made its "before" allocations.
fn start_target() -> (ChildGuard, Lines) {
    start(fixture::ATTACH_TARGET)
}

/// Starts a fixture that says "ready" and waits for it.
fn start(exe: &str) -> (ChildGuard, Lines) {
    let child = Command::new(exe)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("attach_target stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    (target, stdout)
}

/// Has the target allocate at make_during once, and waits until it is done.
fn poke(target: &ChildGuard, stdout: &mut Lines) {
    target.signal(libc::SIGUSR1);
    stdout.wait_for("done", timeout());
}

/// Waits for memprof to end and asserts it exited 0.
fn assert_clean_exit(memprof: &mut ChildGuard, stderr: &mut Lines) {
    let status = memprof.wait_timeout(timeout());
    assert!(
        status.success(),
        "memprof attach ended with {status}; stderr:\n{}",
        stderr.all().join("\n")
    );
}

#[test]
fn attach_sigint_detaches_cleanly() {
    let dir = TempDir::new("attach-sigint");
    let profile = dir.join("attach.mprof");
    let (mut target, mut stdout) = start_target();
    let (mut memprof, mut stderr) = attach(target.pid(), &profile, &[]);

    poke(&target, &mut stdout);
    memprof.signal(libc::SIGINT);
    assert_clean_exit(&mut memprof, &mut stderr);

    // The target survives the detach and keeps working: its probes are gone.
    assert!(target.is_running(), "attach_target died");
    poke(&target, &mut stdout);

    let json = report_json(&profile);
    let during = Counts::of(group_at(&json, "libc", "make_during"));
    assert_eq!(
        (during.live_count, during.live_bytes),
        (300, 24_000),
        "make_during"
    );
    assert!(
        groups_at(&json, "libc", "make_before").is_empty(),
        "allocations made before attaching were reported:\n{}",
        list_groups(&json)
    );
}

#[test]
fn attach_duration_ends_by_itself() {
    let dir = TempDir::new("attach-duration");
    let profile = dir.join("attach.mprof");
    let (mut target, _stdout) = start_target();
    let started = Instant::now();
    let (mut memprof, mut stderr) = attach(target.pid(), &profile, &["--duration", "2"]);

    assert_clean_exit(&mut memprof, &mut stderr);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ended after {:?}, before --duration 2",
        started.elapsed()
    );
    assert!(target.is_running(), "attach_target died");
    report_json(&profile);
}

#[test]
fn attach_target_exit_ends_memprof() {
    let dir = TempDir::new("attach-target-exit");
    let profile = dir.join("attach.mprof");
    let (mut target, mut stdout) = start_target();
    let (mut memprof, mut stderr) = attach(target.pid(), &profile, &[]);

    poke(&target, &mut stdout);
    // Kill and reap the target, so no zombie is left for memprof to wait on.
    target.0.kill().unwrap();
    target.0.wait().unwrap();
    assert_clean_exit(&mut memprof, &mut stderr);

    // The profile is still written, with what was seen before the exit.
    let json = report_json(&profile);
    assert_eq!(
        Counts::of(group_at(&json, "libc", "make_during")).total_count,
        300
    );
}

/// A GC program: memprof traces its threads to hold each collection for the
/// mark-bit pass, and must leave it untraced and working after SIGINT.
#[test]
fn attach_gc_target_judges_collections_and_detaches() {
    let dir = TempDir::new("attach-gc");
    let profile = dir.join("attach.mprof");
    let (mut target, mut stdout) = start(fixture::GC_ATTACH_TARGET);
    let (mut memprof, mut stderr) = attach(target.pid(), &profile, &["--heap", "gc"]);

    poke(&target, &mut stdout);
    poke(&target, &mut stdout);
    memprof.signal(libc::SIGINT);
    assert_clean_exit(&mut memprof, &mut stderr);

    // Untraced again (TracerPid 0) and still collecting.
    let status = std::fs::read_to_string(format!("/proc/{}/status", target.pid())).unwrap();
    assert!(
        status.contains("TracerPid:\t0\n"),
        "still traced:\n{status}"
    );
    poke(&target, &mut stdout);
    assert!(target.is_running(), "gc_attach_target died");

    let json = report_json(&profile);
    assert_eq!(json["gc"]["liveness"], "mark bits");
    assert!(uint(&json, "/gc/collections") >= 2, "{}", json["gc"]);
    assert_eq!(uint(&json, "/gc/collections_not_judged"), 0);
    let kept = group_at(&json, "gc", "make_kept");
    assert_eq!(
        Counts::of(kept),
        Counts {
            live_count: 200,
            live_bytes: 200 * 64,
            total_count: 200,
            total_bytes: 200 * 64
        }
    );
    assert_eq!(uint(kept, "/marked_count"), 200);
    let garbage = group_at(&json, "gc", "make_garbage");
    assert_eq!(uint(garbage, "/total_count"), 2_000);
    // Collected by the collection after each round (the conservative GC may
    // keep a stale pointer or two alive).
    let collected = uint(garbage, "/collected_count");
    assert_eq!(collected + uint(garbage, "/live_count"), 2_000);
    assert!(collected >= 1_990, "only {collected} of 2,000 collected");
}
