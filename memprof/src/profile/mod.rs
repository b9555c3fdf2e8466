//! The `.mprof` profile file: everything a report needs, symbolized, so
//! `memprof report` runs anywhere, without privileges and after the target is
//! gone.
//!
//! Layout: one header line `MEMPROF-PROFILE <version>\n`, then the
//! [`Profile`] as JSON and a newline, then an end line
//! `MEMPROF-END crc32=<hex> bytes=<n>\n` with the CRC-32 of the header
//! line and the JSON (version 2: of the JSON only) and the length of the
//! JSON. The header lets [`load`] tell "not a profile" and "another
//! version" apart, the end line "truncated" and "corrupt" (a flipped byte),
//! before anything is parsed. (The check is at the end so the profile is
//! streamed out once, never held twice in memory.) Counts whose sums would
//! overflow are refused as corrupt.
//!
//! Stacks are interned as pprof does (version 3): a group names its stack
//! by an id into [`Stacks`], where each distinct return address is one
//! [`Location`] (its frames, inlined functions first; strings once in a
//! string table) and each stack a node `[location, caller]` of a tree whose
//! root is the outermost frame, so stacks sharing their outer frames share
//! their nodes. Version-2 files (every group with its whole frames) are
//! still read, and converted on load.
//!
//! ```
//! use memprof::profile::{self, Profile};
//! let mut bytes = Vec::new();
//! profile::write(&Profile::default(), &mut bytes).unwrap();
//! assert!(bytes.starts_with(b"MEMPROF-PROFILE 3\n"));
//! let back = profile::parse(&bytes).unwrap();
//! assert_eq!(back.groups.len(), 0);
//! ```
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod family;
mod stacks;
pub use stacks::{Location, Stacks};

pub const MAGIC: &str = "MEMPROF-PROFILE";
/// The version this memprof writes (3: stacks interned).
pub const VERSION: u32 = 3;
/// The oldest version this memprof reads (2: with the end line; whole
/// frames in every group, converted on load).
pub const OLDEST_READ: u32 = 2;
/// Starts the last line: the checksum and length of the JSON.
const END: &str = "MEMPROF-END";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Profile {
    pub memprof_version: String,
    /// `run` or `attach`.
    pub mode: String,
    pub target: TargetInfo,
    /// Wall-clock start, seconds since the Unix epoch.
    pub start_unix_s: f64,
    pub duration_s: f64,
    /// How the target ended, if it ended while profiled.
    pub exit: Option<ExitInfo>,
    /// How stacks were captured: `fp` (frame pointers) or `dwarf` (CFI tables from `.eh_frame`).
    pub unwind: String,
    /// Allocations were sampled, one sample point every this many bytes on
    /// average (`--sample-bytes`): the groups' counts and bytes are
    /// unbiased estimates. 0: every allocation was followed.
    #[serde(default)]
    pub sample_bytes: u64,
    /// `refill`: Boehm GC allocations were sampled at the collector's
    /// free-list refills (`--gc-sampling refill`), each sample standing for
    /// its list's objects: the GC groups' figures are estimates. Empty:
    /// every GC allocation was followed (or sampled by bytes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gc_sampling: String,
    pub counters: Counters,
    pub probes: Vec<ProbeInfo>,
    pub groups: Vec<Group>,
    /// The stacks the groups name ([`Group::stack`]).
    #[serde(default)]
    pub stacks: Stacks,
    /// What the Boehm collector did while profiled (targets with a GC heap).
    #[serde(default)]
    pub gc: Option<GcSummary>,
    /// Live blocks and bytes per kind, sampled while the target ran
    /// (`--sample-period`); empty when sampling was off.
    #[serde(default)]
    pub timeline: Timeline,
    /// The whole GC heap by type at the first and last censused
    /// collections, tracked objects apart from those memprof did not see
    /// allocated (targets with a GC heap whose collections were held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub census: Option<Censuses>,
    /// The processes of the session: the profiled target first, then (in
    /// `run`) those the command started, listed but not profiled. Empty in
    /// profiles from before processes were listed: [`Profile::processes`]
    /// makes the target's entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}

/// One process of a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// The host's pid.
    pub pid: u32,
    /// Its pid in its own pid namespace (a container's), where different.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// Its parent (0: not known, an attached process's).
    pub ppid: u32,
    pub command: Vec<String>,
    pub exe: String,
    /// When it started and ended, seconds since profiling started (its
    /// start is 0 for the target; `end_s` is `None` if it outlived the
    /// session).
    pub start_s: f64,
    pub end_s: Option<f64>,
    pub exit: Option<ExitInfo>,
    /// Its allocations are in the profile's groups (those with its pid).
    /// `false`: a process the command started, which memprof saw start
    /// and end but did not profile (`--no-follow`; a fork that ended
    /// within 0.2 s without an `exec`; or its session could not start).
    pub profiled: bool,
    /// Profiled from this time on only (seconds since profiling began): a
    /// process forked without an `exec`, attached to once it ran a while;
    /// `None`: from its start (or its `exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiled_from_s: Option<f64>,
    /// A profiled process's own counters (the profile's are the sum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

impl ProcessInfo {
    /// The name `--comm` matches: the program's file name.
    pub fn comm(&self) -> &str {
        let program = self
            .command
            .first()
            .map(String::as_str)
            .filter(|c| !c.is_empty())
            .unwrap_or(&self.exe);
        program.rsplit('/').next().unwrap_or(program)
    }
}

/// Censuses of the GC heap taken at held collections of a session
/// ([`crate::census::session`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Censuses {
    /// At the first held collection: in `attach`, the objects not seen
    /// allocated are those live before attach. `None` in `run` (every
    /// object is seen allocated: empty by construction) or when that
    /// census failed (`note` says why).
    pub start: Option<HeapCensus>,
    /// At the last collection censused (the end's census).
    pub end: Option<HeapCensus>,
    /// Why a census is missing, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One census: live objects by type, as the collector judged them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapCensus {
    /// The collection: `GC_gc_no` after it (what the program's
    /// `GC_get_gc_no()` says once it ran).
    pub collection: u64,
    /// Seconds since profiling started.
    pub t_s: f64,
    /// What the census added to the collector's hold (copying the heap's
    /// index, headers and object memory), and what it took after the
    /// target ran again (judging, naming, telling tracked objects apart).
    pub held_s: f64,
    pub census_s: f64,
    /// Naming the program's type ids from its code, once per session (in
    /// the first census's thread, after the hold).
    #[serde(default)]
    pub naming_s: f64,
    /// Most bytes first.
    pub types: Vec<CensusType>,
}

