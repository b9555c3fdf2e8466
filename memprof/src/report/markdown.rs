//! The markdown table Crystal users know from perf-tools' MemProf:
//!
//! ```text
//! | Live at the end | Live bytes at the end | From the program | Context |
//! |----------------:|----------------------:|------------------|---------|
//! |             600 |                28,800 | `basic.c:9 in 'make_foo'` | `basic.c:9 in 'make_foo'`<br>`basic.c:30 in 'main'` |
//! ```
//!
//! One row per shown context with live allocations: the live count and
//! bytes at the end, the first frame of the program's own source (however
//! deep in the library the allocation is, whatever `--depth` shows), and
//! the frames innermost first. Stacks that show the same frames
//! (the same 5 innermost frames, recursion folded) are one row, which says
//! how many stacks it merges; a stack the unwinder could not follow to its
//! end ends with `…(truncated)`. The runtime's own allocations (fiber
//! stacks, the collector's heap sections) come after the program's, in a
//! table of their own, each named. A header names the target, what was lost
//! and how dead GC objects are recognized.
use std::io::Write;

use anyhow::Result;

use super::{frame_text, loss_summary, rows, thousands, Options, Row};
use crate::profile::{ExitInfo, Profile};

/// Default `--min-bytes` for this format.
pub const DEFAULT_MIN_BYTES: u64 = 1024;
/// Default `--depth` for the tables.
pub const DEFAULT_DEPTH: usize = 5;

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    header(profile, out)?;
    filters(options, out)?;
    table(profile, options, out)
}

/// The filters line (`Filtered: …`), when the report is filtered.
pub fn filters(options: &Options, out: &mut dyn Write) -> Result<()> {
    if let Some(filters) = &options.filters {
        writeln!(out, "Filtered: {}.", escape_text(filters))?;
        writeln!(out)?;
    }
    Ok(())
}

