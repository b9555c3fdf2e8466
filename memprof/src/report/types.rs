//! `--format types`: live objects and bytes per allocated class, like
//! perf-tools MemProf's `log_object_counts` / `log_object_sizes`:
//!
//! ```text
//! | Live objects | Live bytes | Type |
//! |-------------:|-----------:|------|
//! |      100,000 |  3,200,000 | Foo |
//! |            1 |    800,000 | Array(Foo) buffer |
//! |            1 |      4,096 | in free_block (allocs.cr:62) |
//! |       2 | 16,777,216 | fiber stack (runtime) |
//! ```
//!
//! Where the collector collected objects, two more columns before the
//! type: the objects each type allocated, and of them collected.
//!
//! The type is each group's [`Group::type_name`] (see
//! [`crate::crystal::allocated_type`]); groups without one (libc and mmap
//! blocks, buffers of release builds) are summed per allocation
//! site: the first named frame that is not allocator plumbing, with its
//! `file:line` where known (short DWARF names like `new` need it), or
//! `(unknown)`. The runtime's own allocations (fiber stacks, the
//! collector's heap sections, [`super::runtime`]) are rows of their own,
//! after the program's. Rows are sorted by bytes, then objects, then name;
//! `--min-bytes` (default 0) and `--top` apply to rows.
use std::collections::HashMap;
use std::io::Write;

use anyhow::Result;

use super::{markdown, thousands, Options};
use crate::crystal;
use crate::profile::{CensusType, Group, HeapCensus, Profile};

/// Live objects of one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeRow {
    pub name: String,
    pub objects: u64,
    pub bytes: u64,
    /// Objects allocated and collected (GC objects; for the others,
    /// allocated only).
    pub allocated: u64,
    pub collected: u64,
    /// The runtime's own allocations (fiber stacks, the collector's heap):
    /// listed after the program's types.
    pub runtime: bool,
    /// `name` is the allocated class ([`Group::type_name`]); `false`: the
    /// class is not known and `name` is the allocation site (`in f
    /// (file:line)`), `(unknown)`, or a runtime role.
    pub class: bool,
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    markdown::header(profile, out)?;
    markdown::filters(options, out)?;
    let rows = rows(profile, options);
    if rows.is_empty() {
        writeln!(out, "No live objects.")?;
        return censuses(profile, options, out);
    }
    // Where the collector collected, what each type allocated and lost.
    if rows.iter().any(|r| r.collected > 0) {
        let rows: Vec<[String; 5]> = rows
            .iter()
            .map(|r| {
                [
                    thousands(r.objects),
                    thousands(r.bytes),
                    thousands(r.allocated),
                    thousands(r.collected),
                    markdown::escape_text(&r.name),
                ]
            })
            .collect();
        table(
            &[
                "Live objects",
                "Live bytes",
                "Allocated",
                "Collected",
                "Type",
            ],
            &rows,
            out,
        )?;
        return censuses(profile, options, out);
    }
    let rows: Vec<[String; 3]> = rows
        .iter()
        .map(|r| {
            [
                thousands(r.objects),
                thousands(r.bytes),
                markdown::escape_text(&r.name),
            ]
        })
        .collect();
    table(&["Live objects", "Live bytes", "Type"], &rows, out)?;
    censuses(profile, options, out)
}

