//! `cargo xtask bench`: what memprof costs a program, in one invocation.
//!
//! - Per operation: each workload (a malloc/free loop, crystal-samples'
//!   binary-trees 12, GC collection loops) every [`Way`] (untraced, empty
//!   probes, memprof exact, sampled, …), [`REPETITIONS`] times each; the
//!   medians as time per operation, against untraced and against the floor
//!   ([`FLOOR`]: empty probes at the same places), measured in the same run.
//! - End to end: binary-trees 15 under `memprof run` with defaults: wall,
//!   allocations lost, memprof's peak RSS, profile size, longest pause.
//! - Fixed cost: `memprof run -- /bin/true`.
//! - `memprof agent`'s bounds: idle CPU, scrapes with 500 processes
//!   followed, RSS under process churn ([`agent`]).
//! - What `memprof agent` costs everyday programs: gcc, python3, git,
//!   crystal, sort, a malloc loop, cargo and http_server, each untraced
//!   and under the agent ([`agent_cost`]).
//!
//! With `--baseline OLD_MEMPROF`, every traced way runs with that binary
//! too, in the same invocation (rows marked "(baseline)"): a change is
//! judged against the build before it on the same machine, same minute.
//!
//! ```text
//! bench: bench_loop 1000000 (1,000,000 × malloc/free pair), median of 3 runs
//! | way                          |    time ms |  µs per malloc/free pair | vs untraced |  vs floor |
//! |------------------------------|------------|--------------------------|-------------|-----------|
//! | untraced                     |        6.1 |                    0.006 |       1.0 × |    0.00 × |
//! ```
//!
//! A workload is timed by its own `loop_ns=<n>` line on stdout (so start-up
//! and probe attachment are not counted) or by the wall clock ([`Clock`]).
//! Add rows to the `*_WAYS` lists and entries to [`workloads`]. Nothing
//! here asserts a time: the figures are for people to compare.

mod agent;
mod agent_cost;

use crate::{build_memprof, fixtures, fixtures_src, output, setup::setup, show, target_dir};
use anyhow::{bail, ensure, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const REPETITIONS: usize = 3;

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
    Way {
        name: "memprof --sample-bytes 512K",
        memprof: Some(&["--sample-bytes", "524288"]),
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
    Way {
        name: "memprof --sample-bytes 512K",
        memprof: Some(&["--sample-bytes", "524288"]),
    },
    Way {
        name: "memprof --gc-sampling refill",
        memprof: Some(&["--gc-sampling", "refill"]),
    },
];

/// The way whose time is the floor the others are compared with: the
/// bare cost of the probes, at the same places.
const FLOOR: &str = "empty probes, placed";

/// Ways for the GC collection loop: what the mark-bit pass adds to a
/// collection (the collector is held while memprof reads the marks).
const COLLECTION_WAYS: &[Way] = &[
    Way {
        name: "untraced",
        memprof: None,
    },
    Way {
        name: "memprof, reuse only",
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
    /// Operations one run does; `None`: the allocations the exact run
    /// (`memprof (dwarf)`) counted.
    ops: Option<u64>,
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
            ops: Some(pairs),
            op: "malloc/free pair",
            clock: Clock::LoopNs,
        },
        Workload {
            command: vec![binary_trees.into(), "12".into()],
            ways: GC_WAYS,
            ops: None,
            op: "allocation",
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
            ops: Some(collections),
            op: "collection",
            clock: Clock::LoopNs,
        });
    }
    Ok(workloads)
}

/// A memprof binary the traced ways run with, and what its rows are
/// marked with ("" for this build).
struct Binary {
    path: PathBuf,
    mark: &'static str,
}

pub fn bench(
    baseline: Option<PathBuf>,
    agent_only: bool,
    http_only: bool,
    agent_cost: bool,
) -> Result<()> {
    setup()?;
    let mut binaries = vec![Binary {
        path: build_memprof()?,
        mark: "",
    }];
    if let Some(path) = baseline {
        ensure!(
            path.is_file(),
            "--baseline {}: no such file",
            path.display()
        );
        binaries.push(Binary {
            path,
            mark: " (baseline)",
        });
    }
    if agent_only {
        workloads()?; // binary-trees, which the churn starts
        return agent::agent_bounds(&binaries);
    }
    if agent_cost {
        return agent_cost::agent_cost(&binaries);
    }
    let profile = target_dir().join("bench/bench.mprof");
    if http_only {
        return http_throughput(&binaries, &profile);
    }
    let workloads = workloads()?;
    for workload in &workloads {
        per_operation(workload, &binaries, &profile)?;
    }
    let binary_trees = target_dir().join("bench/binary-trees");
    end_to_end(&binaries, &binary_trees, "15", &profile)?;
    http_throughput(&binaries, &profile)?;
    fixed_cost(&binaries, &profile)?;
    agent_cost::agent_cost(&binaries)?;
    agent::agent_bounds(&binaries)?;
    Ok(())
}

