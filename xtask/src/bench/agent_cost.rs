//! What `memprof agent`, left on with its defaults, costs everyday
//! programs ([`workloads`]): each one a whole command, timed by the wall
//! clock, with no agent and under one, [`ROUNDS`] rounds of [`REPEATS`]
//! runs each; the medians and their ratio. (Untraced runs of one command
//! vary by up to 20 % on these 2-core machines: 3 runs' median moved a
//! ratio by 0.2.) crystal-samples' http_server under `wrk` gives
//! requests/s instead, and the ratio is the share of them left.
//!
//! Untraced means no agent at all, not a stopped one: its probes live in
//! the kernel and fire whether its process runs or is stopped (SIGSTOP),
//! so each round starts an agent for the traced runs and stops it
//! (SIGTERM) before the untraced ones. A start per run would time every
//! run in the agent's first seconds; instead a round runs every workload
//! one way, then every one the other, and the next round starts with the
//! other way (`--baseline`'s agent takes its turn too), so no way always
//! comes first and a machine getting busier or quieter weighs on both.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use super::agent::{wait_for_session, Agent};
use super::{
    http_server, median, run_measured, thousands, wait_for_port, wrk, Binary, WRK_SECONDS,
};
use crate::{root, target_dir};

const ROUNDS: usize = 5;
/// Runs of a timed workload in a row, each round, each way (`wrk`: two).
const REPEATS: usize = 3;
/// After "serving on", the agent's first seconds are its start's work
/// (every running process read, its files parsed): the table is about an
/// agent left on, so the traced runs wait this long (as `agent_bounds`).
const SETTLE: Duration = Duration::from_secs(5);

/// One program of the table: its row's name and how it runs.
struct Workload {
    name: String,
    run: Run,
}

enum Run {
    /// A whole command, its output discarded, timed by the wall clock;
    /// `touch`: a file set to now first, untimed (so cargo rebuilds).
    Timed {
        command: Command,
        touch: Option<PathBuf>,
    },
    /// This http_server, started for the run, under `wrk`: requests/s.
    Wrk(PathBuf),
}

impl Workload {
    /// One run: seconds, or requests/s. `agent`: the socket of the agent
    /// it runs under.
    fn measure(&mut self, agent: Option<&Path>) -> Result<f64> {
        match &mut self.run {
            Run::Timed { command, touch } => {
                if let Some(file) = touch {
                    std::fs::File::options()
                        .write(true)
                        .open(&*file)?
                        .set_modified(SystemTime::now())?;
                }
                Ok(run_measured(command)?.0.as_secs_f64())
            }
            Run::Wrk(server) => requests_per_s(server, agent),
        }
    }
}

/// The table: every workload untraced and under each binary's agent.
pub(super) fn agent_cost(binaries: &[Binary]) -> Result<()> {
    let mut workloads = workloads()?;
    // Caches warm, and a workload that fails fails before any agent starts.
    println!("bench: agent cost: a first, untimed run of each workload");
    for workload in &mut workloads {
        workload.measure(None)?;
    }
    // None: untraced; Some: under that binary's agent.
    let ways: Vec<Option<&Binary>> = std::iter::once(None)
        .chain(binaries.iter().map(Some))
        .collect();
    let mut runs = vec![vec![Vec::new(); ways.len()]; workloads.len()];
    // The agent's own CPU seconds per run, by way.
    let mut agent_cpu: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); ways.len()]; workloads.len()];
    for round in 0..ROUNDS {
        for k in 0..ways.len() {
            let way = (round + k) % ways.len();
            println!(
                "bench: agent cost: round {}/{ROUNDS}, {}",
                round + 1,
                ways[way].map_or("untraced".to_string(), |b| format!(
                    "under memprof agent{}",
                    b.mark
                ))
            );
            let agent = ways[way].map(|b| Agent::start(&b.path)).transpose()?;
            if agent.is_some() {
                std::thread::sleep(SETTLE);
            }
            for ((workload, runs), cpu) in workloads.iter_mut().zip(&mut runs).zip(&mut agent_cpu) {
                let socket = agent.as_ref().map(|a| a.socket.as_path());
                let before = agent.as_ref().map(|a| a.cpu_ticks()).transpose()?;
                let repeats = match workload.run {
                    Run::Timed { .. } => REPEATS,
                    Run::Wrk(_) => 2,
                };
                for _ in 0..repeats {
                    runs[way].push(workload.measure(socket)?);
                }
                // What the agent does after a workload (the processes
                // that ended named, a Boehm GC program's session let go)
                // is that workload's: waited for, and counted in its
                // agent CPU, not left to slow the next one.
                if let (Some(agent), Some(before)) = (&agent, before) {
                    settle(agent)?;
                    cpu[way].push(
                        (agent.cpu_ticks()? - before) as f64
                            / super::ticks_per_s()
                            / repeats as f64,
                    );
                }
            }
        }
    }
    println!(
        "\nbench: what memprof agent (defaults) costs everyday programs: each whole command by the wall clock, median of {ROUNDS} rounds of {REPEATS} runs (wrk: 2), untraced (no agent) and under the agent in turn; the agent's CPU per run"
    );
    println!("| workload                                          |      untraced | under the agent |    ratio | the agent's CPU |");
    println!("|---------------------------------------------------|--------------:|----------------:|---------:|----------------:|");
    for ((workload, runs), cpu) in workloads.iter().zip(runs).zip(agent_cpu) {
        let untraced = median(runs[0].clone());
        for ((binary, traced), cpu) in binaries.iter().zip(&runs[1..]).zip(&cpu[1..]) {
            let traced = median(traced.clone());
            let cpu = format!("{:.2} s", median(cpu.clone()));
            let name = format!("{}{}", workload.name, binary.mark);
            let (untraced, traced, ratio) = match workload.run {
                Run::Timed { .. } => (
                    format!("{untraced:.3} s"),
                    format!("{traced:.3} s"),
                    format!("{:.2} ×", traced / untraced),
                ),
                Run::Wrk(_) => (
                    format!("{} req/s", thousands(untraced as u64)),
                    format!("{} req/s", thousands(traced as u64)),
                    format!("{:.1} %", traced / untraced * 100.0),
                ),
            };
            println!("| {name:<49} | {untraced:>13} | {traced:>15} | {ratio:>8} | {cpu:>15} |");
        }
    }
    Ok(())
}

