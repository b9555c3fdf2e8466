//! `memprof heap --pid N`: the whole Boehm GC heap of a running program,
//! judged by the collector at its next collection, on
//! `fixtures/crystal/heap_census.cr`, which keeps exactly 7,000 Author,
//! 5,000 Book and 300 Note objects (3,000 more Authors dropped) and says
//! their type ids and the bytes the collector gives them (`GC_size` of
//! each, asked in process). memprof attaches only after all of it was
//! built, sees none of the allocations, and must find exactly those counts
//! and bytes under those ids, named after their classes (from the
//! constructors, or in `--release` from the DWARF of the inlined `new`),
//! then leave the program running and untraced.

use memprof_tests::*;
use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// What the fixture says once ready: the type ids and collector bytes of
/// Author, Book and Note.
struct Ready {
    ids: [u64; 3],
    bytes: [u64; 3],
    /// `GC_size` of the buffer of the kept `Array(Author)`, `Array(Book)`, `Array(Note)`.
    buffers: [u64; 3],
    /// Type ids of `Array(Author)`, `Array(Book)`, `Array(Note)`.
    arrays: [u64; 3],
    /// Bytes of the Authors the Books hold (the first 5,000), of the
    /// Strings the Notes hold, and of the `Array(Author)` object itself.
    held_authors: u64,
    strings: u64,
    author_array: u64,
    /// `offsetof(Array(Note), @buffer)`, and the index in the Notes'
    /// array of the Note at the lowest address.
    buffer_field: u64,
    first_note: u64,
}

const CLASSES: [(&str, u64, &str); 3] = [
    ("Author", 7_000, "atomic"),
    ("Book", 5_000, "normal"),
    ("Note", 300, "normal"),
];

/// The dropped Authors collection `collection` still marked, as the
/// fixture says after it (count, bytes).
fn dropped_marked(stdout: &mut Lines, collection: u64) -> (u64, u64) {
    let line = stdout.wait_for(
        &format!("collection {collection} dropped_marked "),
        timeout(),
    );
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(3)
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1])
}

fn start(exe: &str) -> (ChildGuard, Ready, Lines) {
    let child = Command::new(exe)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("heap_census stdout", target.0.stdout.take().unwrap());
    let line = stdout.wait_for("ready", timeout());
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("bad ready line: {line}"))
        })
        .collect();
    assert_eq!(n.len(), 17, "bad ready line: {line}");
    let ready = Ready {
        ids: [n[0], n[1], n[2]],
        bytes: [n[3], n[4], n[5]],
        buffers: [n[6], n[7], n[8]],
        arrays: [n[9], n[10], n[11]],
        held_authors: n[12],
        strings: n[13],
        author_array: n[14],
        buffer_field: n[15],
        first_note: n[16],
    };
    (target, ready, stdout)
}

