//! The mark-bit passes of a session with a GC heap ([`crate::gc::pass`]):
//! starting them (collection probes, the tracer that holds collectors),
//! keeping memprof's copy of the GC objects ([`GcCopy`]) current, judging at
//! each held collection, and the GC summary of the profile; or, when mark
//! bits cannot be read, why not (address reuse only).
//!
//! The copy is fed by a thread of its own (`gc_feeder.rs`): it waits on the
//! kernel's ring buffer and applies the events as they come, so the ring
//! never fills while the session's loop is busy (a snapshot, a sample),
//! and sorts the new records in chunks, so a pass only merges. A pass has
//! two parts: at a held collection the loop takes the copy's lock, applies
//! what is left in the ring and reads the mark bits of the heap blocks
//! ([`Judge::read_marks`]); once the collector runs again it judges the
//! objects against them ([`Judge::judge`]). Meanwhile the feeder keeps
//! the ring drained into a spill of its own, applied in order afterwards.
//!
//! With `--gc-sampling refill` the kernel judges the (few) objects itself
//! at each collection and streams its verdicts into the same ring; the
//! feeder settles the copy by them ([`judged_in_kernel`]), and collections
//! are held (and `attach` traces the target) only for a census.
use std::collections::HashMap;
use std::sync::MutexGuard;
use std::thread::JoinHandle;

use anyhow::Result;

use super::gc_feeder::{current, lock, Feeder};
use crate::gc::copy::GcCopy;
use crate::gc::live_types::{classes, first_words};
use crate::gc::pass::{Judge, Marks, SiteGc};
use crate::gc::HeapStats;
use crate::options::{CensusWhen, GcLiveness, SessionOptions};
use crate::plan::{Plan, PlannedGcSampling};
use crate::probes::{Probes, Site};
use crate::profile::{Censuses, GcSummary};
use crate::session::census::SessionCensus;
use crate::symbolize::type_ids::{type_names, TypeNames};
use crate::tracee::trace::Tracer;

/// The mark-bit passes of a session with a GC heap, or why there are none.
pub(super) struct GcWatch {
    judge: Option<Judge>,
    /// The copy of the GC objects and its feeder (while there is a judge,
    /// and after the passes stopped: address reuse is still seen there).
    feeder: Option<Feeder>,
    /// Why dead GC objects are found by address reuse only (no GC heap: None).
    fallback: Option<String>,
    /// The collector's heap figures at the end.
    heap_stats: Option<HeapStats>,
    /// Mark bits read at a hold, for the objects to be judged against once
    /// the collector runs again ([`GcWatch::after_hold`]).
    marks: Option<Marks>,
    /// That judging, on a thread of its own so the loop keeps serving the
    /// target; the judge comes back with its result.
    judging: Option<JoinHandle<(Judge, Result<()>)>>,
    /// Censuses of the whole heap at held collections.
    census: Option<SessionCensus>,
    /// The kernel judges the copy's objects at each collection
    /// (`--gc-sampling refill`: few objects): no hold for them, only for
    /// a census.
    in_kernel: bool,
    /// The names of the program's type ids, worked out on a thread of
    /// their own while it runs ([`Self::name_types`]), taken at the first
    /// hold (or the end), and the classes once given to the sites
    /// ([`Self::read_live_types`]).
    type_names: Option<JoinHandle<TypeNames>>,
    names: Option<TypeNames>,
    live_types_read: bool,
}

/// What the copy of the GC objects learned, at the end.
pub(super) struct GcSites {
    pub(super) sites: Vec<(Site, SiteGc)>,
    /// `GC_free` of addresses the copy did not track.
    pub(super) unknown_frees: u64,
    /// Allocations counted under their kind's overflow site.
    pub(super) sites_overflowed: u64,
}

