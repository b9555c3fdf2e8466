//! `memprof attach --all`: every process that allocates, those started
//! after memprof too, with one load of the probes: each process under its
//! own pid, with exact counts at its allocation sites, finalized at its
//! exit with its name, its parent and its exit code.

use memprof_tests::every_process::*;
use memprof_tests::*;
use serde_json::Value;
use std::process::Stdio;

/// The Crystal fixture's `allocs foos`: 100,000 `Foo` of 32 bytes, all
/// kept (by address reuse, the liveness of `--all`: none is reused).
const FOOS: Counts = Counts {
    live_count: 100_000,
    live_bytes: 3_200_000,
    total_count: 100_000,
    total_bytes: 3_200_000,
};

/// One `attach --all` at a time in this file: each profiles every
/// process, so two at once profile each other (and fill each other's
/// tables with memprof's own allocations).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_process_started_meanwhile_is_profiled_exactly() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_all");
    let profile = dir.join("host.mprof");
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0", "--heap", "all"]);
    let memprof_pid = memprof.pid() as u64;

    // Each program once unasserted: memprof has then read its files (its
    // first run's first allocations may be unwound before that).
    run_to_end(fixture::BASIC, &["zero"]);
    run_to_end(fixture::crystal::ALLOCS_DEBUG, &["foos"]);
    let basics: Vec<u32> = ["one", "two", "three"]
        .iter()
        .map(|word| run_to_end(fixture::BASIC, &[word]))
        .collect();
    let crystal = run_to_end(fixture::crystal::ALLOCS_DEBUG, &["foos"]);
    // And one in a pid namespace of its own (a container's).
    let inner = format!("{} four; :", fixture::BASIC);
    let unshare = run_to_end(
        "unshare",
        &[
            "-m",
            "-p",
            "--fork",
            "--mount-proc",
            "/bin/sh",
            "-c",
            &inner,
        ],
    );

    let json = stop(memprof, stderr, &profile);

    let me = std::process::id();
    for &pid in &basics {
        assert_eq!(
            at_site(&json, pid, "libc", "make_foo"),
            MAKE_FOO,
            "pid {pid}"
        );
        let p = process(&json, pid);
        assert_eq!(p["comm"], "basic", "{p:#}");
        assert_eq!(uint(p, "/ppid"), u64::from(me), "{p:#}");
        assert_eq!(p["exit"]["code"], 0, "{p:#}");
        assert!(
            p["end_s"].as_f64().unwrap() >= p["start_s"].as_f64().unwrap(),
            "{p:#}"
        );
    }
    // Every run a process of its own.
    let mut distinct = basics.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);

    assert_eq!(at_site(&json, crystal, "gc", "Foo.new"), FOOS);
    assert!(
        json["gc"]["liveness"]
            .as_str()
            .unwrap()
            .starts_with("address reuse only: attach --all traces no process"),
        "{:#}",
        json["gc"]
    );
    let p = process(&json, crystal);
    assert_eq!(p["comm"], "allocs_debug", "{p:#}");
    assert_eq!(p["exit"]["code"], 0, "{p:#}");

    // unshare forked the shell as pid 1 of the new namespace; basic is its
    // pid 2, listed under its host pid with the namespace's beside it.
    let in_ns: Vec<&Value> = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ns_pid"] == 2 && p["comm"] == "basic")
        .collect();
    assert_eq!(in_ns.len(), 1, "{:#}", json["processes"]);
    let basic_ns = uint(in_ns[0], "/pid") as u32;
    assert_eq!(at_site(&json, basic_ns, "libc", "make_foo"), MAKE_FOO);
    let shell = process(&json, uint(in_ns[0], "/ppid") as u32);
    assert_eq!(shell["ns_pid"], 1, "{shell:#}");
    assert_eq!(uint(shell, "/ppid"), u64::from(unshare), "{shell:#}");

    // memprof itself is never a process of the profile.
    assert!(json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| uint(p, "/pid") != memprof_pid));
    let markdown = report(&profile, "markdown", &["--pid", &basics[1].to_string()]);
    assert!(markdown.contains("make_foo"), "{markdown}");
}

