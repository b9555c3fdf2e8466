//! What every program reads or writes first: `ENABLED`, the switch that
//! stops them all at once, and `COUNTERS`, what each counts (and what it
//! could not record). Below every other file: they all use it.
use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
};
use memprof_common::KernelCounters;

/// 1 while recording; userspace clears it to stop every program at once.
#[map]
pub(crate) static ENABLED: Array<u32> = Array::with_max_entries(1, 0);
/// One entry per CPU: see `bump`.
#[map]
pub(crate) static COUNTERS: PerCpuArray<KernelCounters> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub(crate) fn enabled() -> bool {
    ENABLED.get(0).is_some_and(|&on| on == 1)
}

/// Adds one to a counter: `bump(|c| &mut c.allocs)`.
#[inline(always)]
pub(crate) fn bump(counter: impl FnOnce(&mut KernelCounters) -> &mut u64) {
    if let Some(counters) = COUNTERS.get_ptr_mut(0) {
        // Per-CPU value: no other CPU writes it.
        unsafe { *counter(&mut *counters) += 1 };
    }
}
