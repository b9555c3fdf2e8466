//! `memprof run` on the Crystal fixture `fixtures/crystal/allocs.cr`, built
//! four ways: exact Boehm GC counts per call site, stacks complete to
//! `__crystal_main` (or to the start of the fiber) in Crystal's own names,
//! the allocator plumbing hidden, the allocated class named.
//!
//! What differs between the builds, and is asserted as such:
//! - debug (`crystal build`, libgc.so) and static (libgc.a linked in): every
//!   Crystal method is a symbol of its own (`Foo.new`, `Array(Foo)#initialize`);
//! - release: `Foo.new` & co are inlined into their callers, and DWARF
//!   names those frames by their short names (`new`, `initialize`); they
//!   read as in the debug build all the same (`Foo.new`,
//!   `Array(Foo)#initialize`: the class from the source, its arguments from
//!   what the caller constructs), but a buffer's class is not known;
//! - stripped (the static build through `strip`): names from `.dynsym` only,
//!   no `file:line`.

use memprof_tests::fixture::crystal::*;
use memprof_tests::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    Debug,
    Release,
    Static,
    Stripped,
}

use Build::*;

impl Build {
    fn exe(self) -> &'static str {
        match self {
            Debug => ALLOCS_DEBUG,
            Release => ALLOCS_RELEASE,
            Static => ALLOCS_STATIC,
            Stripped => ALLOCS_STRIPPED,
        }
    }

    /// Crystal's methods are inlined into their callers.
    fn inlined(self) -> bool {
        self == Release
    }

    /// Frames have `file:line` (DWARF).
    fn has_lines(self) -> bool {
        self != Stripped
    }

    /// `type_name` of a group allocating `class`: where `new` was inlined,
    /// known for a class (from the source and the caller's `Array(Foo).new`),
    /// not for buffers.
    fn class(self, class: &str) -> Value {
        if self.inlined() && class.contains(' ') {
            Value::Null
        } else {
            Value::from(class)
        }
    }
}

/// `memprof run` of one case; returns the profile's directory (kept while
/// the value lives), its path and its JSON report.
fn profile(build: Build, case: &str) -> (TempDir, std::path::PathBuf, Value) {
    let dir = TempDir::new(&format!("crystal-{case}-{build:?}"));
    let path = dir.join("allocs.mprof");
    profile_run(&path, &[build.exe(), case]);
    let json = report_json(&path);
    assert_eq!(json["unwind"], "dwarf", "Crystal has no frame pointers");
    assert!(
        json["gc"]["liveness"].is_string(),
        "no gc liveness in the report"
    );
    assert_eq!(uint(&json, "/lost_events"), 0);
    assert_eq!(uint(&json, "/counters/stack_errors"), 0);
    (dir, path, json)
}

fn frames(group: &Value) -> &[Value] {
    group["frames"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn function(frame: &Value) -> &str {
    frame["function"].as_str().unwrap_or("")
}

fn raw_name(frame: &Value) -> &str {
    frame["raw_name"].as_str().unwrap_or("")
}

/// Whether `frame` is in the fixture's source at the line marked `mark`.
fn at_line(build: Build, frame: &Value, mark: &str) -> bool {
    if !build.has_lines() {
        return true;
    }
    frame["file"]
        .as_str()
        .is_some_and(|f| f.ends_with("/fixtures/crystal/allocs.cr"))
        && frame["line"].as_u64() == Some(u64::from(marked_line(ALLOCS_SOURCE, mark)))
}

/// Whether `frame` is `name`, called at the line marked `mark` (where the build has lines).
fn is_call(build: Build, frame: &Value, name: &str, mark: &str) -> bool {
    function(frame) == name && at_line(build, frame, mark)
}

/// The groups of `kind` whose stack starts with frames matching `stack`.
fn groups_starting<'a>(
    json: &'a Value,
    kind: &str,
    stack: &[&dyn Fn(&Value) -> bool],
) -> Vec<&'a Value> {
    groups(json)
        .iter()
        .filter(|g| {
            g["kind"] == kind
                && frames(g).len() >= stack.len()
                && stack.iter().zip(frames(g)).all(|(matches, f)| matches(f))
        })
        .collect()
}

/// The one group of `kind` whose stack starts with `stack`; panics listing all groups otherwise.
fn one_group<'a>(
    json: &'a Value,
    kind: &str,
    what: &str,
    stack: &[&dyn Fn(&Value) -> bool],
) -> &'a Value {
    match groups_starting(json, kind, stack).as_slice() {
        [group] => group,
        found => panic!(
            "expected one {kind} group for {what}, found {}; all groups:\n{}",
            found.len(),
            list_groups(json)
        ),
    }
}

/// The stack was unwound to the program's entry: not truncated, through `__crystal_main`.
fn assert_reaches_main(group: &Value) {
    assert_eq!(group["truncated"], false, "truncated stack: {group:#}");
    assert!(
        frames(group)
            .iter()
            .any(|f| function(f) == "__crystal_main"),
        "stack does not reach __crystal_main: {group:#}"
    );
}

