//! The processes `attach --comm/--exe` selects, or every process of the
//! machine (`memprof agent`), as the driver steps them: one load of the
//! probes follows them all from their first allocation ([`Family`]), and a
//! program that allocates with the Boehm GC gets a session of its own
//! besides (its collections held, its mark bits read), as under `run`.
use std::collections::{HashMap, HashSet};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::drive::Followed;
use super::Session;
use crate::driver::{Driven, Figures, Flow, Profiling};
use crate::options::{GcSampling, SessionOptions};
use crate::profile::{Counters, ProcessInfo, Profile};
use crate::session::machine::select::{Selection, RESCAN};
use crate::session::machine::Family;

/// The longest wait for the selected processes' events.
const SELECTED_POLL: Duration = Duration::from_millis(10);

/// Every process: /proc is read for Boehm GC programs that ran before
/// memprof this often (each executable is looked at once).
const RESCAN_ALL: Duration = Duration::from_secs(2);

/// The sessions of Boehm GC programs that ended, kept by `memprof agent`
/// (the oldest let go, counted).
const KEEP_ENDED_SESSIONS: usize = 200;

/// A process that ended, as kept.
pub(crate) struct Ended {
    pub info: ProcessInfo,
    /// What it held live when it ended: blocks and bytes per kind (by
    /// [`memprof_common::AllocKind`]'s number).
    pub held: [[u64; 2]; memprof_common::AllocKind::COUNT],
    /// A Boehm GC program's: the collections its session saw.
    pub collections: Option<u64>,
}

/// The processes selected (`None`: every process), followed.
pub(crate) struct Selected {
    selection: Option<Selection>,
    options: SessionOptions,
    /// When /proc was last read for the processes selected.
    last_scan: Option<Instant>,
    /// Every process selected, from its first allocation.
    probes: Family,
    /// The Boehm GC programs among them: a session each.
    own: Followed,
    /// Their sessions being started, a thread each: a start takes ~0.4 s
    /// (the programs' verification, the program's files read), while
    /// the other sessions' held collections and the requests wait on
    /// the driver's steps.
    starting: Vec<(u32, JoinHandle<Result<Session>>)>,
    /// The processes (pid, index) looked at for the Boehm GC (those gone
    /// are forgotten at each scan of /proc).
    checked: HashSet<(u32, u32)>,
    /// Whether each executable (device, inode) allocates with the Boehm GC.
    uses_gc: HashMap<(u64, u64), bool>,
    /// Sessions that ended let go ([`KEEP_ENDED_SESSIONS`]).
    sessions_evicted: u64,
}

impl Selected {
    /// The probes loaded for the processes `selection` names (`None`:
    /// every process).
    pub(crate) fn new(selection: Option<Selection>, options: &SessionOptions) -> Result<Selected> {
        let family = options.for_family();
        let probes = match &selection {
            Some(selection) => Family::select(&family, selection)?,
            None => Family::all(&family)?,
        };
        Ok(Selected {
            selection,
            options: options.clone(),
            last_scan: None,
            probes,
            own: Followed::default(),
            starting: Vec::new(),
            checked: HashSet::new(),
            uses_gc: HashMap::new(),
            sessions_evicted: 0,
        })
    }

    /// How many allocator files have probes.
    pub(crate) fn files_probed(&self) -> usize {
        self.probes.files_probed()
    }

    /// Files held parsed, and files with unwind rows.
    pub(crate) fn files_held(&self) -> (usize, usize) {
        self.probes.files_held()
    }

    /// Whether process `pid`'s program allocates with the Boehm GC (read
    /// once per executable).
    fn uses_gc(&mut self, pid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/exe")) else {
            return false;
        };
        *self
            .uses_gc
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| crate::allocators::program_uses_gc(pid))
    }

    /// The processes running now, by /proc (memprof excluded).
    fn running_now(&self) -> Vec<u32> {
        match &self.selection {
            Some(selection) => selection.matching(),
            None => crate::session::machine::select::all_processes(),
        }
    }

    /// The figures of every process followed now.
    pub(crate) fn figures(&mut self) -> Result<Vec<Figures>> {
        let mut figures = self.own.figures();
        figures.extend(self.probes.figures()?);
        Ok(figures)
    }

    /// The processes that ended, as kept: the machine's, oldest first,
    /// then the Boehm GC programs' sessions'.
    pub(crate) fn ended(&self) -> Vec<Ended> {
        let mut ended: Vec<Ended> = self
            .probes
            .ended()
            .into_iter()
            .map(|(info, held)| Ended {
                info,
                held,
                collections: None,
            })
            .collect();
        for profile in self.own.ended() {
            ended.push(Ended {
                held: profile.live_per_kind(),
                collections: profile
                    .gc
                    .as_ref()
                    .map(|g| g.collections + g.collections_not_judged),
                info: profile.processes().swap_remove(0),
            });
        }
        ended
    }

    /// The pids of the processes that ended, kept (as [`Self::ended`]).
    pub(crate) fn ended_pids(&self) -> Vec<u32> {
        let mut pids = self.probes.ended_pids();
        pids.extend(self.own.ended().iter().map(|p| p.target.pid));
        pids
    }

    /// How many processes that ended are kept.
    pub(crate) fn ended_count(&self) -> usize {
        self.probes.ended_count() + self.own.ended().len()
    }

    /// The profile of the last process `pid` that ended, if kept.
    pub(crate) fn ended_profile(&self, pid: u32) -> Option<Profile> {
        let own = self.own.ended().iter().rev().find(|p| p.target.pid == pid);
        match own {
            Some(profile) => Some(profile.clone()),
            None => self.probes.ended_profile(pid),
        }
    }

    /// The machine's counters now (every process's losses); Boehm GC
    /// programs' sessions count their own, in their profiles.
    pub(crate) fn counters(&self) -> Result<Counters> {
        let mut counters = self.probes.counters()?;
        counters.processes_evicted += self.sessions_evicted;
        counters.gc_sessions_missed += self.own.missed;
        Ok(counters)
    }

    /// Probes the allocator functions of followed process `pid`, for it
    /// alone, until [`Self::unprobe_calls`]; says which files. A Boehm GC
    /// program's session follows its calls already: refused.
    pub(crate) fn probe_calls(&mut self, pid: u32) -> Result<Vec<std::path::PathBuf>> {
        if self.own.pids().contains(&pid) {
            anyhow::bail!("pid {pid} has a session of its own (a Boehm GC program)");
        }
        self.probes.probe_calls(pid)
    }

    /// Process `pid`'s own allocator probes come off; whether it had them.
    pub(crate) fn unprobe_calls(&mut self, pid: u32) -> bool {
        self.probes.unprobe_calls(pid)
    }

    /// The end: every process let go (it runs on, untraced); the
    /// profiles of all those followed.
    pub(crate) fn finish(mut self) -> Result<Vec<Profile>> {
        self.take_started(true);
        let mut profiles = self.own.finish();
        profiles.extend(self.probes.finish()?);
        Ok(profiles)
    }
}

