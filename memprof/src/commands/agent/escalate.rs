//! Which processes the agent gives allocator probes of their own, and
//! for how long. By default no process pays anything per allocation call
//! (resident memory by stack only); a process gets the probes of
//! `malloc`, `free` and the rest, for it alone (no breakpoint in any other
//! process's memory), when:
//!
//! - the operator names it (`--examine PID|NAME`): as long as it runs;
//! - its resident memory keeps growing (`--escalate GROWTH/SECONDS`: the
//!   `rss` bytes memprof counts for it grew by GROWTH over the last
//!   SECONDS, and it was followed all that time): for `--escalate-for`,
//!   at most `--escalate-max` processes at once, once per process.
//!
//! What the probes recorded stays in the process's profile when they come
//! off (its `libc` and `mmap` rows are then as of that moment: frees after
//! it are not seen); the page and `/api/escalations` list each window.
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::driver::Figures;
use crate::session::selected::Selected;
use memprof_common::AllocKind;

/// How the agent escalates (by default: never).
#[derive(Debug, Clone, Default)]
pub struct EscalateOptions {
    /// Growth of resident bytes over `window` that escalates (`None`: never).
    pub growth: Option<(u64, Duration)>,
    /// How long an escalated process keeps its probes.
    pub hold: Duration,
    /// Processes escalated at once, at most.
    pub at_most: usize,
    /// The processes named for probes (`--examine`).
    pub named: Vec<Named>,
}

/// A process named by `--examine`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Pid(u32),
    /// Every process of this program (its figures' program name).
    Program(String),
}

impl Named {
    /// `1234` is a pid, anything else a program's name.
    pub fn parse(text: &str) -> Named {
        match text.parse() {
            Ok(pid) => Named::Pid(pid),
            Err(_) => Named::Program(text.to_string()),
        }
    }

    fn names(&self, f: &Figures) -> bool {
        match self {
            Named::Pid(pid) => f.pid == *pid,
            Named::Program(name) => &f.program == name,
        }
    }
}

/// One window of a process's own probes, as `/api/escalations` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EscalationRow {
    pub pid: u32,
    pub program: String,
    /// Why: `named` (`--examine`) or `growth` (its resident memory grew).
    pub why: String,
    /// Said in words: "grew 40.0 MiB in 60 s".
    pub detail: String,
    /// When the probes went on, and came off (`None`: on now), in
    /// seconds since the epoch.
    pub start_unix_s: f64,
    pub end_unix_s: Option<f64>,
    /// The files whose allocator functions were probed.
    pub files: Vec<String>,
    /// Why the probes could not go on (then `end_unix_s` is the start).
    pub error: Option<String>,
}

/// The escalations: each process's growth, the windows on now, and
/// those over (the last [`KEPT`]).
pub struct Escalations {
    options: EscalateOptions,
    /// Each followed process's resident bytes as last sampled.
    seen: HashMap<u32, VecDeque<(Instant, u64)>>,
    /// Processes with probes now: when they come off (`None`: as long as
    /// it runs), and their row.
    on: BTreeMap<u32, (Option<Instant>, EscalationRow)>,
    /// Processes probed once already (pids of those gone forgotten).
    tried: HashSet<u32>,
    /// The windows over, newest last.
    over: VecDeque<EscalationRow>,
    /// Escalations in all (for `/metrics`).
    pub started: u64,
}

/// Windows over kept for the page.
const KEPT: usize = 100;

impl Escalations {
    pub fn new(options: EscalateOptions) -> Escalations {
        Escalations {
            options,
            seen: HashMap::new(),
            on: BTreeMap::new(),
            tried: HashSet::new(),
            over: VecDeque::new(),
            started: 0,
        }
    }

