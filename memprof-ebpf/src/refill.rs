//! Weighing a Boehm free-list refill (`--gc-sampling refill`, [`Refill`]):
//! `GC_generic_malloc_many` hands out a list of `N` objects of `lb` bytes;
//! the allocation that ran the list out is the sample, and stands for them.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::map, maps::Array, programs::ProbeContext};
use memprof_common::{PendingCall, Refill};

use crate::counters::bump;
use crate::record::record;
use crate::settings::GC_REFILL;

/// How a free-list refill is weighed (`--gc-sampling refill`,
/// [`Refill`]): written by userspace once attached.
#[map]
static REFILL: Array<Refill> = Array::with_max_entries(1, 0);

/// A refill's sample size: what the allocation that ran the list out
/// asked for, in the caller's register ([`Refill::size_reg`]), else
/// the list's object size. `pt_regs` is read at constant offsets only.
#[inline(always)]
pub(crate) fn requested_size(ctx: &ProbeContext) -> u64 {
    let regs = unsafe { &*ctx.regs };
    let lb = regs.rdi;
    let Some(r) = REFILL.get(0) else { return lb };
    let size = match r.size_reg {
        0 => regs.r15,
        1 => regs.r14,
        2 => regs.r13,
        3 => regs.r12,
        4 => regs.rbp,
        5 => regs.rbx,
        _ => lb,
    };
    // Never more than the object holds.
    if size == 0 || size > lb {
        lb
    } else {
        size
    }
}

/// The collector's `GC_bytes_allocd` now (`u64::MAX`: not known).
#[inline(never)]
pub(crate) fn bytes_allocd() -> u64 {
    let Some(r) = REFILL.get(0) else {
        return u64::MAX;
    };
    if r.on != 1 {
        return u64::MAX;
    }
    let arrays = if r.arrays_in_slot == 1 {
        match unsafe { bpf_probe_read_user(r.arrays as *const u64) } {
            Ok(a) => a,
            Err(_) => return u64::MAX,
        }
    } else {
        r.arrays
    };
    unsafe { bpf_probe_read_user(arrays.wrapping_add(r.bytes_allocd) as *const u64) }
        .unwrap_or(u64::MAX)
}

/// The objects a refill handed out, its list's head at `head` (see
/// [`Refill`]): the rise of `GC_bytes_allocd` over `lb` (after a
/// collection inside the call, what was allocated since), at most the
/// objects from the head's block start to the head; at least 1. Times K
/// when one refill in K is followed (`--gc-refill-every`).
#[inline(never)]
fn refill_objects(lb: u64, before: u64, head: u64) -> u16 {
    let lb = lb.max(1);
    let log = match REFILL.get(0) {
        Some(r) if r.on == 1 => r.log_hblksize & 31,
        _ => 12,
    };
    let mut n = (head & ((1u64 << log) - 1)) / lb + 1;
    if before != u64::MAX {
        let after = bytes_allocd();
        if after != u64::MAX {
            let allocd = if after >= before {
                after - before
            } else {
                after
            };
            n = n.min(allocd / lb);
        }
    }
    let every = u64::from(GC_REFILL.load().max(1));
    (n.max(1) * every).min(u16::MAX as u64) as u16
}

/// The return of a refill (`call`, in the thread's `slot`): the new list's
/// head is the object the allocation that ran the list out gets (the
/// collector takes it right after), recorded for the objects of the list.
#[inline(always)]
pub(crate) fn record_refill(call: &PendingCall, slot: *mut PendingCall) {
    let head = unsafe { bpf_probe_read_user(call.arg_ptr as *const u64) }.unwrap_or(0);
    if head == 0 {
        bump(|c| &mut c.failed_allocs);
        return;
    }
    let objects = refill_objects(call.refill_lb, call.allocd_before, head);
    bump(|c| &mut c.refills);
    record(head, call, 0, slot, objects);
}
