//! `memprof agent`: every process of the machine (or those `--comm/--exe`
//! select), profiled until SIGTERM or Ctrl-C, and served while it runs.
//!
//! The processes are followed as `attach --comm/--exe` follows them
//! ([`Selected`]: one load of the probes, sampled by bytes; a session of
//! its own for each Boehm GC program, its collections held and its mark
//! bits read), stepped by the one [`Driver`]. The server runs on a thread
//! of its own ([`serve`]) and asks the driver's thread for what it serves
//! ([`Request`]): the kernel's tables, the sessions and the profiles kept
//! are the driver's alone, read between two steps.
//!
//! | part | what it does |
//! |---|---|
//! | this module | the mode: the driver's steps, the requests answered |
//! | [`serve`] | HTTP on a Unix socket (and, when asked, TCP): the routes |
//! | [`metrics`] | Prometheus's text format, from each process's figures |
//! | [`delta`] | what was allocated between two profiles (`?seconds=N`) |
//! | [`client`] | `memprof report --agent`, `memprof top --agent`: what the agent serves, asked |
//! | [`dir`] | `--dir`: each process's profile kept on disk, read again at the start |
//! | [`escalate`] | which processes get allocator probes of their own, and for how long |
//! | [`history`] | each process's live memory over time: its profile's timeline |
//! | [`page`] | the page at `/` |
pub mod client;
pub mod delta;
pub mod dir;
pub mod escalate;
pub mod history;
pub mod metrics;
pub mod page;
#[cfg(test)]
mod route_tests;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::driver::{profiles, Driven, Driver, Figures, Flow, Profiling};
use crate::options::SessionOptions;
use crate::profile::{ExitInfo, Profile};
use crate::session::machine::select::Selection;
use crate::session::selected::Selected;

/// How the agent serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The Unix socket (root's alone, or `group`'s too).
    pub socket: PathBuf,
    /// A group whose members may connect to the socket.
    pub group: Option<String>,
    /// Also HTTP on this address (loopback unless `allow_remote`).
    pub listen: Option<SocketAddr>,
    pub allow_remote: bool,
    /// `/metrics`: processes with labels of their own, by live bytes; the
    /// others summed.
    pub metrics_top: usize,
    /// `--dir`: snapshots kept on disk.
    pub dir: Option<dir::DirOptions>,
    /// Which processes get allocator probes of their own.
    pub escalate: escalate::EscalateOptions,
}

/// Which processes a profile is asked of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    Pid(u32),
    /// Every running process of this program (the name `/api/processes`
    /// gives), merged.
    Comm(String),
}

/// What the server asks the driver's thread, with where to answer.
pub enum Request {
    Metrics(tokio::sync::oneshot::Sender<String>),
    Processes(tokio::sync::oneshot::Sender<Vec<ProcessRow>>),
    Escalations(tokio::sync::oneshot::Sender<Vec<escalate::EscalationRow>>),
    Profile(
        Which,
        tokio::sync::oneshot::Sender<std::result::Result<Profile, String>>,
    ),
}

/// One process, as `/api/processes` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessRow {
    pub pid: u32,
    /// The program's file name.
    pub comm: String,
    pub exe: String,
    pub running: bool,
    /// Live bytes and blocks, all kinds (at its end, for one that ended).
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Live bytes per kind (`libc`, `mmap`, `gc`, `gc_atomic`).
    pub live_bytes_by_kind: std::collections::BTreeMap<String, u64>,
    pub allocations: u64,
    /// Boehm GC programs: collections seen.
    pub collections: Option<u64>,
    /// Ended: how (`None` while it runs, or when not known).
    pub exit: Option<ExitInfo>,
    /// Ended: when, in seconds since the epoch.
    pub end_unix_s: Option<f64>,
}