/// Live objects of one type and kind in a census.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CensusType {
    /// As `memprof heap` names them: `Foo`, `(type 28)`, `Array(Foo) buffer`, `(no type id)`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<u32>,
    /// `normal`, `atomic`, `uncollectable`, …
    pub kind: String,
    /// Objects memprof did not see allocated (in `attach`: live before
    /// attach), and their bytes as the collector counts them.
    pub unseen_count: u64,
    pub unseen_bytes: u64,
    /// Objects memprof tracks (seen allocated), and their bytes.
    pub tracked_count: u64,
    pub tracked_bytes: u64,
}

impl Profile {
    /// The processes of the session, the profiled target first (made from
    /// [`Profile::target`] for a profile that lists none).
    pub fn processes(&self) -> Vec<ProcessInfo> {
        if !self.processes.is_empty() {
            return self.processes.clone();
        }
        vec![ProcessInfo {
            pid: self.target.pid,
            ns_pid: None,
            ppid: 0,
            command: self.target.command.clone(),
            exe: self.target.exe.clone(),
            start_s: 0.0,
            end_s: self.exit.map(|_| self.duration_s),
            exit: self.exit,
            profiled: true,
            profiled_from_s: None,
            counters: None,
        }]
    }

    /// The process `group`'s allocations were made in.
    pub fn pid_of(&self, group: &Group) -> u32 {
        if group.pid == 0 {
            self.target.pid
        } else {
            group.pid
        }
    }

    /// The frames of `group`'s stack, innermost first.
    pub fn frames<'a>(&'a self, group: &Group) -> impl Iterator<Item = &'a Frame> + Clone + 'a {
        self.stacks.frames(group.stack)
    }

    /// Adds `group` with the stack `frames` (innermost first), interned.
    pub fn push(&mut self, mut group: Group, frames: Vec<Frame>) {
        group.stack = self.stacks.intern(frames);
        self.groups.push(group);
    }
}