fn counts(live_count: u64, live_bytes: u64, total_count: u64, total_bytes: u64) -> Counts {
    Counts {
        live_count,
        live_bytes,
        total_count,
        total_bytes,
    }
}

/// 100,000 `Foo.new` (32 bytes each, kept in an array made beforehand with
/// room for them all) → one row of exactly 100,000 `gc` objects of class
/// `Foo` at `make_foos`' line, and one row for the array's 800,000-byte buffer.
fn foos(build: Build) {
    let (_dir, path, json) = profile(build, "foos");

    // Inlined or not, `new` is named after its class.
    let new = "Foo.new";
    let objects = one_group(
        &json,
        "gc",
        "Foo.new in make_foos",
        &[
            &|f| function(f) == new && at_line(build, f, "foo_initialize"),
            &|f| is_call(build, f, "make_foos", "foo_new"),
        ],
    );
    assert_eq!(
        Counts::of(objects),
        counts(100_000, 3_200_000, 100_000, 3_200_000)
    );
    assert_eq!(objects["type_name"], build.class("Foo"));
    assert_reaches_main(objects);
    if build.has_lines() {
        // No other row is charged to that line.
        let at_foo_new = groups(&json)
            .iter()
            .filter(|g| {
                frames(g)
                    .iter()
                    .any(|f| is_call(build, f, "make_foos", "foo_new"))
            })
            .count();
        assert_eq!(at_foo_new, 1, "{}", list_groups(&json));
    }

    let buffer = one_group(
        &json,
        "gc",
        "the Array(Foo) buffer",
        &[
            &|f| function(f) == "Array(Foo)#initialize",
            &|f| function(f) == "Array(Foo).new",
            &|f| is_call(build, f, "make_foos", "foos_array"),
        ],
    );
    assert_eq!(Counts::of(buffer), counts(1, 800_000, 1, 800_000));
    assert_eq!(buffer["type_name"], build.class("Array(Foo) buffer"));
    assert_reaches_main(buffer);

    let array = one_group(
        &json,
        "gc",
        "the Array(Foo) object",
        &[&|f| function(f) == "Array(Foo).new", &|f| {
            is_call(build, f, "make_foos", "foos_array")
        }],
    );
    assert_eq!(Counts::of(array).live_count, 1);
    // Every build: read from the object itself.
    assert_eq!(array["type_name"], "Array(Foo)");

    // The plumbing hidden above, from the caller of GC_malloc on.
    let all = report(&path, "json", &["--skip-runtime=false"]);
    let all: Value = serde_json::from_str(&all).expect("JSON report");
    let plumbing = ["GC.malloc", "__crystal_malloc64", new];
    let with_plumbing = groups_starting(
        &all,
        "gc",
        &[
            &|f| function(f) == plumbing[0],
            &|f| function(f) == plumbing[1],
            &|f| function(f) == plumbing[2] && at_line(build, f, "foo_initialize"),
            &|f| is_call(build, f, "make_foos", "foo_new"),
        ],
    );
    assert_eq!(with_plumbing.len(), 1, "{}", list_groups(&all));

    // --format types: live objects per class.
    let types = report(&path, "types", &[]);
    let row = |name: &str| {
        types
            .lines()
            .find(|l| l.trim_end().ends_with(&format!("| {name} |")))
            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
    };
    // Every build knows the class (release builds from the source line of
    // the inlined `new`).
    assert_eq!(
        row("Foo").unwrap_or_else(|| panic!("no Foo row in:\n{types}"))[1..3],
        ["100,000", "3,200,000"],
        "{types}"
    );

    // Markdown: the row starts at Foo.new, then make_foos.
    let markdown = report(&path, "markdown", &[]);
    let foo_row = markdown
        .lines()
        .find(|l| l.starts_with('|') && l.contains(" 100,000 |"))
        .unwrap_or_else(|| panic!("no 100,000 row in:\n{markdown}"));
    assert!(foo_row.contains(&format!("in '{new}'`<br>`")), "{foo_row}");
    assert!(foo_row.contains("in 'make_foos'`"), "{foo_row}");
}

/// 1,000 strings `"item-#{i}"` kept in an array → `gc_atomic` blocks
/// charged to `build_strings`' line: exactly 1,000 live, 20,890 bytes (10 of
/// 19 bytes, 90 of 20, 900 of 21: 12-byte header, the text, a NUL).
fn strings(build: Build) {
    let (_dir, _path, json) = profile(build, "strings");
    let at_build = |g: &&Value| {
        frames(g)
            .iter()
            .any(|f| is_call(build, f, "build_strings", "string_build"))
    };
    let atomic: Vec<&Value> = groups(&json)
        .iter()
        .filter(|g| g["kind"] == "gc_atomic")
        .filter(at_build)
        .collect();
    let live: u64 = atomic.iter().map(|g| Counts::of(g).live_count).sum();
    let bytes: u64 = atomic.iter().map(|g| Counts::of(g).live_bytes).sum();
    assert_eq!((live, bytes), (1_000, 20_890), "{}", list_groups(&json));
    for g in atomic.iter().filter(|g| Counts::of(g).live_count > 0) {
        assert_reaches_main(g);
        // Every build, release too (its bytes come from an inlined
        // String::Builder method, not a `new`): read from the objects.
        assert_eq!(g["type_name"], "String", "{g:#}");
    }
}

