//! The rows every writer sees: [`select`] sorts the groups and applies
//! `--min-bytes` and `--top`; [`rows`] merges the stacks a table shows
//! alike into one [`Row`].
use std::collections::HashMap;

use crate::profile::{Frame, Group, Profile};

use super::{frame_text, plumbing, program, runtime, Options};

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
    /// The first frame of the program's own source in the whole stack,
    /// whatever the shown frames are ([`program::frame`]): rows that differ
    /// only there are not merged.
    pub program: Option<&'a Frame>,
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
    let mut index: HashMap<RowKey, usize> = HashMap::new();
    let mut texts = FrameTexts::default();
    let mut rows: Vec<Row<'a>> = Vec::new();
    for g in &profile.groups {
        if live_only && g.live_count == 0 {
            continue;
        }
        let (frames, folded) = options.shown(profile, g, default_depth);
        let role = runtime::role(profile, g);
        let program = program::frame(profile, g);
        let key = (
            texts.ids(&frames),
            program.map(|f| texts.id(f)),
            g.kind.clone(),
            g.truncated,
            g.overflow,
            role,
            g.type_name.clone(),
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
                    program,
                    stacks: 1,
                    folded: folded || g.folded,
                    runtime: role,
                    plumbing_only: all > 0 && plumbing::count(profile.frames(g)) == all,
                });
            }
        }
    }
    rows.retain(|r| r.group.live_bytes >= min);
    sorted(rows, options.top)
}

/// What makes rows one: the text of the frames shown and of the program's
/// frame, the kind, the flags, the class. Not whether recursion was
/// folded: a recursive function's first call (nothing folded) and its
/// deeper ones read the same. Objects of two classes are two rows,
/// whatever their stacks.
type RowKey = (
    Vec<u32>,
    Option<u32>,
    String,
    bool,
    bool,
    Option<runtime::Role>,
    Option<String>,
);

/// Frames read the same when their text does (two return addresses on
/// one line): each frame of the stack table gets the id of its text, once.
#[derive(Default)]
struct FrameTexts {
    text_ids: HashMap<String, u32>,
    frame_ids: HashMap<usize, u32>,
}

impl FrameTexts {
    /// The ids of the texts of `frames`.
    fn ids(&mut self, frames: &[&Frame]) -> Vec<u32> {
        frames.iter().map(|&f| self.id(f)).collect()
    }

    /// The id of the text of `frame`.
    fn id(&mut self, frame: &Frame) -> u32 {
        *self
            .frame_ids
            .entry(std::ptr::from_ref(frame) as usize)
            .or_insert_with(|| {
                let n = self.text_ids.len() as u32;
                *self.text_ids.entry(frame_text(frame)).or_insert(n)
            })
    }
}

/// The program's rows first (live bytes, live count, allocated bytes,
/// descending, then the frames' text), the runtime's after them; `top` of them.
fn sorted(rows: Vec<Row<'_>>, top: Option<usize>) -> Vec<Row<'_>> {
    let text = |r: &Row<'_>| -> String {
        r.frames
            .iter()
            .map(|f| f.function.as_str())
            .collect::<Vec<_>>()
            .join(";")
    };
    let mut keyed: Vec<(Row<'_>, String)> = rows
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
    keyed.truncate(top.unwrap_or(usize::MAX));
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

#[cfg(test)]
mod tests {
    use super::*;

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