/// Live memory over time, sampled by the daemon at a fixed period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The period asked for, seconds. Samples can be further apart when one
    /// sample takes long (a huge live table): memprof keeps its own reading
    /// of the kernel tables under a tenth of the time.
    pub period_s: f64,
    pub samples: Vec<Sample>,
    /// The longest a reading of the live table took, seconds.
    #[serde(default)]
    pub longest_read_s: f64,
}

/// One reading of the kernel's live table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since profiling started.
    pub t_s: f64,
    /// Per kind (`libc`, `mmap`, `gc`, `gc_atomic`): `[live blocks, live bytes]`.
    pub live: std::collections::BTreeMap<String, [u64; 2]>,
    /// The Boehm GC's heap size (`GC_get_heap_size`) at that time, where known.
    #[serde(default)]
    pub gc_heap_bytes: Option<u64>,
    /// Read from the per-site totals (the live table was too big to read
    /// at this rate): counts exact, bytes of freed blocks estimated from
    /// their site's mean allocation size.
    #[serde(default)]
    pub estimated: bool,
}

/// The Boehm GC as memprof saw it: collections, the mark-bit verdicts, the
/// heap at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GcSummary {
    /// How dead GC objects are recognized: `mark bits` (the collector's own
    /// verdict, read after each collection) or `address reuse only: <why>`.
    pub liveness: String,
    /// Collections whose end memprof saw and judged tracked objects at.
    pub collections: u64,
    /// Collections seen but not judged (the collecting thread could not be
    /// held, or its memory could not be read); their dead are found later.
    #[serde(default)]
    pub collections_not_judged: u64,
    /// GC allocations the kernel could not pass on for judging (its event
    /// buffer was full): those objects count as live until freed or reused.
    #[serde(default)]
    pub events_lost: u64,
    /// Judged by the kernel (`--gc-sampling refill`): GC objects its table
    /// had no room for, never judged (live until freed or reused).
    #[serde(default)]
    pub objects_not_judged: u64,
    /// Judged by the kernel: verdicts whose memory it could not read (the
    /// object stays live until a later collection).
    #[serde(default)]
    pub verdicts_failed: u64,
    /// The GC's collection number (`GC_gc_no`) of the last collection judged.
    pub last_collection: Option<u64>,
    /// At the last collection judged: tracked objects the collector had
    /// marked (reachable), and their bytes as the GC counts them (object
    /// sizes rounded up to its granules), comparable to its "in-use heap".
    pub marked_count: u64,
    pub marked_bytes: u64,
    /// Time spent judging, total and the longest single pass (the pause it
    /// added to one collection: the collector is held while it runs).
    pub pass_seconds: f64,
    pub longest_pass_seconds: f64,
    /// The collector's own figures at the end (`GC_get_heap_size`,
    /// `GC_get_free_bytes`, `GC_get_unmapped_bytes`), when readable.
    #[serde(default)]
    pub heap_size: Option<u64>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub unmapped_bytes: Option<u64>,
}

