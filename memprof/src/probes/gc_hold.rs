//! The two protocols between the kernel programs and memprof's tracer,
//! which stop a thread of the target at a moment only the kernel sees.
//!
//! **Holding a collector.** At the end of each Boehm collection's marking
//! (`GC_gc_no++`), the kernel stops the collecting thread with
//! [`HOLD_SIGNAL`](memprof_common::HOLD_SIGNAL) if memprof traces it
//! ([`Probes::set_traced`]) and notes the collection's epoch in `HELD`.
//! The tracer sees the signal, [`Probes::take_held`] says which collection,
//! the reader of the GC event ring ([`GcEvents`]) brings memprof's copy of
//! the GC objects up to date, and the mark-bit pass judges them before the
//! thread goes on.
//!
//! **Library loads (`run`).** `_dl_debug_state` stops the traced main
//! thread with [`LIBRARY_LOAD_SIGNAL`](memprof_common::LIBRARY_LOAD_SIGNAL)
//! after the dynamic linker changed the list of libraries, and flags it in
//! `DLOPEN_SIGNALLED`; [`Probes::take_library_load_signal`] tells that signal from
//! the program's own, and memprof adds the new modules' ranges before
//! their code runs.
//!
//! Both send the same signal, SIGURG, ignored by default: one still pending
//! when memprof detaches (dropped by the tracer) or dies (delivered)
//! changes nothing for the program. Both are switched off
//! ([`Probes::stop_holding`], [`Probes::stop_library_loads`]) before the
//! tracer detaches.
use anyhow::{ensure, Result};
use aya::maps::{Array, HashMap, Map, MapData, RingBuf};
use std::os::fd::AsRawFd;

use memprof_common::{
    gc_event, maps, programs, AllocSite, GcEvent, KernelCounters, KernelMarks, FIRST_WORD_READ,
};

use super::view::{LiveBlock, Site};
use super::Probes;
use crate::modules::Module;

/// A change to the set of GC objects, as the kernel streams it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcChange {
    /// A GC object was allocated at `addr`; by `GC_realloc` of
    /// `replaces` when that is not 0 (its kind is the replaced block's),
    /// which it freed: that free comes in this event, not as a
    /// [`GcChange::Freed`] (the two are never drained apart).
    Allocated {
        addr: u64,
        block: LiveBlock,
        replaces: u64,
        /// Objects it stands for: 1, or a refill sample's list.
        objects: u64,
        /// The thread's previous GC object and its first word, read now
        /// ([`GcEvent::typed`]).
        typed: Option<(u64, u32)>,
    },
    /// The GC object at `addr` was freed (`GC_free`; `GC_realloc(p, 0)`)
    /// at `time_ns`; `first_word`: its first word then, if read (`GC_free`).
    Freed {
        addr: u64,
        time_ns: u64,
        first_word: Option<u32>,
    },
    /// The kernel found the object at `addr` marked for the first time,
    /// `size` bytes as the collector counts it ([`Probes::judge_gc_in_kernel`]).
    /// `first_word`: its first word then, if read.
    Marked {
        addr: u64,
        size: u64,
        first_word: Option<u32>,
    },
    /// The kernel found the object at `addr` not marked at the end of
    /// collection `epoch`'s marking ([`Probes::judge_gc_in_kernel`]).
    /// `first_word`: its first word then (before the sweep), if read.
    Collected {
        addr: u64,
        epoch: u64,
        first_word: Option<u32>,
    },
    /// The kernel judged every object allocated before collection `epoch`
    /// (the collector's `gc_no`), at `time_ns`, in `kernel_ns`: those not
    /// [`GcChange::Collected`] were marked.
    Judged {
        epoch: u64,
        gc_no: u64,
        time_ns: u64,
        kernel_ns: u64,
    },
}

impl TryFrom<&GcEvent> for GcChange {
    type Error = anyhow::Error;

    fn try_from(event: &GcEvent) -> Result<GcChange> {
        match event.op {
            gc_event::ALLOC => Ok(GcChange::Allocated {
                addr: event.addr,
                block: LiveBlock {
                    site: Site::try_from(&AllocSite {
                        caller: event.caller,
                        stack_id: event.stack_id,
                        kind: event.kind,
                        _pad: [0; 3],
                        process: 0,
                    })?,
                    size: event.size,
                    timestamp_ns: event.timestamp_ns,
                    epoch: event.epoch as u64,
                },
                replaces: event.replaces,
                objects: u64::from(event.objects.max(1)),
                typed: (event.typed != 0).then_some((event.typed, event.typed_word)),
            }),
            gc_event::GONE => Ok(GcChange::Freed {
                addr: event.addr,
                time_ns: event.timestamp_ns,
                first_word: first_word(event),
            }),
            gc_event::MARKED => Ok(GcChange::Marked {
                addr: event.addr,
                size: event.size,
                first_word: first_word(event),
            }),
            gc_event::COLLECTED => Ok(GcChange::Collected {
                addr: event.addr,
                epoch: u64::from(event.epoch),
                first_word: first_word(event),
            }),
            gc_event::JUDGED => Ok(GcChange::Judged {
                epoch: u64::from(event.epoch),
                gc_no: event.addr,
                time_ns: event.timestamp_ns,
                kernel_ns: event.size,
            }),
            op => Err(anyhow::anyhow!("unknown GC event {op}")),
        }
    }
}

