//! `cargo xtask test`'s kernel matrix: the smoke set, run again inside each
//! of Debian's kernels (6.1, 6.12) booted under QEMU.
//!
//! memprof's tests run on the kernel of the machine that builds them. Its
//! users run others: older ones lack multi-uprobes, uprobe sessions and the
//! task-VMA iterator, and every kernel without private BPF stacks holds a
//! call chain to 512 bytes. So a few tests, one per command people run,
//! run again in each kernel: the very test binaries `cargo test` built,
//! their fixtures and memprof, seen by the guest at the same paths (the
//! host's root, read-only over 9p), each case a test of its own binary
//! (`BIN --exact NAME`), its output and status written to a folder the
//! guest may write. memprof is 5-10x slower under emulation: the cases'
//! time bounds (hang guards, and the hostile-name cases' deadlines: a
//! profile on time, `/metrics` within a second, SIGTERM within 2 s) are
//! stretched tenfold (`MEMPROF_TEST_SLOWER=10`).
//!
//! ```text
//! kernel matrix: 6.1.0-41-amd64: multi-uprobes no, ...
//!   pass   21.3 s  C program, exact counts (basic)
//!   ...
//! kernel matrix: 14 passed, 0 failed
//! ```

use crate::kernels::{self, Kernel};
use crate::{cargo, target_dir};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One case: what it shows, its test binary (a file of `tests/tests`) and
/// the test's name in it.
struct Case {
    what: &'static str,
    binary: &'static str,
    test: &'static str,
}

/// The smoke set: each command people run, on real programs, with exact
/// assertions (the tests' own).
const SMOKE: &[Case] = &[
    Case {
        what: "run, a C program: exact counts, every report format",
        binary: "basic",
        test: "basic_counts_and_report_formats",
    },
    Case {
        what: "run, a Crystal program: the collector's mark bits, object by object",
        binary: "gc_liveness",
        test: "verdicts_crystal_debug",
    },
    Case {
        what: "attach --pid to a running Crystal program, then detach",
        binary: "attach",
        test: "attach_gc_target_judges_collections_and_detaches",
    },
    Case {
        what: "attach --all: five processes of a millisecond, exact",
        binary: "host",
        test: "five_processes_of_a_millisecond_are_exact",
    },
    Case {
        what: "attach --comm: running and new processes",
        binary: "processes",
        test: "attach_by_program_name_takes_running_and_new_processes",
    },
    Case {
        what: "attach --exe: a static program started later",
        binary: "processes",
        test: "attach_by_executable_takes_a_static_program_started_later",
    },
    Case {
        what: "top: the growing process ranks first",
        binary: "top",
        test: "the_growing_process_ranks_first",
    },
    Case {
        what: "heap: a census of a Crystal program's whole heap, by class",
        binary: "heap",
        test: "heap_census_debug",
    },
    Case {
        what: "agent: Prometheus scrapes /metrics",
        binary: "agent",
        test: "prometheus_scrapes_the_exact_live_bytes",
    },
    Case {
        what: "agent: go tool pprof reads /debug/pprof/heap",
        binary: "agent",
        test: "go_tool_pprof_reads_the_heap_and_what_a_window_allocated",
    },
    Case {
        what: "attach --all: a user's hostile C++ name, shown cut, on time, under 200 MB",
        binary: "hostile_names",
        test: "attach_all_shows_a_hostile_cpp_name_cut_and_ends_on_time",
    },
    Case {
        what: "agent: a user's hostile C++ name; /metrics answers throughout, SIGTERM obeyed",
        binary: "hostile_names",
        test: "the_agent_answers_throughout_and_obeys_sigterm",
    },
    Case {
        what: "--rss-only: 100 MiB written at one stack, exact to the page; given back by munmap, madvise, mmap MAP_FIXED, mremap and brk (seen at rss_stat)",
        binary: "rss",
        test: "every_page_written_is_counted_at_its_stack_and_given_back_every_way",
    },
    Case {
        what: "agent defaults: a user's leak first among its resident memory, not one of its calls probed",
        binary: "rss",
        test: "the_agent_at_its_defaults_finds_a_users_leak_with_nothing_per_call",
    },
    Case {
        what: "agent escalation: a growing process gets allocator probes for a window, breakpoints in its memory alone",
        binary: "rss",
        test: "a_process_whose_memory_keeps_growing_gets_its_own_allocator_probes_for_a_window",
    },
];