/// `memprof agent`: runs until SIGTERM or Ctrl-C, serving meanwhile.
pub fn run(
    driver: &Driver,
    selection: Option<Selection>,
    options: &SessionOptions,
    serve: &ServeOptions,
) -> Result<i32> {
    // The server's sockets first: a wrong address fails before the probes load.
    let (requests, server) = serve::Server::bind(serve, driver.waker())?;
    // After the socket: a second agent (on the same socket) is refused
    // before it touches the first one's directory.
    let snapshots = serve.dir.as_ref().map(dir::Snapshots::open).transpose()?;
    let started = SystemTime::now();
    let followed = Selected::new(selection.clone(), options)?;
    let what = match (options.rss, options.calls) {
        (true, false) => "resident memory by stack (page faults sampled; no allocator function probed: --calls probes them)".to_string(),
        (true, true) => format!("resident memory by stack, and the allocator functions ({} files probed)", followed.files_probed()),
        _ => format!("the allocator functions ({} files probed)", followed.files_probed()),
    };
    eprintln!(
        "memprof agent: following {}: {what}, sampled (--sample-bytes {}); serving on {}{}; SIGTERM or Ctrl-C to stop",
        selection
            .as_ref()
            .map_or_else(|| "every process".to_string(), Selection::describe),
        options.probes.sample_bytes,
        serve.socket.display(),
        serve
            .listen
            .map(|a| format!(" and http://{a}"))
            .unwrap_or_default(),
    );
    let mut agent = Agent {
        followed,
        requests,
        metrics_top: serve.metrics_top,
        started,
        dir: snapshots,
        history: history::History::default(),
        escalations: escalate::Escalations::new(serve.escalate.clone()),
    };
    if let Some(dir) = &agent.dir {
        let counts = dir.counts();
        eprintln!(
            "memprof agent: --dir {}: {} snapshot{} of processes seen before, served as ended{}; a snapshot every {} s of each process whose figures changed, within {} bytes",
            serve.dir.as_ref().map_or(String::new(), |d| d.dir.display().to_string()),
            counts.files,
            if counts.files == 1 { "" } else { "s" },
            match counts.unreadable {
                0 => String::new(),
                n => format!(" ({n} unreadable, skipped)"),
            },
            serve.dir.as_ref().map_or(0.0, |d| d.every.as_secs_f64()),
            serve.dir.as_ref().map_or(0, |d| d.budget),
        );
    }
    let end = driver.drive(&mut agent, options.duration);
    // SIGTERM or Ctrl-C: what is still to name (the processes' last
    // snapshots) is named within half a second, the rest left as addresses.
    crate::symbolize::budget::stopping();
    // No more answers: the server stops before the processes are let go.
    server.stop();
    // The windows on now are over (their probes come off with the rest).
    agent.escalations.end();
    // Every process's last figures on disk, before it is let go.
    let Agent {
        mut followed, dir, ..
    } = agent;
    if let Some(mut dir) = dir {
        dir.work(&mut followed, true);
    }
    let profiles = followed.finish()?;
    end?;
    eprintln!(
        "memprof agent: stopped; {} processes profiled, each runs on, untraced",
        profiles.iter().map(|p| p.processes().len()).sum::<usize>()
    );
    Ok(0)
}

/// The agent's state, as the driver steps it.
struct Agent {
    followed: Selected,
    requests: mpsc::Receiver<Request>,
    metrics_top: usize,
    started: SystemTime,
    /// `--dir`: snapshots kept on disk.
    dir: Option<dir::Snapshots>,
    history: history::History,
    escalations: escalate::Escalations,
}

/// Requests answered per step at most (the processes' events come first).
const ANSWERS_PER_STEP: usize = 8;

/// The longest the driver waits between two steps: a request wakes it
/// at once ([`crate::driver::signals::Waker`]), the reading thread has
/// read each new process already, and a Boehm GC program's session
/// shortens the wait to what it needs; so a quiet machine costs the
/// agent 20 wakeups a second, not 100.
const STEP_AT_LEAST_EVERY: Duration = Duration::from_millis(50);

impl Driven for Agent {
    fn timeout(&self) -> Duration {
        self.followed.timeout_within(STEP_AT_LEAST_EVERY)
    }

    fn step(&mut self) -> Result<Flow> {
        self.followed.step()?;
        if self.history.due() {
            let running = self.followed.figures().unwrap_or_default();
            let kept = self.followed.ended_pids().into_iter().collect();
            self.history.sample(&running, &kept);
            self.escalations.step(&mut self.followed, &running);
        }
        for _ in 0..ANSWERS_PER_STEP {
            let Ok(request) = self.requests.try_recv() else {
                break;
            };
            self.answer(request);
        }
        // Cheap: only processes whose figures changed since their last
        // snapshot are written, at most `dir::STEP_BUDGET` of it a step.
        if let Some(dir) = &mut self.dir {
            dir.work(&mut self.followed, false);
        }
        Ok(Flow::Go)
    }
}