/// The object's first word a verdict or `GC_free` event carries, if read.
fn first_word(event: &GcEvent) -> Option<u32> {
    (event.caller & FIRST_WORD_READ != 0).then_some(event.caller as u32)
}

/// The `GC_EVENTS` ring buffer, taken from [`Probes`] by its one reader
/// ([`Probes::take_gc_events`]).
pub struct GcEvents {
    ring: RingBuf<MapData>,
    /// Events that did not decode (none, unless the kernel object and this
    /// binary disagree): counted with those the ring had no room for.
    malformed: u64,
}

impl GcEvents {
    pub(super) fn new(map: Map) -> Result<GcEvents> {
        Ok(GcEvents {
            ring: RingBuf::try_from(map)?,
            malformed: 0,
        })
    }

    /// Hands every event the kernel queued to `apply`, in order. Returns
    /// how many there were.
    pub fn drain(&mut self, mut apply: impl FnMut(&GcChange)) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            n += 1;
            if item.len() < std::mem::size_of::<GcEvent>() {
                self.malformed += 1;
                continue;
            }
            // SAFETY: the kernel wrote a GcEvent (plain data); unaligned read.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<GcEvent>()) };
            match GcChange::try_from(&event) {
                Ok(change) => apply(&change),
                Err(_) => self.malformed += 1,
            }
        }
        n
    }

    /// Events that did not decode.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// The ring's descriptor: readable (`poll`) when events are queued.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }
}

impl Probes {
    /// `run` only: have `dl_debug_state` stop the traced main thread when the
    /// dynamic linker loads libraries. `module` is the dynamic linker and
    /// `file_offset` its `_dl_debug_state`.
    pub fn watch_library_loads(
        &mut self,
        pid: u32,
        module: &Module,
        file_offset: u64,
    ) -> Result<()> {
        self.attach_at(
            programs::DL_DEBUG_STATE,
            module,
            file_offset,
            pid,
            "_dl_debug_state",
        )?;
        self.set_switch(maps::SIGNAL_ON_DLOPEN, 1)
    }

    /// No more library-load signals (before the tracer lets the threads go).
    pub fn stop_library_loads(&mut self) -> Result<()> {
        self.set_switch(maps::SIGNAL_ON_DLOPEN, 0)
    }

    /// Whether the kernel sent a library-load signal not taken yet
    /// ([`Self::take_library_load_signal`]).
    pub fn library_load_pending(&self) -> Result<bool> {
        Ok(self.switch(maps::DLOPEN_SIGNALLED)? == 1)
    }

    /// Whether the kernel sent the library-load signal since the last call.
    pub fn take_library_load_signal(&mut self) -> Result<bool> {
        let sent = self.switch(maps::DLOPEN_SIGNALLED)? == 1;
        if sent {
            self.set_switch(maps::DLOPEN_SIGNALLED, 0)?;
        }
        Ok(sent)
    }

    /// Puts a collection probe on each `GC_gc_no++` (`increments`: file
    /// offset and link-time address in `module`, the address the probe's
    /// cookie) and, if `hold`, has the kernel hold the collecting thread for
    /// the mark-bit pass when it is one memprof traces ([`Self::set_traced`]).
    pub fn watch_collections(
        &mut self,
        pid: u32,
        module: &Module,
        increments: &[(u64, u64)],
        hold: bool,
    ) -> Result<()> {
        for &(offset, address) in increments {
            let what = format!("GC_gc_no++ at {offset:#x}");
            self.attach_at_with_cookie(
                programs::GC_COLLECTION,
                module,
                (offset, address),
                pid,
                &what,
            )?;
            self.attached += 1;
        }
        self.hold_collections(hold)
    }

    /// Whether the kernel holds the collecting thread at the next
    /// collections (`false`: no more holds, as before the tracer lets the
    /// threads go).
    pub fn hold_collections(&mut self, hold: bool) -> Result<()> {
        self.set_switch(maps::GC_HOLD, u32::from(hold))
    }

