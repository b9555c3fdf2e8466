//! Report writers: a [`Profile`] in, text out. No tracing code here, so
//! `memprof report` runs anywhere, without privileges.
//!
//! Every writer sees the same rows: [`select`] sorts the groups (live bytes,
//! then live count, then stack text, all descending but the stack) and
//! applies `--min-bytes` and `--top`; [`Options::frames`] hides the
//! allocator plumbing (`--skip-runtime`) and applies `--skip` and `--depth`
//! to a stack. [`types`] sums live objects per allocated class instead.
//!
//! ```
//! use memprof::profile::{Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let mut profile = Profile::default();
//! profile.groups.push(Group { kind: "libc".into(), live_count: 3, live_bytes: 3072, ..Default::default() });
//! let mut out = Vec::new();
//! render(&profile, Format::Tsv, &Options::default(), &mut out).unwrap();
//! assert!(String::from_utf8(out).unwrap().starts_with("1\n3\t3072"));
//! ```
pub mod diff;
pub mod filter;
pub mod flamegraph;
pub mod folded;
pub mod html;
pub mod json;
pub mod leaks;
pub mod markdown;
pub mod plumbing;
pub mod pprof;
pub mod runtime;
pub mod timeline;
pub mod tsv;
pub mod types;

use std::collections::HashMap;
use std::io::Write;

use anyhow::Result;

use crate::profile::{Frame, Group, Profile};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Table of live allocations per stack, as perf-tools' MemProf prints it.
    Markdown,
    /// Row count, then `count<TAB>bytes<TAB>frame<TAB>frame…` per stack.
    Tsv,
    /// Everything in the profile, documented in the README.
    Json,
    /// Live objects and bytes per allocated Crystal class (`| Objects | Bytes | Type |`).
    Types,
    /// Folded stacks for flamegraph.pl and friends: `root;…;leaf VALUE` per line.
    Folded,
    /// Flamegraph SVG (inferno): live bytes by stack.
    Flamegraph,
    /// Gzipped pprof profile.proto (alloc_objects, alloc_space, inuse_objects,
    /// inuse_space), for `go tool pprof`; binary, use -o.
    Pprof,
    /// SVG line chart of live bytes per kind over time.
    Timeline,
    /// One self-contained HTML page: summary, timeline, flamegraph, top stacks, types.
    Html,
}

impl Format {
    /// The formats `--diff` can write.
    pub fn diffable(self) -> bool {
        matches!(self, Format::Markdown | Format::Json)
    }
}

/// What flamegraph, folded and the value of each stack count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Count {
    /// Bytes.
    #[default]
    Bytes,
    /// Blocks (objects).
    Objects,
}

/// What to show.
#[derive(Debug, Clone)]
pub struct Options {
    /// Leave out stacks with fewer live bytes (default: 1024 for markdown and tsv, 0 for json).
    pub min_bytes: Option<u64>,
    /// Frames shown per stack (default: 5 in tables, all in json).
    pub depth: Option<usize>,
    /// Innermost frames to skip.
    pub skip: usize,
    /// At most this many stacks.
    pub top: Option<usize>,
    /// Hide the allocator plumbing (`GC.malloc`, `__crystal_malloc64`,
    /// `Pointer(T).malloc`, C++'s `operator new` and the standard library
    /// frames it was called through, …) at the top of each stack, before `--skip`.
    pub skip_runtime: bool,
    /// Folded and flamegraph: count bytes or objects.
    pub count: Count,
    /// Folded and flamegraph: everything allocated instead of what is live.
    pub total: bool,
    /// Flamegraph: icicle graph (roots at the top).
    pub inverted: bool,
    /// The filters applied, in words (`--function make_foo; --temporary …`),
    /// for the headers of markdown, types and html; `None` when unfiltered.
    pub filters: Option<String>,
    /// Keep the profile's order of stacks (`--leaks` ranks them itself).
    pub keep_order: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_bytes: None,
            depth: None,
            skip: 0,
            top: None,
            skip_runtime: true,
            count: Count::Bytes,
            total: false,
            inverted: false,
            filters: None,
            keep_order: false,
        }
    }
}

