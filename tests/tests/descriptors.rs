//! `memprof attach --all` within bounded resources: one descriptor per
//! distinct file, whatever the number of processes that map it (a storm
//! of short processes under a low open-files limit is followed whole),
//! the open-files limit raised to the hard one, and a pid the kernel
//! gives again to another program is another process.

use memprof_tests::every_process::*;
use memprof_tests::*;
use serde_json::Value;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

/// One `attach --all` at a time in this file (each profiles every
/// process, the other's too).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `memprof attach --all --sample-bytes 0 -o PROFILE` with the
/// open-files limit `(soft, hard)`, and waits until its probes are live.
fn start_all_limited(profile: &std::path::Path, limit: (u64, u64)) -> (ChildGuard, Lines) {
    let mut command = memprof([
        "attach",
        "--all",
        "--sample-bytes",
        "0",
        "-o",
        profile.to_str().unwrap(),
    ]);
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit.0,
                rlim_max: limit.1,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start memprof attach --all");
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof stderr", memprof.0.stderr.take().unwrap());
    stderr.wait_for("profiling every process", timeout());
    (memprof, stderr)
}

/// The open-files limit as high as this process may set it (its hard
/// limit: without CAP_SYS_RESOURCE, as on these machines, no higher).
fn hard_limit() -> (u64, u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct given.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    (limit.rlim_max, limit.rlim_max)
}

/// Descriptors process `pid` holds now.
#[cfg(feature = "long")]
fn descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("memprof's descriptors")
        .count()
}

/// The groups of process `pid` (the `reuse`-th of that pid).
fn groups_of(json: &Value, pid: u32, reuse: u64) -> Vec<&Value> {
    groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid) && uint(g, "/pid_reuse") == reuse)
        .collect()
}

/// Whether run `pid` of `basic` (named `name`) is in the profile as
/// itself with its exact counts at make_foo and whole, named stacks.
#[cfg(feature = "long")]
fn exact_basic(json: &Value, pid: u32, name: &str) -> bool {
    let mine = groups_of(json, pid, 0);
    let entries = processes(json, pid);
    entries.len() == 1
        && entries[0]["comm"] == name
        && entries[0]["exit"]["code"] == 0
        && sum_at(&mine, "make_foo") == MAKE_FOO
        && mine.iter().all(|g| {
            let frames = functions(g);
            !frames.contains(&"[unknown]")
                && g["truncated"] == false
                && frames.last() == Some(&"_start")
        })
}

/// 2,000 short processes of one program under an open-files limit of
/// 256 (soft and hard: memprof cannot raise it): memprof keeps what it
/// opens per distinct file, not per process, so the descriptors it holds
/// (sampled every 100 processes) stay well below the limit and do not
/// grow from the first 1,000 processes to the next,
/// the first 1,000 or so are let go (memprof keeps the last 1,000 that
/// ended) and counted, and every other process is exact, or
/// its allocations are counted in `short_of_resources` (never "lost
/// events: 0" for a process unnamed). The build that opened each file
/// per process held 19,327 descriptors after such a storm, and under a
/// limit of 1,024 got 807 of 2,000 processes wrong, silently.
///
/// A long run: `--long`.
#[cfg(feature = "long")]
#[test]
fn a_storm_under_a_low_descriptor_limit_is_exact_or_counted() {
    let _one = one_at_a_time();
    let dir = TempDir::new("fds_storm");
    let profile = dir.join("storm.mprof");
    let program = dir.join("stormy");
    std::fs::copy(fixture::BASIC, &program).unwrap();
    let program = program.to_str().unwrap().to_string();
    let (memprof, stderr) = start_all_limited(&profile, (256, 256));
    let mut held = Vec::new();
    let mut pids = Vec::new();
    for i in 0..2000 {
        pids.push(run_to_end(&program, &[]));
        if i % 100 == 99 {
            held.push(descriptors(memprof.pid()));
        }
    }
    let json = stop(memprof, stderr, &profile);
    // Some held for a while (processes being read as the sample is
    // taken, blazesym's cache until it is renewed), never one more per
    // process: memprof stays well below its limit of 256 (one held per
    // process reaches it within ~160 processes), and the second 1,000
    // processes leave it holding no more than the first 1,000 did, give
    // or take those.
    let (first, second) = held.split_at(held.len() / 2);
    let (first, second) = (first.iter().max().unwrap(), second.iter().max().unwrap());
    assert!(
        *first <= 192 && *second <= first + 16,
        "descriptors memprof held, every 100 processes: {held:?}"
    );
    // The oldest ended processes are let go beyond the last 1,000, and
    // counted.
    let absent = assert_first_let_go(&json, &pids);
    let mut wrong = Vec::new();
    for &pid in &pids[absent..] {
        if exact_basic(&json, pid, "stormy") {
            continue;
        }
        // Not exact: its allocations are counted as such, all of them.
        let entries = processes(&json, pid);
        let counted = entries.first().map(|p| {
            (
                uint(p, "/counters/short_of_resources"),
                uint(p, "/counters/allocs"),
            )
        });
        match counted {
            Some((short, allocs)) if short == allocs && short > 0 => {}
            _ => wrong.push(pid),
        }
    }
    assert_eq!(
        (wrong.len(), &wrong[..wrong.len().min(5)]),
        (0, &[][..]),
        "processes neither exact nor counted"
    );
}

