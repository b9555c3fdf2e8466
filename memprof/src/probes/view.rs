//! A read-only view of the kernel's tables: live blocks, per-site totals,
//! stacks and counters, in userspace types.
//!
//! This is the boundary. The kernel's records ([`AllocSite`],
//! [`LiveAlloc`], per-CPU [`SiteTotals`] and [`KernelCounters`]) are
//! converted here, once: a site becomes a [`Site`] (its kind an
//! [`AllocKind`], a kind byte no kind has is an error), per-CPU values are
//! summed, and the counters become the profile's [`Counters`]. The rest of
//! memprof never sees a kernel key.
use anyhow::Result;
use aya::maps::{HashMap, Map, MapData, PerCpuArray, PerCpuValues, StackTraceMap};
use memprof_common::{
    maps, AllocKind, AllocSite, DwarfStack, KernelCounters, KindLive, LiveAlloc, SiteTotals,
    CALLER_ONLY, NO_STACK, SITES_OVERFLOW,
};

use super::Probes;
use crate::profile::Counters;

/// Where an allocation was made: the userspace form of the kernel's
/// [`AllocSite`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// Return address into the caller of the allocator function (0 if unread).
    pub caller: u64,
    /// Key of the stack in the kernel's stack table ([`HeapMaps::stack`]);
    /// `None` if no stack could be captured.
    pub stack: Option<u64>,
    pub kind: AllocKind,
}

impl TryFrom<&AllocSite> for Site {
    type Error = anyhow::Error;

    fn try_from(site: &AllocSite) -> Result<Site> {
        Ok(Site {
            caller: site.caller,
            stack: (site.stack_id != NO_STACK).then_some(site.stack_id),
            kind: AllocKind::try_from(site.kind)?,
        })
    }
}

/// One live block (the kernel's [`LiveAlloc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub site: Site,
    /// Requested size in bytes.
    pub size: u64,
    /// When it was allocated (CLOCK_MONOTONIC, nanoseconds).
    pub timestamp_ns: u64,
    /// GC collections seen when it was allocated.
    pub epoch: u64,
}

impl TryFrom<&LiveAlloc> for LiveBlock {
    type Error = anyhow::Error;

    fn try_from(live: &LiveAlloc) -> Result<LiveBlock> {
        Ok(LiveBlock {
            site: Site::try_from(&live.site)?,
            size: live.size,
            timestamp_ns: live.timestamp_ns,
            epoch: live.epoch,
        })
    }
}

/// A stack as the kernel recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedStack {
    /// From the DWARF unwinder: return addresses from the allocator's
    /// caller outwards; `folded`: recursion folded into its innermost
    /// occurrence.
    Unwound {
        frames: Vec<u64>,
        truncated: bool,
        folded: bool,
    },
    /// The stack table had no room: the allocator's caller alone
    /// ([`CALLER_ONLY`]).
    CallerOnly,
    /// Not a stack: the kind's overflow site, allocations the site table
    /// had no room for ([`SITES_OVERFLOW`]).
    Overflow,
    /// From the frame-pointer walk: starts at the probed instruction, and
    /// may miss the caller. Empty if the stack table no longer has it.
    Walked(Vec<u64>),
    /// The DWARF stack table does not have it.
    Missing,
}

/// A [`DwarfStack`] as kept in userspace: its frames only.
struct Unwound {
    frames: Box<[u64]>,
    truncated: bool,
    folded: bool,
}

impl From<&DwarfStack> for Unwound {
    fn from(s: &DwarfStack) -> Unwound {
        Unwound {
            frames: s.frames[..(s.len as usize).min(s.frames.len())].into(),
            truncated: s.truncated != 0,
            folded: s.folded != 0,
        }
    }
}