impl Selected {
    /// The wait before the next step, at most `longest` (what the Boehm
    /// GC programs' sessions need, else `longest`).
    pub(crate) fn timeout_within(&self, longest: Duration) -> Duration {
        self.own.timeout(longest)
    }
}

impl Selected {
    /// Whether the Boehm GC programs' sessions trace their processes:
    /// unless the kernel judges their refill samples (no census is taken
    /// of a followed process, so nothing else holds its collections).
    fn traces(&self) -> bool {
        self.options.gc_sampling != GcSampling::Refill || self.options.gc_verdicts.is_some()
    }

    /// The sessions whose start is over (`all`: waited for), followed.
    fn take_started(&mut self, all: bool) {
        let mut i = 0;
        while i < self.starting.len() {
            if !all && !self.starting[i].1.is_finished() {
                i += 1;
                continue;
            }
            let (pid, start) = self.starting.swap_remove(i);
            let session = start
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("starting its session failed")));
            self.adopt(pid, session);
        }
    }

    /// A session started for `pid` takes it over from the probes, which
    /// drop what they recorded of it (the session's profile says from when
    /// it is profiled). Until then they keep it: a process that ended
    /// before its session could start is served from them, with its exit.
    fn adopt(&mut self, pid: u32, session: Result<Session>) {
        if session.is_ok() {
            if let Err(e) = self.probes.leave_out(pid) {
                eprintln!("memprof: pid {pid} is also kept by the machine's probes: {e:#}");
            }
        }
        self.own.started(pid, session);
    }
}

impl Driven for Selected {
    fn timeout(&self) -> Duration {
        self.own.timeout(SELECTED_POLL)
    }

    /// The events read; a new Boehm GC program gets its session.
    fn step(&mut self) -> Result<Flow> {
        self.probes.step()?;
        let mut found = self.probes.members();
        // A program that ran before memprof and allocates only with the
        // Boehm GC (a Crystal server) is seen in /proc, not by the probes.
        let rescan = match self.selection {
            Some(_) => RESCAN,
            None => RESCAN_ALL,
        };
        if self.last_scan.is_none_or(|t| t.elapsed() >= rescan) {
            self.last_scan = Some(Instant::now());
            let now = self.running_now();
            let alive: HashSet<u32> = now
                .iter()
                .copied()
                .chain(found.iter().map(|m| m.0))
                .collect();
            self.checked.retain(|(pid, _)| alive.contains(pid));
            found.extend(now.into_iter().map(|pid| (pid, u32::MAX)));
        }
        for (pid, index) in found {
            if !self.checked.insert((pid, index))
                || self.own.pids().contains(&pid)
                || !self.uses_gc(pid)
            {
                continue;
            }
            if self.starting.iter().any(|(p, _)| *p == pid) {
                continue;
            }
            match self.traces() {
                // A session that traces its process (to hold collections)
                // must be started by the thread that steps it: ptrace
                // belongs to a thread.
                true => {
                    let session = Session::attach_followed(pid, &self.options);
                    self.adopt(pid, session);
                }
                false => {
                    let options = self.options.clone();
                    let start = std::thread::spawn(move || Session::attach_followed(pid, &options));
                    self.starting.push((pid, start));
                }
            }
        }
        self.take_started(false);
        self.own.step(&self.options);
        let probes = &self.probes;
        self.own.learn_exits(|pid| probes.exit_of(pid));
        if self.selection.is_none() {
            self.sessions_evicted += self.own.keep_last(KEEP_ENDED_SESSIONS);
        }
        Ok(Flow::Go)
    }
}

impl Profiling for Selected {
    fn pids(&self) -> Vec<u32> {
        let mut pids = self.own.pids();
        pids.extend(self.probes.pids());
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        match self.own.pids().contains(&pid) {
            true => self.own.snapshot(pid),
            false => self.probes.snapshot(pid),
        }
    }

    /// Those with a session of their own one by one, the probes' in one
    /// reading of the kernel's tables.
    fn snapshots(&mut self, pids: &[u32]) -> Vec<Profile> {
        let own = self.own.pids();
        let (theirs, probed): (Vec<u32>, Vec<u32>) = pids.iter().partition(|p| own.contains(p));
        let mut profiles: Vec<Profile> = theirs
            .iter()
            .filter_map(|&pid| self.own.snapshot(pid).ok())
            .collect();
        profiles.extend(self.probes.snapshots(&probed));
        profiles
    }
}