/// Waits until `agent` is quiet (under 2 % of a core over a quarter of a
/// second), at most 10 s.
fn settle(agent: &Agent) -> Result<()> {
    let quarter = Duration::from_millis(250);
    let quiet = (super::ticks_per_s() * 0.25 * 0.02).ceil() as u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let before = agent.cpu_ticks()?;
        std::thread::sleep(quarter);
        if agent.cpu_ticks()? - before <= quiet {
            break;
        }
    }
    Ok(())
}

/// One run of `wrk` against a fresh http_server, in requests/s; under the
/// agent on `socket`, once the server's own session is up.
fn requests_per_s(server: &Path, socket: Option<&Path>) -> Result<f64> {
    let mut child = Command::new(server)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", server.display()))?;
    let rate = wait_for_port(8080)
        .and_then(|_| socket.map_or(Ok(()), |s| wait_for_session(s, child.id())))
        .and_then(|_| wrk());
    let _ = child.kill();
    let _ = child.wait();
    rate
}

/// The programs, their inputs written into target/bench/agent-cost (the
/// same bytes every time) and what they need built, built.
fn workloads() -> Result<Vec<Workload>> {
    let dir = target_dir().join("bench/agent-cost");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    };

    let c = c_source();
    let c_file = write("functions.c", &c)?;
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-c", "-o"])
        .arg(dir.join("functions.o"))
        .arg(&c_file);

    // Debian's: the python3 first on PATH may be a shim (pyenv's is a
    // shell script, which the table would time too).
    let python = match Path::new("/usr/bin/python3").exists() {
        true => "/usr/bin/python3",
        false => "python3",
    };
    let mut dict = Command::new(python);
    dict.args(["-c", "d = {str(i): i for i in range(300000)}"]);

    let mut git = Command::new("git");
    git.current_dir(root()).args(["log", "-p", "-n", "300"]);

    let small_cr = write("small.cr", CRYSTAL_SOURCE)?;
    let mut crystal = Command::new("crystal");
    crystal
        .args(["build", "--release", "-o"])
        .arg(dir.join("small"))
        .arg(&small_cr)
        .env("CRYSTAL_CACHE_DIR", dir.join("crystal-cache"));
    println!("bench: agent cost: crystal build --release small.cr (the cache warmed, untimed)");
    crate::run(&mut crystal)?;

    let lines = write("lines.txt", &sort_input())?;
    let mut sort = Command::new("sort");
    sort.arg(&lines);

    let malloc_loop = dir.join("bench_loop_O2");
    crate::run(
        Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&malloc_loop)
            .arg(crate::fixtures_src().join("bench_loop.c")),
    )?;
    let mut pairs = Command::new(&malloc_loop);
    pairs.arg("1000000");

    // A syscall each byte: what every syscall pays under the agent.
    let mut dd = Command::new("dd");
    dd.args(["if=/dev/zero", "of=/dev/null", "bs=1", "count=2000000"]);

    let krate = dir.join("tiny-crate");
    std::fs::create_dir_all(krate.join("src"))?;
    // Its own `[workspace]`: not a member of memprof's, which is above it.
    std::fs::write(krate.join("Cargo.toml"), TINY_CRATE_MANIFEST)?;
    let main_rs = krate.join("src/main.rs");
    std::fs::write(&main_rs, TINY_CRATE_MAIN)?;
    let mut cargo = crate::cargo();
    cargo
        .current_dir(&krate)
        .args(["build", "--release", "--offline"])
        .env("CARGO_TARGET_DIR", krate.join("target"));

    Ok(vec![
        Workload {
            name: format!("gcc -O2 -c ({} KB of C)", c.len() / 1000),
            run: Run::Timed {
                command: gcc,
                touch: None,
            },
        },
        Workload {
            name: "python3 -c: a 300,000-entry dict".into(),
            run: Run::Timed {
                command: dict,
                touch: None,
            },
        },
        Workload {
            name: "git log -p -n 300 (this repository)".into(),
            run: Run::Timed {
                command: git,
                touch: None,
            },
        },
        Workload {
            name: "crystal build --release (small, warm cache)".into(),
            run: Run::Timed {
                command: crystal,
                touch: None,
            },
        },
        Workload {
            name: "sort (2,000,000 lines)".into(),
            run: Run::Timed {
                command: sort,
                touch: None,
            },
        },
        Workload {
            name: "1,000,000 malloc(64)/free pairs (gcc -O2)".into(),
            run: Run::Timed {
                command: pairs,
                touch: None,
            },
        },
        Workload {
            name: "dd bs=1 count=2000000 (4,000,000 syscalls)".into(),
            run: Run::Timed {
                command: dd,
                touch: None,
            },
        },
        Workload {
            name: "cargo build --release --offline (tiny crate)".into(),
            run: Run::Timed {
                command: cargo,
                touch: Some(main_rs),
            },
        },
        Workload {
            name: format!("http_server under wrk -t2 -c20 -d{WRK_SECONDS}s"),
            run: Run::Wrk(http_server()?),
        },
    ])
}

