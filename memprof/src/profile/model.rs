//! The data model: a [`Profile`] of one session, its processes, and its
//! [`Group`]s (allocations of one kind from one call stack).
use serde::{Deserialize, Serialize};

use super::history;
use super::lifetimes::compact_lifetimes;
use super::{Censuses, Counters, GcSummary, Lifetimes, Stacks, Timeline};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Profile {
    pub memprof_version: String,
    /// The kernel the session ran on, and which of the features memprof
    /// prefers it had (a fallback was used for each one it lacked).
    /// Absent in profiles from before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelInfo>,
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
    /// With `refill`: one refill in this many was followed, drawn at
    /// random (`--gc-refill-every`), each standing for as many lists.
    /// 0 (older profiles) or 1: every refill.
    #[serde(default, skip_serializing_if = "every_refill")]
    pub gc_refill_every: u32,
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
    /// How many processes of the profile had this pid before this one
    /// (the kernel gives an ended process's pid again): 0 for the first.
    /// Its groups carry the same.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub pid_reuse: u32,
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

fn every_refill(every: &u32) -> bool {
    *every <= 1
}

impl Profile {
    /// How the refills were followed, for the reports: "" when every one
    /// was, else ", one in K followed at random (--gc-refill-every)".
    pub fn refills_thinned(&self) -> String {
        match self.gc_refill_every {
            0 | 1 => String::new(),
            k => format!(", one in {k} followed at random (--gc-refill-every)"),
        }
    }

    /// Live blocks and bytes per allocation kind (in
    /// [`memprof_common::AllocKind::ALL`]'s order), over every group.
    pub fn live_per_kind(&self) -> [[u64; 2]; memprof_common::AllocKind::COUNT] {
        let mut live = [[0u64; 2]; memprof_common::AllocKind::COUNT];
        for g in &self.groups {
            if let Some(k) = kind_index(&g.kind) {
                live[k][0] += g.live_count;
                live[k][1] += g.live_bytes;
            }
        }
        live
    }

    /// The processes of the session, the profiled target first (made from
    /// [`Profile::target`] for a profile that lists none).
    pub fn processes(&self) -> Vec<ProcessInfo> {
        if !self.processes.is_empty() {
            return self.processes.clone();
        }
        vec![ProcessInfo {
            pid: self.target.pid,
            pid_reuse: 0,
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

    /// Whether `group`'s allocations were made in process `p`.
    pub fn is_of(&self, group: &Group, p: &ProcessInfo) -> bool {
        self.pid_of(group) == p.pid && group.pid_reuse == p.pid_reuse
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

    /// About what the groups and stacks hold in memory, in bytes (their
    /// structs and text; not the allocator's own overhead): what a
    /// session's kept profiles are bounded by.
    pub fn estimated_bytes(&self) -> usize {
        let groups: usize = self
            .groups
            .iter()
            .map(|g| {
                std::mem::size_of::<Group>()
                    + g.kind.capacity()
                    + g.type_name.as_ref().map_or(0, String::capacity)
                    + g.gc_history.capacity() * 16
            })
            .sum();
        groups + self.stacks.estimated_bytes()
    }

    /// The stack table made again from the groups: the stacks of groups
    /// let go are dropped (each process's own, its addresses being its
    /// own: `attach --all` kept ~40 KB a process after letting it go).
    pub fn compact_stacks(&mut self) {
        let old = std::mem::take(&mut self.stacks);
        for group in &mut self.groups {
            let frames: Vec<Frame> = old.frames(group.stack).cloned().collect();
            group.stack = self.stacks.intern(frames);
        }
    }
}

/// The kernel a session ran on: its release and what it offered memprof's
/// probes (docs/troubleshooting.md says what each missing one costs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// Multi-uprobe links (Linux 6.6); without: a perf event per probe.
    pub multi_uprobe: bool,
    /// Uprobe sessions (Linux 6.13); without: every allocation's return
    /// probed, no result read at an allocator's entry.
    pub uprobe_session: bool,
    /// The task-VMA iterator (Linux 6.7); without: a new process's first
    /// unwind table waits for /proc (`attach --all`, `run`'s children).
    pub task_vma_iter: bool,
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
    /// The kernel's OOM killer ended it (`attach --all`, `memprof agent`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

impl ExitInfo {
    /// The target exited, how is not known (an attached process not traced).
    pub(crate) const UNKNOWN: ExitInfo = ExitInfo {
        code: None,
        signal: None,
        oom_killed: false,
    };
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
    /// Which process of that pid ([`ProcessInfo::pid_reuse`]).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub pid_reuse: u32,
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
    /// `[first collection, live objects, collections]`.
    #[serde(default, with = "history", skip_serializing_if = "Vec::is_empty")]
    pub gc_history: Vec<[u64; 2]>,
    /// Version-2 files only: the whole stack, moved into
    /// [`Profile::stacks`] on load. Never written.
    #[doc(hidden)]
    #[serde(rename = "frames", default, skip_serializing)]
    pub v2_frames: Vec<Frame>,
}

impl Group {
    /// A group of the same process, kind and stack with nothing counted:
    /// part of this one's objects, counted apart.
    pub fn split_off(&self) -> Group {
        Group {
            pid: self.pid,
            pid_reuse: self.pid_reuse,
            kind: self.kind.clone(),
            stack: self.stack,
            truncated: self.truncated,
            folded: self.folded,
            overflow: self.overflow,
            type_name: self.type_name.clone(),
            ..Group::default()
        }
    }
}

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

impl Frame {
    /// Its struct and text, in bytes.
    pub fn estimated_bytes(&self) -> usize {
        std::mem::size_of::<Frame>()
            + self.function.capacity()
            + self.raw_name.capacity()
            + self.file.as_ref().map_or(0, String::capacity)
            + self.module.capacity()
    }
}

/// The place of the kind named `name` in [`memprof_common::AllocKind::ALL`].
pub fn kind_index(name: &str) -> Option<usize> {
    memprof_common::AllocKind::ALL
        .iter()
        .position(|k| k.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, address: u64) -> Frame {
        Frame {
            function: function.into(),
            address,
            ..Frame::default()
        }
    }

    /// Two processes' groups, one let go: its stack goes with it, the
    /// other's frames stay the same.
    #[test]
    fn stacks_of_groups_let_go_are_dropped() {
        let mut profile = Profile::default();
        let kept = vec![frame("make_foo", 0x1000), frame("main", 0x2000)];
        let gone = vec![frame("make_foo", 0x5000), frame("main", 0x6000)];
        let group = |pid| Group {
            pid,
            kind: "libc".into(),
            ..Group::default()
        };
        profile.push(group(2), gone);
        profile.push(group(1), kept.clone());
        assert_eq!(profile.stacks.locations().len(), 4);
        profile.groups.retain(|g| g.pid == 1);
        profile.compact_stacks();
        assert_eq!(profile.stacks.locations().len(), 2);
        let frames: Vec<Frame> = profile.frames(&profile.groups[0]).cloned().collect();
        assert_eq!(frames, kept);
    }
}
