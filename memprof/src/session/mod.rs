//! One profiling session, start to end: the pipeline the other modules
//! implement, in order.
//!
//! 1. find the target ([`crate::tracee`]) and its allocator functions, and
//!    place the probes ([`crate::plan`]);
//! 2. load and attach the probes ([`crate::probes`]) — for `run`, while the
//!    command is held right after its `exec` ([`start`]);
//! 3. [`Session::step`] until the end (the target exits, Ctrl-C / SIGTERM,
//!    `--duration`): what the traced target did (library loads, held
//!    collections: [`gc_watch`]), the mappings for symbolization, the live
//!    view ([`crate::live`]);
//! 4. [`Session::finish`]: detach, read the kernel's tables
//!    ([`crate::groups`]), symbolize ([`crate::symbolize`]), write the profile
//!    ([`crate::profile`]) and print the top of the table
//!    ([`crate::report`]).
//!
//! `run` and `attach` differ only in how they start ([`start`]) and when
//! they stop ([`drive`]: the modes [`crate::driver`] runs). A session
//! holds everything of one target and nothing process-global: the signal
//! mask belongs to the driver.
//!
//! The probes are detached on every path out: [`Probes`] closes its links
//! when dropped, and the kernel closes them if memprof itself dies.
pub(crate) mod census;
pub(crate) mod drive;
mod gc_feeder;
mod gc_watch;
pub(crate) mod machine;
pub(crate) mod selected;
mod start;
pub(crate) mod table;
mod watch;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;

use crate::driver::profiles::{self, Header};
use crate::driver::Output;
use crate::groups;
use crate::live::Live;
use crate::modules::maps::MapsCache;
use crate::modules::ModuleCache;
use crate::options::{Mode, SessionOptions};
use crate::plan::{self, Plan};
use crate::probes::{HeapMaps, Probes};
use crate::profile::{
    Counters, ExitInfo, Group, ProbeInfo, ProcessInfo, Profile, Stacks, TargetInfo,
};
use crate::tracee::launch::ExitStatus;
use crate::tracee::trace::{Event, Tracer};
use crate::tracee::Tracee;
use table::Vitals;

use gc_watch::GcWatch;

/// How often the mappings are re-read while the target runs.
const MAPS_REFRESH: Duration = Duration::from_secs(1);

/// How often `attach` without a tracer looks in /proc for the target's
/// exit (a step can come 60 times a second, one per held collection, and
/// each look is a file read).
const EXIT_CHECK: Duration = Duration::from_millis(50);

/// What [`Session::step`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The target runs on.
    Running,
    /// The target exited (with its status, when memprof traced it).
    Exited(Option<ExitStatus>),
    /// `run`'s command `exec`ed another program: held before its first
    /// instruction for [`Session::exec_again`].
    Exec,
}

/// Everything of one profiled process: its probes, its tracer (when
/// memprof traces it), the GC passes, its mappings and the live view.
pub struct Session {
    mode: Mode,
    target: Tracee,
    plan: Plan,
    options: SessionOptions,
    probes: Probes,
    /// A second, read-only handle on the kernel's tables.
    tables: HeapMaps,
    /// `run`: always; `attach`: when collections are held (mark bits).
    tracer: Option<Tracer>,
    gc: GcWatch,
    maps: MapsCache,
    live: Live,
    output: Output,
    /// Events of the target that came while a snapshot was published.
    deferred: Vec<Event>,
    started: (Instant, SystemTime),
    /// The target's parent when the session started.
    target_parent: u32,
    /// The target's pid in its own pid namespace, where different.
    target_ns_pid: Option<u32>,
    last_refresh: Instant,
    last_exit_check: Instant,
    /// The target `exec`ed and waits for [`Session::exec_again`].
    execed: bool,
}

impl Session {
    pub fn pid(&self) -> u32 {
        self.target.pid
    }

    /// Asks for the end census at the next held collection; whether there
    /// is one to wait for.
    pub fn want_end_census(&mut self) -> Result<bool> {
        self.gc.want_end_census(&mut self.probes)
    }

    /// Whether the end census asked for is copied (or cannot be).
    pub fn end_census_copied(&self) -> bool {
        self.gc.end_census_copied()
    }

    /// How long the driver may wait for a signal before the next step.
    pub fn timeout(&self) -> Duration {
        self.live.timeout(Duration::from_millis(100))
    }