impl GcSummary {
    /// One collection judged (`GC_gc_no` `gc_no`), the collector paused
    /// `seconds` for it.
    pub fn count_pass(&mut self, gc_no: u64, seconds: f64) {
        self.collections += 1;
        self.last_collection = Some(gc_no);
        self.pass_seconds += seconds;
        self.longest_pass_seconds = self.longest_pass_seconds.max(seconds);
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetInfo {
    pub pid: u32,
    pub command: Vec<String>,
    pub exe: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl From<crate::target::launch::ExitStatus> for ExitInfo {
    fn from(status: crate::target::launch::ExitStatus) -> ExitInfo {
        use crate::target::launch::ExitStatus;
        match status {
            ExitStatus::Code(c) => ExitInfo {
                code: Some(c),
                signal: None,
            },
            ExitStatus::Signal(s) => ExitInfo {
                code: None,
                signal: Some(s),
            },
        }
    }
}

impl ExitInfo {
    /// The target exited, how is not known (an attached process not traced).
    pub const UNKNOWN: ExitInfo = ExitInfo {
        code: None,
        signal: None,
    };
}

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
    /// thread's cache (no return probed; see the README's "Allocations
    /// without their return").
    #[serde(default)]
    pub predicted: u64,
    /// Predictions checked against their return, and of those wrong (one
    /// wrong turns that predictor off for the rest of the session).
    #[serde(default)]
    pub predictions_checked: u64,
    #[serde(default)]
    pub predictions_wrong: u64,
    /// `--gc-sampling refill`: free-list refills recorded, each a sample
    /// standing for the objects of the list it refilled (see the README's
    /// "Sampling at the collector's refills"). Included in `allocs`.
    #[serde(default)]
    pub refills: u64,
    /// `attach --all`: allocations of processes memprof had no room for
    /// (its process table full): not followed.
    #[serde(default)]
    pub processes_not_followed: u64,
}

impl Counters {
    /// Adds `other`'s counts to these (the processes of one profile).
    pub fn add(&mut self, other: &Counters) {
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

/// One probe as attached.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeInfo {
    pub function: String,
    pub module: String,
    /// Offset of the entry probe from the function's start.
    pub entry_offset: u64,
    /// The kernel emulates the probed instruction (cheap) instead of single-stepping it.
    pub emulated: bool,
    pub reason: String,
}

/// Allocations of one kind from one call stack.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Group {
    /// The process (0 in profiles from before processes were followed:
    /// the target; see [`Profile::pid_of`]).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub pid: u32,
    /// `libc`, `mmap`, `gc`, `gc_atomic`.
    pub kind: String,
    pub live_count: u64,
    pub live_bytes: u64,
    pub total_count: u64,
    pub total_bytes: u64,
    /// The call stack, an id in [`Profile::stacks`] (innermost first from
    /// the caller of the allocator function; 0: no frames).
    #[serde(default)]
    pub stack: u32,
    /// The stack could not be unwound to its end (unwinder gave up or hit the depth limit).
    #[serde(default, skip_serializing_if = "is_false")]
    pub truncated: bool,
    /// Repeated frames of a recursive function were folded into one
    /// (unless `--keep-recursion`): the stack is shorter than the real one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub folded: bool,
    /// The site table was full (`--max-sites`): allocations of this kind
    /// counted here without their stack, so totals stay exact.
    #[serde(default, skip_serializing_if = "is_false")]
    pub overflow: bool,
    /// The Crystal class (or buffer kind) these objects are, where the stack says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// GC kinds: objects the collector reclaimed (judged by mark bits, or
    /// proven by their address being allocated again) and their bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub collected_count: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub collected_bytes: u64,
    /// GC kinds: of the live objects, those marked at the last collection
    /// (reachable then; the rest were allocated after it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub marked_count: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub marked_bytes: u64,
    /// How long the objects that died (freed or collected) had lived.
    #[serde(
        default,
        with = "compact_lifetimes",
        skip_serializing_if = "Lifetimes::is_empty"
    )]
    pub lifetimes: Lifetimes,
    /// GC kinds: `[collection number, live objects after it]` at the
    /// collections judged (at most 64 points, older ones thinned out):
    /// the growth the `--leaks` view looks for. Written as runs
    /// `[first collection, live objects, collections]` (see [`history`]).
    #[serde(default, with = "history", skip_serializing_if = "Vec::is_empty")]
    pub gc_history: Vec<[u64; 2]>,
    /// Version-2 files only: the whole stack, moved into
    /// [`Profile::stacks`] on load. Never written.
    #[doc(hidden)]
    #[serde(rename = "frames", default, skip_serializing)]
    pub v2_frames: Vec<Frame>,
}

pub use memprof_common::LIFETIME_BOUNDS_NS;

/// Fields left out of the file when they hold nothing (most groups).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// [`Group::lifetimes`] in the file: `[died, total_ns, [buckets],
/// within_first_collection, collections_survived]`, without the field
/// names of every group. The object (version 2) is read too.
mod compact_lifetimes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Lifetimes;

    type Tuple = (u64, u64, [u64; 8], u64, u64);

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Tuple(Tuple),
        Object(Lifetimes),
    }

    pub fn serialize<S: Serializer>(l: &Lifetimes, s: S) -> Result<S::Ok, S::Error> {
        let tuple: Tuple = (
            l.died,
            l.total_ns,
            l.buckets,
            l.within_first_collection,
            l.collections_survived,
        );
        tuple.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lifetimes, D::Error> {
        Ok(match Either::deserialize(d)? {
            Either::Object(l) => l,
            Either::Tuple((
                died,
                total_ns,
                buckets,
                within_first_collection,
                collections_survived,
            )) => Lifetimes {
                died,
                total_ns,
                buckets,
                within_first_collection,
                collections_survived,
            },
        })
    }
}

