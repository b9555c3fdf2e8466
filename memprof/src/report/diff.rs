//! `memprof report --diff BEFORE AFTER`: what grew between two profiles of
//! the same program (e.g. two `--snapshot-every` snapshots), per stack.
//!
//! Groups are matched by kind and stack: each frame's function name and its
//! offset in its module (stable across runs of the same executable; the
//! source line where there is no offset). Each row is the live count and
//! bytes in AFTER minus those in BEFORE, sorted by growth in bytes (then
//! count). Stacks that did not change are left out. Markdown (default) or
//! json (`--format json`). The filters apply to both profiles; `--min-bytes`
//! to the size of the change (grown or shrunk).
//!
//! ```
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{diff, Options};
//! let profile = |n: u64| {
//!     let mut p = Profile::default();
//!     p.push(Group { kind: "libc".into(), live_count: n, live_bytes: 64 * n, ..Default::default() },
//!         vec![Frame { function: "grow".into(), offset: Some(0x1189), ..Default::default() }]);
//!     p
//! };
//! let (before, after) = (profile(100), profile(350));
//! let rows = diff::rows(&before, &after, &Options::default());
//! assert_eq!((rows[0].count_growth, rows[0].bytes_growth), (250, 16000));
//! ```
use std::collections::HashMap;
use std::io::Write;

use anyhow::{bail, Result};
use serde_json::json;

use super::{frame_text, markdown, thousands, Options};
use crate::profile::{Frame, Group, Profile};

/// Version of the JSON diff schema.
pub const VERSION: u32 = 1;

/// One stack's change.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub kind: String,
    /// The stack as shown (AFTER's group, or BEFORE's if gone).
    pub group: &'a Group,
    /// The profile `group` is from (its stack table).
    pub profile: &'a Profile,
    pub before: [u64; 2],
    pub after: [u64; 2],
    pub count_growth: i64,
    pub bytes_growth: i64,
}

/// Refuses to compare profiles of different programs (their frame offsets
/// would not match).
pub fn check_compatible(before: &Profile, after: &Profile) -> Result<()> {
    if before.target.exe != after.target.exe {
        bail!(
            "cannot diff profiles of different executables: the first profiles {}, the second {}",
            before.target.exe,
            after.target.exe
        );
    }
    Ok(())
}

type Key = (String, Vec<(String, u64)>);

fn key(profile: &Profile, g: &Group, options: &Options) -> Key {
    let frames = options
        .frames(profile, g, usize::MAX)
        .map(|f: &Frame| {
            (
                f.function.clone(),
                f.offset.unwrap_or_else(|| u64::from(f.line.unwrap_or(0))),
            )
        })
        .collect();
    (g.kind.clone(), frames)
}

/// The changed stacks, biggest growth first.
pub fn rows<'a>(before: &'a Profile, after: &'a Profile, options: &Options) -> Vec<Row<'a>> {
    let mut by_key: HashMap<Key, Row<'a>> = HashMap::new();
    for (side, profile) in [(0, before), (1, after)] {
        for g in &profile.groups {
            let row = by_key
                .entry(key(profile, g, options))
                .or_insert_with(|| Row {
                    kind: g.kind.clone(),
                    group: g,
                    profile,
                    before: [0, 0],
                    after: [0, 0],
                    count_growth: 0,
                    bytes_growth: 0,
                });
            let counts = if side == 0 {
                &mut row.before
            } else {
                row.group = g;
                row.profile = profile;
                &mut row.after
            };
            counts[0] += g.live_count;
            counts[1] += g.live_bytes;
        }
    }
    let min = options.min_bytes.unwrap_or(0);
    let mut rows: Vec<Row> = by_key
        .into_values()
        .map(|mut r| {
            r.count_growth = r.after[0] as i64 - r.before[0] as i64;
            r.bytes_growth = r.after[1] as i64 - r.before[1] as i64;
            r
        })
        .filter(|r| {
            (r.count_growth != 0 || r.bytes_growth != 0) && r.bytes_growth.unsigned_abs() >= min
        })
        .collect();
    rows.sort_by(|a, b| {
        b.bytes_growth
            .cmp(&a.bytes_growth)
            .then(b.count_growth.cmp(&a.count_growth))
            .then_with(|| stack_text(a.profile, a.group).cmp(&stack_text(b.profile, b.group)))
    });
    rows.truncate(options.top.unwrap_or(usize::MAX));
    rows
}