/// The run summary above the table.
/// The processes of the session, when there are more than one: each with
/// its parent, what it ran, when and how it ended, and its live and
/// allocated bytes; those memprof did not profile say so.
fn processes(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    let all = profile.processes();
    if all.len() < 2 {
        return Ok(());
    }
    let unprofiled = all.iter().filter(|p| !p.profiled).count();
    write!(
        out,
        "Processes: {}, {} profiled",
        all.len(),
        all.len() - unprofiled
    )?;
    if unprofiled > 0 {
        write!(
            out,
            "; {unprofiled} not (`--no-follow`, ended within 0.2 s of a fork without an `exec`, or memprof could not follow them: see its messages): their allocations are not in this profile"
        )?;
    }
    writeln!(
        out,
        ". The stacks below are every process's; `--pid`/`--comm` show one."
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| pid | parent | command | profiled | started s | ended s | exit | live bytes | allocated bytes |"
    )?;
    writeln!(
        out,
        "|----:|-------:|---------|----------|----------:|--------:|------|-----------:|----------------:|"
    )?;
    for p in &all {
        let (live, total) = profile
            .groups
            .iter()
            .filter(|g| profile.is_of(g, p))
            .fold((0, 0), |(l, t), g| (l + g.live_bytes, t + g.total_bytes));
        let figures = if p.profiled {
            format!("{} | {}", thousands(live), thousands(total))
        } else {
            "— | —".to_string()
        };
        let exit = match p.exit {
            Some(ExitInfo { code: Some(c), .. }) => format!("code {c}"),
            Some(ExitInfo {
                signal: Some(s),
                oom_killed,
                ..
            }) => match oom_killed {
                true => format!("signal {s} (OOM killer)"),
                false => format!("signal {s}"),
            },
            Some(_) => "exited".to_string(),
            None => "running".to_string(),
        };
        let mut pid = match p.ns_pid {
            Some(inner) => format!("{} ({inner} in its namespace)", p.pid),
            None => p.pid.to_string(),
        };
        if p.pid_reuse > 0 {
            pid += " (pid given again)";
        }
        writeln!(
            out,
            "| {pid} | {} | {} | {} | {:.3} | {} | {exit} | {figures} |",
            p.ppid,
            escape_text(&p.command.join(" ")),
            match (p.profiled, p.profiled_from_s) {
                (true, Some(from)) => format!("from {from:.2} s"),
                (true, None) => "yes".to_string(),
                (false, _) => "no".to_string(),
            },
            p.start_s,
            p.end_s.map_or("—".to_string(), |e| format!("{e:.3}")),
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// What the profile is: the command, how it ran and ended, what was seen,
/// lost and sampled, the processes, the collector.
pub fn header(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    title(profile, out)?;
    processes(profile, out)?;
    sampling(profile, out)?;
    writeln!(out, "{}.", capitalize(&loss_summary(profile)))?;
    writeln!(out)?;
    predictions(&profile.counters, out)?;
    for note in super::symbol_notes(profile) {
        writeln!(out, "Symbols: {}", escape_text(&note))?;
        writeln!(out)?;
    }
    if let Some(gc) = &profile.gc {
        gc_summary(gc, out)?;
    }
    Ok(())
}

/// The command, how long it ran and how it ended, what was live and seen.
fn title(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    let t = &profile.target;
    let live: u64 = profile.groups.iter().map(|g| g.live_bytes).sum();
    let live_n: u64 = profile.groups.iter().map(|g| g.live_count).sum();
    writeln!(
        out,
        "# memprof: {} (pid {})",
        escape_text(&t.command.join(" ")),
        t.pid
    )?;
    writeln!(out)?;
    let exit = match profile.exit {
        Some(e) => match (e.code, e.signal) {
            (Some(c), _) => format!(", exited with code {c}"),
            (_, Some(s)) if e.oom_killed => format!(", killed by signal {s} (the OOM killer)"),
            (_, Some(s)) => format!(", killed by signal {s}"),
            _ => String::new(),
        },
        None => String::new(),
    };
    let c = &profile.counters;
    let (at_least, why) = if c.live_incomplete() {
        ("at least ", " (the live table was full: lower bounds)")
    } else {
        ("", "")
    };
    writeln!(
        out,
        "{} for {:.2} s{exit}. Live at the end: {at_least}{} blocks, {at_least}{} bytes{why}. Allocations seen: {} (fully recorded: {}), frees: {}.",
        profile.mode,
        profile.duration_s,
        thousands(live_n),
        thousands(live),
        thousands(c.allocs),
        thousands(c.recorded()),
        thousands(c.frees)
    )?;
    writeln!(out)?;
    Ok(())
}

/// `--sample-bytes` and `--gc-sampling refill`: the figures are estimates.
fn sampling(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    let c = &profile.counters;
    if profile.sample_bytes > 0 {
        // With refill sampling the GC allocations are sampled apart (below).
        let which = if profile.gc_sampling == "refill" {
            " (allocations other than the GC's, sampled at its refills below)"
        } else {
            ""
        };
        writeln!(
            out,
            "Sampled: one allocation followed per {} bytes allocated on average (--sample-bytes){which}: the stacks' counts and bytes are estimates scaled from {} sampled allocations ({} not sampled); frees of blocks not sampled count as frees of unknown blocks.",
            thousands(profile.sample_bytes),
            thousands(c.allocs),
            thousands(c.unsampled_allocs)
        )?;
        writeln!(out)?;
    }
    if profile.gc_sampling == "refill" {
        let gc_objects: u64 = profile
            .groups
            .iter()
            .filter(|g| g.kind.starts_with("gc"))
            .map(|g| g.total_count)
            .sum();
        writeln!(
            out,
            "GC allocations sampled at the collector's free-list refills (--gc-sampling refill{}): {} refills followed, each the allocation that ran its thread's list out, standing for {}; with the GC allocations the lists did not serve (exact), they stand for {} GC objects. GC counts and bytes are estimates: a stack with k samples is within about ±2/√k of its figure (95%), if its allocations are not in step with the lists' length. GC_free of an object served by a list is a free of an unknown block.",
            profile.refills_thinned(),
            thousands(c.refills),
            match profile.gc_refill_every {
                0 | 1 => "the list's objects".to_string(),
                k => format!("the objects of {k} lists ({} refills not followed)", thousands(c.refills_skipped)),
            },
            thousands(gc_objects)
        )?;
        writeln!(out)?;
    }
    Ok(())
}

/// Allocations recorded at their entry, and how their predictions fared.
fn predictions(c: &crate::profile::Counters, out: &mut dyn Write) -> Result<()> {
    if c.predicted > 0 || c.predictions_checked > 0 {
        let wrong = if c.predictions_wrong > 0 {
            format!(
                ", {} wrong: that predictor turned off, and allocations it predicted before (at most 255 per CPU) may carry wrong addresses",
                thousands(c.predictions_wrong)
            )
        } else {
            ", none wrong".into()
        };
        writeln!(
            out,
            "Allocations recorded at their entry (result read from the thread's cache, the collector's free list or glibc's tcache; return not probed): {}; predictions checked against the return: {}{wrong}.",
            thousands(c.predicted),
            thousands(c.predictions_checked)
        )?;
        writeln!(out)?;
    }
    Ok(())
}

/// What the collector did: liveness method, collections, heap at the end.
fn gc_summary(gc: &crate::profile::GcSummary, out: &mut dyn Write) -> Result<()> {
    let stop = if gc.liveness.ends_with('.') { "" } else { "." };
    writeln!(out, "GC liveness: {}{stop}", gc.liveness)?;
    if gc.collections > 0 || gc.collections_not_judged > 0 {
        let last = gc
            .last_collection
            .map(|n| format!(" (last: #{n})"))
            .unwrap_or_default();
        write!(
            out,
            "GC collections judged: {}{last}; marked at the last: {} objects, {} bytes; judging took {:.3} s (longest pause {:.1} ms)",
            thousands(gc.collections),
            thousands(gc.marked_count),
            thousands(gc.marked_bytes),
            gc.pass_seconds,
            gc.longest_pass_seconds * 1e3
        )?;
        if gc.collections_not_judged > 0 {
            write!(
                out,
                "; not judged: {}",
                thousands(gc.collections_not_judged)
            )?;
        }
        if gc.events_lost > 0 {
            write!(
                out,
                "; GC allocations lost on their way to memprof (the kernel's event buffer was full; memprof could not keep up), never judged: {}",
                thousands(gc.events_lost)
            )?;
        }
        if gc.objects_not_judged > 0 {
            write!(
                out,
                "; objects never judged (the kernel's table was full): {}",
                thousands(gc.objects_not_judged)
            )?;
        }
        if gc.verdicts_failed > 0 {
            write!(
                out,
                "; verdicts not read: {}",
                thousands(gc.verdicts_failed)
            )?;
        }
        writeln!(out, ".")?;
    }
    if let Some(size) = gc.heap_size {
        let free = gc.free_bytes.map(thousands).unwrap_or_else(|| "?".into());
        let unmapped = gc
            .unmapped_bytes
            .map(thousands)
            .unwrap_or_else(|| "?".into());
        writeln!(
            out,
            "GC heap at the end: {} bytes, {free} free, {unmapped} unmapped.",
            thousands(size)
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// The table alone (used for the summary at the end of `run`/`attach`):
/// the program's rows, then the runtime's own allocations (fiber stacks,
/// the collector's heap) in a table of their own.
pub fn table(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let rows = rows(profile, options, DEFAULT_MIN_BYTES, DEFAULT_DEPTH, true);
    if rows.is_empty() {
        let min = options.min_bytes.unwrap_or(DEFAULT_MIN_BYTES);
        writeln!(
            out,
            "No stack has {} or more live bytes (--min-bytes).",
            thousands(min)
        )?;
        return Ok(());
    }
    let split = rows
        .iter()
        .position(|r| r.runtime.is_some())
        .unwrap_or(rows.len());
    let (program, runtime) = rows.split_at(split);
    if !program.is_empty() {
        rows_table(program, &profile.unwind, out)?;
    }
    if !runtime.is_empty() {
        if !program.is_empty() {
            writeln!(out)?;
        }
        let bytes: u64 = runtime.iter().map(|r| r.group.live_bytes).sum();
        writeln!(
            out,
            "Runtime ({} bytes live: what the language runtime and libraries allocate for themselves, not the program's objects):",
            thousands(bytes)
        )?;
        writeln!(out)?;
        rows_table(runtime, &profile.unwind, out)?;
    }
    Ok(())
}

/// The header of the tables of rows: the figures are what is live at the
/// end (or at the snapshot), not what was allocated over the run.
pub const HEADER: &str = "| Live at the end | Live bytes at the end | From the program | Context |";

/// One markdown table of `rows`.
fn rows_table(rows: &[Row<'_>], unwind: &str, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "{HEADER}")?;
    writeln!(
        out,
        "|----------------:|----------------------:|------------------|---------|"
    )?;
    for r in rows {
        writeln!(
            out,
            "| {:>15} | {:>21} | {} | {} |",
            thousands(r.group.live_count),
            thousands(r.group.live_bytes),
            program_cell(r),
            context(r, unwind)
        )?;
    }
    Ok(())
}

/// The row's first frame of the program's own source, whatever `--depth`
/// shows; `—` when the stack has none (all library or runtime).
pub fn program_cell(r: &Row<'_>) -> String {
    match r.program {
        Some(f) => format!("`{}`", escape(&frame_text(f))),
        None => "—".to_string(),
    }
}

/// A row's context cell: what the runtime row is, the frames, then the
/// notes (cut short, recursion folded, stacks merged).
pub fn context(r: &Row<'_>, unwind: &str) -> String {
    let g = &r.group;
    if g.overflow {
        return "(no room in the site table: counted without a stack; see --max-sites)".to_string();
    }
    let mut context: Vec<String> = Vec::new();
    if let Some(role) = r.runtime {
        context.push(format!("**{}**", role.label()));
    } else if let Some(class) = &g.type_name {
        // The class of the objects (read from them, or named by the stack).
        context.push(format!("**{}**", escape_text(class)));
    }
    context.extend(
        r.frames
            .iter()
            .map(|f| format!("`{}`", escape(&frame_text(f)))),
    );
    if r.frames.is_empty() {
        context.push("(no stack)".to_string());
    }
    if g.truncated {
        context.push("`…(truncated)`".to_string());
    }
    if r.folded {
        context.push(format!("`{}`", super::FOLDED_NOTE));
    }
    if r.plumbing_only {
        context.push(format!("`{}`", super::plumbing_only_note(unwind)));
    }
    if r.stacks > 1 {
        context.push(format!("`…({} stacks merged)`", thousands(r.stacks)));
    }
    context.join("<br>")
}

/// Text for a code span in a table cell: `|` would end the cell, a
/// backtick the code span, a line break the row; control characters are
/// shown as escapes ([`crate::text`]). (Inside a code span, markdown shows
/// `<`, `&` and `*` as they are.)
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in crate::text::visible(text).chars() {
        match c {
            '|' => out.push_str("\\|"),
            '`' => out.push('\''),
            c => out.push(c),
        }
    }
    out
}

/// Plain text (a command line, a type name outside a code span): every
/// character markdown or HTML would read as markup is shown as itself,
/// control characters as escapes ([`crate::text`]).
pub fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in crate::text::visible(text).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '#' | '~' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Counters, Frame, Group};

    fn render(profile: &Profile) -> String {
        let mut out = Vec::new();
        write(profile, &Options::default(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn header_tells_gc_liveness_and_truncated_stacks() {
        let mut profile = Profile {
            gc: Some(crate::profile::GcSummary {
                liveness: "address reuse only".into(),
                ..Default::default()
            }),
            counters: Counters {
                truncated_stacks: 3,
                ..Counters::default()
            },
            ..Profile::default()
        };
        let text = render(&profile);
        assert!(text.contains("GC liveness: address reuse only."), "{text}");
        assert!(
            text.contains("allocations with a truncated stack: 3 (stacks marked truncated: 0"),
            "{text}"
        );
        profile.gc = None;
        profile.counters.truncated_stacks = 0;
        let text = render(&profile);
        assert!(
            !text.contains("GC liveness") && !text.contains("truncated"),
            "{text}"
        );
    }

    #[test]
    fn gc_allocations_lost_on_the_way_are_counted() {
        let profile = Profile {
            gc: Some(crate::profile::GcSummary {
                liveness: "mark bits".into(),
                collections: 2,
                events_lost: 3_292_488,
                objects_not_judged: 150_311,
                ..Default::default()
            }),
            ..Profile::default()
        };
        let text = render(&profile);
        assert!(
            text.contains("GC allocations lost on their way to memprof (the kernel's event buffer was full; memprof could not keep up), never judged: 3,292,488; objects never judged (the kernel's table was full): 150,311."),
            "{text}"
        );
    }

    /// binary-trees built without --release, recorded with `--unwind fp`:
    /// the frame-pointer walk stops in `GC.malloc`.
    #[test]
    fn stacks_of_nothing_but_plumbing_say_so() {
        let frame = Frame {
            function: "GC.malloc".into(),
            raw_name: "*GC::malloc<UInt64>:Pointer(Void)".into(),
            file: Some("/usr/lib/crystal/lib/gc/boehm.cr".into()),
            line: Some(129),
            ..Frame::default()
        };
        let mut profile = Profile {
            unwind: "fp".into(),
            ..Profile::default()
        };
        let group = Group {
            kind: "gc".into(),
            live_count: 41_042,
            live_bytes: 1_315_360,
            ..Group::default()
        };
        profile.push(group, vec![frame]);
        let text = render(&profile);
        assert!(
            text.contains("|          41,042 |             1,315,360 | — | `/usr/lib/crystal/lib/gc/boehm.cr:129 in 'GC.malloc'`<br>`…(the stack ends in the allocator: frame pointers got no further; record with --unwind dwarf)` |"),
            "{text}"
        );
        let mut out = Vec::new();
        crate::report::types::write(&profile, &Options::default(), &mut out).unwrap();
        let types = String::from_utf8(out).unwrap();
        assert!(
            types.contains(
                "|       41,042 |  1,315,360 | (unknown: the stack ends in the allocator) |"
            ),
            "{types}"
        );
    }

    #[test]
    fn truncated_rows_say_so() {
        let frame = Frame {
            function: "Hash(String, Int32 | Nil)#upsert".into(),
            raw_name: "x".into(),
            file: Some("/src/app.cr".into()),
            line: Some(3),
            ..Frame::default()
        };
        let mut profile = Profile::default();
        let group = Group {
            kind: "gc".into(),
            live_count: 2,
            live_bytes: 4096,
            truncated: true,
            folded: true,
            ..Group::default()
        };
        profile.push(group, vec![frame]);
        let text = render(&profile);
        assert!(
            text.contains("allocations with recursion folded (repeated frames shown once): 0 (stacks marked folded: 1)"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("| ") && l.contains("4,096"))
            .unwrap();
        assert_eq!(
            row,
            "|               2 |                 4,096 | `/src/app.cr:3 in 'Hash(String, Int32 \\| Nil)#upsert'` | `/src/app.cr:3 in 'Hash(String, Int32 \\| Nil)#upsert'`<br>`…(truncated)`<br>`…(recursion folded)` |"
        );
        assert!(text.contains(HEADER), "{text}");
    }
}