/// [`Group::gc_history`] in the file: runs `[first collection, live,
/// length]` of consecutive collections with the same count (a stack whose
/// objects all died reads `[c, 0, 60]` instead of sixty points). Points
/// `[collection, live]` (version 2) are read too.
pub mod history {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// More points than any history holds: a longer run is corrupt.
    const MAX_POINTS: u64 = 1 << 16;

    pub fn serialize<S: Serializer>(points: &[[u64; 2]], s: S) -> Result<S::Ok, S::Error> {
        let mut runs: Vec<[u64; 3]> = Vec::new();
        for &[collection, live] in points {
            match runs.last_mut() {
                Some(run) if run[1] == live && run[0].checked_add(run[2]) == Some(collection) => {
                    run[2] += 1
                }
                _ => runs.push([collection, live, 1]),
            }
        }
        runs.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[u64; 2]>, D::Error> {
        let entries: Vec<Vec<u64>> = Vec::deserialize(d)?;
        let mut points = Vec::new();
        for entry in entries {
            match entry[..] {
                [collection, live] => points.push([collection, live]),
                [first, live, length]
                    if points.len() as u64 + length <= MAX_POINTS
                        && first.checked_add(length).is_some() =>
                {
                    points.extend((first..first + length).map(|c| [c, live]))
                }
                _ => return Err(D::Error::custom("a bad collection history")),
            }
        }
        Ok(points)
    }
}

/// Lifetimes of the objects of one stack that died while profiled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetimes {
    /// Objects that died: freed (libc, `GC_free`) or collected.
    pub died: u64,
    /// Sum of their lifetimes, nanoseconds (allocation to free; for
    /// collected objects, to the end of the collection that found them dead).
    pub total_ns: u64,
    /// Histogram of lifetimes: bucket `i` counts lifetimes below
    /// `LIFETIME_BOUNDS_NS[i]` (and at least the bound before); the last
    /// bucket the rest.
    pub buckets: [u64; 8],
    /// GC kinds: collected at the first collection after their allocation
    /// (they did not survive one collection).
    pub within_first_collection: u64,
    /// GC kinds: sum over collected objects of the collections they survived.
    pub collections_survived: u64,
}

impl Lifetimes {
    /// Nothing died.
    pub fn is_empty(&self) -> bool {
        *self == Lifetimes::default()
    }

    /// Adds one death after `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        self.died += 1;
        self.total_ns += ns;
        self.buckets[memprof_common::lifetime_bucket(ns)] += 1;
    }

    /// Adds `other`'s deaths.
    /// Every count times `f` (sampled lifetimes to estimates).
    pub fn scale(&mut self, f: f64) {
        let times = |n: &mut u64| *n = (*n as f64 * f).round() as u64;
        for n in [
            &mut self.died,
            &mut self.total_ns,
            &mut self.within_first_collection,
            &mut self.collections_survived,
        ] {
            times(n);
        }
        self.buckets.iter_mut().for_each(times);
    }

    pub fn add(&mut self, other: &Lifetimes) {
        self.died += other.died;
        self.total_ns += other.total_ns;
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.within_first_collection += other.within_first_collection;
        self.collections_survived += other.collections_survived;
    }

    /// Deaths younger than `ns`, counted from whole buckets (so `ns` is
    /// rounded up to the next bucket bound).
    pub fn died_within(&self, ns: u64) -> u64 {
        let upto = LIFETIME_BOUNDS_NS
            .iter()
            .position(|&bound| ns <= bound)
            .unwrap_or(LIFETIME_BOUNDS_NS.len());
        self.buckets[..=upto].iter().sum()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Readable function name (`[unknown]` when no symbol covers the address).
    pub function: String,
    /// The symbol as found in the binary.
    pub raw_name: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Path of the module (executable or library).
    pub module: String,
    /// The return address in the target's address space.
    pub address: u64,
    /// The same address as an offset in the module's file (stable across runs).
    #[serde(default)]
    pub offset: Option<u64>,
}

