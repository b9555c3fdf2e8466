//! What the tests of `attach --all` (and `--comm/--exe`) share: starting
//! memprof and stopping it, running a short program to its end, and
//! reading one process out of the profile.

use crate::functions;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{groups, memprof, report_json, timeout, uint, ChildGuard, Counts, Lines, MAKE_FOO};

/// Starts `memprof attach --all -o PROFILE EXTRA...` and waits until its
/// probes are live; returns it, its stderr and the line it said then.
pub fn start_all(profile: &Path, extra: &[&str]) -> (ChildGuard, Lines, String) {
    let mut args = vec!["attach", "--all", "-o", profile.to_str().unwrap()];
    args.extend(extra);
    let child = memprof(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start memprof attach --all");
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof stderr", memprof.0.stderr.take().unwrap());
    let said = stderr.wait_for("profiling every process", timeout());
    (memprof, stderr, said)
}

/// Stops memprof with Ctrl-C (it must exit 0); returns the profile's JSON.
pub fn stop(memprof: ChildGuard, stderr: Lines, profile: &Path) -> Value {
    stop_with_stderr(memprof, stderr, profile).0
}

/// [`stop`], and what memprof said on stderr.
pub fn stop_with_stderr(
    mut memprof: ChildGuard,
    mut stderr: Lines,
    profile: &Path,
) -> (Value, String) {
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    let said = stderr.all().join("\n");
    assert!(status.success(), "memprof: {status}\n{said}");
    (report_json(profile), said)
}

/// Runs `program args` to its end (it must exit 0); returns its pid.
pub fn run_to_end(program: &str, args: &[&str]) -> u32 {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let pid = child.id();
    assert!(child.wait().unwrap().success(), "{program} {args:?} failed");
    pid
}

/// The profile's entries for pid `pid` (one per process the kernel gave
/// that pid).
pub fn processes(json: &Value, pid: u32) -> Vec<&Value> {
    json["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| uint(p, "/pid") == u64::from(pid))
        .collect()
}

/// The profile's entry for process `pid` (the first of that pid).
pub fn process(json: &Value, pid: u32) -> &Value {
    processes(json, pid)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no process {pid} in {:#}", json["processes"]))
}

/// The sum of process `pid`'s groups of `kind` with a frame named
/// `function` (its first allocations may be unwound no further than the
/// allocator's caller: another group of the same site).
pub fn at_site(json: &Value, pid: u32, kind: &str, function: &str) -> Counts {
    let mine: Vec<&Value> = groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid) && g["kind"] == kind)
        .collect();
    sum_at(&mine, function)
}

/// The sum of `groups` with a frame named `function`.
pub fn sum_at(groups: &[&Value], function: &str) -> Counts {
    let mut sum = Counts::default();
    for g in groups.iter().filter(|g| functions(g).contains(&function)) {
        let c = Counts::of(g);
        sum.live_count += c.live_count;
        sum.live_bytes += c.live_bytes;
        sum.total_count += c.total_count;
        sum.total_bytes += c.total_bytes;
    }
    sum
}

/// Process `pid` (a run of `basic` named `name`, at `exe`) as itself:
/// its name, its executable, exit 0, its own counters every call and
/// each free (1,000 and 400). Returns its entry.
fn basic_process<'a>(json: &'a Value, pid: u32, name: &str, exe: &str) -> &'a Value {
    let p = process(json, pid);
    assert_eq!(p["comm"], name, "{p:#}");
    assert_eq!(p["exe"], exe, "{p:#}");
    assert_eq!(p["exit"]["code"], 0, "{p:#}");
    assert_eq!(p["counters"]["allocs"], 1000, "{p:#}");
    assert_eq!(p["counters"]["frees"], 400, "{p:#}");
    p
}

/// [`assert_exact_basic`] on a kernel without the task-VMA iterator
/// (Linux 6.1): process `pid` is there as itself with every allocation
/// and free counted and its exact bytes; a stack that is not whole to
/// `_start` is one of a process whose first table came from /proc, and
/// the profile counts that process (`tables_from_proc`).
pub fn assert_counted_basic(json: &Value, pid: u32, name: &str, exe: &str) {
    let p = basic_process(json, pid, name, exe);
    let mine: Vec<&Value> = groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid))
        .collect();
    let total = |field: &str| {
        mine.iter()
            .map(|g| uint(g, &format!("/{field}")))
            .sum::<u64>()
    };
    assert_eq!(
        Counts {
            live_count: total("live_count"),
            live_bytes: total("live_bytes"),
            total_count: total("total_count"),
            total_bytes: total("total_bytes"),
        },
        MAKE_FOO,
        "pid {pid}: {mine:#?}"
    );
    let cut = mine
        .iter()
        .filter(|g| functions(g).last() != Some(&"_start"))
        .count();
    if cut > 0 {
        assert!(
            uint(p, "/counters/tables_from_proc") >= 1
                || uint(json, "/counters/tables_from_proc") >= 1,
            "pid {pid}: {cut} stacks cut, not counted: {p:#}"
        );
    }
}

/// memprof keeps the last 1,000 processes that ended: of `pids` (run one
/// after another, in this order), those absent from the profile must be
/// the first ones, all but the last 1,000 at least, and no more than it
/// counts as let go. Returns how many are absent.
pub fn assert_first_let_go(json: &Value, pids: &[u32]) -> usize {
    let absent = pids
        .iter()
        .take_while(|&&pid| processes(json, pid).is_empty())
        .count();
    let evicted = uint(json, "/counters/processes_evicted");
    assert!(
        absent >= pids.len().saturating_sub(1000) && absent as u64 <= evicted,
        "{absent} of the first of {} processes absent, {evicted} let go",
        pids.len()
    );
    absent
}

/// Process `pid` (a run of `basic`, or a program like it, named `name`,
/// at `exe`) is in the profile as itself, with its exact counts at
/// make_foo, every one of its stacks whole to `_start`, no frame unnamed.
pub fn assert_exact_basic(json: &Value, pid: u32, name: &str, exe: &str) {
    assert_eq!(
        at_site(json, pid, "libc", "make_foo"),
        MAKE_FOO,
        "pid {pid}"
    );
    basic_process(json, pid, name, exe);
    for g in groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid))
    {
        let frames = functions(g);
        assert!(!frames.contains(&"[unknown]"), "pid {pid}: {frames:?}");
        assert_eq!(g["truncated"], false, "pid {pid}: {frames:?}");
        assert_eq!(frames.last(), Some(&"_start"), "pid {pid}: {frames:?}");
    }
}
