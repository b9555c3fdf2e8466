//! From the kernel's maps to allocation groups: one per (kind, call stack),
//! with live and total counts and bytes, stacks still as raw addresses.
//!
//! A site in the kernel is (caller return address, frame-pointer stack id,
//! kind). Its stack starts at the probed instruction inside the allocator,
//! then the frame-pointer walk; the walk misses the immediate caller when the
//! allocator does not begin with `push %rbp` (the kernel only adds `[%rsp]`
//! for probes on `push %rbp`/`endbr64`), which is why the probe reads the
//! caller itself. Here the two are joined: `[caller, walk[1..]]`, without
//! repeating the caller when the kernel did add it.
// A fast hasher: a big program's end groups millions of sites and
// addresses (SipHash was a tenth of memprof's CPU at `crystal build`'s end).
pub mod named;

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use anyhow::Result;
use memprof_common::AllocKind;

use crate::gc::site::{merge_histories, ClassGc, SiteGc};
use crate::probes::{HeapMaps, RecordedStack, Site};
use crate::profile::Lifetimes;
use crate::sampling;

/// Allocations from one call stack, as read from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawGroup {
    pub kind: AllocKind,
    /// Return addresses as ids into [`RawGroups::addresses`], innermost
    /// (the allocator's caller) first; shared with the grouping's index (a
    /// big program has 100,000s of stacks, of a few 10,000 addresses).
    pub frames: Arc<[u32]>,
    pub live_count: u64,
    pub live_bytes: u64,
    pub total_count: u64,
    pub total_bytes: u64,
    /// The unwinder did not reach the end of this stack.
    pub truncated: bool,
    /// Recursion was folded: frames of a function one of the last few
    /// kept frames had are left out (`--keep-recursion` keeps them).
    pub folded: bool,
    /// Not a stack: the allocations of this kind the site table had no
    /// room for (`--max-sites`); `frames` is empty.
    pub overflow: bool,
    /// GC kinds: collected (mark-bit passes and address reuse).
    pub collected_count: u64,
    pub collected_bytes: u64,
    /// GC kinds: marked at the last collection judged.
    pub marked_count: u64,
    pub marked_bytes: u64,
    pub lifetimes: Lifetimes,
    pub gc_history: Vec<[u64; 2]>,
    /// GC kinds: the objects by class, read from the objects themselves
    /// ([`SiteGc::classes`]).
    pub classes: Vec<ClassGc>,
}

impl RawGroup {
    /// A group with nothing counted yet.
    fn new(kind: AllocKind, stack: Stack) -> RawGroup {
        RawGroup {
            kind,
            frames: stack.frames,
            live_count: 0,
            live_bytes: 0,
            total_count: 0,
            total_bytes: 0,
            truncated: stack.truncated,
            folded: stack.folded,
            overflow: stack.overflow,
            collected_count: 0,
            collected_bytes: 0,
            marked_count: 0,
            marked_bytes: 0,
            lifetimes: Lifetimes::default(),
            gc_history: Vec::new(),
            classes: Vec::new(),
        }
    }

    pub fn kind(&self) -> AllocKind {
        self.kind
    }

    /// From the sampled allocations to estimates of all of them
    /// (`--sample-bytes`, mean `sample_bytes`): each pair of count and
    /// bytes is scaled by its own mean size, as pprof does for Go's live
    /// and allocated figures; what has no bytes of its own (lifetimes,
    /// the GC history) by the weight of the group's mean allocation.
    fn scale_sampled(&mut self, sample_bytes: u64) {
        let pairs = [
            (&mut self.total_count, &mut self.total_bytes),
            (&mut self.live_count, &mut self.live_bytes),
            (&mut self.collected_count, &mut self.collected_bytes),
            (&mut self.marked_count, &mut self.marked_bytes),
        ];
        let mean_size = match *pairs[0].0 {
            0 => 0.0,
            n => *pairs[0].1 as f64 / n as f64,
        };
        for (count, bytes) in pairs {
            (*count, *bytes) = sampling::scale(*count, *bytes, sample_bytes);
        }
        for c in &mut self.classes {
            for (count, bytes) in [
                (&mut c.allocated_count, &mut c.allocated_bytes),
                (&mut c.collected_count, &mut c.collected_bytes),
                (&mut c.live_count, &mut c.live_bytes),
            ] {
                (*count, *bytes) = sampling::scale(*count, *bytes, sample_bytes);
            }
        }
        let weight = sampling::weight(mean_size, sample_bytes);
        let times = |n: &mut u64| *n = (*n as f64 * weight).round() as u64;
        self.lifetimes.scale(weight);
        for point in &mut self.gc_history {
            times(&mut point[1]);
        }
    }
}

/// What the mark-bit passes learned per site, for [`collect`].
pub enum GcFigures<'a> {
    /// A snapshot's: the copy goes on.
    Borrowed(&'a [(Site, SiteGc)]),
    /// The end's: given back as they are merged (a big program's
    /// hundreds of thousands of sites are tens of megabytes).
    Owned(Vec<(Site, SiteGc)>),
}

