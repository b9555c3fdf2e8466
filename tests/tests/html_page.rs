//! The html page (`report --format html`) as a person sees it: a Crystal
//! program profiled under real probes, its page rendered by headless
//! Chromium at a 1280 px window, what is displayed measured by a script
//! injected into a copy of the page (and the flamegraph's labels read off
//! a screenshot by OCR), every figure checked against the fixture's truths
//! and against `--format json` / `--format types`.
//!
//! `html_page` (fixtures/crystal/html_page.cr, debug build): 24,000 Widget
//! objects made in `AssemblyLineOfTheHtmlFixture#make_widgets`, 4,000
//! Gadget objects in `#make_gadgets`, all kept; two collections.

use memprof_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};

const WIDGETS: u64 = 24_000;
const GADGETS: u64 = 4_000;
/// The class whose methods make them: its name makes the methods' full
/// names wider than their frames at 1280 px.
const LINE: &str = "AssemblyLineOfTheHtmlFixture";

/// Measures the rendered page once its scripts ran (inferno's labels are
/// set in a timeout after load): each flamegraph frame's label as
/// displayed, its width and its frame's; what a search matches; a frame
/// zoomed into; the timeline's legend, plot area and data lines (the
/// image's SVG, put inline to measure it). Writes JSON into
/// `<pre id="measured">`. `LINE` is [`LINE`].
const MEASURE: &str = r##"<script>
var LINE = "AssemblyLineOfTheHtmlFixture";
window.addEventListener("load", function() { setTimeout(function() {
  var out = {labels: [], legend: null, plot: null, lines: []};
  var box = function(b) { return {x: b.x, y: b.y, w: b.width, h: b.height}; };
  var frames = document.getElementById("frames");
  for (var i = 0; i < frames.children.length; i++) {
    var g = frames.children[i];
    var t = g.querySelector("text"), r = g.querySelector("rect");
    out.labels.push({text: t.textContent, title: g.querySelector("title").textContent,
      text_box: box(t.getBoundingClientRect()), frame_box: box(r.getBoundingClientRect())});
  }
  // Interactive: a search (inferno's `search`, what its button calls) and
  // a click on make_gadgets' frame (zoom: its label is set again).
  search("Gadget\\.new");
  out.matched = document.getElementById("matched").textContent;
  for (var i = 0; i < frames.children.length; i++) {
    var g = frames.children[i];
    if (g.querySelector("title").textContent.indexOf(LINE + "#make_gadgets (") === 0) {
      g.dispatchEvent(new MouseEvent("click", {bubbles: true}));
      out.zoomed = {text: g.querySelector("text").textContent,
        frame_box: box(g.querySelector("rect").getBoundingClientRect()),
        frames_box: box(frames.getBoundingClientRect())};
    }
  }
  var img = document.querySelector("#timeline img");
  var div = document.createElement("div");
  div.innerHTML = atob(img.src.split(",")[1]);
  document.body.appendChild(div);
  var svg = div.querySelector("svg");
  out.legend = box(svg.querySelector("#legend").getBBox());
  out.plot = box(svg.querySelector("#plot-area").getBBox());
  svg.querySelectorAll("polyline").forEach(function(p) {
    if (p.getAttribute("stroke") !== "#000000") out.lines.push(box(p.getBBox()));
  });
  var pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500); });
</script>"##;

/// `memprof report PROFILE --format html -o PAGE`; returns the page.
fn html(profile: &Path, page: &Path) -> String {
    run_ok([
        OsStr::new("report"),
        profile.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("html"),
        OsStr::new("-o"),
        page.as_os_str(),
    ]);
    std::fs::read_to_string(page).unwrap()
}

/// Headless Chromium's DOM of `page` at a 1280 px window, after its
/// scripts and timers ran.
fn rendered_dom(page: &Path) -> String {
    let dom = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,2000",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", page.display()))
        .stderr(Stdio::null())
        .output()
        .expect("cannot run chromium (cargo xtask setup installs it)");
    assert!(dom.status.success(), "chromium --dump-dom failed");
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

