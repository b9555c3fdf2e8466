//! Sampling (`--sample-bytes N`): which allocation calls are followed.
use aya_ebpf::{
    helpers::bpf_get_prandom_u32,
    macros::map,
    maps::{Array, PerCpuArray},
};
use memprof_common::{host, op, SAMPLE_QUANTILES};

use crate::counters::bump;
use crate::gc_copy::is_gc;
use crate::host::known_process;
use crate::record::LIVE;
use crate::settings::{GC_REFILL, SAMPLING};

/// Bytes to the next sample point, per CPU (0: not drawn yet).
#[map]
static SAMPLE_COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Distances between sample points (see `sample_distance`).
#[map]
static SAMPLE_DISTANCES: Array<u64> = Array::with_max_entries(SAMPLE_QUANTILES, 0);

/// Whether a call entering (`kind`, `size` bytes, `op` with `arg_ptr`)
/// is followed: `None`, not at all (no stack, no return probe work);
/// `Some(0)`, followed; `Some(1)`, not sampled but followed, as a realloc
/// of a tracked block (its return must still release it), recording
/// nothing.
#[inline(always)]
pub(crate) fn draw(kind: u8, size: u64, op: u8, arg_ptr: u64) -> Option<u8> {
    let refill_every = GC_REFILL.load();
    if refill_every != 0 && is_gc(kind) {
        // GC allocations are sampled at refills, not by bytes: one refill
        // in K at random (`--gc-refill-every`), the others cost only the
        // entry probe's trap.
        if op == op::REFILL && refill_every > 1 && refill_skipped(refill_every) {
            bump(|c| &mut c.refills_skipped);
            return None;
        }
        return Some(0);
    }
    if SAMPLING.load() != 1 || sampled(size) {
        return Some(0);
    }
    bump(|c| &mut c.unsampled_allocs);
    let tracked = op == op::REALLOC
        && arg_ptr != 0
        && known_process()
            .is_some_and(|index| LIVE.get_ptr(&host::live_key(arg_ptr, index)).is_some());
    tracked.then_some(1)
}

/// `--gc-refill-every K`: whether this refill is one of the K - 1 in K
/// not followed (each followed one stands for K lists, `refill_objects`).
#[inline(always)]
fn refill_skipped(every: u32) -> bool {
    let draw = unsafe { bpf_get_prandom_u32() };
    draw % every != 0
}

/// Whether a page written for the first time (`--rss`, `size` bytes) is
/// followed: the same draw as an allocation's, every one without
/// sampling.
#[inline(always)]
pub(crate) fn page_sampled(size: u64) -> bool {
    SAMPLING.load() != 1 || sampled(size)
}

/// Sampling (`--sample-bytes N`): whether an allocation of `size` bytes
/// is followed. Sample points are a Poisson process over the bytes
/// allocated (on this CPU), with mean distance N: an allocation is
/// followed when the next point falls within it, then the distance to
/// the next is drawn afresh (memoryless), so each allocation is
/// followed with probability 1 - exp(-size/N), independently.
#[inline(always)]
fn sampled(size: u64) -> bool {
    let Some(left) = SAMPLE_COUNTDOWN.get_ptr_mut(0) else {
        return true;
    };
    let mut remaining = unsafe { *left };
    if remaining == 0 {
        remaining = sample_distance(); // this CPU's first allocation
    }
    let followed = size >= remaining;
    unsafe {
        *left = if followed {
            sample_distance()
        } else {
            remaining - size
        }
    };
    followed
}

/// A distance to the next sample point: userspace fills
/// `SAMPLE_DISTANCES` with equal-probability slices of an exponential
/// distribution of mean N (no floating point here).
#[inline(always)]
fn sample_distance() -> u64 {
    let i = unsafe { bpf_get_prandom_u32() } % SAMPLE_QUANTILES;
    SAMPLE_DISTANCES.get(i).copied().unwrap_or(1).max(1)
}
