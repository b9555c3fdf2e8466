//! Reading an allocator's result at its entry ([`Predict`]): a small
//! request is served from the calling thread's cache (Boehm's free lists,
//! glibc's tcache), whose head for the request's class is the result. A
//! trusted prediction records the allocation at the entry, and a uprobe
//! session then skips the return probe; the first ones are checked
//! against the returns.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::Array,
};
use memprof_common::{
    predict, predictor, AllocKind, PendingCall, Predict, GC_FREELIST_COUNTS, GC_TINY_FREELISTS,
    PREDICT_CHECK_EVERY, PREDICT_TRUST_AFTER, TCACHE_BINS,
};

use crate::counters::{bump, COUNTERS};
use crate::gc::GC_EPOCH;
use crate::gc_copy::is_gc;
use crate::record::record;
use memprof_common::{RUN_RETURN, SKIP_RETURN};

/// How allocators' results are read at their entry, per predictor
/// ([`Predict`]): written by userspace once attached.
#[map]
static PREDICT: Array<Predict> = Array::with_max_entries(predictor::COUNT, 0);

/// A followed call of an allocator with a thread cache, in `slot`:
/// its result predicted from that cache and, trusted, recorded now
/// with no return to probe; else checked at the return. Its own
/// function: its stack is not the unwinder's.
#[inline(never)]
pub(crate) fn predict_call(slot: *mut PendingCall, kind: u8, size: u64) -> u32 {
    let (addr, trusted) = predicted(slot, kind, size);
    if !trusted {
        unsafe { (*slot).predicted = addr };
        return RUN_RETURN;
    }
    unsafe { (*slot).active = 0 };
    bump(|c| &mut c.predicted);
    record(addr, unsafe { &*slot }, 0, slot, 1);
    SKIP_RETURN
}

/// The predictor of allocations of `kind` ([`predictor`]).
#[inline(always)]
fn predictor_of(kind: u8) -> u32 {
    if is_gc(kind) {
        predictor::GC
    } else {
        predictor::MALLOC
    }
}

/// The result of a call of `size` bytes entering now, read from the
/// thread's cache (0 if it has none for the size), and whether it is
/// trusted: recorded at the entry. See [`Predict`].
#[inline(always)]
fn predicted(slot: *mut PendingCall, kind: u8, size: u64) -> (u64, bool) {
    let which = predictor_of(kind);
    let Some(p) = PREDICT.get_ptr(which) else {
        return (0, false);
    };
    let p = unsafe { &*p };
    if p.state == predict::OFF {
        return (0, false);
    }
    let head = if which == predictor::GC {
        gc_list_head(slot, p, kind, size)
    } else {
        tcache_head(slot, p, size)
    };
    if head == 0 {
        return (0, false);
    }
    let result = unsafe { bpf_probe_read_user(head as *const u64) }.unwrap_or(0);
    // Boehm: a word at or below the counts is a count (the slow path);
    // glibc: an empty bin is NULL, a chunk is 16-aligned.
    let object = if which == predictor::GC {
        result > GC_FREELIST_COUNTS
    } else {
        result != 0 && result & 15 == 0
    };
    if !object {
        return (0, false);
    }
    // Every prediction counts in one of the two: each
    // `PREDICT_CHECK_EVERY`th on this CPU is checked.
    let trusted = p.state == predict::TRUSTED
        && COUNTERS.get_ptr(0).is_some_and(|c| unsafe {
            ((*c).predicted + (*c).predictions_checked) % PREDICT_CHECK_EVERY != 0
        });
    (result, trusted)
}

/// Boehm: where the head of the thread's free list for `size` bytes
/// of `kind` is (`_freelists[kind][granules]`; 0: none).
#[inline(always)]
fn gc_list_head(slot: *mut PendingCall, p: &Predict, kind: u8, size: u64) -> u64 {
    let granules = (size + 15 + p.extra_bytes) >> 4;
    if granules >= GC_TINY_FREELISTS {
        return 0;
    }
    let key = cached_address(slot, p, predictor::GC);
    if key == 0 {
        return 0;
    }
    let tlfs = unsafe { bpf_probe_read_user(key as *const u64) }.unwrap_or(0);
    if tlfs <= GC_FREELIST_COUNTS {
        return 0; // the thread is not (or no longer) the collector's
    }
    // PTRFREE (0) for atomic objects, NORMAL (1).
    let list = if kind == AllocKind::GcAtomic as u8 {
        0
    } else {
        1
    };
    tlfs + (list * GC_TINY_FREELISTS + granules) * 8
}