/// By default, sampled by bytes, and libc and mmap only: no Boehm GC
/// function is probed (a trap per GC allocation of every Crystal program).
#[test]
fn all_samples_libc_by_default() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_default");
    let profile = dir.join("host.mprof");
    let (memprof, stderr, said) = start_all(&profile, &[]);
    assert!(
        said.contains("sampled (--sample-bytes 524288;")
            && said.contains("libc and mmap (--heap all: Boehm GC objects too)"),
        "{said}"
    );
    run_to_end(fixture::crystal::ALLOCS_DEBUG, &["foos"]);
    let json = stop(memprof, stderr, &profile);
    assert_eq!(uint(&json, "/sample_bytes"), 524_288);
    // The Crystal program's 100,000 GC objects: not one.
    let gc: Vec<&Value> = groups(&json)
        .iter()
        .filter(|g| g["kind"] == "gc" || g["kind"] == "gc_atomic")
        .collect();
    assert!(gc.is_empty(), "{}", list_groups(&json));
}

/// A fresh copy of `program` at `path` (a new inode: memprof has never
/// seen it).
fn fresh_copy(program: &str, path: &std::path::Path) -> String {
    std::fs::copy(program, path).unwrap_or_else(|e| panic!("copying {program}: {e}"));
    path.to_str().unwrap().to_string()
}

/// The user's case of a busy machine: programs that live a millisecond
/// or two, one seen before, one never seen. Each is in the profile under
/// its own name with its exact counts and whole stacks, from its first
/// allocation: the kernel gives a process its unwind table from its own
/// mappings, and names what it maps, without waiting for memprof to read
/// /proc. Twice over (ten times with `--long`), each time with programs
/// new to memprof.
#[test]
fn programs_of_a_millisecond_are_exact_from_their_first_allocation() {
    let _one = one_at_a_time();
    let rounds = if cfg!(feature = "long") { 10 } else { 2 };
    for round in 0..rounds {
        let dir = TempDir::new(&format!("host_short_{round}"));
        let profile = dir.join("host.mprof");
        let seen = fresh_copy(fixture::BASIC, &dir.join("seen"));
        let never = fresh_copy(fixture::BASIC, &dir.join("neverseen"));
        let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);
        let mut runs: Vec<(u32, &str, &str)> = Vec::new();
        for _ in 0..50 {
            runs.push((run_to_end(&seen, &[]), "seen", seen.as_str()));
        }
        for _ in 0..50 {
            runs.push((run_to_end(&never, &[]), "neverseen", never.as_str()));
        }
        let json = stop(memprof, stderr, &profile);
        for (pid, name, exe) in runs {
            assert_exact_basic(&json, pid, name, exe);
        }
    }
}

/// The kernel matrix's case (`cargo xtask test` runs it in each kernel):
/// five processes of a millisecond, started after `attach --all`, each
/// with its exact counts and whole stacks. On a kernel without the
/// task-VMA iterator (6.1) the first table waits for /proc: the stacks
/// cut at a file not known yet are finished in userspace, still exact.
#[test]
fn five_processes_of_a_millisecond_are_exact() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_five");
    let profile = dir.join("host.mprof");
    let program = fresh_copy(fixture::BASIC, &dir.join("five"));
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);
    let pids: Vec<u32> = (0..5).map(|_| run_to_end(&program, &[])).collect();
    let json = stop(memprof, stderr, &profile);
    for pid in pids {
        if json["kernel"]["task_vma_iter"] == true {
            assert_exact_basic(&json, pid, "five", &program);
        } else {
            // No kernel-built tables: a process gone before memprof read
            // its /proc keeps its exact counts, its stacks may stop at
            // the allocator's caller, and the profile says so.
            assert_counted_basic(&json, pid, "five", &program);
        }
    }
}

/// A program too big for memprof to read before it ends (16 MiB: its
/// unwind rows are built off the event thread): the kernel stops each
/// stack at its code, sends the frame and a copy of the stack above it,
/// and memprof finishes them once it has read the file. Every stack is
/// complete, every count exact.
#[test]
fn stacks_through_a_file_read_too_late_are_finished() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_late");
    let profile = dir.join("host.mprof");
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);
    let mut runs = Vec::new();
    for i in 0..3 {
        let copy = fresh_copy(fixture::BIG_SHORT, &dir.join(&format!("big{i}")));
        runs.push((run_to_end(&copy, &[]), format!("big{i}"), copy));
    }
    let json = stop(memprof, stderr, &profile);
    for (pid, name, exe) in &runs {
        assert_exact_basic(&json, *pid, name, exe);
    }
}

