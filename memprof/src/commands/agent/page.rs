//! The page at `/` ([`page.html`](page.html)): the processes ranked by
//! live bytes, with their growth since the page opened, refreshed every
//! 2 s from `/api/processes`; a click on a process draws its profile from
//! `/api/profile?pid=N&format=json` (the document `memprof report --format
//! json` writes): summary, timeline, a flamegraph of live bytes (click to
//! zoom, a regular expression to search), top stacks and live objects per
//! class, drawn again every 5 s while it runs, zoom and search kept.
//! `/#pid=N` shows that process as the page loads. The first table is
//! written here, so the page reads without scripts too.
use crate::report::thousands;
use crate::text::html_escape;

use super::ProcessRow;

/// The page, with `rows` as its first table.
pub fn render(rows: &[ProcessRow]) -> String {
    let mut table = String::new();
    for r in rows {
        table.push_str(&format!(
            "<tr data-pid=\"{pid}\"><td>{pid}</td><td>{comm}</td><td class=\"n\">{live}</td><td class=\"n\">{blocks}</td><td class=\"n\"></td><td>{state}</td></tr>\n",
            pid = r.pid,
            comm = html_escape(&r.comm),
            live = thousands(r.live_bytes),
            blocks = thousands(r.live_blocks),
            state = if r.running { "running" } else { "ended" },
        ));
    }
    PAGE.replace("{rows}", &table)
}

/// The page, with `{rows}` where the first table's rows go.
const PAGE: &str = include_str!("page.html");