    /// One look at the followed processes' `figures`: windows over end,
    /// processes named or grown get their probes.
    pub fn step(&mut self, followed: &mut Selected, figures: &[Figures]) {
        let now = Instant::now();
        let running: HashSet<u32> = figures.iter().map(|f| f.pid).collect();
        // Windows over, and processes gone.
        let ending: Vec<u32> = self
            .on
            .iter()
            .filter(|(pid, (until, _))| !running.contains(pid) || until.is_some_and(|u| now >= u))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in ending {
            followed.unprobe_calls(pid);
            if let Some((_, mut row)) = self.on.remove(&pid) {
                let end = unix_now();
                if running.contains(&pid) {
                    eprintln!(
                        "memprof agent: pid {pid} ({}): its allocator probes came off after {:.0} s; it runs on, its resident memory followed",
                        crate::text::visible(&row.program),
                        end - row.start_unix_s
                    );
                }
                row.end_unix_s = Some(end);
                self.keep(row);
            }
        }
        self.seen.retain(|pid, _| running.contains(pid));
        self.tried.retain(|pid| running.contains(pid));
        for f in figures {
            if self.tried.contains(&f.pid) {
                continue;
            }
            if self.options.named.iter().any(|n| n.names(f)) {
                self.escalate(followed, f, "named", "named by --examine".to_string(), None);
                continue;
            }
            let Some((growth, window)) = self.options.growth else {
                continue;
            };
            let rss = f.live[AllocKind::Rss as usize][1];
            let samples = self.seen.entry(f.pid).or_default();
            samples.push_back((now, rss));
            // The oldest sample at least `window` old is the baseline.
            while samples.len() > 1 && now.duration_since(samples[1].0) >= window {
                samples.pop_front();
            }
            let (since, before) = samples[0];
            let span = now.duration_since(since);
            let grown = rss.saturating_sub(before);
            let escalated = self.on.values().filter(|(u, _)| u.is_some()).count();
            if span >= window && grown >= growth && escalated < self.options.at_most {
                let detail = format!(
                    "resident memory grew {} in {:.0} s",
                    crate::text::bytes(grown as f64),
                    span.as_secs_f64()
                );
                let until = now + self.options.hold;
                self.escalate(followed, f, "growth", detail, Some(until));
            }
        }
    }

    /// Process `f` gets its own probes (until `until`; `None`: as long
    /// as it runs).
    fn escalate(
        &mut self,
        followed: &mut Selected,
        f: &Figures,
        why: &str,
        detail: String,
        until: Option<Instant>,
    ) {
        self.tried.insert(f.pid);
        self.seen.remove(&f.pid);
        let mut row = EscalationRow {
            pid: f.pid,
            program: f.program.clone(),
            why: why.to_string(),
            detail,
            start_unix_s: unix_now(),
            end_unix_s: None,
            files: Vec::new(),
            error: None,
        };
        match followed.probe_calls(f.pid) {
            Ok(files) => {
                row.files = files.iter().map(|p| p.display().to_string()).collect();
                eprintln!(
                    "memprof agent: pid {} ({}): {}; its allocator functions probed ({}){}",
                    f.pid,
                    crate::text::visible(&f.program),
                    row.detail,
                    row.files.join(", "),
                    match until {
                        Some(_) => format!(" for {:.0} s", self.options.hold.as_secs_f64()),
                        None => " as long as it runs".to_string(),
                    }
                );
                self.started += 1;
                self.on.insert(f.pid, (until, row));
            }
            Err(e) => {
                row.error = Some(format!("{e:#}"));
                row.end_unix_s = Some(row.start_unix_s);
                self.keep(row);
            }
        }
    }

    fn keep(&mut self, row: EscalationRow) {
        self.over.push_back(row);
        while self.over.len() > KEPT {
            self.over.pop_front();
        }
    }

    /// Every window: those on now first, then those over, newest first.
    pub fn rows(&self) -> Vec<EscalationRow> {
        let mut rows: Vec<EscalationRow> = self.on.values().map(|(_, r)| r.clone()).collect();
        rows.extend(self.over.iter().rev().cloned());
        rows
    }

    /// The pids with probes of their own now.
    pub fn probed(&self) -> Vec<(u32, &str)> {
        self.on
            .iter()
            .map(|(pid, (_, row))| (*pid, row.why.as_str()))
            .collect()
    }

    /// The end: every process's own probes come off (`Selected::finish`
    /// detaches them); the windows on now are over.
    pub fn end(&mut self) {
        let on = std::mem::take(&mut self.on);
        for (_, (_, mut row)) in on {
            row.end_unix_s = Some(unix_now());
            self.keep(row);
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
