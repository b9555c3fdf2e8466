//! The page at `/`: the processes ranked by live bytes, with their growth
//! since the page last looked, refreshed every 2 s from `/api/processes`;
//! a click on a process shows its profile as `memprof report --format
//! html` writes it (summary, timeline, flamegraph with zoom and search,
//! top stacks, types), from `/api/profile`; `/#pid=N` clicks that
//! process's row as the page loads. The first table is written
//! here, so the page reads without scripts too.
use crate::report::html_escape as escape;
use crate::report::thousands;

use super::ProcessRow;

/// The page, with `rows` as its first table.
pub fn render(rows: &[ProcessRow]) -> String {
    let mut table = String::new();
    for r in rows {
        table.push_str(&format!(
            "<tr data-pid=\"{pid}\"><td>{pid}</td><td>{comm}</td><td class=\"n\">{live}</td><td class=\"n\">{blocks}</td><td class=\"n\"></td><td>{state}</td><td><a href=\"/api/profile?pid={pid}&amp;format=html\" target=\"profile\">profile</a></td></tr>\n",
            pid = r.pid,
            comm = escape(&r.comm),
            live = thousands(r.live_bytes),
            blocks = thousands(r.live_blocks),
            state = if r.running { "running" } else { "ended" },
        ));
    }
    PAGE.replace("{rows}", &table)
}

const PAGE: &str = r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>memprof agent</title>
<style>
body { font-family: sans-serif; margin: 1em; }
table { border-collapse: collapse; }
td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr[data-pid] { cursor: pointer; }
tr.chosen { background: #fe9; }
#profile { width: 100%; height: 80vh; border: 1px solid #ccc; margin-top: 1em; }
</style></head>
<body>
<h1>memprof agent</h1>
<p id="status">Processes by live bytes; a click shows one's profile. Refreshed every 2 s.</p>
<table id="processes"><thead><tr><th>pid</th><th>program</th><th class="n">live bytes</th><th class="n">live blocks</th><th class="n">growth/s</th><th>state</th><th></th></tr></thead>
<tbody>
{rows}</tbody></table>
<iframe id="profile" name="profile" title="profile"></iframe>
<script>
"use strict";
const last = new Map();
let chosen = null;
function show(pid) {
  chosen = pid;
  document.getElementById("profile").src = "/api/profile?pid=" + pid + "&format=html";
  history.replaceState(null, "", "#pid=" + pid);
  mark();
}
function mark() {
  for (const tr of document.querySelectorAll("tr[data-pid]")) {
    tr.classList.toggle("chosen", Number(tr.dataset.pid) === chosen);
  }
}
function cell(text, numeric) {
  const td = document.createElement("td");
  td.textContent = text;
  if (numeric) td.className = "n";
  return td;
}
async function refresh() {
  let rows;
  try {
    rows = await (await fetch("/api/processes")).json();
  } catch (e) {
    document.getElementById("status").textContent = "The agent does not answer: " + e;
    return;
  }
  const now = Date.now() / 1000;
  const body = document.querySelector("#processes tbody");
  body.replaceChildren();
  for (const r of rows) {
    const before = last.get(r.pid);
    const growth = before && r.running ? (r.live_bytes - before[1]) / (now - before[0]) : null;
    if (r.running) last.set(r.pid, [now, r.live_bytes]);
    const tr = document.createElement("tr");
    tr.dataset.pid = r.pid;
    tr.append(cell(r.pid), cell(r.comm), cell(r.live_bytes.toLocaleString("en"), true),
      cell(r.live_blocks.toLocaleString("en"), true),
      cell(growth === null ? "" : Math.round(growth).toLocaleString("en"), true),
      cell(r.running ? "running" : "ended" + (r.exit && r.exit.signal ? " (signal " + r.exit.signal + ")" : "")), cell(""));
    tr.addEventListener("click", () => show(r.pid));
    body.append(tr);
  }
  mark();
}
for (const tr of document.querySelectorAll("tr[data-pid]")) {
  tr.addEventListener("click", (e) => { e.preventDefault(); show(Number(tr.dataset.pid)); });
}
// `/#pid=N`: that process's row, clicked (a link to one process).
const wanted = /^#pid=(\d+)$/.exec(location.hash);
if (wanted) {
  const tr = document.querySelector('tr[data-pid="' + wanted[1] + '"]');
  if (tr) tr.click();
}
setInterval(refresh, 2000);
</script>
</body></html>
"##;
