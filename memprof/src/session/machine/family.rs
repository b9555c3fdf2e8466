//! `run`'s followed processes on the host machinery: one load of the
//! probes for every process the command starts, directly or not (the
//! kernel checks each new process's ancestors for the command), each
//! from its first allocation, with the module table the kernel builds
//! from the files memprof has read. A program `exec`ed under `run` is
//! held only as long as telling the tracer to let it go takes; a forked
//! worker is followed from its fork. The command itself keeps its own
//! session (its collections held, its mark bits read), and so does a
//! program started that allocates with the Boehm GC
//! ([`Family::leave_out`]).
//!
//! `attach --comm/--exe` follow the processes a selection names the same
//! way ([`Family::select`]): the kernel checks each new process's `comm`
//! and executable.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;

use super::select::Selection;
use super::{Host, Scope};
use crate::driver::Profiling;
use crate::options::SessionOptions;
use crate::probes::{Detaching, ProcessProbes};
use crate::profile::{Counters, Profile};

/// The processes `run`'s command started, or those a selection names,
/// followed together.
pub struct Family {
    host: Host,
    /// Processes given the allocator probes of their own
    /// ([`Family::probe_calls`]), by pid.
    calls: HashMap<u32, ProcessProbes>,
    /// Those whose probes are coming off: once they are off, the blocks
    /// they recorded still live are let go ([`Host::let_go_calls`]).
    coming_off: Vec<(u32, Detaching)>,
}

/// The family's probes being loaded, beside the command's session.
pub struct Loading {
    /// Set once the system's allocators are probed: a program held at
    /// its `exec` can go.
    live: Arc<AtomicBool>,
    loading: JoinHandle<Result<Family>>,
}

impl Loading {
    /// Whether the probes are on the system's allocators by now.
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Waits until [`Loading::live`] (or the loading failed).
    pub fn wait_live(&self) {
        while !self.live() && !self.loading.is_finished() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether the loading is over ([`Loading::join`] does not wait).
    pub fn is_finished(&self) -> bool {
        self.loading.is_finished()
    }

    pub fn join(self) -> Result<Family> {
        match self.loading.join() {
            Ok(family) => family,
            Err(_) => anyhow::bail!("loading the probes failed"),
        }
    }
}

impl Family {
    /// Starts loading the probes for the processes `root` starts from
    /// now on (its files read: its forked children map them), in the
    /// background: the command runs meanwhile.
    pub fn load(options: &SessionOptions, root: u32) -> Loading {
        let live = Arc::new(AtomicBool::new(false));
        let options = options.clone();
        let set = Arc::clone(&live);
        let loading = std::thread::spawn(move || {
            Ok(Family {
                host: Host::start(&options, Scope::Family(root), Some(&set))?,
                calls: HashMap::new(),
                coming_off: Vec::new(),
            })
        });
        Loading { live, loading }
    }

    /// `attach --comm/--exe`: the probes for the processes `selection`
    /// names, those running and those that start, each from its first
    /// allocation (or its `exec`).
    pub fn select(options: &SessionOptions, selection: &Selection) -> Result<Family> {
        Ok(Family {
            host: Host::start(options, Scope::Selected(selection.clone()), None)?,
            calls: HashMap::new(),
            coming_off: Vec::new(),
        })
    }

    /// `memprof agent`: the probes for every process of the machine,
    /// those running and those that start.
    pub fn all(options: &SessionOptions) -> Result<Family> {
        Ok(Family {
            host: Host::start(options, Scope::All, None)?,
            calls: HashMap::new(),
            coming_off: Vec::new(),
        })
    }

    /// The figures of every process followed that has not ended.
    pub fn figures(&mut self) -> Result<Vec<crate::driver::Figures>> {
        self.host.figures()
    }

    /// The processes that ended, as kept (the last
    /// [`KEEP_ENDED`](super::KEEP_ENDED)), oldest first, with what each
    /// held live per kind when it ended.
    pub fn ended(
        &self,
    ) -> Vec<(
        crate::profile::ProcessInfo,
        [[u64; 2]; memprof_common::AllocKind::COUNT],
    )> {
        self.host.ended()
    }

    /// How process `pid`, left out to a session of its own, exited
    /// lately (the OOM killer's choice marked).
    pub fn exit_of(&self, pid: u32) -> Option<crate::profile::ExitInfo> {
        self.host.exit_of(pid)
    }

    /// The pids of the processes that ended, kept: [`Self::ended`]
    /// without their figures (no pass over the groups, nothing cloned).
    pub fn ended_pids(&self) -> Vec<u32> {
        self.host.ended_pids()
    }

