//! Folded stacks, the input of `flamegraph.pl`, inferno, speedscope and
//! friends: one line per stack, frames root first joined by `;`, then a
//! space and the value (live bytes by default; `--count objects`, `--total`).
//! A stack the unwinder could not follow to its end starts with the root
//! frame `[truncated]`; one with recursion folded ends with `[recursion folded]`;
//! GC objects of a known class end with it as a leaf, `[Widget]`.
//!
//! ```
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let f = |name: &str| Frame { function: name.into(), ..Default::default() };
//! let mut profile = Profile::default();
//! profile.push(Group { kind: "libc".into(), live_count: 600, live_bytes: 28800, ..Default::default() },
//!     vec![f("make_foo"), f("main")]);
//! let mut out = Vec::new();
//! render(&profile, Format::Folded, &Options::default(), &mut out).unwrap();
//! assert_eq!(String::from_utf8(out).unwrap(), "main;make_foo 28800\n");
//! ```
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use anyhow::Result;

use super::{select, Count, Options};
use crate::profile::{Frame, Group, Profile};

/// Stack (root first, `;`-joined) → value, summed over groups whose shown
/// stacks are the same; stacks with a zero value are left out.
pub fn stacks(profile: &Profile, options: &Options) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    // Each frame of the stack table named once (by its address in the table).
    let mut names: HashMap<usize, String> = HashMap::new();
    for g in select(profile, options, 0, !options.total) {
        let value = value(g, options);
        if value == 0 {
            continue;
        }
        let frames: Vec<&Frame> = options.frames(profile, g, usize::MAX).collect();
        for &f in &frames {
            names
                .entry(std::ptr::from_ref(f) as usize)
                .or_insert_with(|| frame_name(f));
        }
        let mut stack = String::new();
        if g.truncated {
            // The root: the graph shows where the unwinder gave up.
            stack += super::TRUNCATED_FRAME;
        }
        for &f in frames.iter().rev() {
            if !stack.is_empty() {
                stack.push(';');
            }
            stack += &names[&(std::ptr::from_ref(f) as usize)];
        }
        if frames.is_empty() {
            if !stack.is_empty() {
                stack.push(';');
            }
            stack += "[no stack]";
        }
        if g.folded {
            // Above the innermost frame: the stack keeps its place in the graph.
            stack.push(';');
            stack += super::FOLDED_FRAME;
        }
        if let Some(class) = &g.type_name {
            // The leaf: what the objects are (a flamegraph's top boxes).
            stack += &format!(";[{}]", crate::text::visible(class).replace(';', ":"));
        }
        *out.entry(stack).or_insert(0) += value;
    }
    out
}

/// The number a group contributes: live (or `--total`) bytes (or `--count objects`).
pub fn value(g: &Group, options: &Options) -> u64 {
    match (options.total, options.count) {
        (false, Count::Bytes) => g.live_bytes,
        (false, Count::Objects) => g.live_count,
        (true, Count::Bytes) => g.total_bytes,
        (true, Count::Objects) => g.total_count,
    }
}

/// A frame's name as one folded-stack field: `;` separates frames, so it
/// is replaced by `:`; control characters (a line would end the stack)
/// are shown as escapes ([`crate::text`]). Spaces are fine: readers split
/// the value off at the last one.
pub fn frame_name(frame: &Frame) -> String {
    crate::text::visible(&frame.function).replace(';', ":")
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    for (stack, value) in stacks(profile, options) {
        writeln!(out, "{stack} {value}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_separators_and_merges_equal_stacks() {
        let f = |name: &str| Frame {
            function: name.into(),
            ..Frame::default()
        };
        let g = |bytes| Group {
            kind: "gc".into(),
            live_count: 1,
            live_bytes: bytes,
            total_count: 2,
            total_bytes: 2 * bytes,
            ..Group::default()
        };
        let mut profile = Profile::default();
        for (name, bytes) in [("odd;name\n", 10), ("odd;name\n", 5), ("x", 0)] {
            profile.push(g(bytes), vec![f(name), f("main")]);
        }
        let options = Options::default();
        let stacks = stacks(&profile, &options);
        assert_eq!(stacks.len(), 1);
        assert_eq!(stacks["main;odd:name\\n"], 15);
        let total = Options {
            total: true,
            count: Count::Objects,
            ..Options::default()
        };
        assert_eq!(super::stacks(&profile, &total)["main;x"], 2);
    }

    #[test]
    fn truncated_stacks_get_a_root_frame() {
        let f = |name: &str| Frame {
            function: name.into(),
            address: name.len() as u64,
            ..Frame::default()
        };
        let mut profile = Profile::default();
        let group = Group {
            kind: "gc".into(),
            live_count: 1,
            live_bytes: 32,
            truncated: true,
            ..Group::default()
        };
        profile.push(group, vec![f("new"), f("bottom_up_tree")]);
        let mut out = Vec::new();
        write(&profile, &Options::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[truncated];bottom_up_tree;new 32\n"
        );
        // pprof: the outermost location of the sample is `[truncated]`.
        let proto = crate::report::pprof::build(&profile, &Options::default());
        let root = *proto.sample[0].location_id.last().unwrap();
        let location = &proto.location[root as usize - 1];
        let function = &proto.function[location.line[0].function_id as usize - 1];
        assert_eq!(proto.string_table[function.name as usize], "[truncated]");
        assert_eq!(proto.sample[0].location_id.len(), 3);
    }

    #[test]
    fn folded_recursion_is_marked_above_the_leaf() {
        let f = |name: &str| Frame {
            function: name.into(),
            ..Frame::default()
        };
        let mut profile = Profile::default();
        let group = Group {
            kind: "gc".into(),
            live_count: 1,
            live_bytes: 32,
            folded: true,
            ..Group::default()
        };
        profile.push(group, vec![f("make"), f("rec"), f("main")]);
        let mut out = Vec::new();
        write(&profile, &Options::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "main;rec;make;[recursion folded] 32\n"
        );
        let proto = crate::report::pprof::build(&profile, &Options::default());
        let text = |i: i64| proto.string_table[i as usize].as_str();
        let label = proto.sample[0]
            .label
            .iter()
            .find(|l| text(l.key) == "stack")
            .expect("a stack label");
        assert_eq!(text(label.str), "[recursion folded]");
    }
}
