//! One self-contained HTML page (no network: styles, images and script are
//! inline): the run summary (target, duration, live, lost events, the
//! collector's figures, each once), the timeline chart (its legend beside
//! the plot), the program's live-bytes flamegraph (interactive: click to
//! zoom, Ctrl-F to search; a label too long for its box shows the method
//! alone, the full name on hover), the top stacks and the live objects per
//! type (the rows of `--format types`, a row whose class is not known
//! saying so).
//!
//! ```
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let mut profile = Profile::default();
//! profile.push(Group { kind: "libc".into(), live_count: 600, live_bytes: 28800, ..Default::default() },
//!     vec![Frame { function: "make_foo".into(), ..Default::default() }]);
//! let mut out = Vec::new();
//! render(&profile, Format::Html, &Options::default(), &mut out).unwrap();
//! let page = String::from_utf8(out).unwrap();
//! assert!(page.contains("<td class=\"n\">28,800</td>") && page.contains("make_foo"));
//! ```
use std::io::Write;

use anyhow::Result;
use base64::Engine;

use super::{flamegraph, frame_text, thousands, timeline, types, Options};
use crate::profile::Profile;
use crate::text::html_escape;

/// Stacks in the table when `--top` is not given.
pub const DEFAULT_TOP: usize = 50;

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0}\
td,th{border:1px solid #ccc;padding:.25em .6em;vertical-align:top;text-align:left}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
code{font-size:90%}.note{color:#666}\
section{margin-bottom:2em}#flamegraph svg{width:100%;max-width:1400px}\
td i{color:#666}";

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let title = format!("memprof: {}", flamegraph::target_name(profile));
    writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>{STYLE}</style></head><body>",
        html_escape(&title)
    )?;
    writeln!(out, "<h1>{}</h1>", html_escape(&title))?;
    summary(profile, options, out)?;

    writeln!(
        out,
        "<section id=\"timeline\"><h2>Live memory over time</h2>"
    )?;
    match timeline::svg(profile, options) {
        Ok(svg) => writeln!(
            out,
            "<img alt=\"live bytes per kind over time\" width=\"{}\" height=\"{}\" src=\"data:image/svg+xml;base64,{}\">",
            timeline::SIZE.0,
            timeline::SIZE.1,
            base64::engine::general_purpose::STANDARD.encode(svg)
        )?,
        Err(e) => writeln!(out, "<p class=\"note\">{}</p>", html_escape(&e.to_string()))?,
    }
    writeln!(out, "</section>")?;

    flamegraph_section(profile, options, out)?;
    top_table(profile, options, out)?;
    types_table(profile, options, out)?;
    writeln!(out, "</body></html>")?;
    Ok(())
}

/// The program's live-bytes flamegraph, inline so its script runs, with
/// memprof's labels ([`flamegraph::LABELS_SCRIPT`]). Fiber stacks (8 MiB
/// of address space each, mostly untouched) and the collector's heap
/// sections (which hold the GC objects the graph already draws) are left
/// out, said under the heading: they are in the tables, and would squeeze
/// the program's stacks into slivers.
fn flamegraph_section(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    use super::runtime::Role;
    let runtime: Vec<bool> = profile
        .groups
        .iter()
        .map(|g| {
            matches!(
                super::runtime::role(profile, g),
                Some(Role::FiberStack | Role::GcHeap)
            )
        })
        .collect();
    let left_out: u64 = profile
        .groups
        .iter()
        .zip(&runtime)
        .filter(|&(_, &r)| r)
        .map(|(g, _)| super::folded::value(g, options))
        .sum();
    let program;
    let drawn = if left_out > 0 && runtime.iter().any(|r| !r) {
        let mut p = profile.clone();
        let mut keep = runtime.iter().map(|r| !r);
        p.groups.retain(|_| keep.next().unwrap_or(true));
        program = p;
        &program
    } else {
        profile
    };
    writeln!(
        out,
        "<section id=\"flamegraph\"><h2>Flamegraph: {} by stack</h2>",
        flamegraph::measure(options)
    )?;
    let left_out_note = if drawn.groups.len() < profile.groups.len() {
        let unit = match options.count {
            super::Count::Bytes => "bytes",
            super::Count::Objects => "objects",
        };
        format!(
            "Without the fiber stacks and the collector's heap sections ({} {unit}, in the tables below). ",
            thousands(left_out)
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "<p class=\"note\">{left_out_note}Click a frame to zoom, Ctrl-F to search; a label too long for its frame shows the method, the full name on hover.</p>"
    )?;
    let mut svg = Vec::new();
    match flamegraph::write(drawn, options, &mut svg) {
        Ok(()) => {
            let svg = String::from_utf8_lossy(&svg);
            // Inline: the XML prolog and doctype are not HTML. The graph's
            // script finds itself as the page's first <svg> (the timeline
            // is an image); memprof's labels replace its own after it.
            let start = svg.find("<svg").unwrap_or(0);
            writeln!(out, "{}", &svg[start..])?;
            writeln!(out, "<script>{}</script>", flamegraph::LABELS_SCRIPT)?;
        }
        Err(e) => writeln!(out, "<p class=\"note\">{}</p>", html_escape(&e.to_string()))?,
    }
    writeln!(out, "</section>")?;
    Ok(())
}

/// The summary table: each figure once.
fn summary(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let t = &profile.target;
    let c = &profile.counters;
    let live: u64 = profile.groups.iter().map(|g| g.live_bytes).sum();
    let live_n: u64 = profile.groups.iter().map(|g| g.live_count).sum();
    let exit = match profile.exit {
        Some(e) => match (e.code, e.signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (_, Some(sig)) if e.oom_killed => format!("killed by signal {sig} (the OOM killer)"),
            (_, Some(sig)) => format!("killed by signal {sig}"),
            _ => "exited".to_string(),
        },
        None => "still running when profiling ended".to_string(),
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("Target", format!("{} (pid {})", t.command.join(" "), t.pid)),
        ("Executable", t.exe.clone()),
        (
            "Mode",
            format!("{}, {} unwinding", profile.mode, profile.unwind),
        ),
        ("Duration", format!("{:.2} s", profile.duration_s)),
        ("End", exit),
        (
            "Live at the end",
            format!(
                "{}{} blocks, {} bytes",
                if c.live_incomplete() { "at least " } else { "" },
                thousands(live_n),
                thousands(live)
            ),
        ),
        (
            "Allocations / frees seen",
            format!("{} / {}", thousands(c.allocs), thousands(c.frees)),
        ),
    ];
    if profile.sample_bytes > 0 {
        rows.push((
            "Sampled",
            format!(
                "one allocation per {} bytes allocated on average (--sample-bytes): counts and bytes are estimates",
                thousands(profile.sample_bytes)
            ),
        ));
    }
    if profile.gc_sampling == "refill" {
        rows.push((
            "GC sampled",
            format!(
                "at the collector's free-list refills (--gc-sampling refill, {} refills{}): GC counts and bytes are estimates",
                thousands(c.refills),
                profile.refills_thinned()
            ),
        ));
    }
    rows.push((
        "Lost events",
        if c.lost_events() == 0 {
            "0".to_string()
        } else {
            super::text::lost_events(profile)
        },
    ));
    rows.push(("Also missed", super::text::other_losses(profile)));
    if let Some(gc) = &profile.gc {
        rows.extend(gc_rows(gc));
    }
    if let Some(filters) = &options.filters {
        rows.push(("Filtered", filters.clone()));
    }
    writeln!(out, "<section id=\"summary\"><h2>Summary</h2><table>")?;
    for (name, value) in rows {
        writeln!(
            out,
            "<tr><th>{name}</th><td>{}</td></tr>",
            html_escape(&value)
        )?;
    }
    writeln!(out, "</table></section>")?;
    Ok(())
}

/// The collector's figures, as the profile has them (what the markdown
/// header says about the GC, a row each).
fn gc_rows(gc: &crate::profile::GcSummary) -> Vec<(&'static str, String)> {
    let mut rows = vec![("GC liveness", gc.liveness.clone())];
    if gc.collections > 0 || gc.collections_not_judged > 0 {
        let mut judged = thousands(gc.collections);
        if let Some(n) = gc.last_collection {
            judged += &format!(" (the last: #{n})");
        }
        if gc.collections_not_judged > 0 {
            judged += &format!("; not judged: {}", thousands(gc.collections_not_judged));
        }
        rows.push(("GC collections judged", judged));
        rows.push((
            "Marked at the last collection",
            format!(
                "{} objects, {} bytes (as the collector counts them)",
                thousands(gc.marked_count),
                thousands(gc.marked_bytes)
            ),
        ));
        rows.push((
            "Longest GC pause added",
            format!(
                "{:.1} ms (judging took {:.3} s in all)",
                gc.longest_pass_seconds * 1e3,
                gc.pass_seconds
            ),
        ));
    }
    for (count, name) in [
        (
            gc.events_lost,
            "GC allocations never judged (event buffer full)",
        ),
        (
            gc.objects_not_judged,
            "GC objects never judged (the kernel's table was full)",
        ),
        (gc.verdicts_failed, "GC verdicts not read"),
    ] {
        if count > 0 {
            rows.push((name, thousands(count)));
        }
    }
    if let Some(size) = gc.heap_size {
        let or_unknown = |v: Option<u64>| v.map(thousands).unwrap_or_else(|| "?".into());
        rows.push((
            "GC heap at the end",
            format!(
                "{} bytes, {} free, {} unmapped",
                thousands(size),
                or_unknown(gc.free_bytes),
                or_unknown(gc.unmapped_bytes)
            ),
        ));
    }
    rows
}

fn top_table(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let options = Options {
        top: Some(options.top.unwrap_or(DEFAULT_TOP)),
        ..options.clone()
    };
    let rows = super::rows(profile, &options, 0, super::markdown::DEFAULT_DEPTH, true);
    writeln!(
        out,
        "<section id=\"stacks\"><h2>Top stacks by live bytes</h2>"
    )?;
    if rows.is_empty() {
        writeln!(
            out,
            "<p class=\"note\">No stack has live bytes.</p></section>"
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "<table><tr><th class=\"n\">Live blocks</th><th class=\"n\">Live bytes</th>\
         <th class=\"n\">Allocated blocks</th><th class=\"n\">Allocated bytes</th><th>Kind</th><th>From the program</th><th>Stack</th></tr>"
    )?;
    for r in rows {
        let g = &r.group;
        let mut frames: Vec<String> = Vec::new();
        if let Some(role) = r.runtime {
            frames.push(format!("<b>runtime: {}</b>", html_escape(role.label())));
        }
        frames.extend(
            r.frames
                .iter()
                .map(|f| format!("<code>{}</code>", html_escape(&frame_text(f)))),
        );
        if g.truncated {
            frames.push("<code>…(truncated)</code>".to_string());
        }
        if r.folded {
            frames.push(format!("<code>{}</code>", super::FOLDED_NOTE));
        }
        if r.plumbing_only {
            frames.push(format!(
                "<code>{}</code>",
                html_escape(super::plumbing_only_note(&profile.unwind))
            ));
        }
        if r.stacks > 1 {
            frames.push(format!(
                "<code>…({} stacks merged)</code>",
                thousands(r.stacks)
            ));
        }
        writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            thousands(g.live_count),
            thousands(g.live_bytes),
            thousands(g.total_count),
            thousands(g.total_bytes),
            html_escape(&g.kind),
            r.program
                .map(|f| format!("<code>{}</code>", html_escape(&frame_text(f))))
                .unwrap_or_else(|| "—".to_string()),
            frames.join("<br>")
        )?;
    }
    writeln!(out, "</table></section>")?;
    Ok(())
}

fn types_table(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let options = Options {
        top: Some(options.top.unwrap_or(DEFAULT_TOP)),
        ..options.clone()
    };
    let rows = types::rows(profile, &options);
    writeln!(out, "<section id=\"types\"><h2>Live objects per type</h2>")?;
    if rows.is_empty() {
        writeln!(out, "<p class=\"note\">No live objects.</p></section>")?;
        return Ok(());
    }
    writeln!(
        out,
        "<p class=\"note\">The rows of <code>memprof report --format types</code>: the class allocated, where memprof knows it; where it does not, the row is the call site that allocated (<i>type unknown; call site:</i>).</p>"
    )?;
    writeln!(
        out,
        "<table><tr><th class=\"n\">Objects</th><th class=\"n\">Bytes</th><th>Type</th></tr>"
    )?;
    for r in rows {
        let name = if r.class || r.runtime {
            html_escape(&r.name)
        } else if let Some(site) = r.name.strip_prefix("in ") {
            format!("<i>type unknown; call site:</i> {}", html_escape(site))
        } else {
            format!("<i>type unknown:</i> {}", html_escape(&r.name))
        };
        writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{name}</td></tr>",
            thousands(r.objects),
            thousands(r.bytes),
        )?;
    }
    writeln!(out, "</table></section>")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::GcSummary;

    #[test]
    fn summary_gives_each_figure_once_and_the_collectors() {
        let mut profile = Profile::default();
        profile.counters.live_map_full = 3;
        profile.counters.unknown_frees = 11;
        profile.gc = Some(GcSummary {
            liveness: "mark bits".into(),
            collections: 7,
            last_collection: Some(9),
            marked_count: 28_082,
            marked_bytes: 1_548_304,
            pass_seconds: 0.0074,
            longest_pass_seconds: 0.0055,
            heap_size: Some(1_593_344),
            free_bytes: Some(4096),
            unmapped_bytes: Some(0),
            ..Default::default()
        });
        let mut out = Vec::new();
        summary(&profile, &Options::default(), &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        for row in [
            "<tr><th>Lost events</th><td>3 (each counted once: not tracked as live, live table full: 3;",
            "<tr><th>Also missed</th><td>stacks not captured: 0; frees of unknown blocks: 11</td></tr>",
            "<tr><th>GC collections judged</th><td>7 (the last: #9)</td></tr>",
            "<tr><th>Marked at the last collection</th><td>28,082 objects, 1,548,304 bytes (as the collector counts them)</td></tr>",
            "<tr><th>Longest GC pause added</th><td>5.5 ms (judging took 0.007 s in all)</td></tr>",
            "<tr><th>GC heap at the end</th><td>1,593,344 bytes, 4,096 free, 0 unmapped</td></tr>",
        ] {
            assert!(page.contains(row), "no {row:?} in\n{page}");
        }
        assert_eq!(
            page.to_lowercase().matches("lost events").count(),
            1,
            "{page}"
        );
        for figure in ["1,548,304", "28,082", "11<", ">7 "] {
            assert_eq!(page.matches(figure).count(), 1, "{figure} in\n{page}");
        }
    }
}