/// Seconds of each `wrk` run. On these 2-core virtual machines one run
/// of `wrk` varies by ±8 % from the next, untraced alike, whether it
/// lasts 2 s or 8 s and whether the server and `wrk` are pinned to cores
/// (the host's noise, not the run's length), so: every traced run stands
/// between two untraced ones and is compared with their mean; each round
/// runs the ways in another order (no way is always the one after a start
/// or a stop); and the median of many such ratios counts, with the 95 %
/// interval of that median (order statistics), not one run of each.
const WRK_SECONDS: u32 = 4;
/// Rounds of `memprof agent`, the issue's bound: the median of 40 ratios
/// is good to about ±1.5 % here...
const AGENT_ROUNDS: usize = 40;
/// ...and of each `attach` row, kept for comparison.
const ATTACH_ROUNDS: usize = 10;

/// A traced run of `wrk`: its requests/s, its ratio to the mean of the
/// untraced runs either side of it, and memprof's CPU meanwhile (% of a
/// core).
type Run = (f64, f64, f64);

/// One way memprof runs beside the server: its row's name, its arguments.
struct WrkWay {
    name: String,
    memprof: PathBuf,
    args: Vec<String>,
    /// `attach`'s: written to the bench's profile; `None`: the agent.
    writes: bool,
    ready: &'static str,
    rounds: usize,
}

/// crystal-samples' http_server (port 8080) under `wrk` on 127.0.0.1:
/// requests per second untraced, while `memprof attach` profiles it with
/// `--gc-sampling refill`, while `memprof attach --all` profiles the
/// whole machine (its defaults: the cost to a program nobody asked about),
/// and while `memprof agent` runs with its defaults (GC included, `wrk`
/// started once the server's own session is up), memprof's own start and
/// end excluded.
fn http_throughput(binaries: &[Binary], profile: &Path) -> Result<()> {
    let server = http_server()?;
    let mut child = Command::new(&server)
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", server.display()))?;
    let pid = child.id();
    let socket = profile.with_extension("sock");
    let mut ways = Vec::new();
    for b in binaries {
        let attach = format!("attach --pid {pid} --gc-sampling refill --census off");
        ways.push(WrkWay {
            name: format!("memprof attach --gc-sampling refill{}", b.mark),
            memprof: b.path.clone(),
            args: attach.split(' ').map(String::from).collect(),
            writes: true,
            ready: "attached to pid",
            rounds: ATTACH_ROUNDS,
        });
        ways.push(WrkWay {
            name: format!("memprof attach --all (the machine){}", b.mark),
            memprof: b.path.clone(),
            args: vec!["attach".into(), "--all".into()],
            writes: true,
            ready: "profiling every process",
            rounds: ATTACH_ROUNDS,
        });
        ways.push(WrkWay {
            name: format!("memprof agent (defaults, GC included){}", b.mark),
            memprof: b.path.clone(),
            args: vec![
                "agent".into(),
                "--socket".into(),
                socket.display().to_string(),
            ],
            writes: false,
            ready: "serving on",
            rounds: AGENT_ROUNDS,
        });
    }
    let total: usize = ways.iter().map(|w| w.rounds).sum();
    println!(
        "bench: http_server under wrk: {total} traced runs, each between two untraced ones (~{} min)",
        total * (2 * WRK_SECONDS as usize + 5) / 60
    );
    let result = (|| -> Result<(Vec<f64>, Vec<Vec<Run>>)> {
        wait_for_port(8080)?;
        let mut untraced = vec![wrk()?];
        let mut runs = vec![Vec::new(); ways.len()];
        let most = ways.iter().map(|w| w.rounds).max().unwrap_or(0);
        for round in 0..most {
            let active: Vec<usize> = (0..ways.len())
                .filter(|&i| ways[i].rounds > round)
                .collect();
            for k in 0..active.len() {
                let i = active[(round + k) % active.len()];
                let (traced, cpu) = wrk_while(&ways[i], pid, profile, &socket)?;
                let before = *untraced.last().expect("one untraced run");
                let after = wrk()?;
                untraced.push(after);
                runs[i].push((traced, traced / ((before + after) / 2.0), cpu));
            }
        }
        Ok((untraced, runs))
    })();
    let _ = child.kill();
    let _ = child.wait();
    let (untraced, runs) = result?;
    println!(
        "\nbench: crystal-samples' http_server under wrk -t2 -c20 -d{WRK_SECONDS}s on 127.0.0.1; each traced run against the untraced runs either side of it ({} untraced runs)",
        untraced.len()
    );
    println!("| way                                            | runs | requests/s (median) | vs untraced: median of runs (95 % interval of the median) | memprof's CPU (% of a core) |");
    println!("|------------------------------------------------|-----:|--------------------:|-----------------------------------------------------------:|----------------------------:|");
    println!(
        "| untraced                                       | {:>4} | {:>19.0} | {:>58} | {:>27} |",
        untraced.len(),
        median(untraced),
        "100.0 %",
        "–"
    );
    for (way, runs) in ways.iter().zip(runs) {
        let traced = median(runs.iter().map(|r| r.0).collect());
        let ratios: Vec<f64> = runs.iter().map(|r| r.1).collect();
        let (low, high) = median_interval(ratios.clone());
        let cpu = median(runs.iter().map(|r| r.2).collect());
        println!(
            "| {:<46} | {:>4} | {traced:>19.0} | {:>58} | {cpu:>27.1} |",
            way.name,
            runs.len(),
            format!(
                "{:.1} % ({:.1}–{:.1} %)",
                median(ratios) * 100.0,
                low * 100.0,
                high * 100.0
            ),
        );
    }
    Ok(())
}