impl Options {
    /// The frames of `group` (of `profile`) to show; `default_depth`
    /// applies when `--depth` was not given.
    pub fn frames<'a>(
        &self,
        profile: &'a Profile,
        group: &Group,
        default_depth: usize,
    ) -> impl Iterator<Item = &'a Frame> + 'a {
        let hidden = if self.skip_runtime {
            runtime_frames(profile, group)
        } else {
            0
        };
        profile
            .frames(group)
            .skip(hidden + self.skip)
            .take(self.depth.unwrap_or(default_depth))
    }
}

impl Options {
    /// The frames a table shows for `group`: [`Options::frames`] before
    /// `--depth`, with recursion folded (a run of frames of one function
    /// shown once, its innermost), then `--depth` (`default_depth` when not
    /// given). Also whether a frame was folded.
    pub fn shown<'a>(
        &self,
        profile: &'a Profile,
        group: &Group,
        default_depth: usize,
    ) -> (Vec<&'a Frame>, bool) {
        let depth = self.depth.unwrap_or(default_depth);
        let hidden = if self.skip_runtime {
            runtime_frames(profile, group)
        } else {
            0
        };
        let mut frames: Vec<&'a Frame> = Vec::new();
        let mut folded = false;
        for f in profile.frames(group).skip(hidden + self.skip) {
            if frames.last().is_some_and(|last: &&Frame| {
                last.function == f.function && !f.function.starts_with('[')
            }) {
                folded = true;
                continue;
            }
            if frames.len() == depth {
                break;
            }
            frames.push(f);
        }
        (frames, folded)
    }
}

/// How many innermost frames of `group` are allocator plumbing
/// ([`plumbing::count`]: Crystal's runtime, C++'s `operator new` and the
/// standard library's allocator templates). Only that
/// first run: plumbing deeper in a stack (a GC callback) stays. A stack of
/// nothing but plumbing (cut short) is shown whole.
pub fn runtime_frames(profile: &Profile, group: &Group) -> usize {
    let n = plumbing::count(profile.frames(group));
    // Nothing after the plumbing: keep it all.
    if profile.frames(group).nth(n).is_none() {
        0
    } else {
        n
    }
}

/// Writes `profile` in `format`.
pub fn render(
    profile: &Profile,
    format: Format,
    options: &Options,
    out: &mut dyn Write,
) -> Result<()> {
    match format {
        Format::Markdown => markdown::write(profile, options, out),
        Format::Tsv => tsv::write(profile, options, out),
        Format::Json => json::write(profile, options, out),
        Format::Types => types::write(profile, options, out),
        Format::Folded => folded::write(profile, options, out),
        Format::Flamegraph => flamegraph::write(profile, options, out),
        Format::Pprof => pprof::write(profile, options, out),
        Format::Timeline => timeline::write(profile, options, out),
        Format::Html => html::write(profile, options, out),
    }
}

/// The groups to show, sorted; `live_only` drops stacks with nothing live.
pub fn select<'a>(
    profile: &'a Profile,
    options: &Options,
    default_min: u64,
    live_only: bool,
) -> Vec<&'a Group> {
    let min = options.min_bytes.unwrap_or(default_min);
    let mut rows: Vec<(&Group, String)> = profile
        .groups
        .iter()
        .filter(|g| g.live_bytes >= min && (!live_only || g.live_count > 0))
        .map(|g| (g, stack_key(profile, g)))
        .collect();
    if !options.keep_order {
        rows.sort_by(|(a, ka), (b, kb)| {
            b.live_bytes
                .cmp(&a.live_bytes)
                .then(b.live_count.cmp(&a.live_count))
                .then(b.total_bytes.cmp(&a.total_bytes))
                .then_with(|| ka.cmp(kb))
        });
    }
    rows.truncate(options.top.unwrap_or(usize::MAX));
    rows.into_iter().map(|(g, _)| g).collect()
}

