//! The groups of the profile, from the raw ones: each address of their
//! stacks symbolized once ([`crate::symbolize`]) and made a location, each
//! stack an id in the profile's table, each GC group named by the class
//! it allocates (one row per class where the objects were read).
use std::collections::HashMap;
use std::sync::Arc;

use memprof_common::AllocKind;

use super::{RawGroup, RawGroups};
use crate::crystal;
use crate::gc::site::ClassGc;
use crate::modules::maps::MapsCache;
use crate::modules::ModuleCache;
use crate::profile::{Frame, Group, Stacks};
use crate::symbolize::{self, Budget, NameLosses, SymbolCache};

/// The groups of a profile, their stacks' table, and what could not be named.
pub struct Named {
    pub groups: Vec<Group>,
    pub stacks: Stacks,
    pub losses: NameLosses,
}

/// Symbolizes every group's stack and names the class each GC group
/// allocates. Each distinct address is symbolized once and becomes one
/// [`crate::profile::Location`]; the groups name their stacks in the
/// returned table. With `progress` (a user waits for this profile), a
/// bar, and naming takes what it takes; without, naming waits at most
/// [`Budget::BACKGROUND`] (a loop that serves waits for it).
pub fn symbolize(raw: RawGroups, maps: &MapsCache, modules: &ModuleCache, progress: bool) -> Named {
    symbolize_with(raw, maps, modules, progress, &mut SymbolCache::default())
}

/// [`symbolize`] with the files read through `cache`.
pub fn symbolize_with(
    raw: RawGroups,
    maps: &MapsCache,
    modules: &ModuleCache,
    progress: bool,
    cache: &mut SymbolCache,
) -> Named {
    symbolize_within(
        raw,
        (maps, modules),
        (progress, Budget::of(progress)),
        cache,
    )
}

/// [`symbolize_with`] within `budget`, a bar shown or not.
pub fn symbolize_within(
    raw: RawGroups,
    (maps, modules): (&MapsCache, &ModuleCache),
    (progress, budget): (bool, Budget),
    cache: &mut SymbolCache,
) -> Named {
    let RawGroups {
        groups: raw,
        addresses: ids,
    } = raw;
    let mut stacks = Stacks::default();
    let (location_of, losses) = symbolize::locations(
        &ids,
        (maps, modules),
        (progress, budget),
        &mut stacks,
        cache,
    );
    // Each stack's addresses are given back as its locations are made:
    // a big program's stacks are tens of megabytes either way.
    let location_of: Vec<u32> = ids.iter().map(|a| location_of[a]).collect();
    drop(ids);
    let mut raw = raw;
    let stack_ids = stack_ids(&mut raw, &location_of, &mut stacks);
    let groups = into_groups(raw, stack_ids, &stacks);
    Named {
        groups,
        stacks,
        losses,
    }
}

/// Each raw group's stack as an id in `stacks`, from the locations of its
/// addresses; the groups' address lists are given back on the way.
fn stack_ids(raw: &mut [RawGroup], location_of: &[u32], stacks: &mut Stacks) -> Vec<u32> {
    let mut locations: Vec<u32> = Vec::with_capacity(raw.iter().map(|g| g.frames.len()).sum());
    let mut ends = Vec::with_capacity(raw.len());
    for g in raw.iter_mut() {
        locations.extend(g.frames.iter().map(|&id| location_of[id as usize]));
        ends.push(locations.len());
        g.frames = Arc::from([]);
    }
    stacks.stacks(&locations, &ends)
}