/// crystal-samples' http_server, built `--release` into target/bench once.
fn http_server() -> Result<PathBuf> {
    let server = target_dir().join("bench/http_server");
    if !server.exists() {
        println!("bench: compiling http_server.cr (crystal build --release)");
        crate::run(
            Command::new("crystal")
                .args(["build", "--release", "-o"])
                .arg(&server)
                .arg("/usr/share/doc/crystal/examples/http_server.cr"),
        )?;
    }
    Ok(server)
}

/// The 95 % interval of the median of `values`, by order statistics
/// (the ranks n/2 ∓ 0.98·√n: no assumption on the runs' distribution).
fn median_interval(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len() as f64;
    let half = 0.98 * n.sqrt();
    let low = ((n / 2.0 - half).floor().max(1.0) as usize) - 1;
    let high = ((n / 2.0 + half).ceil() as usize).min(values.len() - 1);
    (values[low], values[high])
}

/// The requests/s of one run of `wrk` while memprof runs `way` (from
/// when it is ready until it is stopped with SIGINT), and memprof's CPU
/// during that run (% of a core).
fn wrk_while(way: &WrkWay, server: u32, profile: &Path, socket: &Path) -> Result<(f64, f64)> {
    let mut command = Command::new(&way.memprof);
    command.args(&way.args);
    if way.writes {
        command.arg("-o").arg(profile);
    }
    let mut session = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut started = wait_for_line(session.stderr.take().context("no stderr")?, way.ready);
    // The agent: the server's own session is attached meanwhile (found
    // in /proc, then ~0.5 s); wrk starts once it is up.
    if !way.writes && started.is_ok() {
        started = agent::wait_for_session(socket, server);
    }
    let traced = started.and_then(|_| {
        let before = cpu_ticks(session.id())?;
        let started = Instant::now();
        let rate = wrk()?;
        let ticks = cpu_ticks(session.id())? - before;
        Ok((
            rate,
            ticks as f64 / ticks_per_s() / started.elapsed().as_secs_f64() * 100.0,
        ))
    });
    send_signal(session.id(), 2); // SIGINT: memprof ends its session
    let status = session.wait()?;
    ensure!(
        status.success(),
        "memprof {} failed ({status})",
        way.args.join(" ")
    );
    traced
}

