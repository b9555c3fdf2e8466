//! The `memprof heap` report: markdown (live objects per type, the size
//! classes, where the RSS goes), tsv (the type rows) or json (everything,
//! versioned; docs/formats.md documents it).
use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Result;
use serde_json::json;

use super::{HeapOptions, HeapReport, Taken};
use crate::gc::census::names::object_name;
use crate::gc::census::{kind_name, Tally, Word};
use crate::report::markdown::escape_text;
use crate::report::thousands;

/// Output formats of `memprof heap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HeapFormat {
    Markdown,
    Tsv,
    Json,
}

/// Live objects of one type and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TypeRow {
    /// The class; `(type N)` for an id no constructor names; `T buffer`
    /// for objects without a type id that an object of type `T` points
    /// into; `(no type id)` for the rest (raw memory).
    pub name: String,
    pub type_id: Option<u32>,
    /// For a buffer: the type id of the object holding it.
    pub held_by: Option<u32>,
    /// `--sizes`, for a type id: bytes reachable from its objects.
    pub retained: Option<u64>,
    pub kind: u8,
    pub count: u64,
    pub bytes: u64,
}

/// The type rows, most bytes first, named by [`crate::symbolize::type_ids`]
/// (the census kept as type ids only first words that are:
/// [`TypeOf::NotAType`] never reaches here).
fn type_rows(report: &HeapReport) -> Vec<TypeRow> {
    let mut rows: BTreeMap<(String, Option<u32>, Option<u32>, u8), Tally> = BTreeMap::new();
    for (&(kind, word), tally) in &report.census.words {
        let name = object_name(&report.names, word, kind);
        let key = match word {
            Word::Type(id) => (name, Some(id), None),
            Word::HeldBy(id) => (name, None, Some(id)),
            Word::Untyped => (name, None, None),
        };
        let row = rows.entry((key.0, key.1, key.2, kind)).or_default();
        row.count += tally.count;
        row.bytes += tally.bytes;
    }
    let mut out: Vec<TypeRow> = rows
        .into_iter()
        .map(|((name, type_id, held_by, kind), t)| TypeRow {
            retained: type_id.and_then(|id| report.retained.as_ref()?.get(&id).copied()),
            name,
            type_id,
            held_by,
            kind,
            count: t.count,
            bytes: t.bytes,
        })
        .collect();
    out.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then(a.name.cmp(&b.name))
    });
    out
}

pub(crate) fn write(report: &HeapReport, options: &HeapOptions, out: &mut dyn Write) -> Result<()> {
    match options.format {
        HeapFormat::Markdown => markdown(report, options.top, out),
        HeapFormat::Tsv => tsv(report, out),
        HeapFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &to_json(report))?;
            writeln!(out)?;
            Ok(())
        }
    }
}

/// Totals over the size classes: live, on free lists, unmarked.
fn totals(report: &HeapReport) -> [Tally; 3] {
    let mut t = [Tally::default(); 3];
    for c in report.census.classes.values() {
        for (sum, part) in t.iter_mut().zip([c.live, c.free_list, c.unmarked]) {
            sum.count += part.count;
            sum.bytes += part.bytes;
        }
    }
    t
}

fn markdown(report: &HeapReport, top: Option<usize>, out: &mut dyn Write) -> Result<()> {
    summary(report, out)?;
    types_table(report, top, out)?;
    if let Some(graph) = &report.graph {
        graph_section(graph, out)?;
    }
    size_classes(report, out)?;
    rss_table(report, out)
}