/// memprof raises its open-files limit to the hard limit at its start.
#[test]
fn the_open_files_limit_is_raised_to_the_hard_one() {
    let _one = one_at_a_time();
    let dir = TempDir::new("fds_limit");
    let profile = dir.join("limit.mprof");
    let (memprof, stderr) = start_all_limited(&profile, (256, 4096));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", memprof.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let figures: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(figures, ["4096", "4096"], "{line}");
    run_to_end(fixture::BASIC, &[]);
    stop(memprof, stderr, &profile);
}

/// `clone3`'s arguments (`struct clone_args`, up to `set_tid_size`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// Runs `argv` to its end as process `pid` (`clone3` with `set_tid`:
/// the kernel gives that pid, free again, to this process).
fn run_as_pid(pid: u32, argv: &[&str]) {
    let argv: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    let null = CString::new("/dev/null").unwrap();
    let tid = [pid as libc::pid_t];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: the child only calls async-signal-safe functions (open,
    // dup2, execv, _exit) on memory prepared before.
    let child = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if child == 0 {
        unsafe {
            let fd = libc::open(null.as_ptr(), libc::O_WRONLY);
            libc::dup2(fd, 1);
            libc::execv(pointers[0], pointers.as_ptr());
            libc::_exit(127);
        }
    }
    assert_eq!(
        child,
        i64::from(pid),
        "clone3 with pid {pid}: {}",
        std::io::Error::last_os_error()
    );
    let mut status = 0;
    // SAFETY: waits for the child just started.
    let waited = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    assert_eq!(waited, pid as libc::pid_t);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{argv:?}: status {status:#x}"
    );
}

/// A program ends, and the kernel gives its pid to another program: two
/// processes of that pid in the profile, each with its own name, exit
/// and allocations (the build that keyed processes by pid merged them
/// into one with both stacks). Three times over.
#[test]
fn a_pid_given_again_to_another_program_is_another_process() {
    let _one = one_at_a_time();
    let dir = TempDir::new("fds_pid_reuse");
    let profile = dir.join("reuse.mprof");
    let first = dir.join("first");
    std::fs::copy(fixture::BASIC, &first).unwrap();
    let first = first.to_str().unwrap().to_string();
    let (memprof, stderr) = start_all_limited(&profile, hard_limit());
    let mut pids = Vec::new();
    for i in 0..3 {
        let library = dir.join(&format!("libbars{i}.so"));
        std::fs::copy(fixture::LIB_BARS, &library).unwrap();
        let pid = run_to_end(&first, &[]);
        run_as_pid(pid, &[fixture::DLOPEN_ONCE, library.to_str().unwrap()]);
        pids.push(pid);
    }
    let json = stop(memprof, stderr, &profile);
    for pid in pids {
        let entries = processes(&json, pid);
        let names: Vec<(&Value, u64)> = entries
            .iter()
            .map(|p| (&p["comm"], uint(p, "/pid_reuse")))
            .collect();
        assert_eq!(
            names,
            [(&Value::from("first"), 0), (&Value::from("dlopen_once"), 1)],
            "pid {pid}"
        );
        for p in &entries {
            assert_eq!(p["exit"]["code"], 0, "{p:#}");
        }
        let before = groups_of(&json, pid, 0);
        let after = groups_of(&json, pid, 1);
        assert_eq!(sum_at(&before, "make_foo"), MAKE_FOO, "pid {pid}");
        assert_eq!(sum_at(&before, "make_bars"), Counts::default(), "pid {pid}");
        let bars = sum_at(&after, "make_bars");
        assert_eq!(
            (bars.total_count, bars.total_bytes, bars.live_count),
            (300, 300 * 64, 300),
            "pid {pid}"
        );
        assert_eq!(sum_at(&after, "make_foo"), Counts::default(), "pid {pid}");
    }
}