/// The maps, kept after the programs are detached so they can be read.
pub struct HeapMaps {
    /// `LIVE` and `SITE_TOTALS`, read whole, in batches.
    live: MapData,
    sites: MapData,
    /// Per kind, the sites `sites` had no room for.
    overflow: PerCpuArray<MapData, SiteTotals>,
    stacks: StackTraceMap<MapData>,
    dwarf_stacks: HashMap<MapData, u64, DwarfStack>,
    /// Stacks cut to their innermost frames (`dwarf_stacks` was full).
    short_stacks: HashMap<MapData, u64, DwarfStack>,
    /// Both stack tables, for [`HeapMaps::stack`] to read whole, in batches,
    /// at its first call (76,000 stacks of the Crystal compiler: 0.4 s one
    /// by one); each is handed out once, then looked up on its own.
    stack_tables: [MapData; 2],
    read_stacks: std::sync::Mutex<Option<std::collections::HashMap<u64, Unwound>>>,
    /// Stacks were unwound with the CFI tables (`dwarf_stacks`), not frame pointers.
    dwarf: bool,
    /// Allocations were sampled with this mean distance (`--sample-bytes`); 0: all followed.
    pub sample_bytes: u64,
    /// GC allocations were sampled at refills, not by `sample_bytes`.
    pub gc_refill: bool,
    /// `--gc-sampling refill`: where `GC_malloc_kind` is in the target. A
    /// refill's stack starts with its frame (the kernel unwinds from the
    /// refill), left out here so that samples and exact allocations of
    /// one stack are one group.
    pub refill_frame: Option<std::ops::Range<u64>>,
    counters: PerCpuArray<MapData, KernelCounters>,
    live_by_kind: PerCpuArray<MapData, KindLive>,
    /// `attach --all`: one process's blocks and sites, taken out of the
    /// tables ([`Probes::take_ended`]); read instead of the tables.
    only: Option<super::Prefetched>,
    /// `attach --all`: stacks the kernel stopped at a file it had no rows
    /// for, finished in userspace: by key, the callers that follow its
    /// frames, and whether it is still cut short.
    finished: Option<Finished>,
}

/// Stacks finished in userspace, by key: the callers that follow the
/// kernel's frames, and whether the stack is still cut short.
pub type Finished = std::sync::Arc<std::collections::HashMap<u64, (Vec<u64>, bool)>>;

impl HeapMaps {
    /// Every live block, by address. An entry can fail to read when the
    /// block is freed between reading its key and its value.
    pub fn live(&self) -> Box<dyn Iterator<Item = Result<(u64, LiveBlock)>> + '_> {
        if let Some(only) = &self.only {
            return Box::new(only.live.iter().map(|&entry| Ok(entry)));
        }
        let mut blocks = Vec::new();
        if let Err(e) = super::batch::read_hash(&self.live, |addr: u64, live: LiveAlloc| {
            blocks.push(LiveBlock::try_from(&live).map(|block| (addr, block)));
        }) {
            blocks.push(Err(e));
        }
        Box::new(blocks.into_iter())
    }

    /// The view of one process of `attach --all` (`only`: its tables).
    pub fn of_process(mut self, only: super::Prefetched) -> HeapMaps {
        self.only = Some(only);
        self
    }

    /// With the stacks finished in userspace (`attach --all`).
    pub fn with_finished(mut self, finished: Finished) -> HeapMaps {
        self.finished = Some(finished);
        self
    }

    /// Every site with its totals, summed over CPUs; then each kind's
    /// overflow site, if it has any.
    pub fn sites(&self) -> Box<dyn Iterator<Item = Result<(Site, SiteTotals)>> + '_> {
        if let Some(only) = &self.only {
            return Box::new(only.sites.iter().map(|&entry| Ok(entry)));
        }
        let sum = |per_cpu: &PerCpuValues<SiteTotals>| {
            let mut sum = SiteTotals::default();
            for totals in per_cpu.iter() {
                sum.add(totals);
            }
            sum
        };
        let overflow = AllocKind::ALL.into_iter().filter_map(move |kind| {
            let totals = match self.overflow.get(&(kind as u32), 0) {
                Ok(per_cpu) => sum(&per_cpu),
                Err(e) => return Some(Err(e.into())),
            };
            let site = Site {
                caller: 0,
                stack: Some(SITES_OVERFLOW),
                kind,
            };
            (totals.count > 0).then_some(Ok((site, totals)))
        });
        let mut sites = Vec::new();
        let read = super::batch::read_per_cpu_hash(
            &self.sites,
            |site: AllocSite, per_cpu: &mut dyn Iterator<Item = SiteTotals>| {
                let mut totals = SiteTotals::default();
                per_cpu.for_each(|cpu| totals.add(&cpu));
                sites.push(Site::try_from(&site).map(|site| (site, totals)));
            },
        );
        if let Err(e) = read {
            sites.push(Err(e));
        }
        Box::new(sites.into_iter().chain(overflow))
    }

    /// The stack stored under `key` ([`Site::stack`]).
    pub fn stack(&self, key: u64) -> RecordedStack {
        if key == CALLER_ONLY {
            RecordedStack::CallerOnly
        } else if key == SITES_OVERFLOW {
            RecordedStack::Overflow
        } else if self.dwarf {
            // A stack the table had no room for is in the short-stack table.
            let found = self.read_stack(key).or_else(|| {
                self.dwarf_stacks
                    .get(&key, 0)
                    .or_else(|_| self.short_stacks.get(&key, 0))
                    .ok()
                    .map(|s| Unwound::from(&s))
            });
            let finished = self.finished.as_ref().and_then(|f| f.get(&key));
            match found {
                Some(Unwound {
                    frames,
                    truncated,
                    folded,
                }) => {
                    let mut frames = frames.into_vec();
                    let mut truncated = truncated;
                    if let Some((callers, cut)) = finished {
                        frames.extend_from_slice(callers);
                        truncated = *cut;
                    }
                    RecordedStack::Unwound {
                        frames,
                        truncated,
                        folded,
                    }
                }
                None => RecordedStack::Missing,
            }
        } else {
            RecordedStack::Walked(
                u32::try_from(key)
                    .ok()
                    .and_then(|id| self.stacks.get(&id, 0).ok())
                    .map(|s| s.frames().iter().map(|f| f.ip).collect())
                    .unwrap_or_default(),
            )
        }
    }

    /// Stack `key` from the tables read whole (the first call reads them;
    /// `attach --all`'s view of one process does not: a lookup each).
    fn read_stack(&self, key: u64) -> Option<Unwound> {
        if self.only.is_some() {
            return None;
        }
        let mut read = self.read_stacks.lock().ok()?;
        let stacks = read.get_or_insert_with(|| {
            let mut all = std::collections::HashMap::new();
            for table in &self.stack_tables {
                // A table that cannot be read is looked up key by key.
                let _ = super::batch::read_hash(table, |key: u64, stack: DwarfStack| {
                    all.entry(key).or_insert_with(|| Unwound::from(&stack));
                });
            }
            all
        });
        stacks.remove(&key)
    }

    /// `[blocks, bytes]` in the live table per kind (indexed by
    /// [`AllocKind`]), in O(1): the kernel's per-kind totals, summed over CPUs.
    pub fn live_by_kind(&self) -> Result<[[u64; 2]; memprof_common::AllocKind::COUNT]> {
        let mut sum = KindLive::default();
        for cpu in self.live_by_kind.get(&0, 0)?.iter() {
            sum.add(cpu);
        }
        Ok(std::array::from_fn(|k| {
            [sum.blocks[k].max(0) as u64, sum.bytes[k].max(0) as u64]
        }))
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        Ok(report_counters(sum_per_cpu(&self.counters)?))
    }
}