/// The flamegraph's labels read off a screenshot by OCR (Tesseract): the
/// page at a 1280 px window (3 device pixels per CSS pixel, for the OCR),
/// the other sections hidden and the frames drawn black on white (their
/// layout and labels unchanged), so the text is what a person sees.
fn flamegraph_ocr(html: &str, dir: &TempDir) -> String {
    let page = dir.join("flamegraph-only.html");
    let style = "<style>body>h1,section:not(#flamegraph),#flamegraph p{display:none}\
                 #frames rect{fill:#fff!important;stroke:#000;stroke-width:.5}\
                 #frames text{fill:#000}</style></head>";
    std::fs::write(&page, html.replacen("</head>", style, 1)).unwrap();
    let png = dir.join("flamegraph.png");
    let shot = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,800",
            "--force-device-scale-factor=3",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stderr(Stdio::null())
        .output()
        .expect("cannot run chromium");
    assert!(shot.status.success(), "chromium --screenshot failed");
    let ocr = Command::new("tesseract")
        .arg(&png)
        .args(["stdout", "--psm", "11"])
        .stderr(Stdio::null())
        .output()
        .expect("cannot run tesseract (cargo xtask setup installs tesseract-ocr)");
    assert!(ocr.status.success(), "tesseract failed");
    String::from_utf8_lossy(&ocr.stdout).into_owned()
}

/// Text of an HTML fragment, tags removed, entities of names decoded.
fn text_of(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The section `id` of the DOM.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<section id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id} in the page"));
    let rest = &dom[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

/// The rows of the table of a section, each as its cells' texts (the
/// header row left out).
fn table_rows(section: &str) -> Vec<Vec<String>> {
    section
        .split("<tr>")
        .skip(2)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| text_of(&format!("<td{cell}")))
                .collect()
        })
        .collect()
}