/// The heap censuses of the profile ([`Profile::census`]): in `attach`,
/// what was live before memprof attached, by type; then the whole heap at
/// the last census, tracked objects apart from the others. `--top`
/// applies to their rows.
fn censuses(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let Some(c) = &profile.census else {
        return Ok(());
    };
    let attach = profile.mode == "attach";
    let top = options.top.unwrap_or(usize::MAX);
    if let Some(start) = &c.start {
        writeln!(out)?;
        writeln!(
            out,
            "## Live before attach, by type (GC collection {}, {:.1} s in)",
            start.collection, start.t_s
        )?;
        writeln!(out)?;
        let mut before: Vec<&CensusType> =
            start.types.iter().filter(|t| t.unseen_count > 0).collect();
        // Most bytes before attach first (the census sorts by all bytes).
        before.sort_by_key(|t| std::cmp::Reverse(t.unseen_bytes));
        let rows: Vec<[String; 3]> = before
            .iter()
            .take(top)
            .map(|t| {
                [
                    thousands(t.unseen_count),
                    thousands(t.unseen_bytes),
                    markdown::escape_text(&t.name),
                ]
            })
            .collect();
        if rows.is_empty() {
            writeln!(out, "Nothing was live before attach.")?;
        } else {
            table(&["Objects", "Bytes", "Type"], &rows, out)?;
        }
        census_cost(start, out)?;
    }
    if let Some(end) = &c.end {
        writeln!(out)?;
        let unseen = if attach { "Before attach" } else { "Not seen" };
        writeln!(
            out,
            "## The GC heap by type at collection {} ({:.1} s in): {} and tracked",
            end.collection,
            end.t_s,
            unseen.to_lowercase()
        )?;
        writeln!(out)?;
        let rows: Vec<[String; 5]> = end
            .types
            .iter()
            .take(top)
            .map(|t| {
                [
                    thousands(t.unseen_count),
                    thousands(t.unseen_bytes),
                    thousands(t.tracked_count),
                    thousands(t.tracked_bytes),
                    markdown::escape_text(&t.name),
                ]
            })
            .collect();
        table(&[unseen, "Bytes", "Tracked", "Bytes", "Type"], &rows, out)?;
        census_cost(end, out)?;
    }
    if let Some(note) = &c.note {
        writeln!(out)?;
        writeln!(out, "Census: {note}.")?;
    }
    Ok(())
}

/// What a census cost the target.
fn census_cost(census: &HeapCensus, out: &mut dyn Write) -> Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "(census: {:.1} ms added to the collector's hold, {:.1} ms after it)",
        census.held_s * 1e3,
        census.census_s * 1e3
    )?;
    Ok(())
}

/// A markdown table: numbers right-aligned, the last column text.
fn table<const N: usize>(
    head: &[&str; N],
    rows: &[[String; N]],
    out: &mut dyn Write,
) -> Result<()> {
    let mut widths = head.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::from("|");
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(&format!(" {cell} |"));
            } else {
                s.push_str(&format!(" {cell:>w$} |", w = widths[i]));
            }
        }
        s
    };
    writeln!(out, "{}", line(&head.map(str::to_string)))?;
    let mut rule = String::from("|");
    for w in &widths[..N - 1] {
        rule.push_str(&format!("{}:|", "-".repeat(w + 1)));
    }
    rule.push_str("------|");
    writeln!(out, "{rule}")?;
    for row in rows {
        writeln!(out, "{}", line(row))?;
    }
    Ok(())
}

