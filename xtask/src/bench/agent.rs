//! `memprof agent`'s bounds (issue: an agent nobody minds leaving on):
//!
//! - **Idle**: its CPU, as a share of one core, over [`IDLE_S`] seconds on
//!   the machine as it is, and its RSS then (the floor of the rows below).
//! - **Scrapes with [`FOLLOWED`] processes**: that many `sleep`s started
//!   and followed, then `/metrics`, `/debug/pprof/heap?comm=sleep` (all of
//!   them merged) and `?pid=` of one, [`SCRAPES`] times each; the median
//!   and the slowest, against the same scrapes with one `sleep` followed.
//! - **Churn**: 200 processes a minute (C tools, a shell pipeline,
//!   crystal-samples' binary-trees 10: a Boehm GC program with its
//!   session) for [`CHURN_S`] seconds (`MEMPROF_BENCH_CHURN_S`: 3600 for
//!   the hour); its RSS every 10 s, and its slope over the
//!   second half (flat: bounded).
//!
//! Requests go over the agent's Unix socket as plain HTTP/1.0 GETs (the
//! bench's client; the agent serves with hyper).
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{median, send_signal, wait_for_line, Binary};
use crate::target_dir;

const IDLE_S: u64 = 30;
const FOLLOWED: usize = 500;
const SCRAPES: usize = 20;
const CHURN_S: u64 = 600;
/// 200 a minute.
const CHURN_EVERY: Duration = Duration::from_millis(300);

/// The agent under measure, stopped (SIGTERM) when dropped.
pub(super) struct Agent {
    child: Child,
    pub(super) socket: PathBuf,
}

impl Agent {
    pub(super) fn start(memprof: &Path) -> Result<Agent> {
        let socket = target_dir().join("bench/agent.sock");
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(memprof)
            .args(["agent", "--socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start memprof agent")?;
        wait_for_line(child.stderr.take().context("no stderr")?, "serving on")?;
        Ok(Agent { child, socket })
    }

    /// utime + stime, in clock ticks.
    pub(super) fn cpu_ticks(&self) -> Result<u64> {
        super::cpu_ticks(self.child.id())
    }

    /// VmRSS, in KiB.
    fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")
    }

    /// The body of `GET path`, and how long it took.
    fn get(&self, path: &str) -> Result<(Vec<u8>, Duration)> {
        get(&self.socket, path)
    }

    /// Running processes of program `comm` the agent lists.
    fn running(&self, comm: &str) -> Result<usize> {
        let (body, _) = self.get("/api/processes")?;
        let rows: serde_json::Value = serde_json::from_slice(&body)?;
        Ok(rows
            .as_array()
            .context("/api/processes: not a list")?
            .iter()
            .filter(|r| r["comm"] == comm && r["running"] == true)
            .count())
    }
}

/// The body of `GET path` from the agent on `socket`, and how long it took.
fn get(socket: &Path, path: &str) -> Result<(Vec<u8>, Duration)> {
    let start = Instant::now();
    let mut stream = UnixStream::connect(socket)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let took = start.elapsed();
    ensure!(
        response.starts_with(b"HTTP/1.0 200") || response.starts_with(b"HTTP/1.1 200"),
        "GET {path}: {}",
        String::from_utf8_lossy(&response[..response.len().min(200)])
    );
    let body = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |at| response[at + 4..].to_vec());
    Ok((body, took))
}

/// Waits (at most 30 s) until the agent on `socket` lists process `pid`
/// with its collections (a Boehm GC program's own session is up), then
/// a second more (its start's last work).
pub(super) fn wait_for_session(socket: &Path, pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (body, _) = get(socket, "/api/processes")?;
        let rows: serde_json::Value = serde_json::from_slice(&body)?;
        let up = rows
            .as_array()
            .context("/api/processes: not a list")?
            .iter()
            .any(|r| r["pid"] == pid && r["collections"].is_u64());
        if up {
            std::thread::sleep(Duration::from_secs(1));
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the agent gave pid {pid} no session of its own within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        send_signal(self.child.id(), 15);
        let _ = self.child.wait();
    }
}

/// The three sections, for each binary.
pub(super) fn agent_bounds(binaries: &[Binary]) -> Result<()> {
    for binary in binaries {
        let agent = Agent::start(&binary.path)?;
        std::thread::sleep(Duration::from_secs(5));
        let (cpu, floor_rss) = idle(&agent)?;
        println!(
            "\nbench: memprof agent{} idle ({IDLE_S} s, defaults, every process): {:.2} % of a core, RSS {:.1} MB",
            binary.mark,
            cpu,
            floor_rss as f64 / 1024.0
        );
        scrapes(&agent, binary.mark)?;
        drop(agent);
        churn(&binary.path, binary.mark, floor_rss)?;
    }
    Ok(())
}

/// Its CPU (% of one core) over [`IDLE_S`], and its RSS then.
fn idle(agent: &Agent) -> Result<(f64, u64)> {
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let before = agent.cpu_ticks()?;
    std::thread::sleep(Duration::from_secs(IDLE_S));
    let ticks = agent.cpu_ticks()? - before;
    Ok((ticks as f64 / hz / IDLE_S as f64 * 100.0, agent.rss_kib()?))
}

