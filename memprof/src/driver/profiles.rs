//! What every profile is made of, whichever mode made it: its header,
//! one process's groups symbolized, and many processes' profiles as one.
use std::time::SystemTime;

use crate::groups::named::{self, Named};
use crate::groups::RawGroups;
use crate::modules::maps::MapsCache;
use crate::modules::ModuleCache;
use crate::profile::{self, Profile, TargetInfo};
use crate::symbolize::{Budget, SymbolCache};

/// Who made a profile and how: [`header`]'s part of it.
pub struct Header {
    /// `run` or `attach`.
    pub mode: &'static str,
    pub target: TargetInfo,
    /// When profiling started (wall clock).
    pub started: SystemTime,
    /// How stacks were unwound (`fp`, `dwarf`).
    pub unwind: String,
    pub sample_bytes: u64,
}

/// The metadata of a profile: memprof's version, the mode, the target,
/// its start, how it was unwound and sampled; the rest empty.
pub fn header(h: Header) -> Profile {
    Profile {
        memprof_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: Some(crate::probes::kernel().info()),
        mode: h.mode.to_string(),
        target: h.target,
        start_unix_s: unix_s(h.started),
        unwind: h.unwind,
        sample_bytes: h.sample_bytes,
        ..Profile::default()
    }
}

/// Seconds since the epoch.
pub fn unix_s(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The groups of process `pid` from its tables (addresses), symbolized
/// with its mappings and files, each group carrying the pid.
pub fn groups_of(
    pid: u32,
    raw: RawGroups,
    maps: &MapsCache,
    modules: &ModuleCache,
    progress: bool,
) -> Named {
    groups_of_with(
        pid,
        raw,
        (maps, modules),
        progress,
        &mut SymbolCache::default(),
    )
}

/// [`groups_of`] with what was read of the files kept in `cache`.
pub fn groups_of_with(
    pid: u32,
    raw: RawGroups,
    (maps, modules): (&MapsCache, &ModuleCache),
    progress: bool,
    cache: &mut SymbolCache,
) -> Named {
    groups_within(
        pid,
        raw,
        (maps, modules),
        (progress, Budget::of(progress)),
        cache,
    )
}

/// [`groups_of_with`] within `budget`, a bar shown or not.
pub fn groups_within(
    pid: u32,
    raw: RawGroups,
    (maps, modules): (&MapsCache, &ModuleCache),
    (progress, budget): (bool, Budget),
    cache: &mut SymbolCache,
) -> Named {
    let mut named = named::symbolize_within(raw, (maps, modules), (progress, budget), cache);
    for g in &mut named.groups {
        g.pid = pid;
    }
    named
}

/// Many processes' profiles as one: `first` (`run`'s command) or else the
/// process that started first stands for them all; the others join it
/// ([`profile::family::merge`]) in the order they started. `None`: no
/// profile at all.
pub fn merge(first: Option<Profile>, mut others: Vec<Profile>) -> Option<Profile> {
    others.sort_by(|a, b| started(a).total_cmp(&started(b)));
    let mut profile = match first {
        Some(profile) => profile,
        None if others.is_empty() => return None,
        None => others.remove(0),
    };
    profile::family::merge(&mut profile, others);
    Some(profile)
}

/// When a profile's process started: its session's start, plus its own
/// start within it (`attach --all` counts every process from one start).
fn started(p: &Profile) -> f64 {
    p.start_unix_s + p.processes.first().map_or(0.0, |i| i.start_s)
}