/// Writes `profile` in the file format.
pub fn write(profile: &Profile, out: &mut impl Write) -> Result<()> {
    let header = format!("{MAGIC} {VERSION}\n");
    out.write_all(header.as_bytes())?;
    // The checksum covers the header too: a version changed by a flipped
    // bit is refused, not read as another format.
    let mut crc = crc32fast::Hasher::new();
    crc.update(header.as_bytes());
    let mut body = Checksummed {
        out: &mut *out,
        crc,
        bytes: 0,
    };
    // serde_json writes in small pieces: checksummed in big ones.
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut body);
    serde_json::to_writer(&mut buffered, profile)?;
    buffered.flush()?;
    drop(buffered);
    let (crc, bytes) = (body.crc.finalize(), body.bytes);
    writeln!(out)?;
    writeln!(out, "{END} crc32={crc:08x} bytes={bytes}")?;
    Ok(())
}

/// Passes bytes on, with their CRC-32 and count.
struct Checksummed<W> {
    out: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Reads a profile file; errors say what is wrong with it in one line.
pub fn load(path: &Path) -> Result<Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes).with_context(|| format!("{}", path.display()))
}

/// Parses the bytes of a profile file.
pub fn parse(bytes: &[u8]) -> Result<Profile> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_bytes()) else {
        bail!("not a memprof profile (no {MAGIC} header)");
    };
    let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
        bail!("profile is truncated (header incomplete)");
    };
    let version = std::str::from_utf8(&rest[..newline])
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let version = match version {
        Some(v) if (OLDEST_READ..=VERSION).contains(&v) => v,
        Some(other) => bail!(
            "profile version {other} is not supported: this memprof reads versions {OLDEST_READ} to {VERSION}"
        ),
        None => bail!("not a memprof profile (bad version in header)"),
    };
    // Version 2 checksums the JSON only, later ones the header line too.
    let covered = if version == 2 {
        &[][..]
    } else {
        &bytes[..MAGIC.len() + newline + 1]
    };
    let body = checked_body(covered, &rest[newline + 1..])?;
    let mut profile: Profile =
        serde_json::from_slice(body).map_err(|e| anyhow::anyhow!("profile is corrupt: {e}"))?;
    if version == 2 {
        from_version_2(&mut profile);
    }
    check_stacks(&profile)?;
    check_sums(&profile)?;
    Ok(profile)
}

/// Moves the whole stacks of a version-2 file into the stack table.
fn from_version_2(profile: &mut Profile) {
    let mut stacks = std::mem::take(&mut profile.stacks);
    for g in &mut profile.groups {
        g.stack = stacks.intern(std::mem::take(&mut g.v2_frames));
    }
    profile.stacks = stacks;
}

/// Refuses groups naming a stack the table does not have, and frames in a
/// version-3 group (a file edited by hand, or written by another tool).
fn check_stacks(profile: &Profile) -> Result<()> {
    let stacks = profile.stacks.node_count();
    for g in &profile.groups {
        if g.stack as usize >= stacks {
            bail!(
                "profile is corrupt (a group names stack {} of {stacks})",
                g.stack
            );
        }
        if !g.v2_frames.is_empty() {
            bail!("profile is corrupt (a version-{VERSION} group with whole frames)");
        }
    }
    Ok(())
}

/// The JSON between the header and the end line, once its length and
/// checksum match the end line's.
fn checked_body<'a>(covered: &[u8], rest: &'a [u8]) -> Result<&'a [u8]> {
    let truncated = || anyhow::anyhow!("profile is truncated (the file ends early)");
    let text = rest.strip_suffix(b"\n").ok_or_else(truncated)?;
    let start = text
        .iter()
        .rposition(|&b| b == b'\n')
        .ok_or_else(truncated)?;
    let Some(end) = std::str::from_utf8(&text[start + 1..])
        .ok()
        .and_then(|l| l.strip_prefix(END))
    else {
        return Err(truncated());
    };
    let field = |name: &str| {
        end.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
    };
    let crc = field("crc32").and_then(|v| u32::from_str_radix(v, 16).ok());
    let len = field("bytes").and_then(|v| v.parse::<usize>().ok());
    let (Some(crc), Some(len)) = (crc, len) else {
        bail!("profile is corrupt (bad end line)");
    };
    if end != format!(" crc32={crc:08x} bytes={len}") {
        bail!("profile is corrupt (bad end line)");
    }
    let body = &text[..start];
    if body.len() != len {
        // Bytes lost or added in the middle: a copy gone wrong.
        bail!(
            "profile is corrupt ({} bytes of JSON where the end line says {len})",
            body.len()
        );
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(covered);
    hasher.update(body);
    if hasher.finalize() != crc {
        bail!(
            "profile is corrupt (checksum mismatch: the file was changed after memprof wrote it)"
        );
    }
    Ok(body)
}