/// Median and slowest of [`SCRAPES`] GETs of `path`, in ms.
fn time_scrapes(agent: &Agent, path: &str) -> Result<(f64, f64)> {
    let mut ms = Vec::new();
    for _ in 0..SCRAPES {
        ms.push(agent.get(path)?.1.as_secs_f64() * 1000.0);
    }
    let slowest = ms.iter().cloned().fold(0.0, f64::max);
    Ok((median(ms), slowest))
}

/// The scrapes with one `sleep` followed, then with [`FOLLOWED`].
fn scrapes(agent: &Agent, mark: &str) -> Result<()> {
    let mut sleeps: Vec<Child> = Vec::new();
    let result = (|| -> Result<()> {
        let mut rows = Vec::new();
        for n in [1, FOLLOWED] {
            while sleeps.len() < n {
                sleeps.push(
                    Command::new("sleep")
                        .arg("3600")
                        .spawn()
                        .context("cannot start sleep")?,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let followed = agent.running("sleep")?;
                if followed >= n {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "the agent follows {followed} of the {n} sleeps after 60 s"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
            let one = format!("/debug/pprof/heap?pid={}", sleeps[0].id());
            let mut times = Vec::new();
            for path in ["/metrics", "/debug/pprof/heap?comm=sleep", one.as_str()] {
                times.push(time_scrapes(agent, path)?);
            }
            rows.push(times);
        }
        println!("\nbench: memprof agent{mark}: scrapes over its socket, {SCRAPES} each (ms)");
        println!("| GET                                 | 1 sleep followed: median | slowest | {FOLLOWED} followed: median | slowest |");
        println!("|-------------------------------------|-------------------------:|--------:|---------------------:|--------:|");
        let names = [
            "/metrics",
            "/debug/pprof/heap?comm=sleep",
            "/debug/pprof/heap?pid=(a sleep)",
        ];
        for (i, name) in names.iter().enumerate() {
            let ((m1, s1), (m, s)) = (rows[0][i], rows[1][i]);
            println!("| {name:<35} | {m1:>24.1} | {s1:>7.1} | {m:>20.1} | {s:>7.1} |");
        }
        Ok(())
    })();
    for mut s in sleeps {
        let _ = s.kill();
        let _ = s.wait();
    }
    result
}

/// The programs the churn starts, in turn.
fn churn_programs() -> Vec<Vec<String>> {
    let binary_trees = target_dir().join("bench/binary-trees");
    let mut programs = vec![
        vec!["ls".into(), "-la".into(), "/usr/lib".into()],
        vec![
            "sh".into(),
            "-c".into(),
            "seq 1 20000 | sort -r | head -1".into(),
        ],
    ];
    if binary_trees.exists() {
        programs.push(vec![binary_trees.display().to_string(), "10".into()]);
    }
    programs
}

/// [`CHURN_S`] seconds of 200 processes a minute; the agent's RSS.
fn churn(memprof: &Path, mark: &str, floor_rss: u64) -> Result<()> {
    let seconds = std::env::var("MEMPROF_BENCH_CHURN_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CHURN_S);
    let agent = Agent::start(memprof)?;
    let programs = churn_programs();
    let start = Instant::now();
    let mut next_sample = Duration::from_secs(10);
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut started = 0usize;
    let mut children: Vec<Child> = Vec::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        let program = &programs[started % programs.len()];
        if let Ok(child) = Command::new(&program[0])
            .args(&program[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            children.push(child);
        }
        started += 1;
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        if start.elapsed() >= next_sample {
            let mb = agent.rss_kib()? as f64 / 1024.0;
            samples.push((start.elapsed().as_secs_f64(), mb));
            next_sample += Duration::from_secs(10);
        }
        std::thread::sleep(CHURN_EVERY);
    }
    for mut c in children {
        let _ = c.wait();
    }
    drop(agent);
    let max = samples.iter().map(|s| s.1).fold(0.0, f64::max);
    let half: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.0 >= seconds as f64 / 2.0)
        .cloned()
        .collect();
    let mean = half.iter().map(|s| s.1).sum::<f64>() / half.len().max(1) as f64;
    println!(
        "\nbench: memprof agent{mark} while 200 processes a minute start ({started} in {seconds} s: ls, sh|seq|sort|head, binary-trees 10)"
    );
    println!("| RSS                                   |        MB | vs idle |");
    println!("|---------------------------------------|----------:|--------:|");
    let floor = floor_rss as f64 / 1024.0;
    for (what, mb) in [
        ("idle (the floor)", floor),
        ("highest", max),
        ("mean over the second half", mean),
    ] {
        println!("| {what:<37} | {mb:>9.1} | {:>5.2} × |", mb / floor);
    }
    println!(
        "| slope over the second half            | {:>+6.1} MB/10 min |         |",
        slope(&half) * 600.0
    );
    Ok(())
}

/// Least-squares slope of (seconds, MB), in MB per second.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let num: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let den: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}
