//! The thread that keeps memprof's copy of the GC objects current
//! ([`Feeder`]): it waits on the kernel's ring buffer and applies the
//! events as they come, or spills them while the copy is busy, to apply
//! them in order afterwards ([`Intake`]).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::Result;

use crate::gc::copy::GcCopy;
use crate::gc::pass::{judged_in_kernel, KernelCollection, KernelVerdicts};
use crate::probes::{GcChange, GcEvents};
use crate::profile::GcSummary;

/// What the feeder takes from the kernel, behind a lock of its own: the
/// ring buffer, and the events read while the copy was busy, in order.
pub(super) struct Intake {
    pub(super) events: GcEvents,
    spill: Vec<GcChange>,
    /// With the kernel judging: its verdicts since the last collection it
    /// judged, and what the collections judged so far found.
    pub(super) kernel: Option<(KernelVerdicts, GcSummary)>,
}

impl Intake {
    /// Applies the spilled events, then every event queued in the ring.
    fn apply(&mut self, copy: &mut GcCopy) {
        let kernel = &mut self.kernel;
        for change in self.spill.drain(..) {
            apply(copy, kernel, &change);
        }
        self.events.drain(|change| apply(copy, kernel, change));
    }

    /// Keeps the ring drained while the copy is busy.
    fn spill(&mut self) {
        let spill = &mut self.spill;
        self.events.drain(|change| spill.push(*change));
    }
}

fn apply(copy: &mut GcCopy, kernel: &mut Option<(KernelVerdicts, GcSummary)>, change: &GcChange) {
    match *change {
        GcChange::Allocated {
            addr,
            block,
            replaces,
            objects,
            typed,
        } => {
            if let Some((earlier, word)) = typed {
                copy.word_read(earlier, word);
            }
            // `GC_realloc`: its free of the block replaced comes in this
            // event, before the new block (the same address, in place).
            if replaces != 0 {
                copy.freed(replaces, block.timestamp_ns, None);
            }
            copy.allocated_as(addr, &block, objects);
            if replaces != 0 {
                copy.reallocated(replaces, addr, block.timestamp_ns);
            }
            if let Some((verdicts, _)) = kernel {
                verdicts.forget(addr);
                verdicts.forget(replaces);
            }
        }
        GcChange::Freed {
            addr,
            time_ns,
            first_word,
        } => {
            copy.freed(addr, time_ns, first_word);
            if let Some((verdicts, _)) = kernel {
                verdicts.forget(addr);
            }
        }
        GcChange::Marked {
            addr,
            size,
            first_word,
        } => {
            if let Some((verdicts, _)) = kernel {
                verdicts.marked(addr, size, first_word);
            }
        }
        GcChange::Collected {
            addr, first_word, ..
        } => {
            if let Some((verdicts, _)) = kernel {
                verdicts.collected(addr, first_word);
            }
        }
        GcChange::Judged {
            epoch,
            gc_no,
            time_ns,
            kernel_ns,
        } => {
            if let Some((verdicts, summary)) = kernel {
                let collection = KernelCollection {
                    epoch,
                    gc_no,
                    now_ns: time_ns,
                    kernel_ns,
                };
                // The kernel's verdicts cannot fail to be read.
                let _ = judged_in_kernel(summary, collection, verdicts, copy);
                verdicts.applied();
            }
        }
    }
}