/// The groups of the profile, each with its stack and, for GC groups, the
/// class it allocates (found once per stack).
fn into_groups(mut raw: Vec<RawGroup>, mut ids: Vec<u32>, stacks: &Stacks) -> Vec<Group> {
    let mut types: HashMap<u32, Option<String>> = HashMap::new();
    // The class a stack's head frames allocate, worked out once per stack.
    let mut stack_type = |stack: u32| {
        types
            .entry(stack)
            .or_insert_with(|| {
                let head: Vec<Frame> = stacks.frames(stack).take(TYPE_FRAMES).cloned().collect();
                crystal::allocated_type(&head)
            })
            .clone()
    };
    // Taken from the end, the raw groups' array shrinking as it goes: the
    // two arrays are not both whole at once.
    let mut groups: Vec<Group> = Vec::with_capacity(raw.len());
    while let (Some(mut g), Some(stack)) = (raw.pop(), ids.pop()) {
        if raw.len().is_multiple_of(RELEASE_EVERY) {
            raw.shrink_to_fit();
        }
        // Classes read from the objects themselves: a row each.
        let classes = std::mem::take(&mut g.classes);
        if !classes.is_empty() {
            let named = stack_type(stack);
            // The stack's name is the qualified one where the program's
            // code gave its class no path (`Node` for `RedBlackTree::Node`).
            let classes = classes
                .into_iter()
                .map(|c| match &named {
                    Some(n) if n.ends_with(&format!("::{}", c.name)) => ClassGc {
                        name: n.clone(),
                        ..c
                    },
                    _ => c,
                })
                .collect();
            groups.extend(by_class(group(g, stack, named), classes));
            continue;
        }
        // Classes are a GC heap notion; libc and mmap rows keep their call site.
        let type_name = match g.kind() {
            AllocKind::Gc | AllocKind::GcAtomic => stack_type(stack),
            AllocKind::Libc | AllocKind::Mmap | AllocKind::Rss => None,
        };
        groups.push(group(g, stack, type_name));
    }
    groups.reverse();
    groups
}

/// `g` as one group per class of its objects (`classes`: read from the
/// objects, biggest first), each with its objects allocated, collected
/// and live. The biggest class keeps what is not per object (the marks,
/// lifetimes, history); the objects of no class (buffers, words not
/// read) stay under `g`'s own name, a group of their own.
fn by_class(g: Group, classes: Vec<ClassGc>) -> Vec<Group> {
    let sum = |of: fn(&ClassGc) -> (u64, u64)| {
        classes
            .iter()
            .map(of)
            .fold((0, 0), |(n, b), (cn, cb)| (n + cn, b + cb))
    };
    let less =
        |(n, b): (u64, u64), (tn, tb): (u64, u64)| (n.saturating_sub(tn), b.saturating_sub(tb));
    let mut rest = g.split_off();
    (rest.total_count, rest.total_bytes) = less(
        (g.total_count, g.total_bytes),
        sum(|c| (c.allocated_count, c.allocated_bytes)),
    );
    (rest.collected_count, rest.collected_bytes) = less(
        (g.collected_count, g.collected_bytes),
        sum(|c| (c.collected_count, c.collected_bytes)),
    );
    (rest.live_count, rest.live_bytes) = less(
        (g.live_count, g.live_bytes),
        sum(|c| (c.live_count, c.live_bytes)),
    );
    let mut out = Vec::with_capacity(classes.len() + 1);
    for (i, c) in classes.into_iter().enumerate() {
        let counts = Group {
            total_count: c.allocated_count,
            total_bytes: c.allocated_bytes,
            collected_count: c.collected_count,
            collected_bytes: c.collected_bytes,
            live_count: c.live_count,
            live_bytes: c.live_bytes,
            type_name: Some(c.name),
            ..g.split_off()
        };
        out.push(if i == 0 {
            // What is not per object stays with the biggest class.
            Group {
                total_count: counts.total_count,
                total_bytes: counts.total_bytes,
                collected_count: counts.collected_count,
                collected_bytes: counts.collected_bytes,
                live_count: counts.live_count,
                live_bytes: counts.live_bytes,
                type_name: counts.type_name,
                ..g.clone()
            }
        } else {
            counts
        });
    }
    if rest.total_count > 0 || rest.live_count > 0 || rest.collected_count > 0 {
        out.push(rest);
    }
    out
}

/// The profile's group of a raw group.
fn group(g: RawGroup, stack: u32, type_name: Option<String>) -> Group {
    Group {
        pid: 0,
        pid_reuse: 0,
        kind: g.kind().name().to_string(),
        live_count: g.live_count,
        live_bytes: g.live_bytes,
        total_count: g.total_count,
        total_bytes: g.total_bytes,
        type_name,
        stack,
        truncated: g.truncated,
        folded: g.folded,
        overflow: g.overflow,
        collected_count: g.collected_count,
        collected_bytes: g.collected_bytes,
        marked_count: g.marked_count,
        marked_bytes: g.marked_bytes,
        lifetimes: g.lifetimes,
        gc_history: g.gc_history,
        v2_frames: Vec::new(),
    }
}

/// Raw groups taken between two shrinks of their array.
const RELEASE_EVERY: usize = 8192;

/// Frames enough to name the class a stack allocates: the allocator
/// plumbing (a handful of frames) and the frame above it.
const TYPE_FRAMES: usize = 32;
