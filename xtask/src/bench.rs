//! `cargo xtask bench`: what memprof costs a program, per allocation.
//!
//! Runs each workload every [`WAYS`] way (untraced, then under `memprof run`
//! with various options), [`REPETITIONS`] times each, and prints the medians:
//!
//! ```text
//! bench: bench_loop 1000000 (1,000,000 × malloc/free pair), median of 3 runs
//! | way                        |    time ms |  µs per malloc/free pair | vs untraced |
//! |----------------------------|------------|--------------------------|-------------|
//! | untraced                   |        6.1 |                    0.006 |       1.0 × |
//! ```
//!
//! A workload is timed by its own `loop_ns=<n>` line on stdout (so start-up
//! and probe attachment are not counted) or by the wall clock ([`Clock`]).
//! Add rows to the `*_WAYS` lists and entries to [`workloads`].

use crate::{build_memprof, fixtures, fixtures_src, output, setup::setup, show, target_dir};
use anyhow::{bail, ensure, Context, Result};
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const REPETITIONS: usize = 3;

/// `memprof run -- binary-trees 10` counts this many allocations (GC and libc).
const BINARY_TREES_10_ALLOCS: u64 = 265_683;

/// One way to run a workload: untraced (`memprof: None`), or under
/// `memprof run <these options> -o FILE -- <workload>`.
struct Way {
    name: &'static str,
    memprof: Option<&'static [&'static str]>,
}

/// Ways for the malloc/free loop: the bare probe cost at +0 and placed,
/// memprof with each unwinder, and memprof without probe placement.
const MALLOC_WAYS: &[Way] = &[
    Way {
        name: "untraced",
        memprof: None,
    },
    Way {
        name: "empty probes at +0",
        memprof: Some(&["--empty-probes", "--probe-at-entry"]),
    },
    Way {
        name: "empty probes, placed",
        memprof: Some(&["--empty-probes"]),
    },
    Way {
        name: "memprof (dwarf)",
        memprof: Some(&[]),
    },
    Way {
        name: "memprof --unwind fp",
        memprof: Some(&["--unwind", "fp"]),
    },
    Way {
        name: "memprof --probe-at-entry",
        memprof: Some(&["--probe-at-entry"]),
    },
];

/// Ways for the Crystal (GC-heavy) workload.
const GC_WAYS: &[Way] = &[
    Way {
        name: "untraced",
        memprof: None,
    },
    Way {
        name: "empty probes, placed",
        memprof: Some(&["--empty-probes"]),
    },
    Way {
        name: "memprof (dwarf)",
        memprof: Some(&[]),
    },
    Way {
        name: "memprof --probe-at-entry",
        memprof: Some(&["--probe-at-entry"]),
    },
];

/// Ways for the GC collection loop: what the mark-bit pass adds to a
/// collection (the collector is held while memprof reads the marks).
const COLLECTION_WAYS: &[Way] = &[
    Way {
        name: "untraced",
        memprof: None,
    },
    Way {
        name: "memprof --gc-liveness reuse",
        memprof: Some(&["--heap", "gc", "--gc-liveness", "reuse"]),
    },
    Way {
        name: "memprof (mark bits)",
        memprof: Some(&["--heap", "gc"]),
    },
];

/// Objects the collection-loop workloads keep live, and collections timed.
const COLLECTION_LOOPS: &[(u64, u64)] = &[(100_000, 10), (1_000_000, 5)];

/// A program to time, and how many operations (of what kind) one run does.
struct Workload {
    command: Vec<OsString>,
    ways: &'static [Way],
    ops: u64,
    op: &'static str,
    clock: Clock,
}

/// Where a workload's time comes from.
#[derive(Clone, Copy)]
enum Clock {
    /// The `loop_ns=<n>` line the workload prints on stdout (required).
    LoopNs,
    /// Untraced: the wall-clock time of the command. Traced: the target's
    /// run time recorded in the profile (`duration_s`), so memprof's own
    /// start-up and probe teardown are not counted.
    Wall,
}

fn workloads() -> Result<Vec<Workload>> {
    let out_dir = target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let bench_loop = fixtures::compile(&fixtures_src().join("bench_loop.c"), &out_dir)
        .map_err(anyhow::Error::msg)?;
    let collect_loop = fixtures::compile(&fixtures_src().join("gc_collect_loop.c"), &out_dir)
        .map_err(anyhow::Error::msg)?;
    let pairs = 1_000_000;
    // crystal-samples' binary-trees, as shipped: GC-heavy, deep recursion.
    let binary_trees = out_dir.join("binary-trees");
    if !binary_trees.exists() {
        println!("bench: compiling binary-trees.cr (crystal build --release)");
        crate::run(
            Command::new("crystal")
                .args(["build", "--release", "-o"])
                .arg(&binary_trees)
                .arg("/usr/share/doc/crystal/examples/binary-trees.cr"),
        )?;
    }
    let mut workloads = vec![
        Workload {
            command: vec![bench_loop.into(), pairs.to_string().into()],
            ways: MALLOC_WAYS,
            ops: pairs,
            op: "malloc/free pair",
            clock: Clock::LoopNs,
        },
        Workload {
            command: vec![binary_trees.into(), "10".into()],
            ways: GC_WAYS,
            // GC allocations of one run at depth 10 (memprof's own count).
            ops: BINARY_TREES_10_ALLOCS,
            op: "GC allocation",
            clock: Clock::Wall,
        },
    ];
    for &(objects, collections) in COLLECTION_LOOPS {
        workloads.push(Workload {
            command: vec![
                collect_loop.clone().into(),
                objects.to_string().into(),
                collections.to_string().into(),
            ],
            ways: COLLECTION_WAYS,
            ops: collections,
            op: "collection",
            clock: Clock::LoopNs,
        });
    }
    Ok(workloads)
}