    /// Handles what happened since the last step: the traced target's
    /// events, the GC objects streamed by the kernel, the mappings (once a
    /// second), and whatever the live view has due.
    pub fn step(&mut self) -> Result<Step> {
        if let Some(status) = self.follow()? {
            return Ok(Step::Exited(Some(status)));
        }
        if self.execed {
            return Ok(Step::Exec);
        }
        // Without a tracer, an attached process's exit is seen in /proc.
        if self.mode == Mode::Attach && self.last_exit_check.elapsed() >= EXIT_CHECK {
            self.last_exit_check = Instant::now();
            if !crate::tracee::is_alive(self.pid()) {
                return Ok(Step::Exited(None));
            }
        }
        if self.last_refresh.elapsed() >= MAPS_REFRESH {
            self.refresh_maps()?;
            self.last_refresh = Instant::now();
        }
        self.tick_live()
    }

    /// Handles the traced target's events: its exit stop (mappings and GC
    /// heap figures read while they exist), memprof's own signals (a library
    /// load: new unwinding ranges; a collection held: the mark-bit pass),
    /// and its exit, returned.
    fn follow(&mut self) -> Result<Option<ExitStatus>> {
        // Events left while a snapshot was published, in order.
        for event in std::mem::take(&mut self.deferred) {
            if let Some(status) = self.handle(event)? {
                return Ok(Some(status));
            }
        }
        loop {
            let Some(tracer) = &mut self.tracer else {
                return Ok(None);
            };
            let probes = &mut self.probes;
            let Some(event) = tracer.poll(&mut |tid| {
                let _ = probes.set_traced(tid);
            })?
            else {
                return Ok(None);
            };
            if let Some(status) = self.handle(event)? {
                return Ok(Some(status));
            }
            if self.execed {
                return Ok(None);
            }
        }
    }

    /// One event of the traced target (see [`Self::follow`]).
    fn handle(&mut self, event: Event) -> Result<Option<ExitStatus>> {
        let pid = self.pid();
        let probes = &mut self.probes;
        match event {
            Event::Exiting => {
                if let Some(now) = self.maps.refresh(pid) {
                    self.plan.modules.keep(&now);
                }
                self.gc.read_heap_stats();
                self.gc.read_live_types(pid);
            }
            Event::Signal { tid, signal } => {
                // The library-load and hold signals are one signal
                // (SIGURG): the kernel's flags say whose it is, and
                // both may have been sent before this one stop.
                let load = tid == pid && probes.take_library_load_signal()?;
                if load {
                    update_ranges(probes, &self.plan, &mut self.maps, pid)?;
                }
                let held = self.gc.on_hold(probes, tid)?;
                // Neither: the program's own SIGURG, delivered.
                if let Some(tracer) = &mut self.tracer {
                    tracer.resume_signal(tid, signal, !(load || held));
                }
                // The collector runs again: its objects are judged now.
                self.gc.after_hold(probes)?;
            }
            Event::Exited(status) => return Ok(Some(status)),
            // Left stopped for the driver ([`Step::Exec`]).
            Event::Exec => self.execed = true,
        }
        Ok(None)
    }

    /// Re-reads the mappings: for symbolization and, when unwinding with
    /// DWARF, for the kernel's module ranges.
    fn refresh_maps(&mut self) -> Result<()> {
        let pid = self.pid();
        update_ranges(&mut self.probes, &self.plan, &mut self.maps, pid)
    }

    /// Live blocks and bytes per kind now: the kernel's table's and the GC
    /// copy's running figures (O(1)).
    fn live_per_kind(&mut self) -> Result<[[u64; 2]; memprof_common::AllocKind::COUNT]> {
        let mut per_kind = self.tables.live_by_kind()?;
        if let Some(gc) = self.gc.per_kind() {
            for (sum, gc) in per_kind.iter_mut().zip(gc) {
                sum[0] += gc[0];
                sum[1] += gc[1];
            }
        }
        Ok(per_kind)
    }

    /// What `memprof top` shows of the process, read cheaply: live bytes,
    /// allocations and collections so far.
    pub fn vitals(&mut self) -> Result<Vitals> {
        let live_bytes = self.live_per_kind()?.iter().map(|k| k[1]).sum();
        let counters = self.tables.counters()?;
        // GC objects come from the copy when there is one (refill samples
        // stand for their lists); the kernel's count holds the rest.
        let allocations = match self.gc.allocated() {
            Some((objects, records)) => counters.allocs.saturating_sub(records) + objects,
            None => counters.allocs,
        };
        Ok(Vitals {
            pid: self.pid(),
            command: self.target.command.first().map_or_else(
                || crate::text::lossy_path(&self.target.exe),
                |argv0| {
                    Path::new(argv0)
                        .file_name()
                        .map_or_else(|| argv0.clone(), |n| n.to_string_lossy().into_owned())
                },
            ),
            live_bytes,
            allocations,
            collections: self.probes.collections_seen().unwrap_or(0),
        })
    }