/// One row of a table: the stacks whose shown frames are the same, merged.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    /// The merged figures (counts, bytes, lifetimes summed; the flags of
    /// the first stack, which all share); `stack` is the first stack's.
    pub group: Group,
    /// The frames shown, innermost first: plumbing hidden, `--skip`,
    /// recursion folded (a function calling itself shown once), `--depth`.
    pub frames: Vec<&'a Frame>,
    /// How many stacks of the profile the row merges.
    pub stacks: u64,
    /// Recursion was folded in the shown frames (or by the unwinder).
    pub folded: bool,
    /// The runtime's own allocations (fiber stacks, the collector's heap).
    pub runtime: Option<runtime::Role>,
    /// The stack is nothing but allocator plumbing (`GC.malloc`): the
    /// unwinder got no further, so the program's frames are unknown.
    pub plumbing_only: bool,
}

/// What a table adds below a stack of nothing but allocator plumbing, for
/// a profile unwound with `unwind` (`fp` or `dwarf`).
pub fn plumbing_only_note(unwind: &str) -> &'static str {
    if unwind == "fp" {
        "…(the stack ends in the allocator: frame pointers got no further; record with --unwind dwarf)"
    } else {
        "…(the stack ends in the allocator: the unwinder got no further)"
    }
}

/// The rows of a table: the groups merged by the frames they show (as
/// perf-tools' MemProf groups by its 5 frames), then `--min-bytes` and
/// `--top` on the merged rows, the program's rows first (live bytes, live
/// count, allocated bytes, descending), the runtime's after them.
/// `live_only` drops rows with nothing live.
pub fn rows<'a>(
    profile: &'a Profile,
    options: &Options,
    default_min: u64,
    default_depth: usize,
    live_only: bool,
) -> Vec<Row<'a>> {
    let min = options.min_bytes.unwrap_or(default_min);
    // Not whether recursion was folded: a recursive function's first call
    // (nothing folded) and its deeper ones read the same.
    type Key = (Vec<u32>, String, bool, bool, Option<runtime::Role>);
    let mut index: HashMap<Key, usize> = HashMap::new();
    // Frames read the same when their text does (two return addresses on
    // one line): each frame of the stack table gets the id of its text, once.
    let mut text_ids: HashMap<String, u32> = HashMap::new();
    let mut frame_ids: HashMap<usize, u32> = HashMap::new();
    let mut rows: Vec<Row<'a>> = Vec::new();
    for g in &profile.groups {
        if live_only && g.live_count == 0 {
            continue;
        }
        let (frames, folded) = options.shown(profile, g, default_depth);
        let role = runtime::role(profile, g);
        let key = (
            frames
                .iter()
                .map(|&f| {
                    *frame_ids
                        .entry(std::ptr::from_ref(f) as usize)
                        .or_insert_with(|| {
                            let n = text_ids.len() as u32;
                            *text_ids.entry(frame_text(f)).or_insert(n)
                        })
                })
                .collect(),
            g.kind.clone(),
            g.truncated,
            g.overflow,
            role,
        );
        match index.get(&key) {
            Some(&i) => {
                let row = &mut rows[i];
                merge(&mut row.group, g);
                row.stacks += 1;
                row.folded |= folded || g.folded;
            }
            None => {
                index.insert(key, rows.len());
                let all = profile.frames(g).count();
                rows.push(Row {
                    group: g.clone(),
                    frames,
                    stacks: 1,
                    folded: folded || g.folded,
                    runtime: role,
                    plumbing_only: all > 0 && plumbing::count(profile.frames(g)) == all,
                });
            }
        }
    }
    rows.retain(|r| r.group.live_bytes >= min);
    let text = |r: &Row<'_>| -> String {
        r.frames
            .iter()
            .map(|f| f.function.as_str())
            .collect::<Vec<_>>()
            .join(";")
    };
    let mut keyed: Vec<(Row<'a>, String)> = rows
        .into_iter()
        .map(|r| {
            let t = text(&r);
            (r, t)
        })
        .collect();
    keyed.sort_by(|(a, ka), (b, kb)| {
        a.runtime
            .is_some()
            .cmp(&b.runtime.is_some())
            .then(b.group.live_bytes.cmp(&a.group.live_bytes))
            .then(b.group.live_count.cmp(&a.group.live_count))
            .then(b.group.total_bytes.cmp(&a.group.total_bytes))
            .then_with(|| ka.cmp(kb))
    });
    keyed.truncate(options.top.unwrap_or(usize::MAX));
    keyed.into_iter().map(|(r, _)| r).collect()
}

