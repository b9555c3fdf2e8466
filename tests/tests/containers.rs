//! `memprof attach` on targets whose files are not what memprof's own paths
//! name: a target in its own mount and pid namespaces (a container) with
//! other files bind-mounted over the host's paths, and a target whose
//! executable was replaced on disk after it started. The fixture is
//! `fixtures/c/attach_target.c` (300 x malloc(80) at make_during per
//! SIGUSR1); memprof must probe the files the target maps and name their
//! functions, never the host's files at the same paths.

use memprof_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The libc this test process maps (the same the fixtures map).
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("this test maps no libc")
}

/// Has the target (host pid `pid`) allocate at make_during once.
fn poke(pid: u32, stdout: &mut Lines) {
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    stdout.wait_for("done", timeout());
}

/// Waits for memprof to end by itself, asserts it exited 0, and returns
/// the profile as JSON.
fn finish(memprof: &mut ChildGuard, stderr: &mut Lines, profile: &Path) -> Value {
    let status = memprof.wait_timeout(timeout());
    assert!(
        status.success(),
        "memprof attach ended with {status}; stderr:\n{}",
        stderr.all().join("\n")
    );
    report_json(profile)
}

/// Exactly the 300 allocations of one make_during, named from the
/// target's own files (attach_target's make_during and main, libc's
/// __libc_start_main), and nothing else.
fn assert_make_during_only(json: &Value) {
    assert_eq!(
        (
            uint(json, "/counters/allocs"),
            uint(json, "/counters/frees")
        ),
        (300, 0),
        "allocations and frees seen; groups:\n{}",
        list_groups(json)
    );
    let group = group_at(json, "libc", "make_during");
    let during = Counts::of(group);
    assert_eq!(
        (during.live_count, during.live_bytes, during.total_count),
        (300, 24_000, 300),
        "make_during"
    );
    let functions: Vec<&str> = group["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["function"].as_str())
        .collect();
    assert_eq!(functions.get(1), Some(&"main"), "frames: {functions:?}");
    assert!(
        functions.contains(&"__libc_start_main"),
        "no frame in libc's __libc_start_main: {functions:?}"
    );
}

/// The one child of process `pid`.
fn only_child(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    match children.split_whitespace().collect::<Vec<_>>()[..] {
        [child] => child.parse().unwrap(),
        ref all => panic!("pid {pid} has children {all:?}, expected one"),
    }
}

/// Starts attach_target as pid 1 of its own mount and pid namespaces,
/// where it and libc are other files than the host's at the same paths:
/// on the host, `DIR/app` is another program (basic) and libc the host's;
/// in the target's namespace, `DIR/app` is attach_target and libc a copy
/// on another inode, each bind-mounted over the host's path. Returns
/// `unshare` (killing it kills the target), the target's output once it
/// is ready, and its host pid.
fn start_in_namespaces(dir: &TempDir) -> (ChildGuard, Lines, u32) {
    let app = dir.join("app");
    std::fs::copy(fixture::BASIC, &app).unwrap();
    let libc = libc_path();
    let libc_copy = dir.join("libc.so.6");
    std::fs::copy(&libc, &libc_copy).unwrap();
    let script = format!(
        "mount --bind '{}' '{}' && mount --bind '{}' '{}' && exec '{}'",
        fixture::ATTACH_TARGET,
        app.display(),
        libc_copy.display(),
        libc.display(),
        app.display()
    );
    let child = Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--kill-child", "sh", "-c"])
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start unshare");
    let mut unshare = ChildGuard(child);
    let mut stdout = Lines::new("attach_target stdout", unshare.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    // The target: unshare's child, pid 1 of its own namespace.
    let pid = only_child(unshare.pid() as u32);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(
        nspid.split_whitespace().skip(1).collect::<Vec<_>>(),
        [pid.to_string().as_str(), "1"],
        "the target is not pid 1 of its own pid namespace"
    );
    (unshare, stdout, pid)
}

#[test]
fn attach_in_own_mount_and_pid_namespaces_with_files_mounted_over_the_hosts() {
    let dir = TempDir::new("containers-namespaces");
    let profile = dir.join("attach.mprof");
    let (mut unshare, mut stdout, pid) = start_in_namespaces(&dir);

    let (mut memprof, mut stderr) = attach(pid, &profile, &[]);
    poke(pid, &mut stdout);
    memprof.signal(libc::SIGINT);
    let json = finish(&mut memprof, &mut stderr, &profile);
    assert_make_during_only(&json);
    assert!(unshare.is_running(), "the target died");
}

/// The target's root is gone by the time memprof symbolizes: its files
/// were kept open from the start.
#[test]
fn attach_in_namespaces_to_a_target_that_exits_first() {
    let dir = TempDir::new("containers-exits");
    let profile = dir.join("attach.mprof");
    let (unshare, mut stdout, pid) = start_in_namespaces(&dir);

    let (mut memprof, mut stderr) = attach(pid, &profile, &[]);
    poke(pid, &mut stdout);
    drop(unshare); // kills the target too (--kill-child)
    let json = finish(&mut memprof, &mut stderr, &profile);
    assert_make_during_only(&json);
}

#[test]
fn attach_to_a_program_replaced_on_disk_since_it_started() {
    let dir = TempDir::new("containers-replaced");
    let profile = dir.join("attach.mprof");
    let app = dir.join("app");
    std::fs::copy(fixture::ATTACH_TARGET, &app).unwrap();
    // A program just written may be busy a moment (ETXTBSY): a process
    // forked meanwhile by another test still holds the writing descriptor.
    let mut tries = 0;
    let child = loop {
        match Command::new(&app).stdout(Stdio::piped()).spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            started => break started,
        }
    }
    .unwrap_or_else(|e| panic!("cannot start {}: {e}", app.display()));
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("attach_target stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    // Another program at the same path now (its maps say "(deleted)").
    std::fs::remove_file(&app).unwrap();
    std::fs::copy(fixture::BASIC, &app).unwrap();

    let pid = target.pid() as u32;
    let (mut memprof, mut stderr) = attach(pid, &profile, &[]);
    poke(pid, &mut stdout);
    memprof.signal(libc::SIGINT);
    let json = finish(&mut memprof, &mut stderr, &profile);
    assert_make_during_only(&json);
    assert_eq!(
        json["target"]["exe"].as_str(),
        Some(app.to_str().unwrap()),
        "the target's executable is named by its path"
    );
    assert!(target.is_running(), "the target died");
}
