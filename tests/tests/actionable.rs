//! Reports a person can act on (issue #14): the first row names the
//! program's own code, not the allocator or the runtime.
//!
//! - C++ at -O2 (`fixtures/cpp/records.cc`): `operator new` and the standard
//!   library's allocator templates are plumbing, so the first frame shown is
//!   `make_records`; libstdc++'s emergency exception pool (72,704 bytes,
//!   allocated by its initializer before `main`) is a runtime row; pprof's
//!   main binary is the program; its truncated stack (the unwinder stops in
//!   the dynamic linker) is rooted at `[truncated]` in folded, flamegraph,
//!   html and pprof.
//! - Crystal release (`allocs foos`): the inlined `new` reads `Foo.new`;
//!   fiber stacks are named and listed after the program's rows.
//! - Recursion (`fixtures/c/recursion.c`, 262,143 nodes from one line): one
//!   row, saying how many stacks it merges.
use memprof_tests::fixture::crystal::*;
use memprof_tests::*;
use std::path::Path;
use std::process::Command;

const CXX_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/cpp/records.cc");

/// The line of `CXX_SOURCE` marked `// line:NAME`.
fn cxx_line(name: &str) -> usize {
    memprof_tests::marked_line_after(CXX_SOURCE, "//", name) as usize
}

/// The table rows (`| live count | live bytes | program | context |`) of a
/// markdown report, in order, as (count, bytes, context cells split at
/// `<br>`).
fn table_rows(markdown: &str) -> Vec<(String, String, Vec<String>)> {
    markdown
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Live at the end"))
        .map(|l| {
            // Cells end at ` | `; an escaped `\|` inside one has no space before it.
            let cells: Vec<&str> = l.trim_matches('|').splitn(4, " | ").collect();
            let context = cells[3].trim().split("<br>").map(str::to_string).collect();
            (cells[0].trim().into(), cells[1].trim().into(), context)
        })
        .collect()
}

/// The markdown report split at the runtime section: (program, runtime).
fn sections(markdown: &str) -> (String, String) {
    match markdown.split_once("\nRuntime (") {
        Some((program, runtime)) => (program.to_string(), runtime.to_string()),
        None => (markdown.to_string(), String::new()),
    }
}

fn cxx_profile(dir: &TempDir) -> std::path::PathBuf {
    let path = dir.join("records.mprof");
    profile_run(&path, &[fixture::CXX_RECORDS]);
    path
}

#[test]
fn cxx_rows_start_at_the_programs_function() {
    let dir = TempDir::new("actionable-cxx");
    let path = cxx_profile(&dir);
    let markdown = report(&path, "markdown", &[]);
    let (program, runtime) = sections(&markdown);
    let rows = table_rows(&program);
    let frame = |line: usize, function: &str| format!("records.cc:{line} in '{function}'`");
    let make_records = "make_records(int) [clone .constprop.0]";
    // 1,000 × `new Record` (64 bytes), then the vector's reserved buffer.
    let (count, bytes, context) = &rows[0];
    assert_eq!(
        (count.as_str(), bytes.as_str()),
        ("1,000", "64,000"),
        "{markdown}"
    );
    assert!(
        context[0].ends_with(&frame(cxx_line("new_record"), make_records)),
        "{markdown}"
    );
    assert!(context[1].ends_with("in 'main'`"), "{markdown}");
    let (count, bytes, context) = &rows[1];
    assert_eq!(
        (count.as_str(), bytes.as_str()),
        ("1", "8,000"),
        "{markdown}"
    );
    assert!(
        context[0].ends_with(&frame(cxx_line("reserve"), make_records)),
        "{markdown}"
    );
    let (count, bytes, context) = &rows[2];
    assert_eq!(
        (count.as_str(), bytes.as_str()),
        ("1", "4,096"),
        "{markdown}"
    );
    assert!(
        context[0].ends_with(&frame(
            cxx_line("push_back"),
            "fill_numbers(int) [clone .constprop.0]"
        )),
        "{markdown}"
    );
    assert!(!program.contains("operator new"), "{markdown}");
    assert!(!program.contains("std::"), "{markdown}");

    // libstdc++'s emergency exception pool: its initializer's, before main.
    let rows = table_rows(&runtime);
    assert_eq!(rows.len(), 1, "{markdown}");
    let (count, bytes, context) = &rows[0];
    assert_eq!(
        (count.as_str(), bytes.as_str()),
        ("1", "72,704"),
        "{markdown}"
    );
    assert_eq!(context[0], "**library initializer (before main)**");
    assert!(context[1].starts_with("`libstdc++.so.6"), "{markdown}");

    // --skip-runtime=false shows the plumbing again.
    let all = report(&path, "markdown", &["--skip-runtime=false"]);
    let first = &table_rows(&all)[0].2[0];
    assert!(
        first.ends_with("in 'operator new(unsigned long)'`"),
        "{all}"
    );
}