/// The summary as (heading, value) rows.
fn summary_rows(dom: &str) -> Vec<(String, String)> {
    section(dom, "summary")
        .split("<tr>")
        .skip(1)
        .map(|row| {
            let (th, td) = row
                .split_once("<td>")
                .expect("a summary row without a value");
            (text_of(th), text_of(td))
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn of(v: &Value) -> Rect {
        let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {v}"));
        Rect {
            x: f("x"),
            y: f("y"),
            w: f("w"),
            h: f("h"),
        }
    }
    fn overlaps(&self, o: &Rect) -> bool {
        self.x < o.x + o.w && o.x < self.x + self.w && self.y < o.y + o.h && o.y < self.y + self.h
    }
    fn inside(&self, o: &Rect, slack: f64) -> bool {
        self.x >= o.x - slack
            && self.y >= o.y - slack
            && self.x + self.w <= o.x + o.w + slack
            && self.y + self.h <= o.y + o.h + slack
    }
}

#[test]
fn html_page_of_a_crystal_program_reads_at_a_glance() {
    let dir = TempDir::new("html-page");
    let profile = dir.join("page.mprof");
    profile_run(&profile, &[fixture::crystal::HTML_PAGE_DEBUG]);
    let page = dir.join("page.html");
    let html = html(&profile, &page);
    for load in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "url(http",
        "@import",
    ] {
        assert!(!html.contains(load), "the page loads something ({load})");
    }
    // A copy with the measuring script, rendered.
    let measured_page = dir.join("measured.html");
    std::fs::write(
        &measured_page,
        html.replace("</body>", &format!("{MEASURE}</body>")),
    )
    .unwrap();
    let dom = rendered_dom(&measured_page);
    let measured: Value = {
        let start = dom.find("<pre id=\"measured\">").unwrap_or_else(|| {
            panic!("the measuring script wrote nothing; the page's scripts failed?")
        });
        let text = &dom[start + "<pre id=\"measured\">".len()..];
        let text = text_of(&text[..text.find("</pre>").unwrap()]);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let json = report_json(&profile);

    // Types: the rows of `--format types`, the fixture's classes with their
    // exact counts; a row whose class is not known says so.
    let types = table_rows(section(&dom, "types"));
    let count_of = |class: &str| -> u64 {
        let row = types
            .iter()
            .find(|r| r[2] == class)
            .unwrap_or_else(|| panic!("no {class} row in the page's types: {types:?}"));
        row[0].replace(',', "").parse().unwrap()
    };
    assert_eq!(count_of("Widget"), WIDGETS);
    assert_eq!(count_of("Gadget"), GADGETS);
    let markdown: Vec<Vec<String>> = report(&profile, "types", &[])
        .lines()
        .skip_while(|l| !l.starts_with("| Live objects |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace('\\', ""))
                .collect()
        })
        .collect();
    assert!(!types.is_empty() && types.len() <= markdown.len());
    for (page_row, types_row) in types.iter().zip(&markdown) {
        assert_eq!(
            page_row[..2],
            types_row[..2],
            "page {page_row:?}, types {types_row:?}"
        );
        // The type is the last column (`Allocated`, `Collected` before it
        // where objects were collected).
        let name = types_row.last().unwrap();
        let expected = match name.strip_prefix("in ") {
            Some(site) => format!("type unknown; call site: {site}"),
            None if name.starts_with('(') => format!("type unknown: {name}"),
            None => name.clone(),
        };
        assert_eq!(page_row[2], expected, "types row {types_row:?}");
    }

    // The flamegraph's labels as displayed: the methods in full, within
    // their frames, none cut to its last characters.
    let labels = measured["labels"].as_array().expect("no flamegraph frames");
    let shown: Vec<&str> = labels.iter().filter_map(|l| l["text"].as_str()).collect();
    for method in ["make_widgets", "make_gadgets"] {
        let full = format!("{LINE}#{method}");
        let frame = labels
            .iter()
            .find(|l| {
                l["title"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{full} ("))
            })
            .unwrap_or_else(|| panic!("no {full} frame in the flamegraph"));
        let label = frame["text"].as_str().unwrap();
        // The name, or the method alone where the name does not fit.
        assert!(
            [full.as_str(), &format!("#{method}"), method].contains(&label),
            "{full} is labelled {label:?}; labels: {shown:?}"
        );
    }
    for class in ["Widget", "Gadget"] {
        assert!(
            shown.contains(&format!("{class}.new").as_str()),
            "no {class}.new label: {shown:?}"
        );
    }
    for l in labels {
        let text = l["text"].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        assert!(
            !text.starts_with(".."),
            "a label cut at its start: {text:?}"
        );
        let (t, f) = (Rect::of(&l["text_box"]), Rect::of(&l["frame_box"]));
        assert!(
            t.x >= f.x - 0.5 && t.x + t.w <= f.x + f.w + 0.5,
            "label {text:?} ({t:?}) overflows its frame ({f:?})"
        );
    }

    // Search and zoom work: a search for Gadget.new matches its share of
    // the graph (the program's live bytes, as JSON has them, without fiber
    // stacks and GC heap sections); make_gadgets' frame, zoomed into,
    // spans the graph and shows its full name.
    let drawn: u64 = groups(&json)
        .iter()
        .filter(|g| !matches!(g["runtime"].as_str(), Some("fiber_stack" | "gc_heap")))
        .map(|g| uint(g, "/live_bytes"))
        .sum();
    let gadget = group_at(&json, "gc", "Gadget.new");
    assert_eq!(uint(gadget, "/live_count"), GADGETS);
    let gadget_bytes = uint(gadget, "/live_bytes");
    assert_eq!(
        measured["matched"].as_str().unwrap_or(""),
        format!(
            "Matched: {:.1}%",
            100.0 * gadget_bytes as f64 / drawn as f64
        ),
        "search for Gadget.new"
    );
    let zoomed = &measured["zoomed"];
    assert_eq!(zoomed["text"], format!("{LINE}#make_gadgets"), "{zoomed}");
    let (frame, all) = (
        Rect::of(&zoomed["frame_box"]),
        Rect::of(&zoomed["frames_box"]),
    );
    assert!(frame.w > all.w * 0.95, "zoomed frame {frame:?} of {all:?}");

    // The same names read off the screenshot. OCR reads `_` as a space or
    // not at all, and may split `Widget.new` at its dot: compared without
    // either.
    let seen = |text: &str| text.replace([' ', '_', '\n'], "");
    let ocr = flamegraph_ocr(&html, &dir);
    for name in ["make_widgets", "make_gadgets", "Widget.new", "Gadget.new"] {
        assert!(
            seen(&ocr).contains(&seen(name)),
            "{name} not read off the screenshot; OCR:\n{ocr}"
        );
    }

    // The timeline's legend beside the plot, over no data.
    let legend = Rect::of(&measured["legend"]);
    let plot = Rect::of(&measured["plot"]);
    assert!(
        !legend.overlaps(&plot),
        "legend {legend:?} over the plot {plot:?}"
    );
    let lines = measured["lines"].as_array().unwrap();
    assert!(!lines.is_empty(), "the timeline has no data lines");
    for line in lines {
        let line = Rect::of(line);
        assert!(
            line.inside(&plot, 2.0),
            "a data line {line:?} outside the plot {plot:?}"
        );
        assert!(
            !line.overlaps(&legend),
            "the legend {legend:?} covers a data line {line:?}"
        );
    }

    // The summary: each figure once, the collector's shown, as JSON has them.
    let summary = summary_rows(&dom);
    let value = |heading: &str| -> &str {
        let rows: Vec<_> = summary.iter().filter(|(h, _)| h == heading).collect();
        assert_eq!(
            rows.len(),
            1,
            "{heading} in the summary {} times: {summary:?}",
            rows.len()
        );
        &rows[0].1
    };
    let live_count: u64 = groups(&json).iter().map(|g| uint(g, "/live_count")).sum();
    let live_bytes: u64 = groups(&json).iter().map(|g| uint(g, "/live_bytes")).sum();
    assert_eq!(
        value("Live at the end"),
        format!(
            "{} blocks, {} bytes",
            thousands(live_count),
            thousands(live_bytes)
        )
    );
    assert_eq!(value("Lost events"), thousands(uint(&json, "/lost_events")));
    let all_text = text_of(section(&dom, "summary")).to_lowercase();
    assert_eq!(all_text.matches("lost events").count(), 1, "{all_text}");
    let collections = uint(&json, "/gc/collections");
    assert!(
        collections >= 2,
        "the fixture collects twice: {}",
        json["gc"]
    );
    assert!(
        value("GC collections judged")
            .starts_with(&format!("{} (the last: #", thousands(collections))),
        "{summary:?}"
    );
    let marked = format!(
        "{} objects, {} bytes",
        thousands(uint(&json, "/gc/marked_count")),
        thousands(uint(&json, "/gc/marked_bytes"))
    );
    assert!(
        value("Marked at the last collection").starts_with(&marked),
        "{summary:?}"
    );
    // Every Widget and Gadget is reachable at the last collection.
    assert!(
        uint(&json, "/gc/marked_count") >= WIDGETS + GADGETS,
        "{}",
        json["gc"]
    );
    let pause = json["gc"]["longest_pass_seconds"].as_f64().unwrap() * 1e3;
    assert!(
        value("Longest GC pause added").starts_with(&format!("{pause:.1} ms")),
        "{summary:?}"
    );
    assert_eq!(
        all_text
            .matches(&thousands(uint(&json, "/gc/marked_bytes")))
            .count(),
        1,
        "{all_text}"
    );
}