/// A whole kernel's run may take this long, boot included (a case takes
/// 10-60 s under emulation).
const KERNEL_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// Runs the smoke set in every kernel `cargo xtask setup` installed, after
/// the tests were built (`long`: with the long runs, as they were built);
/// fails if a case failed in any of them.
pub fn run(memprof: &Path, long: bool) -> Result<()> {
    let binaries = test_binaries(long)?;
    let mut passed = 0;
    let mut failed = Vec::new();
    for kernel in kernels::kernels()? {
        let (p, f) = run_in(&kernel, memprof, &binaries)?;
        passed += p;
        failed.extend(f.into_iter().map(|case| format!("{}: {case}", kernel.name)));
    }
    println!("kernel matrix: {passed} passed, {} failed", failed.len());
    if !failed.is_empty() {
        bail!("in the kernel matrix: {}", failed.join("; "));
    }
    Ok(())
}

/// The test binaries `cargo test` built, by name (already built: this
/// only asks cargo where they are).
fn test_binaries(long: bool) -> Result<HashMap<String, PathBuf>> {
    let mut command = cargo();
    command.args([
        "test",
        "--release",
        "-p",
        "memprof-tests",
        "--no-run",
        "--message-format=json",
    ]);
    if long {
        command.args(["--features", "memprof-tests/long"]);
    }
    let out = crate::output(&mut command)?;
    if !out.status.success() {
        bail!(
            "cargo test --no-run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut binaries = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(exe)) = (
            is_test,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            binaries.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    Ok(binaries)
}

/// The smoke set in one kernel: prints a line per case; returns how many
/// passed and the names of those that failed.
fn run_in(
    kernel: &Kernel,
    memprof: &Path,
    binaries: &HashMap<String, PathBuf>,
) -> Result<(usize, Vec<String>)> {
    let results = target_dir().join("kernel-matrix").join(&kernel.name);
    // Results of an earlier run must not be read as this one's.
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results)
        .with_context(|| format!("cannot create {}", results.display()))?;
    let script = guest_script(memprof, binaries, &results)?;
    println!(
        "kernel matrix: booting {} under QEMU ({} cases)",
        kernel.version,
        SMOKE.len()
    );
    let out = kernels::boot(kernel, &script, &results, KERNEL_TIMEOUT)?;
    let features = std::fs::read_to_string(results.join("features")).unwrap_or_default();
    println!(
        "kernel matrix: {} ({:.0} s, boot included): {}",
        kernel.version,
        out.elapsed.as_secs_f64(),
        features.trim()
    );
    let mut passed = 0;
    let mut failed = Vec::new();
    for (i, case) in SMOKE.iter().enumerate() {
        let status = std::fs::read_to_string(results.join(format!("{i}.status")));
        let secs = std::fs::read_to_string(results.join(format!("{i}.secs"))).unwrap_or_default();
        let (word, ok) = match status.as_deref().map(str::trim) {
            Ok("0") => ("pass", true),
            Ok(code) => (if code == "124" { "hung" } else { "FAIL" }, false),
            Err(_) => ("not run", false),
        };
        println!(
            "  {word:<7} {:>6} s  {} ({}::{})",
            secs.trim(),
            case.what,
            case.binary,
            case.test
        );
        if ok {
            passed += 1;
        } else {
            failed.push(format!("{}::{}", case.binary, case.test));
            let log = results.join(format!("{i}.log"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            for line in tail.into_iter().rev() {
                println!("      | {line}");
            }
            println!("      (whole output: {})", log.display());
        }
    }
    if out.exit_code.is_none() {
        println!(
            "kernel matrix: {} did not finish ({}); the VM's last words:",
            kernel.version,
            if out.timed_out {
                "timed out"
            } else {
                "the VM failed"
            }
        );
        for line in out
            .stderr
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("      | {line}");
        }
    }
    Ok((passed, failed))
}

/// The guest's script: the kernel's features as memprof sees them, then
/// each case, its output in `N.log`, its exit status in `N.status` and its
/// time in `N.secs`, in `results` (the guest's one writable folder).
fn guest_script(
    memprof: &Path,
    binaries: &HashMap<String, PathBuf>,
    results: &Path,
) -> Result<String> {
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let out = quote(results);
    let mut script = format!(
        "export MEMPROF_BIN={memprof} TMPDIR=/tmp MEMPROF_TEST_SLOWER=10\n\
         cd /tmp\n\
         {memprof} probes --kernel > {out}/features 2>&1\n",
        memprof = quote(memprof),
    );
    for (i, case) in SMOKE.iter().enumerate() {
        let binary = binaries
            .get(case.binary)
            .with_context(|| format!("cargo built no test binary {}", case.binary))?;
        script.push_str(&format!(
            "start=$(date +%s.%N)\n\
             timeout 600 {binary} --exact {test} --test-threads=1 > {out}/{i}.log 2>&1\n\
             echo $? > {out}/{i}.status\n\
             echo \"$(date +%s.%N) $start\" | awk '{{printf \"%.1f\", $1 - $2}}' > {out}/{i}.secs\n",
            binary = quote(binary),
            test = case.test,
        ));
    }
    Ok(script)
}