impl Probes {
    /// Second handles on the kernel's tables while the probes stay attached
    /// (timeline samples, `--interval`, `--snapshot-every`): reads see the
    /// tables as the probes change them.
    pub fn peek(&self) -> Result<HeapMaps> {
        let open = |name: &str| -> Result<Map> { Ok(Map::from_map_data(self.dup_map(name)?)?) };
        Ok(HeapMaps {
            live: self.dup_map(maps::LIVE)?,
            sites: self.dup_map(maps::SITE_TOTALS)?,
            overflow: PerCpuArray::try_from(open(maps::OVERFLOW_TOTALS)?)?,
            stacks: StackTraceMap::try_from(open(maps::STACKS)?)?,
            dwarf_stacks: HashMap::try_from(open(maps::DWARF_STACKS)?)?,
            short_stacks: HashMap::try_from(open(maps::SHORT_STACKS)?)?,
            stack_tables: [
                self.dup_map(maps::DWARF_STACKS)?,
                self.dup_map(maps::SHORT_STACKS)?,
            ],
            read_stacks: std::sync::Mutex::new(None),
            dwarf: self.dwarf,
            sample_bytes: self.sample_bytes,
            gc_refill: self.gc_refill,
            refill_frame: None,
            counters: PerCpuArray::try_from(open(maps::COUNTERS)?)?,
            live_by_kind: PerCpuArray::try_from(open(maps::LIVE_BY_KIND)?)?,
            only: None,
            finished: None,
        })
    }
}

/// The `COUNTERS` map's one entry, summed over CPUs.
fn sum_per_cpu<T: std::borrow::Borrow<MapData>>(
    counters: &PerCpuArray<T, KernelCounters>,
) -> Result<KernelCounters> {
    let mut sum = KernelCounters::default();
    for cpu in counters.get(&0, 0)?.iter() {
        sum.add(cpu);
    }
    Ok(sum)
}

/// [`sum_per_cpu`] of the `COUNTERS` map of a loaded object.
pub(super) fn sum_counters(map: &Map) -> Result<KernelCounters> {
    sum_per_cpu(&PerCpuArray::<&MapData, KernelCounters>::try_from(map)?)
}