/// The title, and what the collector's heap held.
fn summary(report: &HeapReport, out: &mut dyn Write) -> Result<()> {
    let copy = &report.copy;
    let [live, free_list, unmarked] = totals(report);
    let heap_bytes: u64 = copy.blocks.iter().map(|b| b.bytes(copy.hblksize)).sum();
    writeln!(
        out,
        "# memprof heap: pid {} ({}), GC collection {}",
        report.target.pid,
        escape_text(&crate::text::visible_path(&report.target.exe)),
        copy.gc_no
    )?;
    writeln!(out)?;
    match &report.taken {
        Taken::Held => writeln!(
            out,
            "Collector held {:.1} ms (copied {} bytes of heap); census {:.1} ms after letting it go.",
            report.held.as_secs_f64() * 1e3,
            thousands(copy.copied_bytes()),
            report.judged.as_secs_f64() * 1e3
        )?,
        Taken::AtRest {
            allocated_since,
            note,
        } => {
            writeln!(
                out,
                "Taken between collections{}: the marks collection {} left, read with the program stopped {:.1} ms, its collector at rest (copied {} bytes of heap); census {:.1} ms after letting it go.",
                note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default(),
                copy.gc_no,
                report.held.as_secs_f64() * 1e3,
                thousands(copy.copied_bytes()),
                report.judged.as_secs_f64() * 1e3
            )?;
            writeln!(out, "{}", not_classified(copy.gc_no, *allocated_since))?;
        }
    }
    writeln!(
        out,
        "GC heap: {} bytes in {} blocks ({} in free blocks). Live (marked): {} objects, {} bytes. \
         On free lists: {} objects, {} bytes. Unmarked (dead or free): {} objects, {} bytes.",
        thousands(heap_bytes),
        thousands(copy.blocks.len() as u64),
        thousands(report.census.free_blocks.bytes),
        thousands(live.count),
        thousands(live.bytes),
        thousands(free_list.count),
        thousands(free_list.bytes),
        thousands(unmarked.count),
        thousands(unmarked.bytes),
    )?;
    if let Some(s) = &copy.stats {
        writeln!(
            out,
            "The collector's figures: heap size {}, free {}, unmapped {} bytes.",
            thousands(s.heap_size),
            thousands(s.free_bytes),
            thousands(s.unmapped_bytes)
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// What a census between collections could not classify, in a sentence.
fn not_classified(gc_no: u64, allocated_since: Option<u64>) -> String {
    match allocated_since {
        Some(0) => format!(
            "Nothing was allocated since collection {gc_no}: every object is judged."
        ),
        Some(b) => format!(
            "Allocated since collection {gc_no}, not classified: {} bytes (the collector's count; objects allocated since are not marked yet, so not in the tables below).",
            thousands(b)
        ),
        None => format!(
            "Allocated since collection {gc_no}, not classified: unknown (memprof cannot read this libgc's count); objects allocated since are not marked yet, so not in the tables below."
        ),
    }
}

/// Live objects by type, the `top` most bytes first.
fn types_table(report: &HeapReport, top: Option<usize>, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "## Live objects by type")?;
    writeln!(out)?;
    let sizes = report.retained.is_some();
    if sizes {
        writeln!(out, "| Objects | Bytes | Retained | Kind | Type |")?;
        writeln!(out, "|--------:|------:|---------:|------|------|")?;
    } else {
        writeln!(out, "| Objects | Bytes | Kind | Type |")?;
        writeln!(out, "|--------:|------:|------|------|")?;
    }
    let rows = type_rows(report);
    let shown = top.unwrap_or(rows.len()).min(rows.len());
    for r in &rows[..shown] {
        let retained = match (sizes, r.retained) {
            (false, _) => String::new(),
            (true, Some(b)) => format!(" {} |", thousands(b)),
            (true, None) => " |".to_string(),
        };
        writeln!(
            out,
            "| {} | {} |{retained} {} | {} |",
            thousands(r.count),
            thousands(r.bytes),
            kind_name(r.kind),
            escape_text(&r.name)
        )?;
    }
    if shown < rows.len() {
        let rest = &rows[shown..];
        writeln!(
            out,
            "| {} | {} |{} | …({} more types) |",
            thousands(rest.iter().map(|r| r.count).sum()),
            thousands(rest.iter().map(|r| r.bytes).sum()),
            if sizes { " |" } else { "" },
            thousands(rest.len() as u64)
        )?;
    }
    if sizes {
        writeln!(out)?;
        writeln!(
            out,
            "Retained: the bytes of every live object reachable from the type's objects (theirs included), each once."
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// `--graph`: the objects linking to the type asked for, as a mermaid chart.
fn graph_section(graph: &super::graph::RefGraph, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "## Objects linking to {}",
        escape_text(&graph.target_type)
    )?;
    writeln!(out)?;
    writeln!(out, "```mermaid")?;
    write!(out, "{}", super::graph::mermaid(graph))?;
    writeln!(out, "```")?;
    writeln!(out)?;
    Ok(())
}

/// The size classes: blocks, live objects, free-list and unmarked slots.
fn size_classes(report: &HeapReport, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "## Size classes")?;
    writeln!(out)?;
    writeln!(
        out,
        "| Kind | Object size | Blocks | Heap bytes | Live | Live bytes | On free lists | Unmarked |"
    )?;
    writeln!(
        out,
        "|------|------------:|-------:|-----------:|-----:|-----------:|--------------:|---------:|"
    )?;
    for (&(kind, size), c) in &report.census.classes {
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            kind_name(kind),
            thousands(size),
            thousands(c.blocks),
            thousands(c.block_bytes),
            thousands(c.live.count),
            thousands(c.live.bytes),
            thousands(c.free_list.count),
            thousands(c.unmarked.count)
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// Where the RSS goes, and what smaps_rollup said.
fn rss_table(report: &HeapReport, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "## Where the RSS goes")?;
    writeln!(out)?;
    writeln!(out, "|      Bytes | What |")?;
    writeln!(out, "|-----------:|------|")?;
    for row in &report.rss {
        writeln!(
            out,
            "| {} | {} |",
            thousands(row.bytes),
            escape_text(&row.what)
        )?;
    }
    let total: u64 = report.rss.iter().map(|r| r.bytes).sum();
    writeln!(out, "| {} | **total** (RSS) |", thousands(total))?;
    if let Some(rollup) = report.rollup_rss {
        writeln!(out)?;
        writeln!(
            out,
            "/proc/{}/smaps_rollup said Rss {} bytes at the same moment.",
            report.target.pid,
            thousands(rollup)
        )?;
    }
    Ok(())
}

/// First line the number of rows, then `count⇥bytes⇥kind⇥type` per type.
fn tsv(report: &HeapReport, out: &mut dyn Write) -> Result<()> {
    let rows = type_rows(report);
    writeln!(out, "{}", rows.len())?;
    for r in rows {
        writeln!(
            out,
            "{}\t{}\t{}\t{}",
            r.count,
            r.bytes,
            kind_name(r.kind),
            crate::text::visible(&r.name)
        )?;
    }
    Ok(())
}

/// Schema version of the JSON report.
const JSON_VERSION: u32 = 1;

fn to_json(report: &HeapReport) -> serde_json::Value {
    let copy = &report.copy;
    let [live, free_list, unmarked] = totals(report);
    let heap_bytes: u64 = copy.blocks.iter().map(|b| b.bytes(copy.hblksize)).sum();
    let stats = copy.stats.as_ref();
    let types: Vec<_> = type_rows(report)
        .into_iter()
        .map(|r| {
            json!({"name": r.name, "type_id": r.type_id, "held_by_type_id": r.held_by,
                   "kind": kind_name(r.kind), "count": r.count, "bytes": r.bytes,
                   "retained_bytes": r.retained})
        })
        .collect();
    let classes: Vec<_> = report
        .census
        .classes
        .iter()
        .map(|(&(kind, size), c)| {
            json!({"kind": kind_name(kind), "size": size, "blocks": c.blocks,
                   "block_bytes": c.block_bytes,
                   "live_count": c.live.count, "live_bytes": c.live.bytes,
                   "free_list_count": c.free_list.count, "free_list_bytes": c.free_list.bytes,
                   "unmarked_count": c.unmarked.count, "unmarked_bytes": c.unmarked.bytes})
        })
        .collect();
    let rss: Vec<_> = report
        .rss
        .iter()
        .map(|r| json!({"what": r.what, "bytes": r.bytes}))
        .collect();
    json!({
        "format": "memprof-heap",
        "version": JSON_VERSION,
        "memprof_version": env!("CARGO_PKG_VERSION"),
        "target": {"pid": report.target.pid, "exe": report.target.exe.display().to_string(),
                   "command": report.target.command},
        "gc": {
            "collection": copy.gc_no,
            "taken": match report.taken { Taken::Held => "held", Taken::AtRest { .. } => "at_rest" },
            "note": match &report.taken { Taken::AtRest { note, .. } => note.clone(), Taken::Held => None },
            "held_seconds": report.held.as_secs_f64(),
            "census_seconds": report.judged.as_secs_f64(),
            "copied_bytes": copy.copied_bytes(),
            "blocks": copy.blocks.len(),
            "block_bytes": heap_bytes,
            "free_block_bytes": report.census.free_blocks.bytes,
            "live_count": live.count, "live_bytes": live.bytes,
            "free_list_count": free_list.count, "free_list_bytes": free_list.bytes,
            "unmarked_count": unmarked.count, "unmarked_bytes": unmarked.bytes,
            "heap_size": stats.map(|s| s.heap_size),
            "free_bytes": stats.map(|s| s.free_bytes),
            "unmapped_bytes": stats.map(|s| s.unmapped_bytes),
        },
        "types": types,
        "not_yet_judged": match report.taken {
            Taken::Held => json!({"count": 0, "bytes": 0}),
            Taken::AtRest { allocated_since, .. } => json!({"count": null, "bytes": allocated_since}),
        },
        "size_classes": classes,
        "rss": rss,
        "rss_total": report.rss.iter().map(|r| r.bytes).sum::<u64>(),
        "graph": report.graph.as_ref().map(|g| json!({
            "target_type": g.target_type,
            "nodes": g.nodes.iter().map(|(a, t)| json!({"addr": format!("{a:#x}"), "type": t})).collect::<Vec<_>>(),
            "edges": g.edges.iter().map(|e| json!({"from": format!("{:#x}", e.from), "to": format!("{:#x}", e.to),
                "field": e.label(), "level": e.level})).collect::<Vec<_>>(),
            "roots": g.roots.iter().map(|(a, r)| json!({"addr": format!("{a:#x}"), "root": r})).collect::<Vec<_>>(),
        })),
        "smaps_rollup_rss": report.rollup_rss,
    })
}
