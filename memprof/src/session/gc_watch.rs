//! The mark-bit passes of a session with a GC heap ([`crate::gc::pass`]):
//! starting them (collection probes, the tracer that holds collectors),
//! judging at each held collection, and the GC summary of the profile; or,
//! when mark bits cannot be read, why not (address reuse only).
use anyhow::Result;

use super::{GcLiveness, Plan, SessionOptions};
use crate::gc::pass::Judge;
use crate::gc::HeapStats;
use crate::probes::Probes;
use crate::profile::GcSummary;
use crate::target::trace::Tracer;

/// The mark-bit passes of a session with a GC heap, or why there are none.
pub(super) struct GcWatch {
    judge: Option<Judge>,
    /// Why dead GC objects are found by address reuse only (no GC heap: None).
    fallback: Option<String>,
    /// The collector's heap figures at the end.
    heap_stats: Option<HeapStats>,
}

impl GcWatch {
    pub(super) fn new(plan: &Plan, options: &SessionOptions, pid: u32) -> GcWatch {
        let mut watch = GcWatch {
            judge: None,
            fallback: None,
            heap_stats: None,
        };
        let Some(module) = plan.gc_module() else {
            return watch;
        };
        if options.gc_liveness == GcLiveness::Reuse {
            watch.fallback = Some("--gc-liveness reuse".into());
            return watch;
        }
        match Judge::new(&plan.modules, pid, &module, options.gc_verdicts.as_deref()) {
            Ok(judge) => watch.judge = Some(judge),
            // The target is gone: the session ends with that one line, not this.
            Err(e) if !crate::target::is_alive(pid) => watch.fallback = Some(format!("{e:#}")),
            Err(e) => watch.fall_back(format!("{e:#}")),
        }
        watch
    }

    /// Says once why mark bits are not read, and stops reading them.
    pub(super) fn fall_back(&mut self, why: String) {
        eprintln!("memprof: GC mark bits not read ({why}); dead GC objects are found by address reuse only");
        self.judge = None;
        self.fallback = Some(why);
    }

    /// Attaches the collection probes (the caller traces the target).
    pub(super) fn start(&mut self, probes: &mut Probes, pid: u32) -> Result<()> {
        if let Some(judge) = &self.judge {
            probes.watch_collections(pid, judge.module_file(), &judge.collection_offsets())?;
        }
        Ok(())
    }

    /// `attach`: traces the target's threads so collectors can be held, and
    /// attaches the collection probes. `None` without a GC heap or when
    /// tracing is refused (then address reuse only).
    pub(super) fn trace(&mut self, probes: &mut Probes, pid: u32) -> Result<Option<Tracer>> {
        if self.judge.is_none() {
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
    /// at a collection, judge the tracked objects now. Returns whether the
    /// signal was memprof's.
    pub(super) fn on_hold(&mut self, probes: &mut Probes, tid: u32) -> Result<bool> {
        let Some(epoch) = probes.take_held(tid)? else {
            return Ok(false);
        };
        let Some(judge) = &mut self.judge else {
            return Ok(true);
        };
        probes.drain_gc_events(|event| judge.apply(event));
        let result = judge.pass(epoch).and_then(|dead| probes.forget_live(&dead));
        if let Err(e) = result {
            judge.not_judged(1);
            self.fall_back(format!("the mark-bit pass failed: {e:#}"));
            probes.stop_holding()?;
        }
        Ok(true)
    }

    /// Keeps the copy of the GC objects current (the ring buffer must not fill).
    pub(super) fn drain(&mut self, probes: &mut Probes) {
        if let Some(judge) = &mut self.judge {
            probes.drain_gc_events(|event| judge.apply(event));
        }
    }

    /// The collector's heap figures, while the target's memory is readable.
    pub(super) fn read_heap_stats(&mut self) {
        if let Some(stats) = self.judge.as_mut().and_then(|j| j.heap_stats()) {
            self.heap_stats = Some(stats);
        }
    }

    /// `GC_get_heap_size()` now (for the timeline), where readable.
    pub(super) fn heap_size_now(&mut self) -> Option<u64> {
        self.read_heap_stats();
        self.heap_stats.as_ref().map(|s| s.heap_size)
    }

    pub(super) fn sites(&self) -> Option<&crate::live::GcSites> {
        self.judge.as_ref().map(|j| j.sites())
    }

    pub(super) fn summary(&mut self, probes: &Probes) -> Option<GcSummary> {
        let mut summary = match (&mut self.judge, &self.fallback) {
            (Some(judge), _) => {
                let _ = judge.finish();
                let mut s = judge.summary().clone();
                s.collections_not_judged += probes.collections_not_held().unwrap_or(0);
                s.events_lost = probes.gc_events_lost().unwrap_or(0);
                s
            }
            (None, Some(why)) => GcSummary {
                liveness: format!("address reuse only ({why}): a GC object counts as live until GC_free or until its address is allocated again"),
                ..Default::default()
            },
            (None, None) => return None,
        };
        if let Some(stats) = &self.heap_stats {
            summary.heap_size = Some(stats.heap_size);
            summary.free_bytes = Some(stats.free_bytes);
            summary.unmapped_bytes = Some(stats.unmapped_bytes);
        }
        Some(summary)
    }
}