/// glibc: where `tcache->entries[idx]` for `size` bytes is (0: none).
#[inline(always)]
fn tcache_head(slot: *mut PendingCall, p: &Predict, size: u64) -> u64 {
    // `request2size` and `csize2tidx`: chunks of 32, 48, … bytes.
    if size > 1 << 32 {
        return 0;
    }
    let chunk = if size + 23 < 32 {
        32
    } else {
        (size + 23) & !15
    };
    let idx = (chunk - 17) >> 4;
    if idx >= TCACHE_BINS {
        return 0;
    }
    let var = cached_address(slot, p, predictor::MALLOC);
    if var == 0 {
        return 0;
    }
    let tcache = unsafe { bpf_probe_read_user(var as *const u64) }.unwrap_or(0);
    if tcache == 0 {
        return 0; // not made yet, or freed as the thread ends
    }
    tcache + TCACHE_BINS * 2 + idx * 8
}

/// The address of the thread's cache variable for predictor `which`
/// (0: not found), found once per thread and kept in its slot; not
/// found, tried again after the next collection.
#[inline(always)]
fn cached_address(slot: *mut PendingCall, p: &Predict, which: u32) -> u64 {
    let known = unsafe {
        if which == predictor::GC {
            (*slot).gc_key
        } else {
            (*slot).tcache
        }
    };
    if known > 1 {
        return known;
    }
    let epoch = GC_EPOCH.get(0).copied().unwrap_or(0);
    if known == 1 && unsafe { (*slot).found_epoch } == epoch {
        return 0;
    }
    let found = find_cache_variable(p, which).unwrap_or(1);
    unsafe {
        if which == predictor::GC {
            (*slot).gc_key = found;
        } else {
            (*slot).tcache = found;
        }
        (*slot).found_epoch = epoch;
    }
    if found > 1 {
        found
    } else {
        0
    }
}

/// The current thread's `GC_thread_key` (fs base, TLS vector, libgc's
/// block) or `tcache` (fs base + the offset in glibc's GOT).
#[inline(always)]
fn find_cache_variable(p: &Predict, which: u32) -> Option<u64> {
    let task = unsafe { bpf_get_current_task() };
    let fsbase: u64 =
        unsafe { bpf_probe_read_kernel((task + p.fsbase_offset) as *const u64) }.ok()?;
    if fsbase == 0 {
        return None;
    }
    if which == predictor::MALLOC {
        let offset: u64 = unsafe { bpf_probe_read_user(p.slot as *const u64) }.ok()?;
        return Some(fsbase.wrapping_add(offset));
    }
    let dtv: u64 = unsafe { bpf_probe_read_user((fsbase + 8) as *const u64) }.ok()?;
    let module: u64 = if p.slot == 0 {
        p.module_id
    } else {
        unsafe { bpf_probe_read_user(p.slot as *const u64) }.ok()?
    };
    if module == 0 || module > 1 << 16 {
        return None;
    }
    // glibc's dtv entries are 16 bytes, the block's address first;
    // -1 (unallocated) until the thread first touches it.
    let block: u64 = unsafe { bpf_probe_read_user((dtv + module * 16) as *const u64) }.ok()?;
    if block == 0 || block == u64::MAX {
        return None;
    }
    Some(block + p.tls_offset)
}

/// At the return of a call whose result was predicted: whether it was
/// right. Trusted after `PREDICT_TRUST_AFTER` right; off at the first wrong.
#[inline(always)]
pub(crate) fn check_prediction(kind: u8, predicted: u64, addr: u64) {
    bump(|c| &mut c.predictions_checked);
    let Some(p) = PREDICT.get_ptr_mut(predictor_of(kind)) else {
        return;
    };
    if predicted != addr {
        bump(|c| &mut c.predictions_wrong);
        unsafe { (*p).state = predict::OFF };
        return;
    }
    // Every CPU adds to one count (its read after is close enough):
    // BPF's atomic add (core has no 64-bit atomics for BPF).
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) core::ptr::addr_of_mut!((*p).matched),
            v = in(reg) 1u64,
        )
    };
    let matched = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*p).matched)) };
    if matched >= PREDICT_TRUST_AFTER && unsafe { (*p).state } == predict::CHECKING {
        unsafe { (*p).state = predict::TRUSTED };
    }
}