/// Refuses counts no run can produce: sums that overflow 64 bits.
fn check_sums(profile: &Profile) -> Result<()> {
    let mut sums = [0u64; 8];
    for g in &profile.groups {
        let values = [
            g.live_count,
            g.live_bytes,
            g.total_count,
            g.total_bytes,
            g.collected_count,
            g.collected_bytes,
            g.marked_count,
            g.marked_bytes,
        ];
        for (sum, value) in sums.iter_mut().zip(values) {
            *sum = sum.checked_add(value).ok_or_else(|| {
                anyhow::anyhow!("profile is corrupt (counts too large to add up)")
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut p = Profile::default();
        p.groups.push(Group {
            kind: "libc".into(),
            live_count: 1,
            ..Group::default()
        });
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        bytes
    }

    fn error(bytes: &[u8]) -> String {
        format!("{:#}", parse(bytes).unwrap_err())
    }

    #[test]
    fn round_trips() {
        assert_eq!(parse(&sample()).unwrap().groups[0].live_count, 1);
    }

    #[test]
    fn names_each_kind_of_bad_file() {
        assert!(error(b"\x7fELF garbage").contains("not a memprof profile"));
        let bytes = sample();
        assert!(error(&bytes[..bytes.len() / 2]).contains("truncated"));
        let other = String::from_utf8(bytes.clone())
            .unwrap()
            .replacen(" 3\n", " 999\n", 1);
        assert!(error(other.as_bytes()).contains("version 999"));
        let mut corrupt = bytes.clone();
        let at = corrupt.len() - 5;
        corrupt[at] = b'#';
        assert!(error(&corrupt).contains("corrupt"));
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = sample();
        for at in 0..bytes.len() {
            for bit in [0x01, 0x20, 0x80] {
                let mut flipped = bytes.clone();
                flipped[at] ^= bit;
                assert!(parse(&flipped).is_err(), "byte {at} ^ {bit:#x} accepted");
            }
        }
    }

    /// A file around `json` as memprof `version` writes it.
    fn file(version: u32, json: &str) -> Vec<u8> {
        let header = format!("{MAGIC} {version}\n");
        let mut crc = crc32fast::Hasher::new();
        if version > 2 {
            crc.update(header.as_bytes());
        }
        crc.update(json.as_bytes());
        let end = format!("{END} crc32={:08x} bytes={}\n", crc.finalize(), json.len());
        format!("{header}{json}\n{end}").into_bytes()
    }

    const V2: &str = r#"{"memprof_version":"0.1.0","mode":"run","target":{"pid":1,"command":["a"],"exe":"/a"},"start_unix_s":0.0,"duration_s":1.0,"exit":null,"unwind":"dwarf","counters":{"live_map_full":0,"sites_map_full":0,"stack_errors":0,"pending_full":0,"unknown_frees":0,"allocs":3,"frees":0,"failed_allocs":0},"probes":[],"groups":[
        {"kind":"gc","live_count":1,"live_bytes":32,"total_count":2,"total_bytes":64,"frames":[
            {"function":"inl","raw_name":"inl","file":"/a.cr","line":3,"module":"/a","address":4352,"offset":256},
            {"function":"Foo.new","raw_name":"*Foo::new:Foo","file":"/a.cr","line":9,"module":"/a","address":4352,"offset":256},
            {"function":"main","raw_name":"main","file":null,"line":null,"module":"/a","address":8192,"offset":4096}],
         "truncated":true,"lifetimes":{"died":1,"total_ns":5,"buckets":[1,0,0,0,0,0,0,0],"within_first_collection":1,"collections_survived":0},
         "gc_history":[[4,1],[5,1],[7,0]]},
        {"kind":"gc_atomic","live_count":1,"live_bytes":8,"total_count":1,"total_bytes":8,"frames":[
            {"function":"main","raw_name":"main","file":null,"line":null,"module":"/a","address":8192,"offset":4096}]}]}"#;

    #[test]
    fn reads_version_2_into_the_stack_table() {
        let p = parse(&file(2, V2)).unwrap();
        // `main` once, `Foo.new` with its inlined frame as one location.
        assert_eq!(p.stacks.locations().len(), 2);
        assert_eq!(p.stacks.locations()[0].frames.len(), 2);
        assert_eq!(p.stacks.node_count(), 3);
        let names =
            |g: &Group| -> Vec<String> { p.frames(g).map(|f| f.function.clone()).collect() };
        assert_eq!(names(&p.groups[0]), ["inl", "Foo.new", "main"]);
        assert_eq!(names(&p.groups[1]), ["main"]);
        // gc_atomic's stack is the caller node of gc's.
        assert_eq!(p.stacks.node(p.groups[0].stack)[1], p.groups[1].stack);
        let main = p.frames(&p.groups[1]).next().unwrap();
        assert_eq!((main.address, main.offset), (8192, Some(4096)));
        assert!(p.groups[0].truncated && !p.groups[0].folded);
        assert_eq!(p.groups[0].lifetimes.within_first_collection, 1);
        assert_eq!(p.groups[0].gc_history, [[4, 1], [5, 1], [7, 0]]);
        // Written again, it is version 3 and reads back the same.
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        let back = parse(&bytes).unwrap();
        assert_eq!(back.stacks, p.stacks);
        assert_eq!(back.groups[0].gc_history, p.groups[0].gc_history);
        assert_eq!(back.groups[0].lifetimes, p.groups[0].lifetimes);
        assert_eq!(back.groups[1].stack, p.groups[1].stack);
        // The version-2 bytes are refused as version 3: the checksum covers the header.
        let v2 = file(2, V2);
        let relabeled = [b"MEMPROF-PROFILE 3".as_slice(), &v2[17..]].concat();
        assert!(
            error(&relabeled).contains("checksum"),
            "{}",
            error(&relabeled)
        );
    }

    #[test]
    fn version_3_layout() {
        let mut p = Profile::default();
        let frame = |function: &str, address| Frame {
            function: function.into(),
            raw_name: function.into(),
            module: "/bin/a".into(),
            address,
            ..Frame::default()
        };
        let stack = vec![frame("leaf", 1), frame("main", 2)];
        let group = |kind: &str| Group {
            kind: kind.into(),
            folded: true,
            gc_history: (10..70).map(|c| [c, 0]).collect(),
            ..Group::default()
        };
        p.push(group("gc"), stack.clone());
        p.push(group("gc_atomic"), stack);
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        let body = text.lines().nth(1).unwrap();
        // Both kinds name one stack; strings once; 60 points as one run;
        // empty fields left out.
        assert_eq!(p.groups[0].stack, p.groups[1].stack);
        assert!(body.contains(r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"stack":2,"folded":true,"gc_history":[[10,0,60]]},"#), "{body}");
        assert!(body.contains(r#""stacks":{"strings":["/bin/a","leaf","main"],"locations":[{"address":1,"offset":null,"module":0,"frames":[{"function":1,"raw_name":1,"file":null,"line":null}]},{"address":2,"offset":null,"module":0,"frames":[{"function":2,"raw_name":2,"file":null,"line":null}]}],"nodes":[[1,0],[0,1]]}"#), "{body}");
        let back = parse(&bytes).unwrap();
        assert!(back.groups[1].folded);
        assert_eq!(back.groups[1].gc_history, p.groups[1].gc_history);
        assert_eq!(back.stacks, p.stacks);
    }

    #[test]
    fn refuses_bad_stack_ids_in_one_line() {
        let p = Profile::default();
        let json = serde_json::to_string(&p).unwrap();
        let bad = [
            // A group naming a stack the table does not have.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"stack":1}]"#),
            // A node naming a location the table does not have.
            json.replace(r#""nodes":[]"#, r#""nodes":[[0,0]]"#),
            // Whole frames in a version-3 group.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"frames":[{"function":"f","raw_name":"f","file":null,"line":null,"module":"m","address":1}]}]"#),
            // A history run longer than any history.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"gc_history":[[1,0,99999999999]]}]"#),
        ];
        for json in bad {
            assert_ne!(json, serde_json::to_string(&p).unwrap());
            let e = error(&file(VERSION, &json));
            assert!(e.contains("profile is corrupt") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn refuses_counts_that_overflow() {
        let mut p = Profile::default();
        for _ in 0..2 {
            p.groups.push(Group {
                kind: "libc".into(),
                live_bytes: u64::MAX - 1,
                ..Group::default()
            });
        }
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        assert!(error(&bytes).contains("too large"), "{}", error(&bytes));
    }
}
