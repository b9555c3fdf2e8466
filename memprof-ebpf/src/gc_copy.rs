//! Userspace's copy of the Boehm GC objects (`GC_COPY`): while memprof
//! reads the collector's mark bits, GC objects are not put in `LIVE`;
//! their allocations and frees are streamed to `GC_EVENTS`, and memprof's
//! copy is the only record (their number is not bounded by `LIVE`'s size;
//! the copy sums their per-site totals, they are not in `SITE_TOTALS`).
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, generated as gen},
    macros::map,
    maps::RingBuf,
};
use memprof_common::{AllocKind, GcEvent, LiveAlloc, PendingCall, ThreadClock};

use crate::counters::bump;
use crate::settings::GC_COPY;

/// GC objects allocated and freed, for userspace's copy (size set by userspace).
#[map]
static GC_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 12, 0);
/// Queued GC event bytes at which the reader is woken (see `gc_event`).
const GC_EVENTS_WAKE_BYTES: u64 = 1 << 20;

#[inline(always)]
pub(crate) fn is_gc(kind: u8) -> bool {
    kind == AllocKind::Gc as u8 || kind == AllocKind::GcAtomic as u8
}

/// Whether blocks of `kind` live in userspace's copy, not in `LIVE`.
#[inline(always)]
pub(crate) fn in_copy(kind: u8) -> bool {
    is_gc(kind) && GC_COPY.load() == 1
}

/// The time of a GC object's allocation: the thread's last clock read
/// while the jiffy and the collection count are the same (a clock read
/// is a quarter of the return probe's time here), so up to a jiffy old.
/// That is finer than GC lifetimes (an object is found dead at a
/// collection), and keeps what userspace's copy needs: times follow
/// the thread's order, and every time of an epoch is later than every
/// time of the epochs before (a new epoch reads the clock). A
/// `GC_realloc` (`fresh`) reads it: its object is matched to the one it
/// replaced, which another thread may have made, by time.
#[inline(always)]
pub(crate) fn gc_time(slot: *mut PendingCall, epoch: u64, fresh: bool) -> u64 {
    let jiffies = unsafe { gen::bpf_jiffies64() };
    let clock = unsafe { &mut (*slot).clock };
    if !fresh && clock.jiffies == jiffies && clock.epoch == epoch {
        return clock.ns;
    }
    let ns = unsafe { bpf_ktime_get_ns() };
    *clock = ThreadClock { ns, jiffies, epoch };
    ns
}

/// The thread's previous GC object (`slot`'s) and its first word, if it
/// was allocated in `epoch` and is not the block `replaces` frees (its
/// first word is the collector's then); (0, 0) otherwise. A collection
/// since then was held, and memprof read it there, while it still held
/// it: a collected object's memory is reused.
#[inline(always)]
pub(crate) fn previous_word(slot: *mut PendingCall, epoch: u64, replaces: u64) -> (u64, u32) {
    let (last, last_epoch) = unsafe { ((*slot).last_gc, (*slot).last_gc_epoch) };
    if last == 0 || last_epoch != epoch || last == replaces {
        return (0, 0);
    }
    match unsafe { bpf_probe_read_user(last as *const u32) } {
        Ok(word) => (last, word),
        Err(_) => (0, 0),
    }
}

/// Tells userspace's copy of the GC objects; `typed`: an earlier object's
/// first word ([`previous_word`]).
#[inline(always)]
pub(crate) fn gc_event(
    addr: u64,
    op: u8,
    object: &LiveAlloc,
    replaces: u64,
    objects: u16,
    typed: (u64, u32),
) {
    let event = GcEvent {
        addr,
        caller: object.site.caller,
        stack_id: object.site.stack_id,
        size: object.size,
        timestamp_ns: object.timestamp_ns,
        replaces,
        typed: typed.0,
        epoch: object.epoch as u32,
        typed_word: typed.1,
        kind: object.site.kind,
        op,
        _pad: 0,
        objects,
    };
    send_gc_event(&event);
}

/// Queues `event` for userspace's copy; whether there was room (an
/// event the ring had none for is counted).
#[inline(always)]
pub(crate) fn send_gc_event(event: &GcEvent) -> bool {
    // Waking the reader for every event would cost a wakeup per
    // allocation: it reads every few ms by itself, and is woken only
    // when the queued events cross `GC_EVENTS_WAKE_BYTES`.
    let queued = GC_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let flags = if (GC_EVENTS_WAKE_BYTES..GC_EVENTS_WAKE_BYTES + 4096).contains(&queued) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if GC_EVENTS.output::<GcEvent>(event, flags as u64).is_err() {
        bump(|c| &mut c.gc_events_lost);
        return false;
    }
    true
}