    /// How many processes that ended are kept.
    pub fn ended_count(&self) -> usize {
        self.host.ended_count()
    }

    /// The profile of the last process `pid` that ended, if kept.
    pub fn ended_profile(&self, pid: u32) -> Option<Profile> {
        self.host.ended_profile(pid)
    }

    /// The machine's counters now: every process's losses, and what no
    /// process could be given.
    pub fn counters(&self) -> Result<Counters> {
        let mut counters = self.host.probes.peek()?.counters()?;
        counters.stacks_not_finished += self.host.deferred.dropped;
        counters.short_of_resources += self.host.short_of_resources;
        let names = self.host.name_losses;
        counters.add_name_losses(names.left_mangled, names.unnamed);
        counters.tables_from_proc += self.host.tables_from_proc();
        (counters.processes_evicted, counters.evicted_allocs) = self.host.evicted;
        Ok(counters)
    }

    /// How many allocator files have probes.
    pub fn files_probed(&self) -> usize {
        self.host.files.probed()
    }

    /// Files held parsed, and files with unwind rows.
    pub fn files_held(&self) -> (usize, usize) {
        let rows = self
            .host
            .files
            .rows
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (self.host.files.parsed(), rows.with_rows())
    }

    /// The processes followed now: pid and index (a process that `exec`s
    /// gets a new index).
    pub fn members(&self) -> Vec<(u32, u32)> {
        self.host
            .processes
            .values()
            .filter(|p| p.end_s.is_none())
            .map(|p| (p.pid, p.index))
            .collect()
    }

    /// Process `pid` (started by the command) is not followed here: a
    /// session of its own follows it.
    pub fn leave_out(&mut self, pid: u32) -> Result<()> {
        self.host.leave_out(pid)
    }

    /// Probes the allocator functions of process `pid`, for it alone,
    /// until [`Family::unprobe_calls`]; says which files.
    pub fn probe_calls(&mut self, pid: u32) -> Result<Vec<std::path::PathBuf>> {
        if self.calls.contains_key(&pid) || self.host.files.calls_probed() {
            anyhow::bail!("pid {pid}'s allocator functions are probed already");
        }
        let host = &mut self.host;
        let (own, files) = host.files.probe_process(&mut host.probes, pid)?;
        self.calls.insert(pid, own);
        Ok(files)
    }

    /// Process `pid`'s own allocator probes come off (detached on a
    /// thread; once off, what they recorded still live is let go: its
    /// frees would not be seen); whether it had them.
    pub fn unprobe_calls(&mut self, pid: u32) -> bool {
        match self.calls.remove(&pid) {
            Some(own) => {
                self.coming_off.push((pid, own.detach()));
                true
            }
            None => false,
        }
    }

    /// The events read (without waiting: the command's session is
    /// stepped by the same loop), the processes that ended finalized.
    pub fn step(&mut self) -> Result<()> {
        let (off, on): (Vec<_>, Vec<_>) = std::mem::take(&mut self.coming_off)
            .into_iter()
            .partition(|(_, detaching)| detaching.is_done());
        self.coming_off = on;
        for (pid, detaching) in off {
            detaching.wait();
            self.host.let_go_calls(pid)?;
        }
        self.host.tick(Duration::ZERO)
    }

    /// The processes followed now.
    pub fn pids(&self) -> Vec<u32> {
        self.host.pids()
    }

    /// A profile of followed process `pid` now.
    pub fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        self.host.snapshot(pid)
    }

    /// Profiles of followed processes `pids` now (see [`Profiling::snapshots`]).
    pub fn snapshots(&mut self, pids: &[u32]) -> Vec<Profile> {
        self.host.snapshots(pids)
    }

    /// Recording stops; the profile of every process followed, the
    /// family's counters (losses included) in the first one's.
    pub fn finish(mut self) -> Result<Vec<Profile>> {
        // No process keeps a probe of memprof's once it stops.
        for (_, own) in self.calls.drain() {
            own.detach().wait();
        }
        for (pid, detaching) in std::mem::take(&mut self.coming_off) {
            detaching.wait();
            self.host.let_go_calls(pid)?;
        }
        let counters = self.host.stop()?;
        let mut done = std::mem::take(&mut self.host.done);
        // Each process's own figures are in its entry of the process
        // list; the profile counts the family's once.
        for profile in &mut done {
            profile.counters = Counters::default();
        }
        if let Some(first) = done.first_mut() {
            first.counters = counters;
        }
        self.host.probes.detach().wait();
        Ok(done)
    }
}