/// `memprof heap --pid PID --format FORMAT`, which must succeed: stdout.
fn heap(pid: i32, format: &str) -> String {
    let pid = pid.to_string();
    let out = run_ok(["heap", "--pid", &pid, "--format", format]);
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Nobody traces `pid` (`TracerPid:` of its status).
fn tracer_of(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("TracerPid in status")
}

/// The census of `exe` has exactly the kept objects of each class, under
/// its type id, named `Class` (or `(type ID)` when not `named`).
/// `arrays_named`: which of `Array(Author)`, `Array(Book)`, `Array(Note)`
/// are named too (in `--release`, where their generic `new` is inlined,
/// only the Authors': `Array(T).new` in `Array#[]`, whose symbol says
/// `*Array(Author)@Array(T)#[]`; the others' DWARF has no frame saying
/// what `T` is).
fn census_is_exact(exe: &str, named: bool, arrays_named: [bool; 3]) {
    let (mut target, ready, mut stdout) = start(exe);
    let text = heap(target.pid(), "json");
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"));
    assert_eq!(json["format"], "memprof-heap");
    // Dropped Authors the collector still marks (conservatively) are live
    // to it: the fixture says how many at that collection.
    let first = uint(&json, "/gc/collection");
    let (extra, extra_bytes) = dropped_marked(&mut stdout, first);
    let types = json["types"].as_array().expect("types");
    for (i, (class, count, kind)) in CLASSES.iter().enumerate() {
        let (count, bytes) = match i {
            0 => (count + extra, ready.bytes[0] + extra_bytes),
            _ => (*count, ready.bytes[i]),
        };
        let rows: Vec<&Value> = types
            .iter()
            .filter(|t| t["type_id"].as_u64() == Some(ready.ids[i]))
            .collect();
        let name = if named {
            class.to_string()
        } else {
            format!("(type {})", ready.ids[i])
        };
        assert_eq!(rows.len(), 1, "{class}: rows with its id: {rows:#?}");
        let row = rows[0];
        assert_eq!(row["name"], name.as_str(), "{row:#}");
        assert_eq!(row["kind"], *kind, "{row:#}");
        assert_eq!(uint(row, "/count"), count, "{class}: {row:#}");
        assert_eq!(uint(row, "/bytes"), bytes, "{class}: {row:#}");
    }
    // Each kept array's buffer (no type id of its own) is named after the
    // array pointing to it (`Array(Author) buffer`, or `(type N) buffer`
    // when the array's id is unnamed): the only live one of its kind.
    for (i, class) in ["Author", "Book", "Note"].iter().enumerate() {
        let array = ready.arrays[i];
        let holder: Vec<&Value> = types
            .iter()
            .filter(|t| t["type_id"].as_u64() == Some(array))
            .collect();
        assert_eq!(holder.len(), 1, "Array({class}): {holder:#?}");
        let rows: Vec<&Value> = types
            .iter()
            .filter(|t| t["held_by_type_id"].as_u64() == Some(array))
            .collect();
        assert_eq!(rows.len(), 1, "Array({class}) buffer: {rows:#?}");
        let name = format!("{} buffer", holder[0]["name"].as_str().unwrap());
        if arrays_named[i] {
            assert_eq!(name, format!("Array({class}) buffer"));
        }
        assert_eq!(rows[0]["name"], name.as_str(), "{:#}", rows[0]);
        assert_eq!(uint(rows[0], "/count"), 1, "{:#}", rows[0]);
        assert_eq!(uint(rows[0], "/bytes"), ready.buffers[i], "{:#}", rows[0]);
        assert_eq!(rows[0]["type_id"], Value::Null);
    }
    // Every live object is in one type row, and the RSS table adds up.
    let live = uint(&json, "/gc/live_bytes");
    let typed: u64 = types.iter().map(|t| uint(t, "/bytes")).sum();
    assert_eq!(typed, live);
    let rss = json["rss"].as_array().expect("rss");
    let total: u64 = rss.iter().map(|r| uint(r, "/bytes")).sum();
    assert_eq!(total, uint(&json, "/rss_total"));
    let live_row = rss
        .iter()
        .find(|r| r["what"] == "GC heap: live objects")
        .expect("a GC live row");
    // Resident live bytes: at most the live bytes (a large buffer never
    // written is not resident), at least the kept objects (written, and
    // each in a one-page block).
    let kept: u64 = ready.bytes.iter().sum();
    let resident_live = uint(live_row, "/bytes");
    assert!(
        (kept..=live).contains(&resident_live),
        "resident live {resident_live}, kept {kept}, live {live}"
    );
    let rollup = uint(&json, "/smaps_rollup_rss");
    assert!(
        total.abs_diff(rollup) * 50 <= rollup,
        "RSS rows sum to {total}, smaps_rollup says {rollup}"
    );
    // Left running, untraced.
    assert!(target.is_running());
    assert_eq!(tracer_of(target.pid()), 0);

    if named {
        let md = heap(target.pid(), "markdown");
        let collection: u64 = md
            .lines()
            .next()
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .expect("the collection in the title");
        // Two censuses between the same two collections describe the same one.
        let (extra, extra_bytes) = if collection == first {
            (extra, extra_bytes)
        } else {
            dropped_marked(&mut stdout, collection)
        };
        let author = format!(
            "| {} | {} | atomic | Author |",
            thousands(7_000 + extra),
            thousands(ready.bytes[0] + extra_bytes)
        );
        assert!(md.contains(&author), "no {author:?} in:\n{md}");
        assert!(md.contains("## Where the RSS goes"), "{md}");
        assert!(target.is_running());
    }
}

/// `--sizes`: retained bytes, each reachable byte once, from what the
/// fixture holds: an Author holds nothing, a Book its Author, a Note its
/// String, the Array(Author) its buffer and the 7,000 Authors.
#[test]
fn heap_retained_sizes() {
    let (target, ready, mut stdout) = start(fixture::crystal::HEAP_CENSUS_DEBUG);
    let pid = target.pid().to_string();
    let out = run_ok(["heap", "--pid", &pid, "--format", "json", "--sizes"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let (_, extra_bytes) = dropped_marked(&mut stdout, uint(&json, "/gc/collection"));
    let retained = |id: u64| {
        let rows: Vec<&Value> = json["types"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["type_id"].as_u64() == Some(id))
            .collect();
        assert_eq!(rows.len(), 1, "type {id}: {rows:#?}");
        uint(rows[0], "/retained_bytes")
    };
    let [authors, books, notes] = ready.bytes;
    // Authors hold nothing: all of them, dropped ones still marked too.
    assert_eq!(retained(ready.ids[0]), authors + extra_bytes);
    assert_eq!(retained(ready.ids[1]), books + ready.held_authors);
    assert_eq!(retained(ready.ids[2]), notes + ready.strings);
    assert_eq!(
        retained(ready.arrays[0]),
        ready.author_array + ready.buffers[0] + authors
    );
    // Buffers have no type id: no retained figure of their own.
    let buffer = json["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "Array(Author) buffer")
        .expect("the Array(Author) buffer");
    assert_eq!(buffer["retained_bytes"], Value::Null);
}

/// `--graph Note --ref-limit 1 --ref-level 3`: the Note at the lowest
/// address is held only by the Notes' array buffer (in the slot of its
/// index), which only the `Array(Note)` holds, at its `@buffer` field;
/// nothing in the heap holds that array: a global and the stack do.
#[test]
fn heap_graph_of_a_type() {
    let (target, ready, _stdout) = start(fixture::crystal::HEAP_CENSUS_DEBUG);
    let pid = target.pid().to_string();
    let args = ["heap", "--pid", &pid, "--format", "json", "--graph", "Note"];
    let out = run_ok(args.iter().chain(&["--ref-limit", "1", "--ref-level", "3"]));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let graph = &json["graph"];
    assert_eq!(graph["target_type"], "Note");
    let nodes = graph["nodes"].as_array().unwrap();
    let types: Vec<&str> = nodes.iter().map(|n| n["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["Note", "Array(Note) buffer", "Array(Note)"],
        "{graph:#}"
    );
    let addr = |i: usize| nodes[i]["addr"].as_str().unwrap();
    let edges: Vec<(&str, &str, String, u64)> = graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["from"].as_str().unwrap(),
                e["to"].as_str().unwrap(),
                e["field"].as_str().unwrap().to_string(),
                uint(e, "/level"),
            )
        })
        .collect();
    assert_eq!(
        edges,
        [
            (
                addr(1),
                addr(0),
                format!("@(field {})", ready.first_note * 8),
                0
            ),
            (
                addr(2),
                addr(1),
                format!("@(field {})", ready.buffer_field),
                1
            ),
        ],
        "{graph:#}"
    );
    // What holds the chain from outside the heap: the class variable
    // `Keep.all` (the global `Keep::all`) holds the Array(Note), and so
    // does the main thread's stack (`notes`, a local of the main program).
    let roots: Vec<(&str, &str)> = graph["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["addr"].as_str().unwrap(), r["root"].as_str().unwrap()))
        .collect();
    let holds_array = |what: &str| {
        roots
            .iter()
            .any(|&(a, r)| a == addr(2) && r.starts_with(what))
    };
    assert!(holds_array("global Keep::all"), "{roots:#?}");
    assert!(holds_array(&format!("stack of thread {pid}")), "{roots:#?}");
    // The markdown shows it as mermaid, MemProf's way.
    let md = run_ok(["heap", "--pid", &pid, "--graph", "Note", "--ref-limit", "1"]);
    let md = String::from_utf8(md.stdout).unwrap();
    let line = format!(
        "  {0}[\"{0} Array(Note)\"] -- \"@(field {1}),1\" --> {2}[\"{2} Array(Note) buffer\"]",
        addr(2),
        ready.buffer_field,
        addr(1)
    );
    assert!(md.contains("```mermaid\ngraph LR\n"), "{md}");
    assert!(md.contains(&line), "no {line:?} in:\n{md}");
}

/// perf-tools MemProf's documentation example (two A, each holding an
/// Array(B) of two B, each holding a C; built with `--debug`):
/// `--graph C --ref-level 4` shows exactly its edges — `B --@c,0--> C`,
/// buffer → B at slots 0 and 8, `Array(B) --@buffer,2-->` buffer,
/// `A --@bs,3--> Array(B)` — fields named from the DWARF.
#[test]
fn heap_graph_of_memprofs_documentation_example() {
    let child = Command::new(fixture::crystal::OBJECT_GRAPH_DEBUG)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("object_graph stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    let pid = target.pid().to_string();
    let out = run_ok([
        "heap",
        "--pid",
        &pid,
        "-f",
        "json",
        "--graph",
        "C",
        "--ref-level",
        "4",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let graph = &json["graph"];
    let type_of: std::collections::HashMap<&str, &str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["addr"].as_str().unwrap(), n["type"].as_str().unwrap()))
        .collect();
    let mut count = std::collections::BTreeMap::new();
    for t in type_of.values() {
        *count.entry(*t).or_insert(0) += 1;
    }
    assert_eq!(
        count,
        [
            ("A", 2),
            ("Array(B)", 2),
            ("Array(B) buffer", 2),
            ("B", 4),
            ("C", 4)
        ]
        .into(),
        "{graph:#}"
    );
    // (from type, to type, field, level) of every edge, and each
    // buffer's two slots.
    let mut edges: Vec<(&str, &str, String, u64)> = Vec::new();
    let mut slots: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for e in graph["edges"].as_array().unwrap() {
        let (from, to) = (e["from"].as_str().unwrap(), e["to"].as_str().unwrap());
        let field = e["field"].as_str().unwrap().to_string();
        if type_of[from] == "Array(B) buffer" {
            slots.entry(from).or_default().push(field.clone());
        }
        edges.push((type_of[from], type_of[to], field, uint(e, "/level")));
    }
    edges.sort();
    // The fixture is built with --debug: the DWARF names the fields; a
    // buffer's slots have no names, only their offsets.
    let field = |off: u64| format!("@(field {off})");
    let mut expected = Vec::new();
    for (from, to, label, level, times) in [
        ("A", "Array(B)", "@bs".to_string(), 3, 2),
        ("Array(B)", "Array(B) buffer", "@buffer".to_string(), 2, 2),
        ("Array(B) buffer", "B", field(0), 1, 2),
        ("Array(B) buffer", "B", field(8), 1, 2),
        ("B", "C", "@c".to_string(), 0, 4),
    ] {
        expected.extend(std::iter::repeat_n((from, to, label, level), times));
    }
    assert_eq!(edges, expected, "{graph:#}");
    for (buffer, mut fields) in slots {
        fields.sort();
        assert_eq!(fields, [field(0), field(8)], "{buffer}");
    }
}

/// An object held only by a waiting fiber's local variable: no object
/// points to it, its root is that fiber's stack (not the stack of the
/// thread the collection ran on).
#[test]
fn heap_graph_root_in_a_fiber_stack() {
    let child = Command::new(fixture::crystal::OBJECT_GRAPH_DEBUG)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    Lines::new("object_graph stdout", target.0.stdout.take().unwrap()).wait_for("ready", timeout());
    let pid = target.pid().to_string();
    let out = run_ok(["heap", "--pid", &pid, "-f", "json", "--graph", "Lonely"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let graph = &json["graph"];
    let nodes = graph["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{graph:#}");
    assert_eq!(nodes[0]["type"], "Lonely");
    assert_eq!(graph["edges"].as_array().unwrap().len(), 0, "{graph:#}");
    let roots: Vec<&str> = graph["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["root"].as_str().unwrap())
        .collect();
    assert!(
        roots
            .iter()
            .any(|r| r.starts_with("stack 0x") && r.ends_with("(another thread's or a fiber's)")),
        "{roots:#?}"
    );
    assert!(!roots.iter().any(|r| r.starts_with("global")), "{roots:#?}");
}

#[test]
fn heap_graph_of_an_unknown_type_is_one_line() {
    let (target, _, _stdout) = start(fixture::crystal::HEAP_CENSUS_DEBUG);
    let out = run([
        "heap",
        "--pid",
        &target.pid().to_string(),
        "--graph",
        "Nope",
    ]);
    assert_one_line_error(&out, &["--graph Nope: no live object of that type"]);
}

#[test]
fn heap_census_debug() {
    census_is_exact(fixture::crystal::HEAP_CENSUS_DEBUG, true, [true; 3]);
}

#[test]
fn heap_census_static_libgc() {
    census_is_exact(fixture::crystal::HEAP_CENSUS_STATIC, true, [true; 3]);
}

#[test]
fn heap_census_stripped() {
    census_is_exact(fixture::crystal::HEAP_CENSUS_STRIPPED, true, [true; 3]);
}

/// `--release` inlines the constructors: the ids are found where the
/// callers store them, and named from the DWARF of the inlined `new`
/// (its line is the class's `def initialize`, in the source).
#[test]
fn heap_census_release() {
    census_is_exact(
        fixture::crystal::HEAP_CENSUS_RELEASE,
        true,
        [true, false, false],
    );
}

#[test]
fn heap_of_a_program_without_gc_is_one_line() {
    let child = Command::new(fixture::ATTACH_TARGET)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    Lines::new("attach_target", target.0.stdout.take().unwrap()).wait_for("ready", timeout());
    let out = run(["heap", "--pid", &target.pid().to_string()]);
    assert_one_line_error(&out, &["has no Boehm GC heap", "GC_malloc"]);
    assert!(target.is_running());
    assert_eq!(tracer_of(target.pid()), 0);
}

/// A C program on Boehm GC that collects only when asked
/// (gc_attach_target: SIGUSR1), idle since its start: libgc's own first
/// collection (`GC_INIT` collects once) left marks, little was allocated
/// since, so `memprof heap` answers at once from them, even with `--wait`
/// longer than it took; the program untouched, and it still collects
/// afterwards.
#[test]
fn heap_of_a_c_program_between_collections() {
    let child = Command::new(fixture::GC_ATTACH_TARGET)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("gc_attach_target", target.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    let pid = target.pid();
    let started = Instant::now();
    let out = run_ok([
        "heap",
        "--pid",
        &pid.to_string(),
        "--wait",
        "10",
        "--format",
        "json",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["gc"]["taken"], "at_rest", "{:#}", json["gc"]);
    assert_eq!(uint(&json, "/gc/collection"), 1, "{:#}", json["gc"]);
    assert!(uint(&json, "/not_yet_judged/bytes") <= 256 << 10);
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
    target.signal(libc::SIGUSR1);
    stdout.wait_for("done", timeout());
}

#[test]
fn heap_wait_must_not_be_negative() {
    let out = run(["heap", "--pid", "1", "--wait=-1"]);
    assert_one_line_error(
        &out,
        &["--wait must be 0 (never wait) or a positive number of seconds"],
    );
}

/// `fixtures/crystal/idle_heap.cr`, started with its stdin a pipe: the
/// type ids of Widget, Gadget and Gizmo and the bytes the collector gives
/// each class's kept objects, from its `ready` line.
fn start_idle(exe: &str) -> (ChildGuard, ChildStdin, Lines, [(u64, u64, u64); 3]) {
    let child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let mut target = ChildGuard(child);
    let stdin = target.0.stdin.take().unwrap();
    let mut stdout = Lines::new("idle_heap stdout", target.0.stdout.take().unwrap());
    let line = stdout.wait_for("ready", timeout());
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("bad ready line: {line}"))
        })
        .collect();
    assert_eq!(n.len(), 6, "bad ready line: {line}");
    // (type id, count kept, bytes).
    let kept = [(n[0], 4_000, n[3]), (n[1], 1_500, n[4]), (n[2], 250, n[5])];
    (target, stdin, stdout, kept)
}

/// Says `line` on the fixture's stdin.
fn say(stdin: &mut ChildStdin, line: &str) {
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
}

/// The census has exactly the kept Widgets, Gadgets and Gizmos, under
/// their type ids, named after their classes.
fn idle_classes_are_exact(json: &Value, kept: &[(u64, u64, u64); 3]) {
    let types = json["types"].as_array().expect("types");
    for (&(id, count, bytes), class) in kept.iter().zip(["Widget", "Gadget", "Gizmo"]) {
        let rows: Vec<&Value> = types
            .iter()
            .filter(|t| t["type_id"].as_u64() == Some(id))
            .collect();
        assert_eq!(rows.len(), 1, "{class}: rows with its id: {rows:#?}");
        assert_eq!(rows[0]["name"], class, "{:#}", rows[0]);
        assert_eq!(uint(rows[0], "/count"), count, "{class}: {:#}", rows[0]);
        assert_eq!(uint(rows[0], "/bytes"), bytes, "{class}: {:#}", rows[0]);
    }
}

/// An idle program (built its graph, collected, said `ready`, waits on
/// its stdin): `memprof heap` answers at once, from the marks of its last
/// collection, with the exact count per class, says which collection,
/// and how many bytes were allocated since (the `ready` line's strings
/// and I/O buffers: a few KiB, under the threshold); the program runs on
/// untraced, and answers its stdin after.
fn idle_census_is_exact(exe: &str) {
    let (mut target, mut stdin, mut stdout, kept) = start_idle(exe);
    let pid = target.pid();
    let started = Instant::now();
    let out = run_ok(["heap", "--pid", &pid.to_string(), "--format", "json"]);
    let took = started.elapsed();
    eprintln!("{exe}: answered in {took:?}");
    // A bound on an idle program's wait (memprof waited for nothing), not a benchmark.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let text = String::from_utf8(out.stdout.clone()).expect("UTF-8");
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"));
    assert_eq!(json["gc"]["taken"], "at_rest", "{:#}", json["gc"]);
    assert_eq!(json["gc"]["note"], Value::Null);
    // The fixture collected once, at GC.collect, or more while building.
    let collection = uint(&json, "/gc/collection");
    assert!(collection >= 1, "{:#}", json["gc"]);
    let since = uint(&json, "/not_yet_judged/bytes");
    assert!(since <= 256 << 10, "allocated since: {since}");
    assert_eq!(json["not_yet_judged"]["count"], Value::Null);
    idle_classes_are_exact(&json, &kept);
    // Said once on stderr, what is not classified; no wait.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = if since == 0 {
        String::new()
    } else {
        format!(
            "memprof: census from the marks of pid {pid}'s collection {collection}: {} bytes allocated since are not classified\n",
            thousands(since)
        )
    };
    assert_eq!(stderr, said);
    // Left running, untraced, and it still works.
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
    say(&mut stdin, "more 10");
    stdout.wait_for("allocated ", timeout());
    // The markdown says it too.
    let md = String::from_utf8(run_ok(["heap", "--pid", &pid.to_string(), "--wait", "0"]).stdout)
        .unwrap();
    assert!(
        md.contains(&format!(
            "Taken between collections: the marks collection {collection} left"
        )),
        "{md}"
    );
    assert!(md.contains("not classified"), "{md}");
}

#[test]
fn heap_of_an_idle_program_debug() {
    idle_census_is_exact(fixture::crystal::IDLE_HEAP_DEBUG);
}

/// libgc linked into the program: its code is not told apart, every
/// thread must be waiting in the kernel, as an idle program's are.
#[test]
fn heap_of_an_idle_program_static_libgc() {
    idle_census_is_exact(fixture::crystal::IDLE_HEAP_STATIC);
}

/// `--wait 0` after the program allocated more than memprof takes
/// unclassified (30,000 kept objects, ~430 KiB, no collection since the
/// last one they caused): the census at once, from the last collection's
/// marks; the bytes allocated since it stated exactly as the program's
/// own collector counts them (GC_get_bytes_since_gc, in process), in the
/// JSON, in the markdown and on stderr (with the little Crystal's runtime
/// allocates after the fixture read its count). Without `--wait 0`, memprof waits
/// for a collection, saying why, and (none coming) answers from the same
/// marks after --wait, saying so.
#[test]
fn heap_wait_0_never_waits_and_says_what_it_could_not_classify() {
    let (mut target, mut stdin, mut stdout, kept) = start_idle(fixture::crystal::IDLE_HEAP_DEBUG);
    let pid = target.pid();
    say(&mut stdin, "more 30000");
    let line = stdout.wait_for("allocated ", timeout());
    let allocated: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(allocated > 256 << 10, "{line}");
    let started = Instant::now();
    let out = run_ok([
        "heap",
        "--pid",
        &pid.to_string(),
        "--wait",
        "0",
        "--format",
        "json",
    ]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["gc"]["taken"], "at_rest");
    // What the collector counted when memprof stopped it: what the
    // fixture allocated, and what Crystal's runtime allocated on its way
    // back to waiting for stdin after the fixture read its count (a
    // thread's free list refilled counts whole): a few KiB.
    let since = uint(&json, "/not_yet_judged/bytes");
    assert!(
        (allocated..=allocated + (64 << 10)).contains(&since),
        "allocated {allocated}, since {since}"
    );
    // Every Widget, Gadget and Gizmo was marked at that collection too.
    idle_classes_are_exact(&json, &kept);
    let collection = uint(&json, "/gc/collection");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        format!(
            "memprof: census from the marks of pid {pid}'s collection {collection}: {} bytes allocated since are not classified\n",
            thousands(since)
        )
    );
    let md = String::from_utf8(run_ok(["heap", "--pid", &pid.to_string(), "--wait", "0"]).stdout)
        .unwrap();
    // Idle: the same count each time.
    let said = format!(
        "Allocated since collection {collection}, not classified: {} bytes",
        thousands(since)
    );
    assert!(md.contains(&said), "no {said:?} in:\n{md}");
    // Without --wait 0: it waits (one line saying why), then answers
    // from the same marks, saying none came.
    let started = Instant::now();
    let out = run_ok([
        "heap",
        "--pid",
        &pid.to_string(),
        "--wait",
        "1",
        "--format",
        "json",
    ]);
    assert!(started.elapsed() >= Duration::from_secs(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let waiting = format!(
        "memprof: pid {pid} allocated {} bytes since its collection {collection} (more than memprof takes unclassified: 262,144): waiting up to 1 s for its next collection",
        thousands(since)
    );
    assert!(stderr.starts_with(&waiting), "{stderr}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["gc"]["taken"], "at_rest");
    assert_eq!(json["gc"]["note"], "no collection came within 1 s");
    assert_eq!(uint(&json, "/gc/collection"), collection);
    assert_eq!(uint(&json, "/not_yet_judged/bytes"), since);
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
}

/// Much allocated since the last collection (30,000 kept Extra objects,
/// ~430 KiB): memprof says why it waits, once its probe is on, and takes
/// the census at the program's next collection (`GC.collect`, asked on
/// the fixture's stdin), its collector held: exact, the Extras counted
/// too, nothing left unclassified.
#[test]
fn heap_waits_for_a_collection_when_much_was_allocated_since() {
    let (mut target, mut stdin, mut stdout, kept) = start_idle(fixture::crystal::IDLE_HEAP_DEBUG);
    let pid = target.pid();
    say(&mut stdin, "more 30000");
    stdout.wait_for("allocated ", timeout());
    let pid_arg = pid.to_string();
    let mut heap = memprof([
        "heap", "--pid", &pid_arg, "--wait", "20", "--format", "json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let heap_stdout = heap.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut { heap_stdout }, &mut text).unwrap();
        text
    });
    let mut stderr = Lines::new("memprof heap stderr", heap.stderr.take().unwrap());
    let waiting = stderr.wait_for("waiting up to 20 s for its next collection", timeout());
    assert!(
        waiting.starts_with(&format!("memprof: pid {pid} allocated ")),
        "{waiting}"
    );
    say(&mut stdin, "collect");
    let line = stdout.wait_for("collected ", timeout());
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    let (collection, extras, extra_bytes) = (n[0], n[1], n[2]);
    assert_eq!(extras, 30_000);
    let status = heap.wait().unwrap();
    let text = reader.join().unwrap();
    assert!(status.success(), "{status}: {text}");
    let json: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["gc"]["taken"], "held", "{:#}", json["gc"]);
    assert_eq!(uint(&json, "/gc/collection"), collection);
    assert_eq!(
        json["not_yet_judged"],
        serde_json::json!({"count": 0, "bytes": 0})
    );
    idle_classes_are_exact(&json, &kept);
    let types = json["types"].as_array().unwrap();
    let rows: Vec<&Value> = types.iter().filter(|t| t["name"] == "Extra").collect();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(uint(rows[0], "/count"), extras, "{:#}", rows[0]);
    assert_eq!(uint(rows[0], "/bytes"), extra_bytes, "{:#}", rows[0]);
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
}

/// A program whose collector memprof never finds at rest (it computes
/// without pause, libgc linked in, so its code is not told apart) and
/// that does not collect: `--wait 0` is one error line saying why and
/// what to do; with `--wait 1`, one line while waiting, then one error
/// line; the program running on, untraced, never left stopped.
#[test]
fn heap_of_a_program_never_at_rest() {
    let child = Command::new(fixture::crystal::BUSY_LOOP_STATIC)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    Lines::new("busy_loop", target.0.stdout.take().unwrap()).wait_for("ready", timeout());
    let pid = target.pid();
    let out = run(["heap", "--pid", &pid.to_string(), "--wait", "0"]);
    assert_one_line_error(
        &out,
        &[
            &format!(
                "pid {pid}'s collector was not at rest any of the 30 times memprof stopped it"
            ),
            "running",
            "--wait SECONDS",
        ],
    );
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
    let out = run(["heap", "--pid", &pid.to_string(), "--wait", "1"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with(&format!("memprof: pid {pid}'s collector was not at rest"))
            && lines[0].ends_with("waiting up to 1 s for its next collection, for an exact census"),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "memprof: error: pid {pid} did not collect within 1 s"
        )) && lines[1].contains("its last collection's marks could not be read either"),
        "{stderr}"
    );
    assert!(target.is_running());
    assert_eq!(tracer_of(pid), 0);
    let state = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(state.contains("State:\tR (running)"), "{state}");
}