pub fn bench() -> Result<()> {
    setup()?;
    let memprof = build_memprof()?;
    let profile = target_dir().join("bench/bench.mprof");
    for workload in workloads()? {
        let per_op = format!("µs per {}", workload.op);
        println!(
            "\nbench: {} ({} × {}), median of {REPETITIONS} runs",
            name(&workload),
            thousands(workload.ops),
            workload.op
        );
        println!(
            "| {:<26} | {:>10} | {per_op:>24} | {:>11} |",
            "way", "time ms", "vs untraced"
        );
        println!("|{:-<28}|{:-<12}|{:-<26}|{:-<13}|", "", "", "", "");
        let mut baseline = None;
        let mut times = Vec::new();
        for way in workload.ways {
            let mut command = match way.memprof {
                None => Command::new(&workload.command[0]),
                Some(options) => {
                    let mut command = Command::new(&memprof);
                    command
                        .arg("run")
                        .args(options)
                        .arg("-o")
                        .arg(&profile)
                        .arg("--")
                        .arg(&workload.command[0]);
                    command
                }
            };
            command.args(&workload.command[1..]);
            let traced = way.memprof.map(|_| (memprof.as_path(), profile.as_path()));
            let time = median_time(&mut command, workload.clock, traced)?.as_secs_f64();
            times.push(time);
            let baseline = *baseline.get_or_insert(time);
            println!(
                "| {:<26} | {:>10.1} | {:>24.3} | {:>9.1} × |",
                way.name,
                time * 1e3,
                time * 1e6 / workload.ops as f64,
                time / baseline
            );
        }
        if workload.op == "collection" {
            // The pass: marks minus probes alone, per collection, per 100k tracked objects.
            let objects: f64 = workload.command[1].to_string_lossy().parse()?;
            let pause = (times[2] - times[1]) / workload.ops as f64;
            println!(
                "mark-bit pass: {:.1} ms added to each collection with {} objects tracked = {:.2} ms per 100,000 tracked objects",
                pause * 1e3,
                thousands(objects as u64),
                pause * 1e3 * 100_000.0 / objects
            );
        }
    }
    Ok(())
}

/// The workload's command line, with the program's file name only.
fn name(workload: &Workload) -> String {
    let program = Path::new(&workload.command[0])
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let args = workload.command[1..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned());
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Runs `command` [`REPETITIONS`] times; returns the median time.
/// `traced` is (memprof, profile) when the command is `memprof run`.
fn median_time(
    command: &mut Command,
    clock: Clock,
    traced: Option<(&Path, &Path)>,
) -> Result<Duration> {
    let mut times = (0..REPETITIONS)
        .map(|_| time_once(command, clock, traced))
        .collect::<Result<Vec<_>>>()?;
    times.sort();
    Ok(times[times.len() / 2])
}

/// One timed run; fails unless the command exits 0.
fn time_once(
    command: &mut Command,
    clock: Clock,
    traced: Option<(&Path, &Path)>,
) -> Result<Duration> {
    let start = Instant::now();
    let out = output(command)?;
    let wall = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{} failed ({})\n{stdout}{}",
        show(command),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if let Clock::Wall = clock {
        return match traced {
            None => Ok(wall),
            Some((memprof, profile)) => profile_duration(memprof, profile),
        };
    }
    let Some(ns) = stdout
        .lines()
        .find_map(|line| line.strip_prefix("loop_ns="))
    else {
        bail!("{} printed no loop_ns= line:\n{stdout}", show(command));
    };
    let ns = ns
        .trim()
        .parse()
        .with_context(|| format!("{}: bad loop_ns line {ns:?}", show(command)))?;
    Ok(Duration::from_nanos(ns))
}

/// The target's run time as the profile recorded it.
fn profile_duration(memprof: &Path, profile: &Path) -> Result<Duration> {
    let out = output(
        Command::new(memprof)
            .arg("report")
            .arg(profile)
            .args(["--format", "json"]),
    )?;
    ensure!(
        out.status.success(),
        "memprof report {} failed",
        profile.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let seconds = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"duration_s\":"))
        .and_then(|v| v.trim().trim_end_matches(',').parse::<f64>().ok())
        .with_context(|| format!("no duration_s in the report of {}", profile.display()))?;
    Ok(Duration::from_secs_f64(seconds))
}
