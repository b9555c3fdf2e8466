//! What the core tables record: sites, live blocks and their totals.
#[cfg(doc)]
use crate::{host, AllocKind, KernelCounters};

/// Stack id stored when no stack could be captured; counted in [`KernelCounters::stack_errors`].
pub const NO_STACK: u64 = u64::MAX;

/// Stack id of an allocation whose stack had no room in the stack table:
/// only its caller (the innermost frame, [`AllocSite::caller`]) is kept,
/// shown as a one-frame truncated stack; counted in
/// [`KernelCounters::stacks_degraded`] (not a loss).
pub const CALLER_ONLY: u64 = u64::MAX - 1;

/// Stack id of the overflow site of each kind: allocations whose site had
/// no room in the site table (`--max-sites`) are recorded there, with
/// caller 0 (totals and live figures stay exact, their stack is unknown);
/// counted in [`KernelCounters::sites_overflowed`].
pub const SITES_OVERFLOW: u64 = u64::MAX - 2;

/// Where an allocation was made: the user stack (frame-pointer walk, kept in
/// the `STACKS` map) plus the return address read from the stack at the probe,
/// which the frame-pointer walk misses when the allocator does not start with
/// `push %rbp`. Key of the per-site totals map, and part of every live entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocSite {
    /// Return address into the caller of the allocator function.
    pub caller: u64,
    /// Frame-pointer unwinding: id in the `STACKS` map. DWARF unwinding: key
    /// (hash of the frames) in `DWARF_STACKS`. [`NO_STACK`] if none.
    pub stack_id: u64,
    /// [`AllocKind`] as `u8`.
    pub kind: u8,
    pub _pad: [u8; 3],
    /// `attach --all`: the process's index ([`host`]); else 0.
    pub process: u32,
}

/// One live block: value of the `LIVE` map, keyed by address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LiveAlloc {
    pub site: AllocSite,
    pub size: u64,
    /// `bpf_ktime_get_ns()` at allocation (CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// GC collections seen (`GC_EPOCH`) when it was allocated: a collection
    /// judges only objects allocated before it.
    pub epoch: u64,
}

/// Blocks and bytes in `LIVE` per [`AllocKind`], changed by this CPU's
/// inserts and removes (value of the per-CPU `LIVE_BY_KIND` map; one CPU's
/// figures can be negative, their sum is what `LIVE` holds). Read in O(1)
/// for timeline samples instead of walking `LIVE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindLive {
    /// By [`AllocKind`](crate::AllocKind) byte; room for 8 so that the
    /// kernel indexes with `kind & 7`, which the verifier can bound.
    pub blocks: [i64; 8],
    pub bytes: [i64; 8],
}

impl KindLive {
    /// Adds another CPU's figures.
    pub fn add(&mut self, other: &KindLive) {
        for i in 0..8 {
            self.blocks[i] += other.blocks[i];
            self.bytes[i] += other.bytes[i];
        }
    }
}

/// Upper bounds of the lifetime histogram buckets, in nanoseconds: 100 µs,
/// 1 ms, 10 ms, 100 ms, 1 s, 10 s, 100 s; the last bucket holds the rest.
pub const LIFETIME_BOUNDS_NS: [u64; 7] = [
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    100_000_000_000,
];

/// Histogram bucket of a lifetime of `ns` nanoseconds.
#[inline(always)]
pub fn lifetime_bucket(ns: u64) -> usize {
    let mut bucket = 0;
    for bound in LIFETIME_BOUNDS_NS {
        bucket += (ns >= bound) as usize;
    }
    bucket
}

/// Everything allocated at one site over the whole run: value of the per-CPU
/// `SITE_TOTALS` map (userspace sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SiteTotals {
    pub count: u64,
    pub bytes: u64,
    /// Blocks of this site that died: freed, or (GC kinds) found dead
    /// because their address was allocated again.
    pub died: u64,
    /// Sum of their lifetimes, nanoseconds.
    pub lifetime_ns: u64,
    /// Their lifetimes by [`lifetime_bucket`].
    pub buckets: [u64; 8],
    /// GC kinds: of `died`, those proven collected by address reuse.
    pub reused: u64,
    pub reused_bytes: u64,
}

impl SiteTotals {
    /// Adds another CPU's totals, field by field.
    pub fn add(&mut self, other: &SiteTotals) {
        // Destructured, not `..`: a field added to the struct does not
        // compile until it is summed here.
        let SiteTotals {
            count,
            bytes,
            died,
            lifetime_ns,
            buckets,
            reused,
            reused_bytes,
        } = *other;
        self.count += count;
        self.bytes += bytes;
        self.died += died;
        self.lifetime_ns += lifetime_ns;
        for (mine, theirs) in self.buckets.iter_mut().zip(buckets) {
            *mine += theirs;
        }
        self.reused += reused;
        self.reused_bytes += reused_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_site_total_is_summed() {
        let one = SiteTotals {
            count: 1,
            bytes: 2,
            died: 3,
            lifetime_ns: 4,
            buckets: [5, 6, 7, 8, 9, 10, 11, 12],
            reused: 13,
            reused_bytes: 14,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(sum.count, 2);
        assert_eq!(sum.bytes, 4);
        assert_eq!(sum.died, 6);
        assert_eq!(sum.lifetime_ns, 8);
        assert_eq!(sum.buckets, [10, 12, 14, 16, 18, 20, 22, 24]);
        assert_eq!((sum.reused, sum.reused_bytes), (26, 28));
    }
}
