//! The markdown table Crystal users know from perf-tools' MemProf:
//!
//! ```text
//! | Allocations | Total size | Context |
//! |------------:|-----------:|---------|
//! |         600 |     28,800 | `basic.c:9 in 'make_foo'`<br>`basic.c:30 in 'main'` |
//! ```
//!
//! One row per stack with live allocations: the live count and bytes, and
//! the frames innermost first. A header names the target and what was lost.
use std::io::Write;

use anyhow::Result;

use super::{frame_text, loss_summary, select, thousands, Options};
use crate::profile::Profile;

/// Default `--min-bytes` for this format.
pub const DEFAULT_MIN_BYTES: u64 = 1024;
/// Default `--depth` for the tables.
pub const DEFAULT_DEPTH: usize = 5;

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    header(profile, out)?;
    table(profile, options, out)
}

/// The run summary above the table.
pub fn header(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    let t = &profile.target;
    let live: u64 = profile.groups.iter().map(|g| g.live_bytes).sum();
    let live_n: u64 = profile.groups.iter().map(|g| g.live_count).sum();
    writeln!(out, "# memprof: {} (pid {})", t.command.join(" "), t.pid)?;
    writeln!(out)?;
    let exit = match profile.exit {
        Some(e) => match (e.code, e.signal) {
            (Some(c), _) => format!(", exited with code {c}"),
            (_, Some(s)) => format!(", killed by signal {s}"),
            _ => String::new(),
        },
        None => String::new(),
    };
    writeln!(
        out,
        "{} for {:.2} s{exit}. Live at the end: {} blocks, {} bytes. Allocations seen: {}, frees: {}.",
        profile.mode,
        profile.duration_s,
        thousands(live_n),
        thousands(live),
        thousands(profile.counters.allocs),
        thousands(profile.counters.frees)
    )?;
    writeln!(out)?;
    writeln!(out, "{}.", capitalize(&loss_summary(profile)))?;
    writeln!(out)?;
    Ok(())
}

/// The table alone (used for the summary at the end of `run`/`attach`).
pub fn table(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let rows = select(profile, options, DEFAULT_MIN_BYTES, true);
    if rows.is_empty() {
        let min = options.min_bytes.unwrap_or(DEFAULT_MIN_BYTES);
        writeln!(
            out,
            "No stack has {} or more live bytes (--min-bytes).",
            thousands(min)
        )?;
        return Ok(());
    }
    writeln!(out, "| Allocations | Total size | Context |")?;
    writeln!(out, "|------------:|-----------:|---------|")?;
    for g in rows {
        let context: Vec<String> = options
            .frames(g, DEFAULT_DEPTH)
            .map(|f| format!("`{}`", frame_text(f).replace('|', "\\|").replace('`', "'")))
            .collect();
        let context = if context.is_empty() {
            "(no stack)".to_string()
        } else {
            context.join("<br>")
        };
        writeln!(
            out,
            "| {:>11} | {:>10} | {context} |",
            thousands(g.live_count),
            thousands(g.live_bytes)
        )?;
    }
    Ok(())
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