/// Sites merged between two shrinks of an owned [`GcFigures`] array.
const RELEASE_EVERY: usize = 8192;

/// The groups read from the kernel, and the return addresses their
/// stacks name (each once).
#[derive(Debug, Default)]
pub struct RawGroups {
    pub groups: Vec<RawGroup>,
    /// By id: [`RawGroup::frames`] holds ids.
    pub addresses: Vec<u64>,
}

/// Reads the live table and the per-site totals and merges them per stack,
/// with what the mark-bit passes learned per site (`gc`).
pub fn collect(maps: &HeapMaps, gc: Option<GcFigures<'_>>) -> Result<RawGroups> {
    // Sized for the sites the kernel stored: grown by doubling, each table
    // was briefly held twice, at the peak of memprof's memory.
    let sites = maps.counters().map_or(0, |c| c.sites_stored as usize);
    let mut grouper = Grouper {
        maps,
        stacks: HashMap::with_capacity(sites),
        by_stack: HashMap::with_capacity(sites),
        by_site: HashMap::with_capacity(sites),
        groups: Vec::with_capacity(sites),
        address_ids: HashMap::new(),
        addresses: Vec::new(),
    };
    for entry in maps.sites() {
        let (site, totals) = entry?;
        let group = grouper.group(site);
        group.total_count += totals.count;
        group.total_bytes += totals.bytes;
        // Frees and address reuse, seen by the kernel.
        let l = &mut group.lifetimes;
        l.died += totals.died;
        l.total_ns += totals.lifetime_ns;
        for (mine, theirs) in l.buckets.iter_mut().zip(totals.buckets) {
            *mine += theirs;
        }
        group.collected_count += totals.reused;
        group.collected_bytes += totals.reused_bytes;
    }
    // The copy's allocation totals first: a `GC_realloc` retyped by
    // `add_gc` moves its totals from the group that counted it.
    let copied = match &gc {
        Some(GcFigures::Borrowed(sites)) => *sites,
        Some(GcFigures::Owned(sites)) => sites.as_slice(),
        None => &[],
    };
    for (site, s) in copied {
        let group = grouper.group(*site);
        group.total_count += s.allocated_count;
        group.total_bytes += s.allocated_bytes;
    }
    match gc {
        Some(GcFigures::Borrowed(sites)) => {
            for (site, s) in sites {
                add_gc(&mut grouper, *site, s);
            }
        }
        Some(GcFigures::Owned(mut sites)) => {
            while let Some((site, s)) = sites.pop() {
                if sites.len().is_multiple_of(RELEASE_EVERY) {
                    sites.shrink_to_fit();
                }
                add_gc(&mut grouper, site, &s);
            }
        }
        None => {}
    }
    for entry in maps.live() {
        let (_addr, live) = entry?;
        let group = grouper.group(live.site);
        group.live_count += 1;
        group.live_bytes += live.size;
    }
    let mut groups = grouper.groups;
    if maps.sample_bytes > 0 {
        // GC groups sampled at refills are estimates already (`add_gc`).
        let refilled =
            |g: &RawGroup| maps.gc_refill && matches!(g.kind, AllocKind::Gc | AllocKind::GcAtomic);
        for group in groups.iter_mut().filter(|g| !refilled(g)) {
            group.scale_sampled(maps.sample_bytes);
        }
    }
    Ok(RawGroups {
        groups,
        addresses: grouper.addresses,
    })
}

/// Adds what the passes learned about `site` to its group (estimates of
/// all the objects, where refills were sampled).
fn add_gc(grouper: &mut Grouper<'_>, site: Site, s: &SiteGc) {
    let estimated;
    let s = if s.objects_per_record() == 1.0 {
        s
    } else {
        estimated = s.estimated();
        &estimated
    };
    let group = grouper.group(site);
    group.collected_count += s.collected_count;
    group.collected_bytes += s.collected_bytes;
    group.marked_count += s.marked_count;
    group.marked_bytes += s.marked_bytes;
    // GC objects live in memprof's copy, not in the live table.
    group.live_count += s.tracked_count;
    group.live_bytes += s.tracked_bytes;
    // GC_realloc'd blocks the kernel counted as `gc` are of this kind.
    group.total_count += s.retyped_count;
    group.total_bytes += s.retyped_bytes;

    group.lifetimes.add(&s.lifetimes);
    group.gc_history = merge_histories(&group.gc_history, &s.history);
    for class in &s.classes {
        match group.classes.iter_mut().find(|c| c.name == class.name) {
            Some(c) => c.add(class),
            None => group.classes.push(class.clone()),
        }
    }
    if s.retyped_count > 0 {
        let counted = grouper.group(Site {
            kind: AllocKind::Gc,
            ..site
        });
        counted.total_count = counted.total_count.saturating_sub(s.retyped_count);
        counted.total_bytes = counted.total_bytes.saturating_sub(s.retyped_bytes);
    }
}