impl GcWatch {
    pub(super) fn new(plan: &Plan, options: &SessionOptions, pid: u32) -> GcWatch {
        let mut watch = GcWatch {
            judge: None,
            feeder: None,
            fallback: None,
            heap_stats: None,
            marks: None,
            judging: None,
            census: None,
            in_kernel: false,
            type_names: None,
            names: None,
            live_types_read: false,
        };
        let Some(module) = plan.gc_module() else {
            return watch;
        };
        // Refill samples are few: the kernel judges them at the collection
        // itself, and the collector is not held for it (a hold costs the
        // whole program a round trip through memprof's tracer).
        watch.in_kernel = matches!(plan.gc_sampling, PlannedGcSampling::Refill { .. })
            && options.gc_verdicts.is_none();
        if options.gc_liveness == GcLiveness::Reuse {
            watch.fallback = Some("--gc-liveness reuse".into());
            return watch;
        }
        match Judge::new(&plan.modules, pid, &module, options.gc_verdicts.as_deref()) {
            Ok(judge) => watch.judge = Some(judge),
            // The target is gone: the session ends with that one line, not this.
            Err(e) if !crate::tracee::is_alive(pid) => watch.fallback = Some(format!("{e:#}")),
            Err(e) => watch.fall_back(format!("{e:#}")),
        }
        watch
    }

    /// What the probes are loaded for: GC objects kept in memprof's copy
    /// only (with a judge), and judged by the kernel itself; what
    /// [`Self::keep_copy`] then sets up.
    pub(super) fn kernel_copy(&self) -> (bool, bool) {
        let copy = self.judge.is_some();
        (copy, copy && self.in_kernel)
    }

    /// With a judge, has the kernel stream the GC objects to memprof's copy
    /// only (not to its live table) and starts feeding it: before any
    /// probe is attached.
    pub(super) fn keep_copy(&mut self, probes: &mut Probes) -> Result<()> {
        if self.judge.is_none() {
            return Ok(());
        }
        let Some(events) = probes.take_gc_events() else {
            return Ok(());
        };
        let in_kernel = match (&self.judge, self.in_kernel) {
            (Some(judge), true) => Some(judge.summary().clone()),
            _ => None,
        };
        self.feeder = Some(Feeder::start(events, in_kernel)?);
        probes.keep_gc_copy()?;
        if let (Some(judge), true) = (&self.judge, self.in_kernel) {
            probes.judge_gc_in_kernel(&judge.kernel_marks())?;
        }
        Ok(())
    }

    /// Whether GC objects are kept in memprof's copy (judged by mark bits).
    pub(super) fn copies(&self) -> bool {
        self.feeder.is_some()
    }