    /// No more holds at collections (before the tracer lets the threads go).
    pub fn stop_holding(&mut self) -> Result<()> {
        self.hold_collections(false)
    }

    /// Has the kernel judge the GC objects of the copy by the collector's
    /// mark bits itself, at each collection (`marks`: where they are), and
    /// stream its verdicts ([`GcChange::Collected`], [`GcChange::Judged`]):
    /// before any probe is attached, after [`Self::keep_gc_copy`]. The
    /// probes must have been loaded for it ([`ProbeOptions::gc_verdicts`](super::ProbeOptions::gc_verdicts)).
    pub fn judge_gc_in_kernel(&mut self, marks: &KernelMarks) -> Result<()> {
        ensure!(
            self.gc_verdicts,
            "the probes were loaded without the kernel's GC verdicts"
        );
        let mut map: Array<&mut MapData, KernelMarks> =
            Array::try_from(self.map_mut(maps::GC_MARKS)?)?;
        map.set(0, *marks, 0)?;
        Ok(())
    }

    /// The kernel's verdicts not given: GC objects its table had no room
    /// for, and verdicts whose memory it could not read (summed over CPUs).
    pub fn kernel_verdicts_missing(&self) -> Result<(u64, u64)> {
        let c = self.kernel_counters()?;
        Ok((c.gc_unjudged, c.gc_verdicts_failed))
    }

    /// Marks thread `tid` as traced by memprof: the kernel may hold it.
    pub fn set_traced(&mut self, tid: u32) -> Result<()> {
        let mut traced: HashMap<&mut MapData, u32, u32> =
            HashMap::try_from(self.map_mut(maps::TRACED)?)?;
        traced.insert(tid, 1, 0)?;
        Ok(())
    }

    /// If the kernel is holding `tid` at a collection, the collection's
    /// epoch (and the hold is cleared).
    pub fn take_held(&mut self, tid: u32) -> Result<Option<u64>> {
        let mut held: HashMap<&mut MapData, u32, u64> =
            HashMap::try_from(self.map_mut(maps::HELD)?)?;
        match held.get(&tid, 0) {
            Ok(epoch) => {
                held.remove(&tid)?;
                Ok(Some(epoch))
            }
            Err(_) => Ok(None),
        }
    }

    /// The GC event ring buffer, for its one reader (once).
    pub fn take_gc_events(&mut self) -> Option<GcEvents> {
        self.gc_events.take()
    }

    /// The kernel keeps GC objects out of `LIVE` and streams them to the
    /// ring buffer only ([`memprof_common::globals::GC_COPY`]): a load-time
    /// setting ([`ProbeOptions::gc_copy`](super::ProbeOptions::gc_copy)); this checks the probes were
    /// loaded with it.
    pub fn keep_gc_copy(&mut self) -> Result<()> {
        ensure!(self.gc_copy, "the probes were loaded without the GC copy");
        Ok(())
    }

    /// Starts predicting results with `settings` ([`memprof_common::Predict`]),
    /// for predictor `which` ([`memprof_common::predictor`]).
    pub fn predict_results(
        &mut self,
        which: u32,
        settings: &memprof_common::Predict,
    ) -> Result<()> {
        self.set_entry(memprof_common::maps::PREDICT, which, settings)
    }

    /// `--gc-sampling refill`: how the kernel weighs a refill
    /// ([`memprof_common::Refill`]).
    pub fn refill_settings(&mut self, settings: &memprof_common::Refill) -> Result<()> {
        self.set_entry(memprof_common::maps::REFILL, 0, settings)
    }

    /// Writes entry `index` of the settings array `map`.
    fn set_entry<T: aya::Pod>(&mut self, map: &str, index: u32, value: &T) -> Result<()> {
        let mut array: aya::maps::Array<_, T> = aya::maps::Array::try_from(self.map_mut(map)?)?;
        array.set(index, *value, 0)?;
        Ok(())
    }

    /// GC events the ring buffer had no room for (summed over CPUs).
    pub fn gc_events_lost(&self) -> Result<u64> {
        Ok(self.kernel_counters()?.gc_events_lost)
    }

    /// Collections the kernel saw (summed over CPUs).
    pub fn collections_seen(&self) -> Result<u64> {
        Ok(self.kernel_counters()?.gc_collections)
    }

    /// Collections the kernel saw and could not hold for (summed over CPUs).
    pub fn collections_not_held(&self) -> Result<u64> {
        Ok(self.kernel_counters()?.gc_not_held)
    }

    /// The kernel's counters now, summed over CPUs.
    fn kernel_counters(&self) -> Result<KernelCounters> {
        super::view::sum_counters(self.map(maps::COUNTERS)?)
    }
}
