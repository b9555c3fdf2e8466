//! One self-contained HTML page (no network: styles, images and script are
//! inline): the run summary (target, duration, lost events, GC
//! collections), the timeline chart, the live-bytes flamegraph
//! (interactive: click to zoom, Ctrl-F to search), the top stacks and the
//! live objects per type.
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

use super::{flamegraph, frame_text, loss_summary, thousands, timeline, types, Options};
use crate::profile::Profile;

/// Stacks in the table when `--top` is not given.
pub const DEFAULT_TOP: usize = 50;

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0}\
td,th{border:1px solid #ccc;padding:.25em .6em;vertical-align:top;text-align:left}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
code{font-size:90%}.note{color:#666}\
section{margin-bottom:2em}#flamegraph svg{width:100%;max-width:1400px}";

/// `<`, `>`, `&` and quotes as entities.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let title = format!("memprof: {}", flamegraph::target_name(profile));
    writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>{STYLE}</style></head><body>",
        escape(&title)
    )?;
    writeln!(out, "<h1>{}</h1>", escape(&title))?;
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
        Err(e) => writeln!(out, "<p class=\"note\">{}</p>", escape(&e.to_string()))?,
    }
    writeln!(out, "</section>")?;

    writeln!(
        out,
        "<section id=\"flamegraph\"><h2>Flamegraph: {} by stack</h2>",
        flamegraph::measure(options)
    )?;
    let mut svg = Vec::new();
    match flamegraph::write(profile, options, &mut svg) {
        Ok(()) => {
            let svg = String::from_utf8_lossy(&svg);
            // Inline: the XML prolog and doctype are not HTML. The graph's
            // script finds itself as the page's first <svg>.
            let start = svg.find("<svg").unwrap_or(0);
            writeln!(out, "{}", &svg[start..])?;
        }
        Err(e) => writeln!(out, "<p class=\"note\">{}</p>", escape(&e.to_string()))?,
    }
    writeln!(out, "</section>")?;

    top_table(profile, options, out)?;
    types_table(profile, options, out)?;
    writeln!(out, "</body></html>")?;
    Ok(())
}

fn summary(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let t = &profile.target;
    let c = &profile.counters;
    let live: u64 = profile.groups.iter().map(|g| g.live_bytes).sum();
    let live_n: u64 = profile.groups.iter().map(|g| g.live_count).sum();
    let exit = match profile.exit {
        Some(e) => match (e.code, e.signal) {
            (Some(code), _) => format!("exited with code {code}"),
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
        ("Lost events", thousands(c.lost_events())),
        ("Losses", loss_summary(profile)),
    ];
    if let Some(gc) = &profile.gc {
        rows.push(("GC liveness", gc.liveness.clone()));
        rows.push(("GC collections", thousands(gc.collections)));
        if let Some(size) = gc.heap_size {
            rows.push(("GC heap at the end", format!("{} bytes", thousands(size))));
        }
    }
    if let Some(filters) = &options.filters {
        rows.push(("Filtered", filters.clone()));
    }
    writeln!(out, "<section id=\"summary\"><h2>Summary</h2><table>")?;
    for (name, value) in rows {
        writeln!(out, "<tr><th>{name}</th><td>{}</td></tr>", escape(&value))?;
    }
    writeln!(out, "</table></section>")?;
    Ok(())
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
            frames.push(format!("<b>runtime: {}</b>", escape(role.label())));
        }
        frames.extend(
            r.frames
                .iter()
                .map(|f| format!("<code>{}</code>", escape(&frame_text(f)))),
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
                escape(super::plumbing_only_note(&profile.unwind))
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
            escape(&g.kind),
            r.program
                .map(|f| format!("<code>{}</code>", escape(&frame_text(f))))
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
        "<table><tr><th class=\"n\">Objects</th><th class=\"n\">Bytes</th><th>Type</th></tr>"
    )?;
    for r in rows {
        writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            thousands(r.objects),
            thousands(r.bytes),
            escape(&r.name)
        )?;
    }
    writeln!(out, "</table></section>")?;
    Ok(())
}