    /// Why mark bits are not read, if they are not.
    pub(super) fn why_no_marks(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Says once why mark bits are not read, and stops reading them. The
    /// copy stays: address reuse and frees are still applied to it.
    pub(super) fn fall_back(&mut self, why: String) {
        eprintln!("memprof: GC mark bits not read ({why}); dead GC objects are found by address reuse only");
        self.judge = None;
        self.fallback = Some(why);
    }

    /// Censuses the whole heap at held collections ([`SessionCensus`]);
    /// `attach`: the objects not seen allocated were live before memprof.
    pub(super) fn census_heap(
        &mut self,
        plan: &Plan,
        pid: u32,
        exe: &std::path::Path,
        attach: bool,
        when: CensusWhen,
    ) {
        let Some(judge) = &self.judge else {
            return;
        };
        match SessionCensus::new(&plan.modules, pid, judge.module(), exe, attach, when) {
            Ok(census) => self.census = Some(census),
            Err(e) => eprintln!("memprof: no heap census ({e:#})"),
        }
    }

    /// Starts naming the type ids of program `exe` (a Crystal program's
    /// objects say their class by them), for [`Self::read_live_types`].
    pub(super) fn name_types(&mut self, plan: &Plan, exe: &std::path::Path) {
        if self.judge.is_none() {
            return;
        }
        let Ok(exe) = plan.modules.get(exe) else {
            return;
        };
        self.type_names = std::thread::Builder::new()
            .name("type-names".into())
            .spawn(move || type_names(&exe))
            .ok();
    }

    /// The names of the program's type ids, once worked out (waited for
    /// at the first call); `None` for a program whose objects say no
    /// class (not Crystal).
    fn names(&mut self) -> Option<&TypeNames> {
        if let Some(thread) = self.type_names.take() {
            self.names = thread.join().ok();
        }
        self.names
            .as_ref()
            .filter(|n| !n.names.is_empty() || !n.stored.is_empty())
    }

    /// Reads the first word of every GC object tracked now not read
    /// before, while process `pid`'s memory is there (once: at its exit
    /// stop, or before it is let go); each site's objects by class.
    pub(super) fn read_live_types(&mut self, pid: u32) {
        if std::mem::replace(&mut self.live_types_read, true) {
            return;
        }
        let _ = self.join_judging();
        if self.names().is_none() {
            return; // not a Crystal program
        }
        let Some(mut copy) = self.settled() else {
            return;
        };
        let addrs: Vec<u64> = copy.settled_unread().collect();
        let words = first_words(pid, &addrs);
        let words: Vec<(u64, Option<u32>)> = addrs.into_iter().zip(words).collect();
        copy.note_last_words(&words);
        let Some(names) = self.names.as_ref() else {
            return;
        };
        let mut per_site: HashMap<u32, Vec<&crate::gc::copy::Slot>> = HashMap::new();
        for slot in copy.slots() {
            per_site.entry(slot.site).or_default().push(slot);
        }
        let per_site: Vec<(u32, Vec<crate::gc::site::ClassGc>)> = per_site
            .into_iter()
            .map(|(n, slots)| {
                let atomic = copy.sites()[n as usize].0.kind == memprof_common::AllocKind::GcAtomic;
                (n, classes(names, atomic, slots.into_iter()))
            })
            .collect();
        for (n, found) in per_site {
            if let Some((_, gc)) = copy.site_mut(n) {
                gc.classes = found;
            }
        }
    }

    /// Asks for a census at the next held collection, the end census;
    /// whether there is one to wait for (a census kept and not failed).
    pub(super) fn want_end_census(&mut self, probes: &mut Probes) -> Result<bool> {
        let wanted = self.census.as_mut().is_some_and(SessionCensus::want_end);
        if wanted && self.in_kernel && self.judge.is_some() {
            probes.hold_collections(true)?;
        }
        Ok(wanted)
    }

    /// Whether collections are held: for every pass, or with the kernel
    /// judging, for a census that could be due.
    fn holds(&self) -> bool {
        !self.in_kernel
            || self
                .census
                .as_ref()
                .is_some_and(SessionCensus::could_be_due)
    }

    /// Whether the end census asked for has been copied (or cannot be).
    pub(super) fn end_census_copied(&self) -> bool {
        self.census.as_ref().is_none_or(SessionCensus::end_copied)
    }

    /// The censuses taken, at the end (`None` without a GC heap held).
    pub(super) fn take_census(&mut self) -> Option<Censuses> {
        self.census.take().map(SessionCensus::finish)
    }

    /// Attaches the collection probes (the caller traces the target).
    pub(super) fn start(&mut self, probes: &mut Probes, pid: u32) -> Result<()> {
        if let Some(judge) = &self.judge {
            let increments = judge.collection_increments();
            probes.watch_collections(pid, judge.module_file(), &increments, self.holds())?;
        }
        Ok(())
    }

    /// `attach`: traces the target's threads so collectors can be held, and
    /// attaches the collection probes. `None` without a GC heap, when
    /// nothing will be held (the kernel judges, no census), or when
    /// tracing is refused (then address reuse only).
    pub(super) fn trace(&mut self, probes: &mut Probes, pid: u32) -> Result<Option<Tracer>> {
        if self.judge.is_none() {
            return Ok(None);
        }
        // The kernel judges and no census will hold: nothing to trace for
        // (a traced thread's every signal stops it for memprof, and a
        // multi-threaded collector signals each thread at each collection).
        if self.in_kernel && self.census.is_none() {
            self.start(probes, pid)?;
            return Ok(None);
        }
        match Tracer::seize(pid, &mut |tid| {
            let _ = probes.set_traced(tid);
        }) {
            Ok(tracer) => {
                self.start(probes, pid)?;
                Ok(Some(tracer))
            }
            Err(e) => {
                self.fall_back(format!("{e:#}"));
                Ok(None)
            }
        }
    }

    /// A thread stopped with the hold signal: if the kernel is holding it
    /// at a collection, read the mark bits now (the objects are judged by
    /// [`Self::after_hold`], once the caller has let it go). Returns whether
    /// the signal was memprof's. The pause counts from here, including
    /// waiting for the previous collection's judging to end.
    pub(super) fn on_hold(&mut self, probes: &mut Probes, tid: u32) -> Result<bool> {
        let started = std::time::Instant::now();
        let Some(epoch) = probes.take_held(tid)? else {
            return Ok(false);
        };
        // The previous collection's verdicts come first (in order).
        self.after_hold(probes)?;
        self.finish_judging(probes)?;
        if self.in_kernel {
            // Held for a census only: the kernel judged the collection.
            if let Some(census) = &mut self.census {
                census.at_hold();
            }
            let holds = self.holds();
            probes.hold_collections(holds)?;
            return Ok(true);
        }
        // Names wanted before any object is read: a Crystal program's
        // objects are read at each hold, others' not.
        let typed = self.names().is_some();
        let (Some(judge), Some(feeder)) = (&mut self.judge, &self.feeder) else {
            return Ok(true);
        };
        let result = judge.read_marks(epoch, &feeder.current(), started, typed);
        match result {
            Ok(marks) => {
                self.marks = Some(marks);
                if let Some(census) = &mut self.census {
                    // A census copies the heap while the collector is
                    // still held: its time is part of this pause.
                    let at = std::time::Instant::now();
                    census.at_hold();
                    let (extra, total) = (at.elapsed(), started.elapsed());
                    judge.held_longer(extra.as_secs_f64(), total.as_secs_f64());
                }
            }
            Err(e) => {
                judge.not_judged(1);
                self.fall_back(format!("the mark-bit pass failed: {e:#}"));
                probes.stop_holding()?;
            }
        }
        Ok(true)
    }

    /// After a held collector was let go: judges the tracked objects
    /// against the mark bits read at the hold, on a thread of its own.
    pub(super) fn after_hold(&mut self, probes: &mut Probes) -> Result<()> {
        self.finish_judging(probes)?;
        if self.in_kernel {
            // Held for a census only (the kernel judged the collection).
            if let (Some(feeder), Some(census)) = (&self.feeder, &mut self.census) {
                let (copy, intake) = (feeder.copy.clone(), feeder.intake.clone());
                census.after_hold(move |addrs| current(&copy, &intake).tracks(addrs));
            }
            return Ok(());
        }
        let (Some(feeder), Some(marks)) = (&self.feeder, self.marks.take()) else {
            return Ok(());
        };
        if let Some(census) = &mut self.census {
            let (copy, intake) = (feeder.copy.clone(), feeder.intake.clone());
            census.after_hold(move |addrs| current(&copy, &intake).tracks(addrs));
        }
        let Some(mut judge) = self.judge.take() else {
            return Ok(());
        };
        let (copy, intake) = (feeder.copy.clone(), feeder.intake.clone());
        self.judging = Some(std::thread::Builder::new().name("gc-judge".into()).spawn(
            move || {
                let result = judge.judge(marks, &mut current(&copy, &intake));
                (judge, result)
            },
        )?);
        Ok(())
    }

    /// Waits for a judging in flight and takes its judge back; a failed
    /// one ends the passes (`probes`: to stop holding collectors).
    fn finish_judging(&mut self, probes: &mut Probes) -> Result<()> {
        if let Some(why) = self.join_judging() {
            self.fall_back(why);
            probes.stop_holding()?;
        }
        Ok(())
    }

    /// [`Self::finish_judging`] without stopping the holds: why the
    /// judging failed, if it did (the passes are over either way then).
    fn join_judging(&mut self) -> Option<String> {
        let handle = self.judging.take()?;
        match handle.join() {
            Ok((judge, Ok(()))) => {
                self.judge = Some(judge);
                None
            }
            Ok((judge, Err(e))) => {
                self.judge = Some(judge);
                Some(format!("the mark-bit pass failed: {e:#}"))
            }
            Err(_) => Some("judging the GC objects panicked".into()),
        }
    }

    /// The copy of the GC objects, every event applied and settled (frees
    /// and address reuse), for a snapshot or the end; `None` without one.
    pub(super) fn settled(&self) -> Option<MutexGuard<'_, GcCopy>> {
        let mut copy = self.feeder.as_ref()?.current();
        // Settling without a pass judges nothing: it cannot fail.
        let _ = copy.settle(None);
        Some(copy)
    }

