//! What went wrong or was dropped, counted by the kernel.
#[cfg(doc)]
use crate::{CALLER_ONLY, SHORT_FRAMES, SITES_OVERFLOW};

/// Declares [`KernelCounters`] and what is derived from its field list, so
/// adding a counter is one edit: its line in the struct.
macro_rules! counters {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $( $(#[$field_doc:meta])* pub $field:ident: u64, )*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$field_doc])* pub $field: u64, )*
        }

        impl $name {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($field)),*].len();
            /// Their names, in field order.
            pub const NAMES: [&'static str; Self::COUNT] = [$(stringify!($field)),*];

            /// Adds another CPU's counters, field by field.
            pub fn add(&mut self, other: &$name) {
                $( self.$field += other.$field; )*
            }

            /// Every counter, in field order.
            pub fn fields_mut(&mut self) -> [&mut u64; Self::COUNT] {
                [$(&mut self.$field),*]
            }
        }
    };
}

counters! {
    /// Things that went wrong or were dropped, and totals for context:
    /// the value of the per-CPU `COUNTERS` map (one entry). Nothing is lost
    /// silently: every report prints these. Userspace sums the CPUs with
    /// [`KernelCounters::add`].
    pub struct KernelCounters {
        /// An allocation counted in its site's totals but not recorded in
        /// `LIVE` (map full): its free is never matched, live figures are
        /// lower bounds. Disjoint from `sites_map_full` and `both_maps_full`.
        pub live_map_full: u64,
        /// An allocation recorded in `LIVE` whose site could not be added to
        /// `SITE_TOTALS` nor to its overflow slot: missing from the totals
        /// only. (A full site table sends sites to the overflow slot, so this
        /// stays 0 in practice.)
        pub sites_map_full: u64,
        /// `bpf_get_stackid` failed (stack map full or hash collision): site recorded without a stack.
        pub stack_errors: u64,
        /// A call could not be remembered between entry and return (`PENDING` full): allocation lost.
        pub pending_full: u64,
        /// A call remembered at entry whose return was never seen (its frame
        /// was gone when the thread made its next call): allocation lost.
        /// The stale entry is replaced, so it hides nothing after it.
        pub stale_calls: u64,
        /// An allocation neither table had room for (`LIVE` and
        /// `SITE_TOTALS` full): counted in `allocs` only.
        pub both_maps_full: u64,
        /// Frees of addresses memprof never saw allocated (made before attach, or lost).
        pub unknown_frees: u64,
        /// Allocations whose return the probes saw (recorded or not): each
        /// one is either fully recorded or in exactly one of
        /// `live_map_full`, `sites_map_full`, `both_maps_full`.
        pub allocs: u64,
        /// Frees seen (known or unknown).
        pub frees: u64,
        /// Failed allocations (NULL / MAP_FAILED returned).
        pub failed_allocs: u64,
        /// Allocation calls whose stack the DWARF unwinder could not follow
        /// to the end (one per call, not per distinct stack).
        pub truncated_stacks: u64,
        /// GC collections whose end of marking the probe saw.
        pub gc_collections: u64,
        /// Of those, collections whose collecting thread memprof could not hold
        /// for the mark-bit pass (not traced): not judged.
        pub gc_not_held: u64,
        /// GC events the ring buffer had no room for: an allocation missing
        /// from userspace's copy of the GC objects (counted in its site's
        /// totals only, never live nor judged), or a `GC_free` not seen.
        pub gc_events_lost: u64,
        /// Allocation calls whose DWARF stack had frames folded away
        /// (recursion: a function one of the last few kept frames had).
        pub folded_stacks: u64,
        /// Allocation calls whose stack had no room in the stack table
        /// (`--max-stacks`): recorded under their innermost
        /// [`SHORT_FRAMES`] frames in the short-stack table, marked
        /// truncated. Not a loss: attribution is coarser.
        pub stacks_shortened: u64,
        /// Allocation calls whose stack had no room in the stack table nor
        /// in the short-stack table: recorded under their caller alone
        /// ([`CALLER_ONLY`]). Not a loss: attribution is coarser.
        pub stacks_degraded: u64,
        /// Allocations whose site had no room in the site table
        /// (`--max-sites`): recorded in their kind's overflow site
        /// ([`SITES_OVERFLOW`]), totals exact, stack unknown.
        pub sites_overflowed: u64,
        /// Entries added to the stack table (DWARF) and the site table: how
        /// full they are.
        pub stacks_stored: u64,
        pub sites_stored: u64,
        /// Allocation calls not followed because sampling skipped them
        /// (`--sample-bytes`): not a loss, the reports scale the sampled
        /// ones. Includes calls made inside another allocator call (a
        /// `realloc(NULL, n)` calling `malloc`): sampling draws first.
        pub unsampled_allocs: u64,
        /// Allocation calls whose return the kernel probed: every call with
        /// the pair of programs; with a uprobe session (sampling), only
        /// those the entry followed.
        pub returns_probed: u64,
        /// Allocations recorded at their entry, their result read from the
        /// thread's cache ([`Predict`](crate::Predict)): no return probed.
        pub predicted: u64,
        /// Predictions checked against the return (the first ones, then
        /// one in [`PREDICT_CHECK_EVERY`](crate::PREDICT_CHECK_EVERY)).
        pub predictions_checked: u64,
        /// Of those, wrong: that predictor is then off for the session.
        pub predictions_wrong: u64,
        /// `--gc-sampling refill`: free-list refills recorded, each a sample
        /// standing for the objects of the list (counted in `allocs`).
        pub refills: u64,
        /// `--gc-refill-every K`: free-list refills not followed (K - 1 in
        /// K, at random): not a loss, each followed one stands for K lists.
        pub refills_skipped: u64,
        /// GC objects the kernel's table of objects to judge
        /// ([`globals::GC_VERDICTS`](crate::globals::GC_VERDICTS)) had no room for: never judged, they
        /// count as live until freed or their address is reused.
        pub gc_unjudged: u64,
        /// Verdicts the kernel could not reach (the collector's memory
        /// unreadable, or a block index chain longer than it follows): the
        /// object stays live until the next collection.
        pub gc_verdicts_failed: u64,
        /// `attach --all`: allocations of processes that got no index
        /// (the process table full, or every index given): not followed.
        pub processes_not_followed: u64,
        /// `attach --all`: module tables the kernel could not build
        /// itself (no free segment, or the process's memory map busy):
        /// the process waited for userspace's, its first stacks may be
        /// cut short.
        pub tables_not_built: u64,
        /// `attach --all`: stacks cut at a file the kernel had no rows
        /// for whose copy could not be sent for unwinding in userspace
        /// (`DEFERRED_STACKS` full): they stay cut there.
        pub deferred_lost: u64,
        /// A page sampled at its first write (`rss`) not recorded: the
        /// table of sampled ranges (`RSS_CHUNKS`) was full.
        pub rss_pages_untracked: u64,
        /// A range unmapped or discarded too big to look through whole
        /// (`rss`): pages of it sampled before may still count as
        /// resident.
        pub rss_releases_cut: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_counter_is_summed() {
        for i in 0..KernelCounters::COUNT {
            let mut one = KernelCounters::default();
            *one.fields_mut()[i] = 1;
            let mut sum = one;
            sum.add(&one);
            let summed: Vec<u64> = sum.fields_mut().into_iter().map(|v| *v).collect();
            let mut expected = vec![0; KernelCounters::COUNT];
            expected[i] = 2;
            assert_eq!(summed, expected, "counter {}", KernelCounters::NAMES[i]);
        }
        // Plain u64 fields, nothing else: the map value is exactly the counters.
        assert_eq!(
            core::mem::size_of::<KernelCounters>(),
            8 * KernelCounters::COUNT
        );
    }
}