impl Agent {
    /// Answers one request (a client gone meanwhile is not an error).
    fn answer(&mut self, request: Request) {
        match request {
            Request::Metrics(reply) => {
                let text = self.metrics().unwrap_or_else(|e| {
                    format!("# memprof agent: the figures could not be read: {e:#}\n")
                });
                let _ = reply.send(text);
            }
            Request::Processes(reply) => {
                let _ = reply.send(self.processes());
            }
            Request::Escalations(reply) => {
                let _ = reply.send(self.escalations.rows());
            }
            Request::Profile(which, reply) => {
                let _ = reply.send(self.profile(&which).map_err(|e| format!("{e:#}")));
            }
        }
    }

    fn metrics(&mut self) -> Result<String> {
        let figures = self.followed.figures()?;
        let counters = self.followed.counters()?;
        let ended = self.followed.ended_count();
        Ok(metrics::render(&metrics::Machine {
            figures: &figures,
            counters: &counters,
            ended_kept: ended,
            top: self.metrics_top,
            dir: self.dir.as_ref().map(dir::Snapshots::counts),
            files: self.followed.files_held(),
            escalations: &self.escalations,
        }))
    }

    fn processes(&mut self) -> Vec<ProcessRow> {
        let mut rows: Vec<ProcessRow> = self
            .followed
            .figures()
            .unwrap_or_default()
            .iter()
            .map(running_row)
            .collect();
        let start = self
            .started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for ended in self.followed.ended() {
            let info = ended.info;
            let comm = info.comm().to_string();
            let figures = Figures {
                pid: info.pid,
                program: comm,
                exe: info.exe.clone(),
                live: ended.held,
                allocations: info.counters.as_ref().map_or(0, |c| c.allocs),
                collections: ended.collections,
                ..Figures::default()
            };
            rows.push(ProcessRow {
                running: false,
                exit: info.exit,
                end_unix_s: info.end_s.map(|e| start + e),
                ..running_row(&figures)
            });
        }
        if let Some(dir) = &self.dir {
            let listed: std::collections::HashSet<u32> = rows.iter().map(|r| r.pid).collect();
            rows.extend(dir.rows(&listed));
        }
        rows.sort_by(|a, b| {
            (b.running, b.live_bytes, a.pid).cmp(&(a.running, a.live_bytes, b.pid))
        });
        rows
    }

    /// The profile of process `pid` now (or as it ended), or of every
    /// running process of a program, merged.
    fn profile(&mut self, which: &Which) -> Result<Profile> {
        match which {
            Which::Pid(pid) => {
                // Followed (running, or ended and kept): with its
                // timeline. One from `--dir` is served as written.
                let followed = match self.followed.pids().contains(pid) {
                    true => Some(self.followed.snapshot(*pid)?),
                    false => self.followed.ended_profile(*pid),
                };
                if let Some(mut profile) = followed {
                    self.history.timeline_of(*pid, &mut profile);
                    return Ok(profile);
                }
                match self.dir.as_ref().and_then(|d| d.profile(*pid)) {
                    Some(read) => read,
                    None => anyhow::bail!("pid {pid} is not followed, and no process {pid} that ended is kept (GET /api/processes lists them)"),
                }
            }
            Which::Comm(comm) => {
                let pids: Vec<u32> = self
                    .followed
                    .figures()?
                    .into_iter()
                    .filter(|f| &f.program == comm)
                    .map(|f| f.pid)
                    .collect();
                // One that ended meanwhile is left out.
                let profiles = self.followed.snapshots(&pids);
                profiles::merge(None, profiles).ok_or_else(|| {
                    anyhow::anyhow!("no running process of program {comm:?} is followed (GET /api/processes lists them)")
                })
            }
        }
    }
}

/// A process's row, from its figures (as if running).
pub(crate) fn running_row(f: &Figures) -> ProcessRow {
    ProcessRow {
        pid: f.pid,
        comm: f.program.clone(),
        exe: f.exe.clone(),
        running: true,
        live_bytes: f.live.iter().map(|k| k[1]).sum(),
        live_blocks: f.live.iter().map(|k| k[0]).sum(),
        live_bytes_by_kind: memprof_common::AllocKind::ALL
            .iter()
            .map(|k| (k.name().to_string(), f.live[*k as usize][1]))
            .collect(),
        allocations: f.allocations,
        collections: f.collections,
        exit: None,
        end_unix_s: None,
    }
}
