//! What a session counted: allocations, frees, and the events it could
//! not record ([`Counters`]).
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What could not be recorded, and totals for context. Nothing is lost
/// silently: every report prints these.
///
/// Each allocation call is counted once: either its entry could not be
/// followed to its return (`pending_full`, `stale_calls`: not in `allocs`),
/// or it is in `allocs` and then either fully recorded ([`Self::recorded`])
/// or in exactly one of `live_map_full`, `sites_map_full`, `both_maps_full`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Allocations in their stack's totals but not tracked as live: the
    /// live table was full (`--max-live`). Live figures are then lower bounds.
    pub live_map_full: u64,
    /// Allocations tracked as live but missing from their stack's totals:
    /// the site table was full (`--max-sites`).
    pub sites_map_full: u64,
    /// Allocations in neither table (both full): only counted here and in `allocs`.
    #[serde(default)]
    pub both_maps_full: u64,
    /// Allocations whose stack could not be captured (stack table full or hash collision, `--max-stacks`).
    pub stack_errors: u64,
    /// Allocation calls lost because the in-flight call table was full.
    pub pending_full: u64,
    /// Allocation calls whose return was never seen (lost).
    #[serde(default)]
    pub stale_calls: u64,
    /// Frees of blocks allocated before profiling started (or lost).
    pub unknown_frees: u64,
    /// Allocations whose return was seen, recorded or not.
    pub allocs: u64,
    pub frees: u64,
    /// Allocation calls that failed (returned NULL / MAP_FAILED).
    pub failed_allocs: u64,
    /// Allocation calls whose stack the unwinder could not follow to its
    /// end (one per call; a group is marked `truncated` per distinct stack,
    /// and also when its stack could not be captured at all).
    #[serde(default)]
    pub truncated_stacks: u64,
    /// Allocation calls whose stack had recursion folded into its innermost
    /// occurrence (DWARF unwinding without `--keep-recursion`).
    #[serde(default)]
    pub folded_stacks: u64,
    /// Allocation calls recorded under their caller alone because the stack
    /// table was full (`--max-stacks`): not a loss, a coarser stack.
    #[serde(default)]
    pub stacks_degraded: u64,
    /// Allocation calls recorded under their innermost 8 frames because the
    /// stack table was full (`--max-stacks`): not a loss, a shorter stack
    /// (marked truncated).
    #[serde(default)]
    pub stacks_shortened: u64,
    /// Allocations recorded in their kind's overflow group because the site
    /// table had no room (full at `--max-sites`, or the kernel could not
    /// allocate an entry of the on-demand table during a burst of new
    /// sites): totals exact, stack unknown.
    #[serde(default)]
    pub sites_overflowed: u64,
    /// Entries the kernel's stack table (DWARF) and site table hold at the
    /// end (`--max-stacks`, `--max-sites` are their capacities).
    #[serde(default)]
    pub stacks_stored: u64,
    #[serde(default)]
    pub sites_stored: u64,
    /// Allocation calls sampling skipped (`--sample-bytes`): not followed,
    /// not a loss; the groups' figures are estimates scaled from the others.
    #[serde(default)]
    pub unsampled_allocs: u64,
    /// Allocation calls whose return was probed: all of them, except with
    /// sampling on a kernel with uprobe sessions, where only the followed
    /// ones are (the others cost their entry probe alone).
    #[serde(default)]
    pub returns_probed: u64,
    /// Allocations recorded at their entry, their result read from the
    /// thread's cache (no return probed; see docs/how-it-works.md,
    /// "Allocations without their return").
    #[serde(default)]
    pub predicted: u64,
    /// Predictions checked against their return, and of those wrong (one
    /// wrong turns that predictor off for the rest of the session).
    #[serde(default)]
    pub predictions_checked: u64,
    #[serde(default)]
    pub predictions_wrong: u64,
    /// `--gc-sampling refill`: free-list refills recorded, each a sample
    /// standing for the objects of the list it refilled (see
    /// docs/how-it-works.md, "Sampling at the collector's refills"). Included in `allocs`.
    #[serde(default)]
    pub refills: u64,
    /// `--gc-refill-every K`: refills not followed (K - 1 in K, at
    /// random): not a loss, each followed one stands for K lists.
    #[serde(default)]
    pub refills_skipped: u64,
    /// `attach --all`: allocations of processes memprof had no room for
    /// (its process table full): not followed.
    #[serde(default)]
    pub processes_not_followed: u64,
    /// `attach --all`: stacks the kernel stopped at a file it had no rows
    /// for whose copy could not be finished in userspace (no room to send
    /// or keep it): they stay cut there (and count in `truncated_stacks`).
    #[serde(default)]
    pub stacks_not_finished: u64,
    /// `--rss`: pages sampled at their first write not recorded (the
    /// kernel's table of sampled ranges was full).
    #[serde(default)]
    pub rss_pages_untracked: u64,
    /// `--rss`: ranges unmapped or discarded too big to look through
    /// whole: pages sampled in them may still count as resident.
    #[serde(default)]
    pub rss_releases_cut: u64,
    /// `attach --all` on a kernel without the task-VMA iterator (Linux <
    /// 6.7): processes whose first module table came from memprof's
    /// reading of /proc, the kernel building none of its own: their
    /// first stacks, before it, may stop at the allocator's caller.
    #[serde(default)]
    pub tables_from_proc: u64,
    /// `attach --all`: allocations of processes memprof was refused one
    /// of their files, or the reading of their mappings, for want of a
    /// resource (descriptors, memory): counted, but their frames may be
    /// addresses and their name the kernel's short one.
    #[serde(default)]
    pub short_of_resources: u64,
    /// `attach --all`: processes that ended let go to keep memory
    /// bounded (beyond the most recent ended ones kept, the oldest
    /// first), and their allocations: in `allocs`, in no group.
    #[serde(default)]
    pub processes_evicted: u64,
    /// `attach --all`, `--comm/--exe`, `agent`: Boehm GC programs that
    /// ended before their session could attach (a program living a few
    /// milliseconds): their libc calls are followed, their GC objects
    /// not.
    #[serde(default)]
    pub gc_sessions_missed: u64,
    #[serde(default)]
    pub evicted_allocs: u64,
    /// The agent's `--examine`/`--escalate`: blocks a process's own
    /// allocator probes recorded, still live when the probes came off,
    /// and their bytes: let go then (their frees would not be seen; in
    /// `allocs` and their sites' totals, in no live figure). Sampled: the
    /// blocks they stand for, as the live figures count them.
    #[serde(default)]
    pub calls_live_let_go: u64,
    #[serde(default)]
    pub calls_live_let_go_bytes: u64,
    /// Frames whose C++ or Rust name was left mangled (shown cut): its
    /// demangled form would pass the cap (a few KiB), or it is too long
    /// to try. A name made of back-references can demangle to terabytes.
    #[serde(default)]
    pub names_left_mangled: u64,
    /// Addresses left as `module+0xOFFSET`: naming ran out of its time or
    /// memory budget, memprof was stopped while naming, or the file could
    /// not be read there.
    #[serde(default)]
    pub frames_unnamed: u64,
}