/// `go tool pprof -top FILE` output.
fn pprof_top(file: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-unit=B"])
        .arg(file)
        .output()
        .expect("cannot run go tool pprof (cargo xtask setup installs golang-go)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn cxx_pprof_and_graphs_name_the_program_and_mark_cut_stacks() {
    let dir = TempDir::new("actionable-cxx-graphs");
    let path = cxx_profile(&dir);

    // pprof: the program is the main binary; its functions carry the bytes.
    let file = dir.join("records.pb.gz");
    run_ok([
        OsStr::new("report"),
        path.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        file.as_os_str(),
    ]);
    let top = pprof_top(&file);
    assert_eq!(top.lines().next(), Some("File: cxx_records"), "{top}");
    let flat = |function: &str| -> String {
        top.lines()
            .find(|l| l.ends_with(&format!("  {function}")))
            .unwrap_or_else(|| panic!("no {function} in:\n{top}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(flat("make_records(int) [clone .constprop.0]"), "72000B");
    assert_eq!(flat("fill_numbers(int) [clone .constprop.0]"), "4096B");
    assert!(!top.contains("operator new"), "{top}");
    // The pool's stack, cut short in the dynamic linker, hangs from `[truncated]`.
    let line = top
        .lines()
        .find(|l| l.ends_with(" [truncated]"))
        .unwrap_or_else(|| panic!("no [truncated] in:\n{top}"));
    assert_eq!(line.split_whitespace().nth(3), Some("72704B"), "{line}");

    // Folded: the truncated stack's root is `[truncated]`; whole stacks are not.
    let folded = report(&path, "folded", &[]);
    let cut: Vec<&str> = folded
        .lines()
        .filter(|l| l.starts_with("[truncated];"))
        .collect();
    assert_eq!(cut.len(), 1, "{folded}");
    assert!(
        cut[0].ends_with(";_dl_init;call_init;call_init;[unknown] 72704"),
        "{folded}"
    );
    assert!(
        folded.lines().any(|l| l.starts_with("_start;")
            && l.ends_with(";main;make_records(int) [clone .constprop.0] 72000")),
        "{folded}"
    );
    // Flamegraph and html draw it.
    let svg = report(&path, "flamegraph", &[]);
    assert!(svg.contains("<title>[truncated] (72,704 bytes, "), "{svg}");
    let html = report(&path, "html", &[]);
    assert!(html.contains("[truncated] (72,704 bytes, "), "html");
}

#[test]
fn crystal_release_names_the_inlined_new_and_puts_fiber_stacks_apart() {
    let dir = TempDir::new("actionable-crystal");
    let path = dir.join("allocs.mprof");
    profile_run(&path, &[ALLOCS_RELEASE, "foos"]);
    let markdown = report(&path, "markdown", &[]);
    let (program, runtime) = sections(&markdown);
    let rows = table_rows(&program);
    let (count, bytes, context) = &rows[0];
    assert_eq!(
        (count.as_str(), bytes.as_str()),
        ("100,000", "3,200,000"),
        "{markdown}"
    );
    let initialize = marked_line(ALLOCS_SOURCE, "foo_initialize");
    // The class first, then the frames.
    assert_eq!(context[0], "**Foo**", "{markdown}");
    assert!(
        context[1].ends_with(&format!("allocs.cr:{initialize} in 'Foo.new'`")),
        "{markdown}"
    );
    assert!(context[2].ends_with("in 'make_foos'`"), "{markdown}");
    // The main fiber's stack pool is the runtime's: named, after the program.
    assert!(!program.contains("allocate_stack"), "{markdown}");
    let fiber: Vec<_> = table_rows(&runtime)
        .into_iter()
        .filter(|r| r.2[0] == "**fiber stack**")
        .collect();
    assert!(!fiber.is_empty(), "{markdown}");
    for (_, bytes, _) in &fiber {
        assert!(
            bytes.ends_with(",388,608") || bytes == "16,777,216",
            "{markdown}"
        );
    }
    // --format types: the class, and the runtime after the program's types.
    let types = report(&path, "types", &[]);
    let type_rows: Vec<&str> = types
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .collect();
    assert!(type_rows[0].ends_with("| Foo |"), "{types}");
    assert_eq!(
        type_rows[0].split('|').nth(1).map(str::trim),
        Some("100,000"),
        "{types}"
    );
    assert!(
        types
            .lines()
            .any(|l| l.ends_with("| fiber stack (runtime) |")),
        "{types}"
    );
}

const NODES: u64 = (1 << 18) - 1;

/// recursion.c's 262,143 nodes come from one line of `build`: however the
/// unwinder kept the recursion, the table shows one row.
#[test]
fn recursion_rows_merge_by_the_frames_shown() {
    let dir = TempDir::new("actionable-recursion");
    // Folded by the unwinder: the root's stack and the folded one (one
    // row of 2 stacks). Kept: one stack per node, each its own row before
    // merging; a burst of 262,143 new sites can find the kernel's
    // on-demand site table short of memory: those nodes are in the
    // overflow row (counted, without a stack), the rest in the merged row.
    for (name, extra) in [
        ("folded", &[][..]),
        (
            "kept",
            &[
                "--keep-recursion",
                "--max-stacks",
                "300000",
                "--max-sites",
                "300000",
            ][..],
        ),
    ] {
        let path = dir.join(&format!("{name}.mprof"));
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("run"),
            OsStr::new("-o"),
            path.as_os_str(),
            OsStr::new("--heap"),
            OsStr::new("libc"),
        ];
        args.extend(extra.iter().map(OsStr::new));
        args.extend([OsStr::new("--"), OsStr::new(fixture::RECURSION)]);
        run_ok(args);
        let markdown = report(&path, "markdown", &[]);
        let rows = table_rows(&markdown);
        let overflow: u64 = rows
            .iter()
            .filter(|r| r.2[0].starts_with("(no room in the site table"))
            .map(|r| r.0.replace(',', "").parse::<u64>().unwrap())
            .sum();
        let stacks = if name == "folded" {
            2
        } else {
            NODES - overflow
        };
        assert_eq!(
            rows.len(),
            1 + usize::from(overflow > 0),
            "{name}: {markdown}"
        );
        let (count, bytes, context) = &rows[0];
        assert_eq!(
            (count.clone(), bytes.clone()),
            (
                thousands(NODES - overflow),
                thousands((NODES - overflow) * 48)
            ),
            "{name}: {markdown}"
        );
        assert!(context[0].ends_with("in 'build'`"), "{name}: {markdown}");
        assert!(context[1].ends_with("in 'main'`"), "{name}: {markdown}");
        let merged = format!("`…({} stacks merged)`", thousands(stacks));
        assert_eq!(context.last(), Some(&merged), "{name}: {markdown}");
        assert!(
            context.contains(&"`…(recursion folded)`".to_string()),
            "{name}: {markdown}"
        );
        if name == "folded" {
            assert_eq!(overflow, 0, "{markdown}");
        }
    }
}

/// `--leaks` on a server-like program (`fixtures/crystal/server_leak.cr`):
/// of the connection buffers held at a level, the cache warmed up then
/// full, the report built in the last rounds and the sessions registered
/// and never removed, only the sessions leak; the row shows the history.
#[test]
fn leaks_name_only_the_steady_growth() {
    let dir = TempDir::new("actionable-leaks");
    let path = dir.join("server.mprof");
    profile_run(&path, &[SERVER_LEAK_DEBUG]);
    let markdown = report(&path, "markdown", &["--leaks"]);
    let rows: Vec<&str> = markdown
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Growth"))
        .collect();
    assert_eq!(rows.len(), 1, "{markdown}");
    let cells: Vec<&str> = rows[0]
        .trim_matches('|')
        .split(" | ")
        .map(str::trim)
        .collect();
    // 50 sessions a round for 40 rounds: 50 after the first collection, 2,000 at the end.
    assert_eq!(
        cells[..4],
        ["1,950", "46,800", "2,000", "48,000"],
        "{markdown}"
    );
    assert!(
        cells[4].starts_with("50 → 2,000 over 40 collections ("),
        "{markdown}"
    );
    let frames: Vec<&str> = cells[5].split("<br>").collect();
    let initialize = marked_line(SERVER_LEAK_SOURCE, "session_initialize");
    assert!(
        frames[0].ends_with(&format!("server_leak.cr:{initialize} in 'Session.new'`")),
        "{markdown}"
    );
    let request = marked_line(SERVER_LEAK_SOURCE, "session_new");
    assert!(
        frames[1].ends_with(&format!("server_leak.cr:{request} in 'handle_request'`")),
        "{markdown}"
    );
    // The other formats keep the same one stack.
    let json: Value = serde_json::from_str(&report(&path, "json", &["--leaks"])).unwrap();
    assert_eq!(groups(&json).len(), 1, "{}", list_groups(&json));
}

/// Stripped executables: one note names the module without symbols (frames
/// read `module+offset`, the same offsets as with symbols, so profiles still
/// diff); with its debug info split off and linked (`.gnu_debuglink`, as
/// distributions ship it), the names come back.
#[test]
fn stripped_binaries_say_so_and_debug_links_are_followed() {
    let dir = TempDir::new("actionable-stripped");
    let stripped = dir.join("basic_stripped");
    let linked = dir.join("basic_linked");
    let debug = dir.join("basic_linked.debug");
    let tool = |program: &str, args: &[&OsStr]| {
        let output = Command::new(program).args(args).output().unwrap();
        assert!(output.status.success(), "{program}: {}", describe(&output));
    };
    let basic = OsStr::new(fixture::BASIC);
    tool("strip", &[OsStr::new("-o"), stripped.as_os_str(), basic]);
    tool(
        "objcopy",
        &[OsStr::new("--only-keep-debug"), basic, debug.as_os_str()],
    );
    tool("strip", &[OsStr::new("-o"), linked.as_os_str(), basic]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    tool("objcopy", &[OsStr::new(&link), linked.as_os_str()]);

    let first_frame = |exe: &Path| -> (String, Value, String) {
        let path = dir.join(&format!(
            "{}.mprof",
            exe.file_name().unwrap().to_string_lossy()
        ));
        profile_run(&path, &[exe.to_str().unwrap()]);
        let markdown = report(&path, "markdown", &[]);
        let json = report_json(&path);
        let group = groups(&json)
            .iter()
            .find(|g| Counts::of(g).live_bytes == 28_800)
            .unwrap_or_else(|| panic!("no 28,800-byte group: {}", list_groups(&json)))
            .clone();
        let frame = group["frames"][0].clone();
        (markdown, frame, list_groups(&json))
    };

    let (markdown, frame, _) = first_frame(&stripped);
    assert_eq!(frame["function"], "[unknown]", "{frame}");
    let offset = frame["offset"].as_str().unwrap().to_string();
    let row = table_rows(&markdown).into_iter().next().unwrap();
    assert_eq!(
        (row.0.as_str(), row.1.as_str()),
        ("600", "28,800"),
        "{markdown}"
    );
    assert_eq!(
        row.2[0],
        format!("`basic_stripped+{offset} in '[unknown]'`"),
        "{markdown}"
    );
    let notes: Vec<&str> = markdown
        .lines()
        .filter(|l| l.starts_with("Symbols: "))
        .collect();
    assert_eq!(notes.len(), 1, "{markdown}");
    assert!(
        notes[0].starts_with("Symbols: basic\\_stripped: no symbols at all (stripped); its frames read basic\\_stripped+0xOFFSET."),
        "{markdown}"
    );

    let (markdown, frame, groups) = first_frame(&linked);
    assert_eq!(frame["function"], "make_foo", "{groups}");
    assert!(
        frame["file"]
            .as_str()
            .unwrap()
            .ends_with("fixtures/c/basic.c"),
        "{frame}"
    );
    // The same place in the same file: the same offset as stripped.
    assert_eq!(frame["offset"].as_str(), Some(offset.as_str()), "{frame}");
    assert!(!markdown.contains("Symbols: basic\\_linked"), "{markdown}");
}