/// A program that loads a library memprof has never seen, allocates
/// from it and exits at once: the library's frames are named, its
/// counts exact.
#[test]
fn a_library_loaded_just_before_the_end_is_named() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_dlopen");
    let profile = dir.join("host.mprof");
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);
    let mut runs = Vec::new();
    for i in 0..3 {
        let library = fresh_copy(fixture::LIB_BARS, &dir.join(&format!("libbars{i}.so")));
        runs.push(run_to_end(fixture::DLOPEN_ONCE, &[&library]));
    }
    let json = stop(memprof, stderr, &profile);
    for pid in runs {
        let bars = at_site(&json, pid, "libc", "make_bars");
        assert_eq!(
            (bars.total_count, bars.total_bytes, bars.live_count),
            (300, 300 * 64, 300),
            "pid {pid}"
        );
        for g in groups(&json)
            .iter()
            .filter(|g| uint(g, "/pid") == u64::from(pid) && functions(g).contains(&"make_bars"))
        {
            let frames = functions(g);
            assert_eq!(frames[..2], ["make_bars", "main"], "pid {pid}: {frames:?}");
            assert_eq!(g["truncated"], false, "pid {pid}: {frames:?}");
        }
    }
}

/// A storm of short processes, bounded (2,000 in a row, ~13 s here):
/// the last 1,000 to end are in the profile, each with its exact counts
/// and whole stacks, and the ones before them let go and counted (what
/// is kept of ended processes is bounded). (The build before the kernel
/// built the tables lost 166,821 allocations of these to a full live
/// table and got none of the 2,000 exact.) A long run: `--long`.
#[cfg(feature = "long")]
#[test]
fn a_storm_of_two_thousand_processes_is_followed_whole() {
    let _one = one_at_a_time();
    let dir = TempDir::new("host_storm");
    let profile = dir.join("host.mprof");
    let program = fresh_copy(fixture::BASIC, &dir.join("stormy"));
    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);
    let pids: Vec<u32> = (0..2000).map(|_| run_to_end(&program, &[])).collect();
    let json = stop(memprof, stderr, &profile);
    // Each one exact (its 1,000 allocations and 400 frees all recorded,
    // its stacks whole). The counters are the machine's: another test's
    // `attach --all` running beside this one is profiled too, and may
    // fill the tables with its own allocations.
    let absent = assert_first_let_go(&json, &pids);
    for &pid in &pids[absent..] {
        assert_exact_basic(&json, pid, "stormy", &program);
    }
}

/// `attach --comm/--exe` on the same machinery: the kernel checks each
/// new process's name and executable, so a selected program that lives a
/// millisecond is exact from its first allocation, and nothing else is
/// in the profile. Programs new to memprof each round: one selected by
/// name, one by executable, one not selected.
#[test]
fn a_selection_takes_its_programs_of_a_millisecond_and_nothing_else() {
    let _one = one_at_a_time();
    for round in 0..3 {
        let dir = TempDir::new(&format!("host_selected_{round}"));
        let profile = dir.join("selected.mprof");
        let by_name = fresh_copy(fixture::BASIC, &dir.join("byname"));
        let by_exe = fresh_copy(fixture::BASIC, &dir.join("byexe"));
        let other = fresh_copy(fixture::BASIC, &dir.join("other"));
        let child = memprof([
            "attach",
            "--comm",
            "byname",
            "--exe",
            &by_exe,
            "--sample-bytes",
            "0",
            "-o",
            profile.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start memprof attach --comm");
        let mut memprof = ChildGuard(child);
        let mut stderr = Lines::new("memprof stderr", memprof.0.stderr.take().unwrap());
        stderr.wait_for("profiling every process of --comm byname --exe", timeout());
        let mut selected: Vec<(u32, &str, &str)> = Vec::new();
        for _ in 0..20 {
            selected.push((run_to_end(&by_name, &[]), "byname", by_name.as_str()));
            selected.push((run_to_end(&by_exe, &[]), "byexe", by_exe.as_str()));
            run_to_end(&other, &[]);
        }
        let json = stop(memprof, stderr, &profile);
        let mut pids: Vec<u64> = json["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| uint(p, "/pid"))
            .collect();
        pids.sort_unstable();
        let mut expected: Vec<u64> = selected.iter().map(|&(pid, ..)| u64::from(pid)).collect();
        expected.sort_unstable();
        assert_eq!(pids, expected, "round {round}: {:#}", json["processes"]);
        for (pid, name, exe) in selected {
            assert_exact_basic(&json, pid, name, exe);
        }
        // A process outside the selection frees nothing memprof knows of.
        assert_eq!(
            json["counters"]["unknown_frees"], 0,
            "{:#}",
            json["counters"]
        );
    }
}