/// About 30 KB of C: small functions with structs, loops and branches.
fn c_source() -> String {
    let mut c = String::from(
        "/* The agent-cost bench's gcc workload (generated). */\n#include <stddef.h>\n\n",
    );
    let mut i = 0;
    while c.len() < 30_000 {
        let _ = write!(
            c,
            "struct s{i} {{ int key; double weight; struct s{i} *next; }};\n\n\
             int f{i}(struct s{i} *list, const int *values, size_t n) {{\n\
             \x20   int sum = {i};\n\
             \x20   for (size_t k = 0; k < n; k++) {{\n\
             \x20       sum += values[k] * {} + (int)(k % {});\n\
             \x20       if (sum > {}) sum -= values[k] >> 1;\n\
             \x20   }}\n\
             \x20   for (struct s{i} *p = list; p; p = p->next)\n\
             \x20       sum += p->key + (int)(p->weight * {}.0);\n\
             \x20   return sum;\n\
             }}\n\n",
            i % 7 + 2,
            i % 5 + 3,
            1000 + 37 * i,
            i % 3 + 1,
        );
        i += 1;
    }
    c
}

/// 2,000,000 lines of hexadecimal, from a fixed linear congruential sequence.
fn sort_input() -> String {
    let mut x: u64 = 1;
    let mut text = String::with_capacity(2_000_000 * 11);
    for _ in 0..2_000_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let _ = writeln!(text, "{:010x}", x >> 24);
    }
    text
}

const CRYSTAL_SOURCE: &str = r#"# The agent-cost bench's crystal workload (generated).
class Account
  getter name : String
  getter balance : Int64

  def initialize(@name, @balance)
  end

  def deposit(amount) : Account
    Account.new(@name, @balance + amount)
  end
end

accounts = (1..1000).map { |i| Account.new("account #{i % 97}", i.to_i64) }
totals = Hash(String, Int64).new(0_i64)
accounts.each { |a| totals[a.name] += a.deposit(10).balance }
puts totals.values.sum
"#;

const TINY_CRATE_MANIFEST: &str = r#"[package]
name = "tiny-crate"
version = "0.1.0"
edition = "2021"

[workspace]
"#;

const TINY_CRATE_MAIN: &str = r#"//! The agent-cost bench's cargo workload (generated): no dependencies.
use std::collections::HashMap;

struct Entry {
    word: String,
    count: u64,
}

fn count(text: &str) -> Vec<Entry> {
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word).or_default() += 1;
    }
    let mut entries: Vec<Entry> = counts
        .into_iter()
        .map(|(word, count)| Entry { word: word.to_string(), count })
        .collect();
    entries.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.word.cmp(&b.word)));
    entries
}

fn main() {
    let text = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    for entry in count(&text).iter().take(10) {
        println!("{} {}", entry.word, entry.count);
    }
}
"#;