/// A stack as a group shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stack {
    /// Address ids.
    frames: Arc<[u32]>,
    truncated: bool,
    folded: bool,
    overflow: bool,
}

/// A stack read from the kernel, for its sites.
enum Known {
    Stack(Stack),
    /// What the site's caller completes (the frame-pointer walk, or no stack).
    PerCaller(RecordedStack),
}

/// Assigns sites to groups; sites are few, live blocks many, so the group of
/// each site is looked up once.
struct Grouper<'a> {
    maps: &'a HeapMaps,
    /// Stack key → the stack the kernel recorded (read once), as groups
    /// show it when that does not depend on the site's caller.
    stacks: HashMap<u64, Known>,
    /// Same frames, truncated or folded or not: different stacks.
    by_stack: HashMap<(AllocKind, Stack), usize>,
    by_site: HashMap<Site, usize>,
    groups: Vec<RawGroup>,
    /// Each return address's id: its index in `addresses`.
    address_ids: HashMap<u64, u32>,
    addresses: Vec<u64>,
}

impl Grouper<'_> {
    /// `frames` without a leading frame in the refill function
    /// ([`HeapMaps::refill_frame`]).
    fn without_refill_frame<'f>(&self, frames: &'f [u64]) -> &'f [u64] {
        match (&self.maps.refill_frame, frames.split_first()) {
            (Some(range), Some((first, rest))) if range.contains(first) => rest,
            _ => frames,
        }
    }

    fn group(&mut self, site: Site) -> &mut RawGroup {
        if let Some(&i) = self.by_site.get(&site) {
            return &mut self.groups[i];
        }
        if let Some(key) = site.stack.filter(|key| !self.stacks.contains_key(key)) {
            let known = match self.maps.stack(key) {
                // The DWARF unwinder starts at the caller already.
                RecordedStack::Unwound {
                    frames,
                    truncated,
                    folded,
                } => Known::Stack(Stack {
                    frames: self.ids(self.without_refill_frame(&frames)),
                    truncated,
                    folded,
                    overflow: false,
                }),
                RecordedStack::Overflow => Known::Stack(Stack {
                    frames: Arc::new([]),
                    truncated: true,
                    folded: false,
                    overflow: true,
                }),
                other => Known::PerCaller(other),
            };
            self.stacks.insert(key, known);
        }
        let missing = Known::PerCaller(RecordedStack::Missing);
        let known = site.stack.and_then(|key| self.stacks.get(&key));
        let stack = match known.unwrap_or(&missing) {
            Known::Stack(stack) => stack.clone(),
            // No stack, or no room for it: the caller alone.
            Known::PerCaller(RecordedStack::Walked(walk)) => {
                let frames = join_caller(site.caller, walk);
                Stack {
                    frames: self.ids(&frames),
                    truncated: false,
                    folded: false,
                    overflow: false,
                }
            }
            // The allocator's caller alone, marked as cut short.
            Known::PerCaller(_) => Stack {
                frames: self.ids(&join_caller(site.caller, &[])),
                truncated: true,
                folded: false,
                overflow: false,
            },
        };
        let groups = &mut self.groups;
        let i = *self
            .by_stack
            .entry((site.kind, stack.clone()))
            .or_insert_with(|| {
                groups.push(RawGroup::new(site.kind, stack));
                groups.len() - 1
            });
        self.by_site.insert(site, i);
        &mut self.groups[i]
    }

    /// The ids of `frames`, each address numbered when first seen.
    fn ids(&mut self, frames: &[u64]) -> Arc<[u32]> {
        let addresses = &mut self.addresses;
        frames
            .iter()
            .map(|&a| {
                *self.address_ids.entry(a).or_insert_with(|| {
                    addresses.push(a);
                    addresses.len() as u32 - 1
                })
            })
            .collect()
    }
}

/// `[caller, walk[1..]]`: drops the probe's own address (`walk[0]`) and the
/// caller when the kernel already put it at `walk[1]`.
fn join_caller(caller: u64, walk: &[u64]) -> Vec<u64> {
    let rest = walk.get(1..).unwrap_or(&[]);
    let rest = match rest.first() {
        Some(&first) if first == caller => &rest[1..],
        _ => rest,
    };
    let mut frames = Vec::with_capacity(rest.len() + 1);
    if caller != 0 {
        frames.push(caller);
    }
    frames.extend_from_slice(rest);
    frames
}

#[cfg(test)]
mod tests {
    use super::join_caller;

    #[test]
    fn adds_the_caller_the_walk_missed() {
        assert_eq!(
            join_caller(0x20, &[0x10, 0x30, 0x40]),
            vec![0x20, 0x30, 0x40]
        );
    }

    #[test]
    fn does_not_repeat_a_caller_the_kernel_added() {
        assert_eq!(join_caller(0x20, &[0x10, 0x20, 0x30]), vec![0x20, 0x30]);
    }

    #[test]
    fn no_stack_still_has_the_caller() {
        assert_eq!(join_caller(0x20, &[]), vec![0x20]);
    }
}