/// Process `pid`'s CPU time so far, in clock ticks (user and system).
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's closing parenthesis: fields 3 on.
    let rest = stat.rsplit_once(')').context("bad stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// Clock ticks a second (`/proc/PID/stat`'s unit).
pub(crate) fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// The requests/s of one run of `wrk` against port 8080.
fn wrk() -> Result<f64> {
    let out = output(
        Command::new("wrk")
            .args(["-t2", "-c20", &format!("-d{WRK_SECONDS}s")])
            .arg("http://127.0.0.1:8080/"),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("wrk printed no Requests/sec:\n{text}"))
}

/// Waits (at most 10 s) until something listens on 127.0.0.1:`port`.
fn wait_for_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        ensure!(
            Instant::now() < deadline,
            "nothing listens on port {port} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Reads `pipe` until a line contains `needle` (at most 60 s), then keeps
/// draining it in the background.
fn wait_for_line(pipe: impl std::io::Read + Send + 'static, needle: &str) -> Result<()> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_string();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            if line.contains(&needle) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .context("memprof attach did not say it attached within 60 s")
}

/// Sends `signal` to process `pid` (`kill`, to need no libc crate).
fn send_signal(pid: u32, signal: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// Times `workload` every way; prints a table with each way's time per
/// operation, against untraced and against the empty-probe floor.
fn per_operation(workload: &Workload, binaries: &[Binary], profile: &Path) -> Result<()> {
    let mut rows: Vec<(String, f64)> = Vec::new();
    let mut ops = workload.ops;
    // This build's rows first (the floor and the collection pass read
    // them by position), then the baseline's traced ways.
    for (b, binary) in binaries.iter().enumerate() {
        for way in workload.ways {
            let memprof = &binary.path;
            let mut command = match way.memprof {
                None if b > 0 => continue,
                None => Command::new(&workload.command[0]),
                Some(options) => {
                    let mut command = Command::new(memprof);
                    command
                        .arg("run")
                        .args(options)
                        .arg("-o")
                        .arg(profile)
                        .arg("--")
                        .arg(&workload.command[0]);
                    command
                }
            };
            command.args(&workload.command[1..]);
            let traced = way.memprof.map(|_| (memprof.as_path(), profile));
            let time = median_time(&mut command, workload.clock, traced)?.as_secs_f64();
            if ops.is_none() && way.name == "memprof (dwarf)" {
                ops = Some(
                    report_json(memprof, profile)?["counters"]["allocs"]
                        .as_u64()
                        .unwrap_or(0),
                );
            }
            let mark = if way.memprof.is_some() {
                binary.mark
            } else {
                ""
            };
            rows.push((format!("{}{mark}", way.name), time));
        }
    }
    let ops = ops.context("no exact run counted the operations")?.max(1);
    let per_op = format!("µs per {}", workload.op);
    println!(
        "\nbench: {} ({} × {}), median of {REPETITIONS} runs",
        name(workload),
        thousands(ops),
        workload.op
    );
    println!(
        "| {:<39} | {:>10} | {per_op:>24} | {:>11} | {:>9} |",
        "way", "time ms", "vs untraced", "vs floor"
    );
    println!(
        "|{:-<41}|{:-<12}|{:-<26}|{:-<13}|{:-<11}|",
        "", "", "", "", ""
    );
    let untraced = rows[0].1;
    let floor = rows.iter().find(|(name, _)| name == FLOOR).map(|r| r.1);
    for (name, time) in &rows {
        let time = *time;
        let vs_floor = floor.map_or("".to_string(), |f| format!("{:.2} ×", time / f));
        println!(
            "| {:<39} | {:>10.1} | {:>24.3} | {:>9.1} × | {:>9} |",
            name,
            time * 1e3,
            time * 1e6 / ops as f64,
            time / untraced,
            vs_floor
        );
    }
    if workload.op == "collection" {
        // The pass: marks minus probes alone, per collection, per 100k tracked objects.
        let objects: f64 = workload.command[1].to_string_lossy().parse()?;
        let pause = (rows[2].1 - rows[1].1) / ops as f64;
        println!(
            "mark-bit pass: {:.1} ms added to each collection with {} objects tracked = {:.2} ms per 100,000 tracked objects",
            pause * 1e3,
            thousands(objects as u64),
            pause * 1e3 * 100_000.0 / objects
        );
    }
    Ok(())
}

/// A real program end to end under `memprof run` with defaults: wall
/// time, allocations lost, memprof's peak memory, the profile's size and
/// the longest mark-bit pass (the pause memprof added to one collection).
fn end_to_end(binaries: &[Binary], program: &Path, arg: &str, profile: &Path) -> Result<()> {
    let (untraced, _) = run_measured(Command::new(program).arg(arg))?;
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    println!("\nbench: {name} {arg} end to end under `memprof run` (defaults), one run");
    println!("| memprof | untraced s | memprof s | allocations | lost | memprof peak RSS MB | profile MB | longest pause ms |");
    println!("|---------|-----------:|----------:|------------:|-----:|--------------------:|-----------:|-----------------:|");
    for binary in binaries {
        end_to_end_row(binary, untraced, program, arg, profile)?;
    }
    Ok(())
}

/// One row of [`end_to_end`]: `program arg` under `binary`.
fn end_to_end_row(
    binary: &Binary,
    untraced: Duration,
    program: &Path,
    arg: &str,
    profile: &Path,
) -> Result<()> {
    let memprof = &binary.path;
    let (wall, peak_kib) = run_measured(
        Command::new(memprof)
            .arg("run")
            .arg("-o")
            .arg(profile)
            .arg("--")
            .arg(program)
            .arg(arg),
    )?;
    let report = report_json(memprof, profile)?;
    let c = &report["counters"];
    let field = |name: &str| c[name].as_u64().unwrap_or(0);
    let lost = [
        "live_map_full",
        "sites_map_full",
        "both_maps_full",
        "pending_full",
        "stale_calls",
    ]
    .iter()
    .map(|n| field(n))
    .sum::<u64>();
    let size = std::fs::metadata(profile)?.len();
    let pause = report["gc"]["longest_pass_seconds"].as_f64().unwrap_or(0.0);
    println!(
        "| {:<7} | {:>10.2} | {:>9.2} | {:>11} | {:>4} | {:>19.1} | {:>10.1} | {:>16.1} |",
        if binary.mark.is_empty() {
            "this"
        } else {
            "baseline"
        },
        untraced.as_secs_f64(),
        wall.as_secs_f64(),
        thousands(field("allocs")),
        thousands(lost),
        peak_kib as f64 / 1024.0,
        size as f64 / 1e6,
        pause * 1e3
    );
    Ok(())
}

/// What memprof costs before and after any allocation: `run -- /bin/true`
/// (load, attach, detach, write), wall clock, median of [`REPETITIONS`].
fn fixed_cost(binaries: &[Binary], profile: &Path) -> Result<()> {
    let mut untraced = Vec::new();
    let mut traced = vec![Vec::new(); binaries.len()];
    // Alternating, so that a slower minute of the machine is shared.
    for _ in 0..REPETITIONS {
        untraced.push(run_measured(&mut Command::new("/bin/true"))?.0);
        for (binary, times) in binaries.iter().zip(&mut traced) {
            let (wall, _) = run_measured(
                Command::new(&binary.path)
                    .arg("run")
                    .arg("-o")
                    .arg(profile)
                    .args(["--", "/bin/true"]),
            )?;
            times.push(wall);
        }
    }
    untraced.sort();
    println!("\nbench: fixed cost, median of {REPETITIONS} runs");
    println!("| way | wall ms |");
    println!("|-----|--------:|");
    println!(
        "| /bin/true | {:.1} |",
        untraced[REPETITIONS / 2].as_secs_f64() * 1e3
    );
    for (binary, mut times) in binaries.iter().zip(traced) {
        times.sort();
        println!(
            "| memprof run -- /bin/true{} | {:.1} |",
            binary.mark,
            times[REPETITIONS / 2].as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Runs `command` (output discarded) to its end; returns its wall time
/// and peak resident memory in KiB (`wait4`'s `ru_maxrss`). Fails unless
/// it exits 0.
fn run_measured(command: &mut Command) -> Result<(Duration, u64)> {
    use std::process::Stdio;
    let start = Instant::now();
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", show(command)))?;
    let mut status = 0;
    // SAFETY: plain out-parameters; the child is ours and not waited elsewhere.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    ensure!(
        r == pid,
        "waiting for {}: {}",
        show(command),
        std::io::Error::last_os_error()
    );
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} failed (wait status {status:#x})",
        show(command)
    );
    Ok((wall, usage.ru_maxrss as u64))
}

/// `memprof report FILE --format json`, parsed.
fn report_json(memprof: &Path, profile: &Path) -> Result<serde_json::Value> {
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
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("the JSON report of {} does not parse", profile.display()))
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
pub(crate) fn thousands(n: u64) -> String {
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
    let seconds = report_json(memprof, profile)?["duration_s"]
        .as_f64()
        .with_context(|| format!("no duration_s in the report of {}", profile.display()))?;
    Ok(Duration::from_secs_f64(seconds))
}

/// The median of `values` (the middle one; `values` is not empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