/// Adds `other`'s figures to `into`.
fn merge(into: &mut Group, other: &Group) {
    into.live_count += other.live_count;
    into.live_bytes += other.live_bytes;
    into.total_count += other.total_count;
    into.total_bytes += other.total_bytes;
    into.collected_count += other.collected_count;
    into.collected_bytes += other.collected_bytes;
    into.marked_count += other.marked_count;
    into.marked_bytes += other.marked_bytes;
    into.lifetimes.add(&other.lifetimes);
    if into.type_name != other.type_name {
        into.type_name = None;
    }
    // Histories at the same collections add up; a stack first seen later
    // adds from its first point on.
    let mut history: std::collections::BTreeMap<u64, u64> =
        into.gc_history.iter().map(|&[c, n]| (c, n)).collect();
    for &[c, n] in &other.gc_history {
        *history.entry(c).or_insert(0) += n;
    }
    into.gc_history = history.into_iter().map(|(c, n)| [c, n]).collect();
}

fn stack_key(profile: &Profile, group: &Group) -> String {
    profile
        .frames(group)
        .map(|f| f.function.as_str())
        .collect::<Vec<_>>()
        .join(";")
}

/// `file:line in 'name'`, the frame text of perf-tools' MemProf.
pub fn frame_text(frame: &Frame) -> String {
    let place = match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("{}:{line}", display_path(file)),
        (Some(file), None) => display_path(file),
        // No source line: the module and the offset in its file (stable
        // across runs, unlike the address).
        _ => format!(
            "{}+{:#x}",
            crate::allocators::short(std::path::Path::new(&frame.module)),
            frame.offset.unwrap_or(frame.address)
        ),
    };
    format!("{place} in '{}'", frame.function)
}

/// Source paths relative to the current directory when under it.
fn display_path(path: &str) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            std::path::Path::new(path)
                .strip_prefix(&cwd)
                .ok()
                .map(|p| p.display().to_string())
        })
        .unwrap_or_else(|| path.to_string())
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What each loss category means, for the markdown header and the JSON
/// report (`loss_categories`). The categories are disjoint: each allocation
/// call is counted in at most one of them.
pub const LOSS_CATEGORIES: [(&str, &str); 5] = [
    (
        "live_map_full",
        "allocations in their stack's totals but not tracked as live (live table full, --max-live)",
    ),
    (
        "sites_map_full",
        "allocations tracked as live but missing from their stack's totals (site table full, --max-sites)",
    ),
    (
        "both_maps_full",
        "allocations in neither table (both full): only counted as seen",
    ),
    (
        "pending_full",
        "allocation calls not followed to their return (in-flight table full): not counted as seen",
    ),
    (
        "stale_calls",
        "allocation calls whose return was missed: not counted as seen",
    ),
];