    /// What `memprof agent`'s metrics say of the process, read cheaply.
    pub fn figures(&mut self) -> Result<crate::driver::Figures> {
        let vitals = self.vitals()?;
        Ok(crate::driver::Figures {
            pid: vitals.pid,
            program: vitals.command,
            exe: crate::text::lossy_path(&self.target.exe),
            live: self.live_per_kind()?,
            allocations: vitals.allocations,
            collections: Some(vitals.collections),
            gc_heap_bytes: self.gc.heap_size_now(),
        })
    }

    /// Timeline samples, `--interval` tables and `--snapshot-every` files, when due.
    fn tick_live(&mut self) -> Result<Step> {
        let due = self.live.due();
        if due.sample {
            let t0 = Instant::now();
            let per_kind = self.live_per_kind()?;
            let gc_heap = self.gc.heap_size_now();
            self.live
                .sample(t0, crate::live::PerKind::from_array(per_kind), gc_heap);
        }
        if due.print || due.snapshot {
            self.publish(due)?;
        }
        Ok(Step::Running)
    }

    /// `--interval` / `--snapshot-every`: the tables are read here, then
    /// symbolized and published on a thread while this one keeps serving
    /// held collections (a hold must not wait for a snapshot). Any other
    /// event of the target waits until the snapshot is out (the thread
    /// stays stopped), then goes through [`Self::follow`].
    fn publish(&mut self, due: crate::live::Due) -> Result<()> {
        let (counters, raw) = raw_tables(&self.tables, &self.gc)?;
        let header = Profile {
            duration_s: self.started.0.elapsed().as_secs_f64(),
            counters,
            timeline: self.live.timeline().clone(),
            ..self.describe()
        };
        let pid = self.pid();
        let Session {
            maps,
            plan,
            live,
            tracer,
            probes,
            gc,
            deferred,
            ..
        } = self;
        std::thread::scope(|scope| -> Result<()> {
            let publishing = scope.spawn(|| -> Result<()> {
                let named = groups::named::symbolize(raw, maps, &plan.modules, false);
                let mut counters = header.counters.clone();
                counters.add_name_losses(named.losses.left_mangled, named.losses.unnamed);
                live.publish(
                    &Profile {
                        groups: named.groups,
                        stacks: named.stacks,
                        counters,
                        ..header
                    },
                    due,
                )
            });
            if let Some(tracer) = tracer {
                while !publishing.is_finished() {
                    if !deferred.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    let event = tracer.poll(&mut |tid| {
                        let _ = probes.set_traced(tid);
                    })?;
                    match event {
                        // A hold only (no library load pending on it): served now.
                        Some(Event::Signal { tid, signal })
                            if !(tid == pid && probes.library_load_pending()?) =>
                        {
                            if gc.on_hold(probes, tid)? {
                                tracer.resume_signal(tid, 0, false);
                                gc.after_hold(probes)?;
                            } else {
                                deferred.push(Event::Signal { tid, signal });
                            }
                        }
                        Some(event) => deferred.push(event),
                        None => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            }
            publishing
                .join()
                .map_err(|_| anyhow::anyhow!("publishing a snapshot failed"))?
        })
    }

    /// A profile of the kernel's tables as they are now, without the GC
    /// summary and exit status only the end knows.
    pub fn snapshot(&self) -> Result<Profile> {
        self.profile(false)
    }

    fn profile(&self, progress: bool) -> Result<Profile> {
        let (counters, groups, stacks) = read_tables(
            &self.tables,
            &self.gc,
            &self.maps,
            &self.plan.modules,
            progress,
        )?;
        Ok(Profile {
            duration_s: self.started.0.elapsed().as_secs_f64(),
            counters,
            groups,
            stacks,
            timeline: self.live.timeline().clone(),
            ..self.describe()
        })
    }

    /// Lets the target go (it keeps running): the mappings and GC heap
    /// figures are read one last time, nothing signals the target any more
    /// (no collection held, no library load), and every traced thread is
    /// detached; a signal of ours still pending is dropped by the tracer.
    pub fn release(&mut self, exited: bool) -> Result<()> {
        if let Some(now) = self.maps.refresh(self.pid()) {
            self.plan.modules.keep(&now);
        }
        if !exited {
            self.gc.read_heap_stats();
            self.gc.read_live_types(self.pid());
        }
        self.probes.stop_holding()?;
        self.probes.stop_library_loads()?;
        if let Some(tracer) = &mut self.tracer {
            tracer.detach();
        }
        Ok(())
    }

    /// Detaches the probes, collects, symbolizes, writes the profile and
    /// prints the summary. `exit`: how the target ended, if it did.
    /// `followed`: the profiles of the processes `run` followed with
    /// sessions of their own ([`Session::into_profile`]), made part of it.
    pub fn finish(self, exit: Option<ExitInfo>, followed: Vec<Profile>) -> Result<()> {
        let top = self.options.top;
        let mut output = Output::none();
        let (profile, detaching) = self.collect(exit, Some(&mut output))?;
        let profile = profiles::merge(Some(profile), followed).unwrap_or_default();
        output.write_and_print(&profile, top)?;
        eprintln!("memprof: detaching {} probes", detaching.1);
        detaching.0.wait();
        Ok(())
    }

    /// The profile of a process `run` followed, for the command's session
    /// to take in ([`Session::finish`]): its probes detached, nothing written.
    pub fn into_profile(self, exit: Option<ExitInfo>) -> Result<Profile> {
        let (profile, detaching) = self.collect(exit, None)?;
        detaching.0.wait();
        Ok(profile)
    }

    /// Detaches the probes, collects and symbolizes; hands over the output
    /// file (into `output`) and what is still detaching.
    fn collect(
        mut self,
        exit: Option<ExitInfo>,
        output: Option<&mut Output>,
    ) -> Result<(Profile, (crate::probes::Detaching, usize))> {
        let header = self.describe();
        // The processes the command started go now, not after the writing.
        let processes = self.processes(exit);
        if let Some(tracer) = &mut self.tracer {
            tracer.detach();
        }
        let gc = self.gc.summary(&self.probes);
        let census = self.gc.take_census();
        let attached = self.probes.attached;
        // Every program is a no-op from here: the tables no longer change.
        // Closing the links takes the kernel a while: done meanwhile.
        self.probes.disable()?;
        let detaching = self.probes.detach();
        // The copy of the GC objects gets the events still queued; only its
        // figures per site are needed past here: its objects are given
        // back before the stacks are read.
        let gc_sites = self.gc.take_sites();
        crate::memory::trim();
        let (gc_figures, gc_counts) = match gc_sites {
            Some(s) => (
                Some(groups::GcFigures::Owned(s.sites)),
                (s.unknown_frees, s.sites_overflowed),
            ),
            None => (None, (0, 0)),
        };
        let raw = groups::collect(&self.tables, gc_figures)?;
        let mut counters = self.tables.counters()?;
        counters.unknown_frees += gc_counts.0;
        counters.sites_overflowed += gc_counts.1;
        let named = profiles::groups_of(
            self.target.pid,
            raw,
            &self.maps,
            &self.plan.modules,
            output.is_some(),
        );
        counters.add_name_losses(named.losses.left_mangled, named.losses.unnamed);
        let (groups, stacks) = (named.groups, named.stacks);
        let duration_s = self.started.0.elapsed().as_secs_f64();
        let timeline =
            self.live
                .into_timeline(&groups, duration_s, gc.as_ref().and_then(|g| g.heap_size));
        if let Some(output) = output {
            *output = std::mem::replace(&mut self.output, Output::none());
        }
        let mut processes = processes;
        processes[0].counters = Some(counters.clone());
        let profile = Profile {
            duration_s,
            exit,
            gc,
            census,
            counters,
            groups,
            stacks,
            timeline,
            processes,
            ..header
        };
        Ok((profile, (detaching, attached)))
    }

    /// The processes the command started that forked at least `age` ago
    /// and never `exec`ed (workers), let go for sessions that attach to
    /// them ([`Session::attach_followed`]).
    pub fn take_forked(&mut self, age: Duration) -> Vec<u32> {
        match &mut self.tracer {
            Some(tracer) if self.options.follow => tracer.take_forked(age),
            _ => Vec::new(),
        }
    }

    /// Lets `pid`, one of [`Session::take_execs`], run on without a
    /// session of its own (still followed by the tracer).
    pub fn resume_exec(&mut self, pid: u32) {
        if let Some(tracer) = &mut self.tracer {
            tracer.resume_exec(pid);
        }
    }

    /// Whether the command has started a process (`run`, following).
    pub fn has_family(&self) -> bool {
        self.options.follow && self.tracer.as_ref().is_some_and(|t| t.has_members())
    }

    /// The processes the command started that have just `exec`ed a
    /// program, held for sessions of their own ([`Session::adopt`]).
    pub fn take_execs(&mut self) -> Vec<u32> {
        self.tracer
            .as_mut()
            .map(|t| t.take_execs())
            .unwrap_or_default()
    }

    /// The target, then (in `run`) the processes it started: listed, not
    /// profiled. `exit`: how the target ended, if it did.
    fn processes(&self, exit: Option<ExitInfo>) -> Vec<ProcessInfo> {
        let t0 = self.started.0;
        let since = |at: Instant| at.saturating_duration_since(t0).as_secs_f64();
        let mut list = vec![ProcessInfo {
            pid: self.target.pid,
            pid_reuse: 0,
            ns_pid: self.target_ns_pid,
            ppid: self.target_parent,
            command: self.target.command.clone(),
            exe: crate::text::lossy_path(&self.target.exe),
            start_s: 0.0,
            end_s: exit.map(|_| since(Instant::now())),
            exit,
            profiled: true,
            profiled_from_s: None,
            counters: None,
        }];
        let family = self.tracer.as_ref().map(|t| t.family()).unwrap_or_default();
        list.extend(family.into_iter().map(|m| {
            ProcessInfo {
                pid: m.pid,
                pid_reuse: 0,
                ns_pid: m.ns_pid,
                ppid: m.ppid,
                command: m.command,
                exe: m.exe,
                start_s: since(m.started),
                end_s: m.ended.map(|(at, _)| since(at)),
                // Gone, and not seen ending (let go for a session that came
                // too late): exited, how not known.
                exit: m
                    .ended
                    .map(|(_, status)| ExitInfo::from(status))
                    .or_else(|| (!crate::tracee::is_alive(m.pid)).then_some(ExitInfo::UNKNOWN)),
                profiled: false,
                profiled_from_s: None,
                counters: None,
            }
        }));
        list
    }

    /// The metadata of a profile: target, mode, start, probes.
    fn describe(&self) -> Profile {
        Profile {
            gc_sampling: match self.plan.gc_sampling {
                plan::PlannedGcSampling::Refill { .. } => "refill".to_string(),
                _ => String::new(),
            },
            gc_refill_every: match self.plan.gc_sampling {
                plan::PlannedGcSampling::Refill { .. } => self.options.probes.gc_refill_every,
                _ => 0,
            },
            probes: self
                .plan
                .probes
                .iter()
                .map(|p| ProbeInfo {
                    function: p.func.func.symbol.to_string(),
                    module: crate::text::lossy_path(&p.func.module),
                    entry_offset: p.placement.offset,
                    emulated: p.placement.emulated,
                    reason: p.placement.reason.clone(),
                })
                .collect(),
            ..profiles::header(Header {
                mode: self.mode.name(),
                target: TargetInfo {
                    pid: self.target.pid,
                    command: self.target.command.clone(),
                    exe: crate::text::lossy_path(&self.target.exe),
                },
                started: self.started.1,
                unwind: self.plan.unwind_name().to_string(),
                sample_bytes: self.probes.sample_bytes(),
            })
        }
    }
}

/// The counters and the groups per stack, symbolized, from the kernel's tables.
fn read_tables(
    tables: &HeapMaps,
    gc: &GcWatch,
    maps: &MapsCache,
    modules: &ModuleCache,
    progress: bool,
) -> Result<(Counters, Vec<Group>, Stacks)> {
    let (mut counters, raw) = raw_tables(tables, gc)?;
    let named = groups::named::symbolize(raw, maps, modules, progress);
    counters.add_name_losses(named.losses.left_mangled, named.losses.unnamed);
    Ok((counters, named.groups, named.stacks))
}

/// The counters and the groups per stack (addresses), from the kernel's
/// tables and the copy of the GC objects.
fn raw_tables(tables: &HeapMaps, gc: &GcWatch) -> Result<(Counters, groups::RawGroups)> {
    let settled = gc.settled();
    let copy = settled.as_deref();
    let raw = groups::collect(tables, copy.map(|c| groups::GcFigures::Borrowed(c.sites())))?;
    let mut counters = tables.counters()?;
    // GC_free of an address the copy did not track.
    counters.unknown_frees += copy.map_or(0, |c| c.unknown_frees());
    Ok((counters, raw))
}

/// Re-reads the mappings of `pid`; with DWARF unwinding, gives the kernel
/// the module ranges when they changed.
fn update_ranges(probes: &mut Probes, plan: &Plan, maps: &mut MapsCache, pid: u32) -> Result<()> {
    if let Some(now) = maps.refresh(pid) {
        // Every file the target maps stays readable once it is gone.
        plan.modules.keep(&now);
        if let Some(tables) = &plan.tables {
            probes.set_module_ranges(&tables.ranges(&now))?;
        }
    }
    Ok(())
}