impl Counters {
    /// Counts what naming could not do.
    pub(crate) fn add_name_losses(&mut self, left_mangled: u64, unnamed: u64) {
        self.names_left_mangled += left_mangled;
        self.frames_unnamed += unnamed;
    }
}

impl Counters {
    /// Adds `other`'s counts to these (the processes of one profile).
    pub(crate) fn add(&mut self, other: &Counters) {
        let (Ok(Value::Object(mut sum)), Ok(Value::Object(more))) =
            (serde_json::to_value(&*self), serde_json::to_value(other))
        else {
            return;
        };
        for (name, n) in more {
            if let (Some(a), Some(b)) = (sum.get(&name).and_then(Value::as_u64), n.as_u64()) {
                sum.insert(name, Value::from(a.saturating_add(b)));
            }
        }
        if let Ok(added) = serde_json::from_value(Value::Object(sum)) {
            *self = added;
        }
    }

    /// Allocation calls not fully recorded, each counted once (the sum of
    /// the disjoint loss categories).
    pub fn lost_events(&self) -> u64 {
        self.live_map_full
            + self.sites_map_full
            + self.both_maps_full
            + self.pending_full
            + self.stale_calls
            + self.processes_not_followed
            + self.short_of_resources
            + self.rss_pages_untracked
    }

    /// Allocations recorded in both tables.
    pub fn recorded(&self) -> u64 {
        self.allocs
            .saturating_sub(self.live_map_full + self.sites_map_full + self.both_maps_full)
    }

    /// The live table was full at some point: live figures are lower bounds.
    pub fn live_incomplete(&self) -> bool {
        self.live_map_full + self.both_maps_full > 0
    }
}