/// 1,000 `Foo.new` on a spawned fiber → the stack goes through the spawn
/// block's proc and `Fiber#run` to the start of the fiber (its own stack:
/// no `__crystal_main`), not truncated.
fn fiber(build: Build) {
    let (_dir, _path, json) = profile(build, "fiber");
    let spawn_line = marked_line(ALLOCS_SOURCE, "spawn");
    let spawn_block = |f: &Value| {
        raw_name(f).starts_with("~procProc(Nil)@")
            && raw_name(f).ends_with(&format!("allocs.cr:{spawn_line}"))
            && function(f).starts_with("-> proc at ")
            && at_line(build, f, "fiber_foo_new")
    };
    // Inlined or not, `new` is named after its class.
    let new = "Foo.new";
    let objects = one_group(
        &json,
        "gc",
        "Foo.new in the spawned block",
        &[&|f| function(f) == new, &spawn_block],
    );
    assert_eq!(Counts::of(objects), counts(1_000, 32_000, 1_000, 32_000));
    assert_eq!(objects["type_name"], build.class("Foo"));
    assert_eq!(objects["truncated"], false, "truncated stack: {objects:#}");

    // Outside the block: Fiber#run, then at most the fiber's entry proc
    // (release builds tail-call Fiber#run from it, so it is not on the stack).
    let stack = frames(objects);
    assert_eq!(function(&stack[2]), "Fiber#run", "{objects:#}");
    let entry = &stack[3..];
    assert!(
        entry.len() <= 1
            && entry
                .iter()
                .all(|f| raw_name(f).starts_with("~proc") && raw_name(f).contains("/fiber.cr:")),
        "expected the stack to end at the fiber's entry: {objects:#}"
    );
}

/// `GC.free` of a 4,096-byte block → no longer live; a 2,048-byte block
/// kept → live. Both `gc_atomic` (`Pointer(UInt8).malloc`), at `free_block`.
fn free(build: Build) {
    let (_dir, _path, json) = profile(build, "free");
    let freed = counts(0, 0, 1, 4_096);
    let kept = counts(1, 2_048, 1, 2_048);
    if build.has_lines() {
        for (mark, want) in [("freed_block", freed), ("kept_block", kept)] {
            let g = one_group(
                &json,
                "gc_atomic",
                mark,
                &[&|f| is_call(build, f, "free_block", mark)],
            );
            assert_eq!(Counts::of(g), want, "{mark}");
            assert_reaches_main(g);
        }
    } else {
        // Without lines the two sites are told apart by their sizes.
        let at_free_block =
            groups_starting(&json, "gc_atomic", &[&|f| function(f) == "free_block"]);
        let mut got: Vec<Counts> = at_free_block.iter().map(|g| Counts::of(g)).collect();
        got.sort_by_key(|c| c.total_bytes);
        assert_eq!(got, [kept, freed], "{}", list_groups(&json));
        at_free_block.iter().for_each(|g| assert_reaches_main(g));
    }
}

/// One `#[test]` per build of each case: `foos::debug`, `foos::release`, …
macro_rules! per_build {
    ($($case:ident),*) => {$(
        mod $case {
            #[test]
            fn debug() {
                super::$case(super::Debug)
            }
            #[test]
            fn release() {
                super::$case(super::Release)
            }
            #[test]
            fn static_libgc() {
                super::$case(super::Static)
            }
            #[test]
            fn stripped() {
                super::$case(super::Stripped)
            }
        }
    )*};
}

per_build!(foos, strings, fiber, free);

/// The static build has the GC in the executable (no libgc.so), exported in
/// `.dynsym`; the stripped one has no `.symtab` and no DWARF left.
#[test]
fn static_and_stripped_builds_are_what_they_claim() {
    let tool = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(out.status.success(), "{program} {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for exe in [ALLOCS_STATIC, ALLOCS_STRIPPED] {
        let needed = tool("readelf", &["-d", exe]);
        assert!(
            !needed.contains("libgc.so"),
            "{exe} needs libgc.so:\n{needed}"
        );
        let dynsym = tool("nm", &["-D", "--defined-only", exe]);
        for symbol in ["GC_malloc", "GC_malloc_atomic", "GC_realloc", "GC_free"] {
            assert!(
                dynsym.lines().any(|l| l.ends_with(&format!(" T {symbol}"))),
                "{exe} does not define {symbol}"
            );
        }
    }
    let sections = tool("readelf", &["-S", "-W", ALLOCS_STRIPPED]);
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug_"),
        "not stripped:\n{sections}"
    );
    let needed = tool("readelf", &["-d", ALLOCS_DEBUG]);
    assert!(needed.contains("libgc.so"), "debug build without libgc.so");
}