/// The profile's counters from the kernel's: every field is named, so a
/// counter added to [`KernelCounters`] does not compile until it is placed.
fn report_counters(kernel: KernelCounters) -> Counters {
    let KernelCounters {
        live_map_full,
        sites_map_full,
        stack_errors,
        pending_full,
        stale_calls,
        both_maps_full,
        unknown_frees,
        allocs,
        frees,
        failed_allocs,
        truncated_stacks,
        folded_stacks,
        stacks_shortened,
        stacks_degraded,
        sites_overflowed,
        stacks_stored,
        sites_stored,
        unsampled_allocs,
        returns_probed,
        predicted,
        predictions_checked,
        predictions_wrong,
        refills,
        refills_skipped,
        processes_not_followed,
        // Reported in the GC summary (`Probes::collections_not_held`,
        // `Probes::gc_events_lost`, `Probes::kernel_verdicts`), not here.
        gc_collections: _,
        gc_not_held: _,
        gc_events_lost: _,
        gc_unjudged: _,
        gc_verdicts_failed: _,
        // Not a loss: such a process waits for userspace's table, and a
        // stack cut short meanwhile is counted in `truncated_stacks`. (It
        // counts attempts, each library load again: on a kernel without
        // the task-VMA iterator, every one. Userspace counts those
        // processes instead: `ModuleTables::tables_from_proc`.)
        tables_not_built: _,
        deferred_lost,
        rss_pages_untracked,
        rss_releases_cut,
    } = kernel;
    Counters {
        live_map_full,
        sites_map_full,
        stack_errors,
        pending_full,
        stale_calls,
        both_maps_full,
        unknown_frees,
        allocs,
        frees,
        failed_allocs,
        truncated_stacks,
        folded_stacks,
        stacks_shortened,
        stacks_degraded,
        sites_overflowed,
        stacks_stored,
        sites_stored,
        unsampled_allocs,
        returns_probed,
        predicted,
        predictions_checked,
        predictions_wrong,
        refills,
        refills_skipped,
        processes_not_followed,
        stacks_not_finished: deferred_lost,
        rss_pages_untracked,
        rss_releases_cut,
        // Userspace's: `attach --all` adds it.
        short_of_resources: 0,
        tables_from_proc: 0,
        processes_evicted: 0,
        evicted_allocs: 0,
        calls_live_let_go: 0,
        calls_live_let_go_bytes: 0,
        gc_sessions_missed: 0,
        names_left_mangled: 0,
        frames_unnamed: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_report_counter_comes_from_its_kernel_counter() {
        let mut kernel = KernelCounters::default();
        for (value, field) in kernel.fields_mut().into_iter().enumerate() {
            *field = value as u64 + 1;
        }
        let c = report_counters(kernel);
        let read = [
            c.live_map_full,
            c.sites_map_full,
            c.stack_errors,
            c.pending_full,
            c.stale_calls,
            c.both_maps_full,
            c.unknown_frees,
            c.allocs,
            c.frees,
            c.failed_allocs,
            c.truncated_stacks,
            c.folded_stacks,
            c.stacks_shortened,
            c.stacks_degraded,
            c.sites_overflowed,
            c.stacks_stored,
            c.sites_stored,
            c.unsampled_allocs,
            c.returns_probed,
            c.predicted,
            c.predictions_checked,
            c.predictions_wrong,
            c.refills,
            c.refills_skipped,
            c.processes_not_followed,
        ];
        assert_eq!(
            read,
            [
                kernel.live_map_full,
                kernel.sites_map_full,
                kernel.stack_errors,
                kernel.pending_full,
                kernel.stale_calls,
                kernel.both_maps_full,
                kernel.unknown_frees,
                kernel.allocs,
                kernel.frees,
                kernel.failed_allocs,
                kernel.truncated_stacks,
                kernel.folded_stacks,
                kernel.stacks_shortened,
                kernel.stacks_degraded,
                kernel.sites_overflowed,
                kernel.stacks_stored,
                kernel.sites_stored,
                kernel.unsampled_allocs,
                kernel.returns_probed,
                kernel.predicted,
                kernel.predictions_checked,
                kernel.predictions_wrong,
                kernel.refills,
                kernel.refills_skipped,
                kernel.processes_not_followed,
            ]
        );
        // Every field had its own value: no two report counters read one field.
        let mut distinct = read.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), read.len());
    }

    #[test]
    fn a_site_with_an_unknown_kind_is_an_error() {
        let site = AllocSite {
            caller: 0x10,
            stack_id: NO_STACK,
            kind: 9,
            _pad: [0; 3],
            process: 0,
        };
        assert!(Site::try_from(&site).is_err());
        let site = AllocSite { kind: 3, ..site };
        assert_eq!(
            Site::try_from(&site).unwrap(),
            Site {
                caller: 0x10,
                stack: None,
                kind: AllocKind::GcAtomic
            }
        );
    }
}
