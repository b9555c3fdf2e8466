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
//! Add rows to [`WAYS`] and entries to [`workloads`].

use crate::{build_memprof, fixtures, fixtures_src, output, setup::setup, show, target_dir};
use anyhow::{bail, ensure, Context, Result};
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const REPETITIONS: usize = 3;

/// One way to run a workload: untraced (`memprof: None`), or under
/// `memprof run <these options> -o FILE -- <workload>`.
struct Way {
    name: &'static str,
    memprof: Option<&'static [&'static str]>,
}

const WAYS: &[Way] = &[
    Way {
        name: "untraced",
        memprof: None,
    },
    Way {
        name: "memprof --empty-probes",
        memprof: Some(&["--empty-probes"]),
    },
    Way {
        name: "memprof",
        memprof: Some(&[]),
    },
    Way {
        name: "memprof --probe-at-entry",
        memprof: Some(&["--probe-at-entry"]),
    },
];

/// A program to time, and how many operations (of what kind) one run does.
struct Workload {
    command: Vec<OsString>,
    ops: u64,
    op: &'static str,
    clock: Clock,
}

/// Where a workload's time comes from.
#[derive(Clone, Copy)]
enum Clock {
    /// The `loop_ns=<n>` line the workload prints on stdout (required).
    LoopNs,
    /// The wall-clock time of the whole command, memprof's start-up included.
    #[allow(dead_code)] // for workloads that print no timing of their own
    Wall,
}

fn workloads() -> Result<Vec<Workload>> {
    let out_dir = target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let bench_loop = fixtures::compile(&fixtures_src().join("bench_loop.c"), &out_dir)
        .map_err(anyhow::Error::msg)?;
    let pairs = 1_000_000;
    Ok(vec![Workload {
        command: vec![bench_loop.into(), pairs.to_string().into()],
        ops: pairs,
        op: "malloc/free pair",
        clock: Clock::LoopNs,
    }])
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
        for way in WAYS {
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
            let time = median_time(&mut command, workload.clock)?.as_secs_f64();
            let baseline = *baseline.get_or_insert(time);
            println!(
                "| {:<26} | {:>10.1} | {:>24.3} | {:>9.1} × |",
                way.name,
                time * 1e3,
                time * 1e6 / workload.ops as f64,
                time / baseline
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
fn median_time(command: &mut Command, clock: Clock) -> Result<Duration> {
    let mut times = (0..REPETITIONS)
        .map(|_| time_once(command, clock))
        .collect::<Result<Vec<_>>>()?;
    times.sort();
    Ok(times[times.len() / 2])
}

/// One timed run; fails unless the command exits 0.
fn time_once(command: &mut Command, clock: Clock) -> Result<Duration> {
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
        return Ok(wall);
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