/// One line naming what was lost, for report headers: the disjoint loss
/// categories (their sum is the lost events), then what else was missed.
pub fn loss_summary(profile: &Profile) -> String {
    let c = &profile.counters;
    let mut line = format!(
        "lost events: {} (each counted once: not tracked as live, live table full: {}; missing from the stack totals, site table full: {}; in neither table: {}; calls not followed, in-flight table full: {}; returns missed: {}{}); stacks not captured: {}; frees of unknown blocks: {}",
        thousands(c.lost_events()),
        thousands(c.live_map_full),
        thousands(c.sites_map_full),
        thousands(c.both_maps_full),
        thousands(c.pending_full),
        thousands(c.stale_calls),
        // `attach --all` only.
        match c.processes_not_followed {
            0 => String::new(),
            n => format!("; calls of processes not followed, process table full: {}", thousands(n)),
        },
        thousands(c.stack_errors),
        thousands(c.unknown_frees)
    );
    let truncated = truncated_groups(profile);
    if c.truncated_stacks > 0 || truncated > 0 {
        line += &format!(
            "; allocations with a truncated stack: {} (stacks marked truncated: {}, incl. those not captured)",
            thousands(c.truncated_stacks),
            thousands(truncated)
        );
    }
    let folded = folded_groups(profile);
    if c.folded_stacks > 0 || folded > 0 {
        line += &format!(
            "; allocations with recursion folded (repeated frames shown once): {} (stacks marked folded: {})",
            thousands(c.folded_stacks),
            thousands(folded)
        );
    }
    // Coarser attribution, not losses: said only when it happened.
    let coarser = [
        (
            c.stacks_shortened,
            "allocations under their innermost 8 frames (stack table full, --max-stacks)",
        ),
        (
            c.stacks_degraded,
            "allocations under their caller alone (stack tables full, --max-stacks)",
        ),
        (
            c.sites_overflowed,
            "allocations in their kind's overflow group (site table full, --max-sites, or no kernel memory for a new entry)",
        ),
    ];
    for (count, what) in coarser {
        if count > 0 {
            line += &format!("; {what}: {}", thousands(count));
        }
    }
    line
}