/// The thread that keeps the copy current.
pub(super) struct Feeder {
    pub(super) intake: Arc<Mutex<Intake>>,
    pub(super) copy: Arc<Mutex<GcCopy>>,
    /// The copy's per-kind figures when last read.
    pub(super) per_kind: [[u64; 2]; memprof_common::AllocKind::COUNT],
    /// The copy's allocated objects and records when last read.
    pub(super) allocated: (u64, u64),
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long the feeder waits on the ring (the kernel wakes it only when
/// events pile up) before reading it anyway.
const FEEDER_WAIT_MS: i32 = 10;

/// Takes a lock whether or not a thread holding it panicked.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Feeder {
    /// `in_kernel`: the kernel judges the objects, the feeder applies its
    /// verdicts (`summary`: what a pass would have started with).
    pub(super) fn start(events: GcEvents, in_kernel: Option<GcSummary>) -> Result<Feeder> {
        let fd = events.fd();
        let intake = Arc::new(Mutex::new(Intake {
            events,
            spill: Vec::new(),
            kernel: in_kernel.map(|summary| (KernelVerdicts::default(), summary)),
        }));
        // A minute back: events queued before the copy was made count
        // from before it.
        let base_ns = crate::gc::pass::monotonic_ns().saturating_sub(60_000_000_000);
        let copy = Arc::new(Mutex::new(GcCopy::starting_at(base_ns)));
        let stop = Arc::new(AtomicBool::new(false));
        let (i, c, s) = (intake.clone(), copy.clone(), stop.clone());
        // `fd` stays valid while the thread holds `intake`.
        let thread = std::thread::Builder::new()
            .name("gc-copy".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let mut intake = lock(&i);
                    // Never waits for the copy while holding the intake
                    // (the loop takes them in the other order).
                    match c.try_lock() {
                        Ok(mut copy) => {
                            intake.apply(&mut copy);
                            drop(intake);
                            copy.sort_tail();
                        }
                        Err(_) => {
                            intake.spill();
                            drop(intake);
                        }
                    }
                    // No lock is held while waiting: a thread that holds
                    // the copy and waits for the intake gets it now (held
                    // through the wait, the intake was retaken before that
                    // thread woke, for seconds at a time).
                    wait_readable(fd, FEEDER_WAIT_MS);
                }
            })?;
        Ok(Feeder {
            intake,
            copy,
            per_kind: [[0; 2]; memprof_common::AllocKind::COUNT],
            allocated: (0, 0),
            stop,
            thread: Some(thread),
        })
    }

    /// The copy, with every event queued so far applied.
    pub(super) fn current(&self) -> MutexGuard<'_, GcCopy> {
        current(&self.copy, &self.intake)
    }
}

/// The copy, with every event queued so far applied (the copy's lock is
/// taken first, as everywhere).
pub(super) fn current<'a>(
    copy: &'a Mutex<GcCopy>,
    intake: &Mutex<Intake>,
) -> MutexGuard<'a, GcCopy> {
    let mut copy = lock(copy);
    lock(intake).apply(&mut copy);
    copy
}

/// Waits until `fd` is readable (the kernel queued events), at most `timeout_ms`.
fn wait_readable(fd: std::os::fd::RawFd, timeout_ms: i32) {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, timeout_ms) };
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{LiveBlock, Site};
    use memprof_common::AllocKind;

    /// A 16-byte GC object of `kind` allocated at `addr` at `t` µs; by
    /// `GC_realloc` of `replaces` when not 0.
    fn allocated(addr: u64, kind: AllocKind, t: u64, replaces: u64) -> GcChange {
        let block = LiveBlock {
            site: Site {
                caller: 0x10,
                stack: None,
                kind,
            },
            size: 16,
            timestamp_ns: t * 1_000,
            epoch: 0,
        };
        GcChange::Allocated {
            addr,
            block,
            replaces,
            objects: 1,
            typed: None,
        }
    }

    /// A `GC_realloc` moving or growing in place an atomic object keeps it
    /// atomic, wherever the feeder's drains (and the settles between them)
    /// fall: its free of the old block comes with the new block. (Told as
    /// a free of its own, a drain could end between the two, and a settle
    /// then dropped the freed object before the realloc named it: the new
    /// block kept GC_realloc's `gc`; one string in 1,000 under load.)
    #[test]
    fn a_realloc_keeps_the_kind_whatever_the_settles_between_its_events() {
        for new in [0x200, 0x100] {
            let events = [
                allocated(0x100, AllocKind::GcAtomic, 1, 0),
                allocated(0x300, AllocKind::Gc, 2, 0),
                allocated(new, AllocKind::Gc, 3, 0x100),
            ];
            for settle_after in 0..events.len() {
                let mut copy = GcCopy::default();
                for (n, change) in events.iter().enumerate() {
                    apply(&mut copy, &mut None, change);
                    if n == settle_after {
                        copy.settle(None).unwrap();
                    }
                }
                copy.settle(None).unwrap();
                let kinds = copy.per_kind();
                assert_eq!(
                    (
                        kinds[AllocKind::GcAtomic as usize],
                        kinds[AllocKind::Gc as usize]
                    ),
                    ([1, 16], [1, 16]),
                    "realloc to {new:#x}, settled after event {settle_after}"
                );
                assert_eq!(copy.unknown_frees(), 0);
                assert_eq!(copy.len(), 2);
            }
        }
    }
}