    /// The end: the copy of the GC objects, settled, reduced to what was
    /// learned per site (the objects themselves are dropped).
    pub(super) fn take_sites(&mut self) -> Option<GcSites> {
        let _ = self.join_judging();
        let copy = self.settled()?;
        let (unknown_frees, sites_overflowed) = (copy.unknown_frees(), copy.sites_overflowed());
        drop(copy);
        let feeder = self.feeder.take()?;
        let copy = std::mem::take(&mut *feeder.current());
        drop(feeder);
        Some(GcSites {
            sites: copy.into_sites(),
            unknown_frees,
            sites_overflowed,
        })
    }

    /// Tracked GC objects and bytes per kind, cheaply (for timeline
    /// samples): never waits for the copy's lock (the feeder may be
    /// merging), the last figures read then.
    pub(super) fn per_kind(&mut self) -> Option<[[u64; 2]; memprof_common::AllocKind::COUNT]> {
        let feeder = self.feeder.as_mut()?;
        if let Ok(copy) = feeder.copy.try_lock() {
            feeder.per_kind = copy.per_kind();
        }
        Some(feeder.per_kind)
    }

    /// GC objects allocated so far and the allocations recorded for them,
    /// as the copy has counted them ([`GcCopy::allocated_so_far`]; the last
    /// figures read if the copy is busy); `None` without a copy.
    pub(super) fn allocated(&mut self) -> Option<(u64, u64)> {
        let feeder = self.feeder.as_mut()?;
        if let Ok(copy) = feeder.copy.try_lock() {
            feeder.allocated = copy.allocated_so_far();
        }
        Some(feeder.allocated)
    }