/// Modules with return addresses no symbol covers: (module path,
/// addresses without a symbol, addresses in the module), most first. Their
/// frames read `module+offset` (stable across runs, so profiles still diff).
pub fn modules_without_symbols(profile: &Profile) -> Vec<(String, u64, u64)> {
    let mut per_module: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for location in profile.stacks.locations() {
        // The outermost frame of a location is the symbol's (or `[unknown]`).
        let Some(frame) = location.frames.last() else {
            continue;
        };
        if frame.module.is_empty() || frame.module == "[unknown]" {
            continue;
        }
        let entry = per_module.entry(frame.module.as_str()).or_default();
        entry.1 += 1;
        if frame.raw_name.is_empty() {
            entry.0 += 1;
        }
    }
    let mut out: Vec<(String, u64, u64)> = per_module
        .into_iter()
        .filter(|(_, (unknown, _))| *unknown > 0)
        .map(|(m, (unknown, all))| (m.to_string(), unknown, all))
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// One line per module without symbols for some of its addresses, saying
/// what is missing and how to get it.
pub fn symbol_notes(profile: &Profile) -> Vec<String> {
    modules_without_symbols(profile)
        .into_iter()
        .map(|(module, unknown, all)| {
            let name = crate::allocators::short(std::path::Path::new(&module));
            let what = if unknown == all {
                "no symbols at all (stripped)".to_string()
            } else {
                format!(
                    "no symbol for {} of its {} addresses (functions missing from its symbol table)",
                    thousands(unknown),
                    thousands(all)
                )
            };
            format!(
                "{name}: {what}; its frames read {name}+0xOFFSET. For names, install its separate debug info (looked up through .gnu_debuglink and /usr/lib/debug/.build-id/, as Debian's -dbgsym packages install it) or profile a build that keeps its symbols ({module})."
            )
        })
        .collect()
}

/// Groups whose stack had repeated frames of recursive functions folded
/// into one.
pub fn folded_groups(profile: &Profile) -> u64 {
    profile.groups.iter().filter(|g| g.folded).count() as u64
}

/// What markdown and html add below a stack whose recursion was folded.
pub const FOLDED_NOTE: &str = "…(recursion folded)";
/// The frame folded and flamegraph add above the innermost frame of such a
/// stack, and the `stack` label of its pprof sample.
pub const FOLDED_FRAME: &str = "[recursion folded]";
/// The root frame folded, flamegraph (and html's) and pprof put below the
/// outermost frame of a stack the unwinder could not follow to its end, so
/// a cut stack never reads as if its last frame were the program's entry.
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Groups whose stack is marked truncated (cut short by the unwinder, or
/// not captured at all): counted per stack, where `truncated_stacks`
/// counts allocation calls.
pub fn truncated_groups(profile: &Profile) -> u64 {
    profile.groups.iter().filter(|g| g.truncated).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(28800), "28,800");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    fn group(p: &mut Profile, live_bytes: u64, live_count: u64, name: &str) {
        let group = Group {
            kind: "libc".into(),
            live_bytes,
            live_count,
            ..Group::default()
        };
        let frame = Frame {
            function: name.into(),
            ..Frame::default()
        };
        p.push(group, vec![frame]);
    }

    fn named(raw: &str) -> Frame {
        Frame {
            function: crate::symbolize::display_name(raw),
            raw_name: raw.into(),
            ..Frame::default()
        }
    }

    #[test]
    fn hides_the_allocator_plumbing_before_skip_and_depth() {
        let mut p = Profile::default();
        let frames = [
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Foo::new<Int32>:Foo",
            "*make_foos:Array(Foo)",
            "__crystal_main",
        ]
        .map(named)
        .to_vec();
        p.push(Group::default(), frames);
        // Nothing but plumbing: shown as it is rather than as no stack.
        p.push(Group::default(), vec![named("__crystal_malloc64")]);
        let (group, cut) = (&p.groups[0], &p.groups[1]);
        let shown = |options: &Options| -> Vec<String> {
            options
                .frames(&p, group, usize::MAX)
                .map(|f| f.function.clone())
                .collect()
        };
        assert_eq!(
            shown(&Options::default()),
            ["Foo.new", "make_foos", "__crystal_main"]
        );
        let options = Options {
            skip: 1,
            depth: Some(1),
            ..Options::default()
        };
        assert_eq!(shown(&options), ["make_foos"]);
        let options = Options {
            skip_runtime: false,
            ..Options::default()
        };
        assert_eq!(shown(&options)[..2], ["GC.malloc", "__crystal_malloc64"]);
        assert_eq!(Options::default().frames(&p, cut, 5).count(), 1);
    }

    #[test]
    fn rows_merge_recursion_depths_and_put_the_runtime_last() {
        let f = |name: &str, line: u32| Frame {
            function: name.into(),
            raw_name: name.into(),
            file: Some("/src/t.c".into()),
            line: Some(line),
            module: "/bin/t".into(),
            address: u64::from(line),
            ..Frame::default()
        };
        let g = |live_bytes: u64| Group {
            kind: "libc".into(),
            live_bytes,
            live_count: 1,
            ..Group::default()
        };
        let mut p = Profile::default();
        // build() at three depths: one row of three stacks.
        p.push(g(2000), vec![f("build", 5), f("main", 9)]);
        p.push(g(2000), vec![f("build", 5), f("build", 7), f("main", 9)]);
        p.push(
            g(2000),
            vec![f("build", 5), f("build", 7), f("build", 7), f("main", 9)],
        );
        let fiber = Frame {
            raw_name: "*Fiber::StackPool#checkout:Tuple(Pointer(Void), Pointer(Void))".into(),
            ..f("checkout", 1)
        };
        p.push(g(1 << 23), vec![fiber, f("main", 9)]);
        let rows = rows(&p, &Options::default(), 1024, 5, true);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].stacks, rows[0].group.live_bytes), (3, 6000));
        assert!(rows[0].folded && rows[0].runtime.is_none());
        let shown: Vec<&str> = rows[0].frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(shown, ["build", "main"]);
        assert_eq!(rows[1].runtime, Some(runtime::Role::FiberStack));
        // --min-bytes applies to the merged row: 6,000 bytes pass 5,000.
        let options = Options {
            min_bytes: Some(5000),
            ..Options::default()
        };
        assert_eq!(super::rows(&p, &options, 1024, 5, true)[0].stacks, 3);
    }

    #[test]
    fn sorts_by_bytes_then_count_then_stack() {
        let mut p = Profile::default();
        group(&mut p, 2048, 1, "b");
        group(&mut p, 4096, 1, "a");
        group(&mut p, 2048, 2, "c");
        group(&mut p, 2048, 1, "a");
        group(&mut p, 10, 1, "tiny");
        let names: Vec<&str> = select(&p, &Options::default(), 1024, true)
            .iter()
            .map(|g| p.frames(g).next().unwrap().function.as_str())
            .collect();
        assert_eq!(names, ["a", "c", "a", "b"]);
    }
}