/// The live objects per type, and those allocated and collected, sorted
/// by live bytes, `--min-bytes` and `--top` applied. A type whose objects
/// were all collected is a row too.
pub fn rows(profile: &Profile, options: &Options) -> Vec<TypeRow> {
    let mut sums: HashMap<(bool, String, bool), [u64; 4]> = HashMap::new();
    for g in profile
        .groups
        .iter()
        .filter(|g| g.live_count > 0 || g.collected_count > 0)
    {
        let key = match super::runtime::role(profile, g) {
            Some(role) => (true, format!("{} (runtime)", role.label()), false),
            None => (false, type_of(profile, g), g.type_name.is_some()),
        };
        let sum = sums.entry(key).or_default();
        sum[0] += g.live_count;
        sum[1] += g.live_bytes;
        sum[2] += g.total_count;
        sum[3] += g.collected_count;
    }
    let min = options.min_bytes.unwrap_or(0);
    let mut rows: Vec<TypeRow> = sums
        .into_iter()
        .filter(|&(_, [_, bytes, ..])| bytes >= min)
        .map(
            |((runtime, name, class), [objects, bytes, allocated, collected])| TypeRow {
                name,
                objects,
                bytes,
                allocated,
                collected,
                runtime,
                class,
            },
        )
        .collect();
    rows.sort_by(|a, b| {
        a.runtime
            .cmp(&b.runtime)
            .then(b.bytes.cmp(&a.bytes))
            .then(b.objects.cmp(&a.objects))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows.truncate(options.top.unwrap_or(usize::MAX));
    rows
}

/// The type a group is counted under.
fn type_of(profile: &Profile, group: &Group) -> String {
    if let Some(name) = &group.type_name {
        return name.clone();
    }
    let plumbing = super::plumbing::count(profile.frames(group));
    let site = profile
        .frames(group)
        .skip(plumbing)
        .find(|f| !crystal::is_runtime(f) && !f.raw_name.is_empty());
    let Some(frame) = site else {
        if plumbing > 0 && plumbing == profile.frames(group).count() {
            // Nothing but plumbing: the unwinder stopped in the allocator.
            return "(unknown: the stack ends in the allocator)".to_string();
        }
        return "(unknown)".to_string();
    };
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => {
            let file = file.rsplit('/').next().unwrap_or(file);
            format!("in {} ({file}:{line})", frame.function)
        }
        _ => format!("in {}", frame.function),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Frame;

    #[test]
    fn sums_groups_of_one_class() {
        let foo = Group {
            kind: "gc".into(),
            live_count: 2,
            live_bytes: 64,
            type_name: Some("Foo".into()),
            ..Default::default()
        };
        let profile = Profile {
            groups: vec![foo.clone(), foo],
            ..Default::default()
        };
        let rows = rows(&profile, &Options::default());
        assert_eq!(
            (rows[0].name.as_str(), rows[0].objects, rows[0].bytes),
            ("Foo", 4, 128)
        );
    }

    fn group(
        type_name: Option<&str>,
        frames: &[&str],
        live_count: u64,
        live_bytes: u64,
    ) -> (Group, Vec<Frame>) {
        let group = Group {
            kind: "gc".into(),
            live_count,
            live_bytes,
            type_name: type_name.map(str::to_string),
            ..Group::default()
        };
        let frames = frames
            .iter()
            .map(|raw| Frame {
                function: crate::symbolize::display_name(raw),
                raw_name: raw.to_string(),
                file: raw.starts_with('*').then(|| "/src/allocs.cr".to_string()),
                line: raw.starts_with('*').then_some(12),
                ..Frame::default()
            })
            .collect();
        (group, frames)
    }

    fn profile() -> Profile {
        let mut profile = Profile::default();
        for (group, frames) in [
            group(Some("Foo"), &[], 60_000, 1_920_000),
            group(Some("Array(Foo) buffer"), &[], 1, 800_000),
            group(Some("Foo"), &[], 40_000, 1_280_000),
            group(
                None,
                &["__crystal_malloc64", "*make_foos:Array(Foo)"],
                3,
                96,
            ),
            group(None, &["*make_foos:Array(Foo)"], 1, 32),
            group(None, &["", "GC_init", "*GC::init:Nil"], 2, 48),
            group(None, &[], 1, 16),
            group(Some("Dead"), &[], 0, 0),
        ] {
            profile.push(group, frames);
        }
        profile
    }

    #[test]
    fn sums_live_objects_per_type() {
        let rows = rows(&profile(), &Options::default());
        let got: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.objects, r.bytes))
            .collect();
        assert_eq!(
            got,
            [
                ("Foo", 100_000, 3_200_000),
                ("Array(Foo) buffer", 1, 800_000),
                ("in make_foos (allocs.cr:12)", 4, 128),
                ("in GC.init (allocs.cr:12)", 2, 48),
                ("(unknown)", 1, 16),
            ]
        );
    }

    #[test]
    fn min_bytes_and_top_apply_to_rows() {
        let options = Options {
            min_bytes: Some(100),
            top: Some(2),
            ..Options::default()
        };
        let names: Vec<String> = rows(&profile(), &options)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["Foo", "Array(Foo) buffer"]);
    }

    #[test]
    fn table() {
        let mut out = Vec::new();
        write(&profile(), &Options::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "| Live objects | Live bytes | Type |\n|-------------:|-----------:|------|\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("|      100,000 |  3,200,000 | Foo |\n"),
            "{text}"
        );
    }
}