    /// The collector's heap figures, while the target's memory is readable.
    pub(super) fn read_heap_stats(&mut self) {
        if let Some(why) = self.join_judging() {
            self.fall_back(why);
        }
        if let Some(stats) = self.judge.as_mut().and_then(|j| j.heap_stats()) {
            self.heap_stats = Some(stats);
        }
    }

    /// `GC_get_heap_size()` now (for the timeline), where readable.
    pub(super) fn heap_size_now(&mut self) -> Option<u64> {
        // The judge is busy judging: the last figures stand.
        if self.judging.as_ref().is_some_and(|j| !j.is_finished()) {
            return self.heap_stats.as_ref().map(|s| s.heap_size);
        }
        self.read_heap_stats();
        self.heap_stats.as_ref().map(|s| s.heap_size)
    }

    pub(super) fn summary(&mut self, probes: &Probes) -> Option<GcSummary> {
        if let Some(why) = self.join_judging() {
            self.fall_back(why);
        }
        let kernel = self
            .feeder
            .as_ref()
            .and_then(|feeder| lock(&feeder.intake).kernel.as_ref().map(|(_, s)| s.clone()));
        let mut summary = match (&mut self.judge, &self.fallback) {
            (Some(judge), _) => {
                let _ = judge.finish();
                let mut s = judge.summary().clone();
                if let Some(kernel) = kernel {
                    // The kernel judged: what it found, and what it could not judge.
                    s = GcSummary {
                        liveness: "mark bits, read by the kernel at each collection".into(),
                        ..kernel
                    };
                    let (unjudged, failed) = probes.kernel_verdicts_missing().unwrap_or((0, 0));
                    s.objects_not_judged = unjudged;
                    s.verdicts_failed = failed;
                }
                s.collections_not_judged += probes.collections_not_held().unwrap_or(0);
                s
            }
            (None, Some(why)) => GcSummary {
                liveness: format!("address reuse only ({why}): a GC object counts as live until GC_free or until its address is allocated again"),
                ..Default::default()
            },
            (None, None) => return None,
        };
        // The copy outlives a failed pass: its losses count either way.
        if let Some(feeder) = &self.feeder {
            // One lock at a time (the copy's is taken before the intake's).
            let unrepresentable = feeder.current().unrepresentable();
            let malformed = lock(&feeder.intake).events.malformed() + unrepresentable;
            summary.events_lost = probes.gc_events_lost().unwrap_or(0) + malformed;
        }
        if let Some(stats) = &self.heap_stats {
            summary.heap_size = Some(stats.heap_size);
            summary.free_bytes = Some(stats.free_bytes);
            summary.unmapped_bytes = Some(stats.unmapped_bytes);
        }
        Some(summary)
    }
}