fn stack_text(profile: &Profile, g: &Group) -> String {
    profile
        .frames(g)
        .map(|f| f.function.as_str())
        .collect::<Vec<_>>()
        .join(";")
}

fn signed(n: i64) -> String {
    let s = thousands(n.unsigned_abs());
    match n.signum() {
        1 => format!("+{s}"),
        -1 => format!("-{s}"),
        _ => s,
    }
}

/// Writes the diff; `json` selects JSON over markdown. `names` are the two
/// files as given, for the header.
pub fn write(
    before: &Profile,
    after: &Profile,
    names: [&str; 2],
    json: bool,
    options: &Options,
    out: &mut dyn Write,
) -> Result<()> {
    let rows = rows(before, after, options);
    let sides = [(names[0], before), (names[1], after)];
    if json {
        write_json(sides, &rows, options, out)
    } else {
        write_markdown(sides, &rows, options, out)
    }
}

/// Live blocks and bytes of `p`.
fn live(p: &Profile) -> [u64; 2] {
    p.groups
        .iter()
        .fold([0, 0], |[n, b], g| [n + g.live_count, b + g.live_bytes])
}

/// The diff as JSON (`memprof-diff`, versioned; docs/formats.md documents it).
fn write_json(
    [(before_name, before), (after_name, after)]: [(&str, &Profile); 2],
    rows: &[Row<'_>],
    options: &Options,
    out: &mut dyn Write,
) -> Result<()> {
    let (lb, la) = (live(before), live(after));
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let frames: Vec<serde_json::Value> = options
                .frames(r.profile, r.group, usize::MAX)
                .map(|f| {
                    json!({"function": f.function, "file": f.file, "line": f.line,
                           "module": f.module, "offset": f.offset.map(|o| format!("{o:#x}"))})
                })
                .collect();
            json!({
                "kind": r.kind,
                "count_growth": r.count_growth, "bytes_growth": r.bytes_growth,
                "before": {"live_count": r.before[0], "live_bytes": r.before[1]},
                "after": {"live_count": r.after[0], "live_bytes": r.after[1]},
                "frames": frames,
            })
        })
        .collect();
    let side = |name: &str, p: &Profile, l: [u64; 2]| {
        json!({"file": name, "pid": p.target.pid, "exe": p.target.exe,
               "start_unix_s": p.start_unix_s, "duration_s": p.duration_s,
               "live_count": l[0], "live_bytes": l[1]})
    };
    let doc = json!({
        "format": "memprof-diff", "version": VERSION,
        "before": side(before_name, before, lb),
        "after": side(after_name, after, la),
        "count_growth": la[0] as i64 - lb[0] as i64,
        "bytes_growth": la[1] as i64 - lb[1] as i64,
        "rows": rows,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

/// The diff as a markdown table, most growth first.
fn write_markdown(
    [(before_name, before), (after_name, after)]: [(&str, &Profile); 2],
    rows: &[Row<'_>],
    options: &Options,
    out: &mut dyn Write,
) -> Result<()> {
    let (lb, la) = (live(before), live(after));
    writeln!(out, "# memprof diff: {before_name} → {after_name}")?;
    writeln!(out)?;
    writeln!(
        out,
        "Live: {} blocks, {} bytes → {} blocks, {} bytes ({} blocks, {} bytes).",
        thousands(lb[0]),
        thousands(lb[1]),
        thousands(la[0]),
        thousands(la[1]),
        signed(la[0] as i64 - lb[0] as i64),
        signed(la[1] as i64 - lb[1] as i64)
    )?;
    writeln!(out)?;
    if rows.is_empty() {
        writeln!(out, "No stack changed.")?;
        return Ok(());
    }
    writeln!(
        out,
        "| Δ Allocations |     Δ Size |     Before |      After | Kind | Context |"
    )?;
    writeln!(
        out,
        "|--------------:|-----------:|-----------:|-----------:|------|---------|"
    )?;
    for r in rows {
        let context: Vec<String> = options
            .frames(r.profile, r.group, markdown::DEFAULT_DEPTH)
            .map(|f| format!("`{}`", markdown::escape(&frame_text(f))))
            .collect();
        writeln!(
            out,
            "| {:>13} | {:>10} | {:>10} | {:>10} | {} | {} |",
            signed(r.count_growth),
            signed(r.bytes_growth),
            thousands(r.before[1]),
            thousands(r.after[1]),
            r.kind,
            if context.is_empty() {
                "(no stack)".to_string()
            } else {
                context.join("<br>")
            }
        )?;
    }
    Ok(())
}
