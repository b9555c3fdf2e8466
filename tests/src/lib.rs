//! Helpers for memprof's integration tests (`tests/tests/*.rs`).
//!
//! The tests run the real `memprof` binary, as root, on the C fixtures of
//! `fixtures/c/` (compiled by `build.rs`), then read the profile back through
//! `memprof report --format json`:
//!
//! ```no_run
//! use memprof_tests::*;
//! let dir = TempDir::new("basic");
//! let profile = dir.join("basic.mprof");
//! run_ok([OsStr::new("run"), OsStr::new("-o"), profile.as_os_str(), OsStr::new("--"), OsStr::new(fixture::BASIC)]);
//! let json = report_json(&profile);
//! assert_eq!(Counts::of(group_at(&json, "libc", "make_foo")).live_count, 600);
//! ```
//!
//! The binary is `$MEMPROF_BIN` if set (`cargo xtask test` sets it), else
//! `<workspace>/target/release/memprof`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub use serde_json::Value;
pub use std::ffi::OsStr;

/// Paths of the compiled C fixtures (see `fixtures/c/*.c` for what each does).
pub mod every_process;

pub mod fixture {
    pub const BASIC: &str = env!("FIXTURE_BASIC");
    pub const ESCAPING: &str = env!("FIXTURE_ESCAPING");
    pub const FAMILIES: &str = env!("FIXTURE_FAMILIES");
    pub const THREADS: &str = env!("FIXTURE_THREADS");
    pub const ATTACH_TARGET: &str = env!("FIXTURE_ATTACH_TARGET");
    /// A Boehm GC program that collects on each SIGUSR1 (`fixtures/c/gc_attach_target.c`).
    pub const GC_ATTACH_TARGET: &str = env!("FIXTURE_GC_ATTACH_TARGET");
    pub const GROW: &str = env!("FIXTURE_GROW");
    /// `hostile [ROUNDS]`: its allocating function carries a 451-byte C++
    /// name some 14 TB long demangled; 1,000 × malloc(64) kept, then
    /// ROUNDS × 100 more 10 ms apart, each freeing the oldest
    /// (`fixtures/c/hostile.c`).
    pub const HOSTILE: &str = env!("FIXTURE_HOSTILE");
    /// `rss_touch SECONDS [UNMAP_SECONDS]`: 100 MiB mapped and each page
    /// written at touch_pages, then (with UNMAP_SECONDS) unmapped
    /// (`fixtures/c/rss_touch.c`).
    pub const RSS_TOUCH: &str = env!("FIXTURE_RSS_TOUCH");
    /// `rss_leak SECONDS`: leaks 1 MiB/s in 4 KiB blocks it writes at
    /// leak_block, beside a malloc(64)/free churn (`fixtures/c/rss_leak.c`).
    pub const RSS_LEAK: &str = env!("FIXTURE_RSS_LEAK");
    /// Forks two workers that never exec; each mallocs 500 × 64 bytes at
    /// worker_alloc after 4 s (`fixtures/c/forker.c`).
    pub const FORKER: &str = env!("FIXTURE_FORKER");
    /// Eight workers forked at once, each 500 x malloc(64) at
    /// worker_alloc at once, exiting within milliseconds
    /// (`fixtures/c/quick_forker.c`).
    pub const QUICK_FORKER: &str = env!("FIXTURE_QUICK_FORKER");
    /// Waits 4 s, mallocs 500 × 64 bytes at delayed_alloc, exits 1 s
    /// later (`fixtures/c/delayed.c`).
    pub const DELAYED: &str = env!("FIXTURE_DELAYED");
    pub const GROWER: &str = env!("FIXTURE_GROWER");
    /// Grows by malloc(1 MiB) after a line on stdin until the OOM killer
    /// ends it, saying "allocated N" after each (`fixtures/c/oom_grower.c`).
    pub const OOM_GROWER: &str = env!("FIXTURE_OOM_GROWER");
    pub const BENCH_LOOP: &str = env!("FIXTURE_BENCH_LOOP");
    pub const NO_LIBC: &str = env!("FIXTURE_NO_LIBC");
    /// basic's allocations in a 16 MiB program that exits at once
    /// (`fixtures/c/big_short.c`).
    pub const BIG_SHORT: &str = env!("FIXTURE_BIG_SHORT");
    /// A shared library: make_bars(n), n × malloc(64) (`fixtures/c/lib_bars.c`).
    pub const LIB_BARS: &str = env!("FIXTURE_LIB_BARS");
    /// dlopens its argument, calls make_bars(300) and exits
    /// (`fixtures/c/dlopen_once.c`).
    pub const DLOPEN_ONCE: &str = env!("FIXTURE_DLOPEN_ONCE");
    /// dlopen/dlclose of libm.so.6 in a loop, forever (`fixtures/c/dlopen_loop.c`).
    pub const DLOPEN_LOOP: &str = env!("FIXTURE_DLOPEN_LOOP");
    /// 4 threads looping malloc + free, each in its own function (`fixtures/c/thread_loops.c`).
    pub const THREAD_LOOPS: &str = env!("FIXTURE_THREAD_LOOPS");
    /// 500 mallocs in a known order, for tables too small (`fixtures/c/overflow.c`).
    pub const OVERFLOW: &str = env!("FIXTURE_OVERFLOW");
    /// A binary tree of 262,143 malloc(48) built by a function recursing
    /// from two call sites: as many distinct stacks (`fixtures/c/recursion.c`).
    pub const RECURSION: &str = env!("FIXTURE_RECURSION");
    /// Three freed sites of known byte shares and a leaking one, for
    /// `--sample-bytes 4096` (`fixtures/c/sampling.c`).
    pub const SAMPLING: &str = env!("FIXTURE_SAMPLING");
    /// malloc, realloc to grow, half freed: sampled reallocs
    /// (`fixtures/c/sampled_realloc.c`).
    pub const SAMPLED_REALLOC: &str = env!("FIXTURE_SAMPLED_REALLOC");
    /// Large blocks and threads' arenas, which glibc's malloc maps itself;
    /// the only mmap blocks are 4 thread stacks (`fixtures/c/sampled_mmaps.c`).
    pub const SAMPLED_MMAPS: &str = env!("FIXTURE_SAMPLED_MMAPS");
    /// `fixtures/c/gc_verdicts.c` (`gc_verdicts OUT [SLEEP]`) linked with libgc.so.
    pub const GC_VERDICTS: &str = env!("FIXTURE_GC_VERDICTS");
    /// The same source with libgc.a linked in.
    pub const GC_VERDICTS_STATIC: &str = env!("FIXTURE_GC_VERDICTS_STATIC");
    /// 4 GC-registered threads, 100,000 kept objects each (`fixtures/c/gc_threads.c`).
    pub const GC_THREADS: &str = env!("FIXTURE_GC_THREADS");
    /// `fixtures/cpp/records.cc` built with g++ -O2: `new Record` and
    /// `std::vector` buffers under known functions.
    pub const CXX_RECORDS: &str = env!("FIXTURE_CXX_RECORDS");

    /// The Crystal fixture `fixtures/crystal/allocs.cr` (`allocs CASE`) in
    /// each build flavour (see `fixtures/compile.rs`).
    pub mod crystal {
        /// A server-like program: a steady leak among held buffers, a warmed
        /// cache and a late phase (`fixtures/crystal/server_leak.cr`).
        pub const SERVER_LEAK_DEBUG: &str = env!("FIXTURE_CR_SERVER_LEAK_DEBUG");
        pub const SERVER_LEAK_SOURCE: &str = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/crystal/server_leak.cr"
        );
        /// `fixtures/crystal/html_page.cr`: 24,000 Widget and 4,000 Gadget
        /// objects kept, made in `AssemblyLineOfTheHtmlFixture#make_widgets`
        /// and `#make_gadgets`; two collections, 1.2 s in all (debug build).
        pub const HTML_PAGE_DEBUG: &str = env!("FIXTURE_CR_HTML_PAGE_DEBUG");
        pub const ALLOCS_SOURCE: &str =
            concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/crystal/allocs.cr");
        /// `crystal build`: libgc.so, nothing inlined.
        pub const ALLOCS_DEBUG: &str = env!("FIXTURE_CR_ALLOCS_DEBUG");
        /// `crystal build --release`.
        pub const ALLOCS_RELEASE: &str = env!("FIXTURE_CR_ALLOCS_RELEASE");
        /// `crystal build` against libgc.a: the GC is in the executable.
        pub const ALLOCS_STATIC: &str = env!("FIXTURE_CR_ALLOCS_STATIC");
        /// The static build, stripped: `.dynsym` names only, no DWARF.
        pub const ALLOCS_STRIPPED: &str = env!("FIXTURE_CR_ALLOCS_STRIPPED");

        /// `fixtures/crystal/gc_verdicts.cr` (`gc_verdicts OUT [SLEEP]`):
        /// debug (libgc.so), static (libgc.a) and stripped static builds.
        pub const GC_VERDICTS_DEBUG: &str = env!("FIXTURE_CR_GC_VERDICTS_DEBUG");
        pub const GC_VERDICTS_STATIC: &str = env!("FIXTURE_CR_GC_VERDICTS_STATIC");
        pub const GC_VERDICTS_STRIPPED: &str = env!("FIXTURE_CR_GC_VERDICTS_STRIPPED");
        /// `fixtures/crystal/gc_leak.cr`: a steady leak among garbage (debug build).
        pub const GC_LEAK_DEBUG: &str = env!("FIXTURE_CR_GC_LEAK_DEBUG");
        /// `fixtures/crystal/heap_census.cr`: 7,000 Author, 5,000 Book and
        /// 300 Note objects kept, collecting every 100 ms; says `ready …`.
        pub const HEAP_CENSUS_DEBUG: &str = env!("FIXTURE_CR_HEAP_CENSUS_DEBUG");
        pub const HEAP_CENSUS_RELEASE: &str = env!("FIXTURE_CR_HEAP_CENSUS_RELEASE");
        pub const HEAP_CENSUS_STATIC: &str = env!("FIXTURE_CR_HEAP_CENSUS_STATIC");
        pub const HEAP_CENSUS_STRIPPED: &str = env!("FIXTURE_CR_HEAP_CENSUS_STRIPPED");
        /// `fixtures/crystal/idle_heap.cr`: 4,000 Widget, 1,500 Gadget and
        /// 250 Gizmo objects kept, one collection, then idle (`ready …`);
        /// `more N` on stdin allocates N more without collecting.
        pub const IDLE_HEAP_DEBUG: &str = env!("FIXTURE_CR_IDLE_HEAP_DEBUG");
        pub const IDLE_HEAP_STATIC: &str = env!("FIXTURE_CR_IDLE_HEAP_STATIC");
        /// `fixtures/crystal/short_lived.cr` (`short_lived [WAIT_S]`): waits
        /// 0.3 s, makes 2,000 Record objects (kept), says `made 2000`,
        /// exits (debug build).
        pub const SHORT_LIVED_DEBUG: &str = env!("FIXTURE_CR_SHORT_LIVED_DEBUG");
        /// `fixtures/crystal/classes.cr` (`classes [wait]`): keeps 12,345
        /// Widget (the compiler's `new`), 1,000 Gadget, 55 Holder, 77
        /// Array(Gadget) and 1 Hash(String, Gadget).
        pub const CLASSES_DEBUG: &str = env!("FIXTURE_CR_CLASSES_DEBUG");
        pub const CLASSES_RELEASE: &str = env!("FIXTURE_CR_CLASSES_RELEASE");
        pub const CLASSES_STATIC: &str = env!("FIXTURE_CR_CLASSES_STATIC");
        pub const CLASSES_STRIPPED: &str = env!("FIXTURE_CR_CLASSES_STRIPPED");
        /// `fixtures/crystal/collected.cr`: 20,000 Widget, 5,000 Gadget and
        /// 3,000 Sprocket made, 500 Widget and 100 Gadget kept, one
        /// collection; prints `<class> <allocated> <collected> <live>` as
        /// the collector found them.
        pub const COLLECTED_DEBUG: &str = env!("FIXTURE_CR_COLLECTED_DEBUG");
        pub const COLLECTED_RELEASE: &str = env!("FIXTURE_CR_COLLECTED_RELEASE");
        /// `fixtures/crystal/busy_loop.cr`: one collection, then computes
        /// forever without allocating (libgc linked in).
        pub const BUSY_LOOP_STATIC: &str = env!("FIXTURE_CR_BUSY_LOOP_STATIC");
        /// `fixtures/crystal/object_graph.cr`: MemProf's documentation
        /// example (A → Array(B) → B → C, two of each), collecting every 100 ms.
        pub const OBJECT_GRAPH_DEBUG: &str = env!("FIXTURE_CR_OBJECT_GRAPH_DEBUG");
        /// `fixtures/crystal/attach_census.cr`: 4,000 Early objects kept
        /// before memprof attaches, 2,500 Late ones after (on a line on stdin).
        pub const ATTACH_CENSUS_DEBUG: &str = env!("FIXTURE_CR_ATTACH_CENSUS_DEBUG");
        pub const ATTACH_CENSUS_STATIC: &str = env!("FIXTURE_CR_ATTACH_CENSUS_STATIC");
        /// `fixtures/crystal/refill_sites.cr`: 400,000 Small, 80,000 Kept
        /// (all kept) and 200,000 40-byte buffers, interleaved, then a
        /// collection: debug, static and stripped static builds.
        pub const REFILL_SITES_DEBUG: &str = env!("FIXTURE_CR_REFILL_SITES_DEBUG");
        pub const REFILL_SITES_STATIC: &str = env!("FIXTURE_CR_REFILL_SITES_STATIC");
        pub const REFILL_SITES_STRIPPED: &str = env!("FIXTURE_CR_REFILL_SITES_STRIPPED");
        /// `fixtures/crystal/refill_alias.cr`: 127 Common then 1 Rare
        /// object of one size class, 4,000 rounds (debug build).
        pub const REFILL_ALIAS_DEBUG: &str = env!("FIXTURE_CR_REFILL_ALIAS_DEBUG");
        /// Hash and Set growth deep in the standard library, from the
        /// program's `Registry#fill` (`fixtures/crystal/deep.cr`).
        pub const DEEP_DEBUG: &str = env!("FIXTURE_CR_DEEP_DEBUG");
        pub const DEEP_RELEASE: &str = env!("FIXTURE_CR_DEEP_RELEASE");
        pub const DEEP_SOURCE: &str =
            concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/crystal/deep.cr");
        /// crystal-samples' binary-trees.cr (`binary-trees DEPTH`), `--release`.
        pub const BINARY_TREES_RELEASE: &str = env!("FIXTURE_CR_BINARY_TREES_RELEASE");
        /// crystal-samples' havlak.cr, `--release` (~10 s untraced).
        pub const HAVLAK_RELEASE: &str = env!("FIXTURE_CR_HAVLAK_RELEASE");
    }
}

/// The number of the line of `source` that carries the mark `# line:NAME`;
/// panics if there is not exactly one.
pub fn marked_line(source: &str, name: &str) -> u32 {
    marked_line_after(source, "#", name)
}

/// [`marked_line`] for a language whose comments start with `comment`
/// (`//` in C and C++).
pub fn marked_line_after(source: &str, comment: &str, name: &str) -> u32 {
    let text =
        std::fs::read_to_string(source).unwrap_or_else(|e| panic!("cannot read {source}: {e}"));
    let mark = format!("{comment} line:{name}");
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&mark))
        .map(|(i, _)| i + 1)
        .collect();
    match lines[..] {
        [line] => line as u32,
        _ => panic!("{source}: expected one line marked {mark:?}, found {lines:?}"),
    }
}

/// `1234567` → `1,234,567`, as reports write counts.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// How long any single wait in a test may take before it counts as a hang:
/// 30 s, times `MEMPROF_TEST_SLOWER` where the machine is that many times
/// slower (the kernel matrix sets 10: its kernels run emulated).
pub fn timeout() -> Duration {
    Duration::from_secs(30) * slower()
}

/// How many times slower than this machine the tests' machine is
/// (`MEMPROF_TEST_SLOWER`, 1 if unset): what a fixture waits for memprof
/// is stretched by it.
pub fn slower() -> u32 {
    std::env::var("MEMPROF_TEST_SLOWER")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The memprof binary under test.
pub fn memprof_bin() -> PathBuf {
    match std::env::var_os("MEMPROF_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/memprof"),
    }
}

/// A `memprof` command with the given arguments, not yet run.
pub fn memprof<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let bin = memprof_bin();
    assert!(
        bin.exists(),
        "memprof binary not found at {} (build it: cargo build --release -p memprof)",
        bin.display()
    );
    let mut command = Command::new(bin);
    command.args(args);
    command
}

/// Runs memprof to completion and returns its output, whatever the exit status.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = memprof(args);
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

/// Runs memprof and panics, showing its output, unless it exits 0.
pub fn run_ok<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let output = run(&args);
    assert!(
        output.status.success(),
        "memprof {args:?} failed ({})\n{}",
        output.status,
        describe(&output)
    );
    output
}

/// `memprof run -o PROFILE -- COMMAND...`, which must exit 0; returns its output.
pub fn profile_run(profile: &Path, command: &[&str]) -> Output {
    let mut args = vec![
        OsStr::new("run"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--"),
    ];
    args.extend(command.iter().map(OsStr::new));
    let output = run_ok(args);
    assert!(
        profile.exists(),
        "memprof run exited 0 but wrote no {}\n{}",
        profile.display(),
        describe(&output)
    );
    output
}

/// Starts `memprof attach --pid PID -o PROFILE EXTRA...` (stderr piped,
/// stdout discarded), without waiting for it.
pub fn spawn_attach(
    pid: impl std::fmt::Display,
    profile: &Path,
    extra: &[&str],
) -> (ChildGuard, Lines) {
    let pid = pid.to_string();
    let mut args = vec![
        OsStr::new("attach"),
        OsStr::new("--pid"),
        OsStr::new(&pid),
        OsStr::new("-o"),
        profile.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    let child = memprof(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start memprof attach");
    let mut memprof = ChildGuard(child);
    let stderr = Lines::new("memprof attach stderr", memprof.0.stderr.take().unwrap());
    (memprof, stderr)
}

/// [`spawn_attach`], then waits until memprof says its probes are live.
pub fn attach(pid: impl std::fmt::Display, profile: &Path, extra: &[&str]) -> (ChildGuard, Lines) {
    let (memprof, mut stderr) = spawn_attach(pid, profile, extra);
    stderr.wait_for("attached", timeout());
    (memprof, stderr)
}

/// stdout and stderr of a finished process, for failure messages.
pub fn describe(output: &Output) -> String {
    format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `memprof report PROFILE --format FORMAT EXTRA...`, which must succeed; returns stdout.
pub fn report(profile: &Path, format: &str, extra: &[&str]) -> String {
    let mut args = vec![
        OsStr::new("report"),
        profile.as_os_str(),
        OsStr::new("--format"),
        OsStr::new(format),
    ];
    args.extend(extra.iter().map(OsStr::new));
    String::from_utf8(run_ok(args).stdout).expect("report output is UTF-8")
}

/// The profile as JSON (`memprof report PROFILE --format json`).
pub fn report_json(profile: &Path) -> Value {
    let text = report(profile, "json", &[]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{text}"))
}

/// The result-prediction counters of a profile (`predict.rs`). On a
/// kernel with uprobe sessions (the profile's `kernel`): none wrong, at
/// least the 4,096 checks made before trusting, and `Some((predicted,
/// predictions_checked))` for the caller's own bounds. Without them
/// (Linux 6.12 and before) no result is read at an entry: both 0, `None`.
pub fn assert_predictions_right(json: &Value) -> Option<(u64, u64)> {
    let counter = |name: &str| uint(json, &format!("/counters/{name}"));
    assert_eq!(counter("predictions_wrong"), 0, "{:#}", json["counters"]);
    if json["kernel"]["uprobe_session"] != true {
        assert_eq!(
            (counter("predicted"), counter("predictions_checked")),
            (0, 0),
            "{:#}",
            json["kernel"]
        );
        return None;
    }
    let checked = counter("predictions_checked");
    assert!(checked >= 4_096, "{:#}", json["counters"]);
    Some((counter("predicted"), checked))
}

/// The unsigned integer at a JSON pointer (e.g. `/counters/failed_allocs`); panics if absent.
pub fn uint(json: &Value, pointer: &str) -> u64 {
    json.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no unsigned integer at {pointer} in {json:#}"))
}

/// The groups of `kind` whose innermost frame (the allocator's caller) is `function`.
pub fn groups_at<'a>(json: &'a Value, kind: &str, function: &str) -> Vec<&'a Value> {
    groups(json)
        .iter()
        .filter(|g| {
            g["kind"] == kind
                && g.pointer("/frames/0/function").and_then(Value::as_str) == Some(function)
        })
        .collect()
}

/// The one group of `kind` whose innermost frame is `function`; panics,
/// listing every group, if there is none or more than one.
pub fn group_at<'a>(json: &'a Value, kind: &str, function: &str) -> &'a Value {
    match groups_at(json, kind, function).as_slice() {
        [group] => group,
        found => panic!(
            "expected exactly one {kind} group at {function}, found {}; all groups:\n{}",
            found.len(),
            list_groups(json)
        ),
    }
}

/// All groups of a JSON report.
pub fn groups(json: &Value) -> &[Value] {
    json["groups"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("report has no groups array: {json:#}"))
}

/// The functions of a group's stack, innermost first ("?" where unnamed).
pub fn functions(group: &Value) -> Vec<&str> {
    group["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f["function"].as_str().unwrap_or("?"))
        .collect()
}

/// One line per group: kind, counts and the innermost frames, for failure messages.
pub fn list_groups(json: &Value) -> String {
    let mut list = String::new();
    for g in groups(json) {
        let frames = functions(g);
        let innermost = &frames[..frames.len().min(4)];
        list += &format!(
            "  {} {:?} <- {}\n",
            g["kind"],
            Counts::of(g),
            innermost.join(" <- ")
        );
    }
    list
}

/// basic's make_foo: 1,000 × malloc(48), 400 freed.
pub const MAKE_FOO: Counts = Counts {
    live_count: 600,
    live_bytes: 28_800,
    total_count: 1_000,
    total_bytes: 48_000,
};

/// The four counts of a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub live_count: u64,
    pub live_bytes: u64,
    pub total_count: u64,
    pub total_bytes: u64,
}

impl Counts {
    pub fn of(group: &Value) -> Counts {
        Counts {
            live_count: uint(group, "/live_count"),
            live_bytes: uint(group, "/live_bytes"),
            total_count: uint(group, "/total_count"),
            total_bytes: uint(group, "/total_bytes"),
        }
    }
}

/// A fresh directory for one test's files, unique per test name and process.
/// Removed on drop unless the test failed, so its profiles can be inspected.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("memprof-test-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A child process that is killed and reaped on drop, so a failing test
/// leaves no fixture or memprof behind.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(
            rc,
            0,
            "kill({}, {sig}): {}",
            self.pid(),
            std::io::Error::last_os_error()
        );
    }

    /// True while the process has not exited. (`kill(pid, 0)` would also
    /// succeed on an unreaped zombie child; `try_wait` tells them apart.)
    pub fn is_running(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the process to exit; panics (and kills it) after `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.0.kill();
                panic!("pid {} still running after {timeout:?}", self.pid());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines of a child's output pipe, read on a thread, so a test can wait
/// for a given line with a timeout.
pub struct Lines {
    what: String,
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    /// Starts reading `pipe`; `what` names it in failure messages.
    pub fn new(what: &str, pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            what: what.to_owned(),
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for the next line containing `needle` and returns it; panics,
    /// showing what was read, on timeout or end of output.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => {
                    let why = if e == RecvTimeoutError::Timeout {
                        "timed out"
                    } else {
                        "output ended"
                    };
                    panic!(
                        "{} {why} waiting for a line with {needle:?}; read so far:\n{}",
                        self.what,
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Every line read so far plus what is still to come, until the pipe
    /// closes (call after the process exited).
    pub fn all(&mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(timeout()) {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

/// Asserts that memprof failed cleanly: non-zero exit, and stderr is one line
/// `memprof: error: ...` containing every word of `words`, with no panic.
pub fn assert_one_line_error(output: &Output, words: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "expected failure, got {}\n{}",
        output.status,
        describe(output)
    );
    assert!(!stderr.contains("panicked"), "memprof panicked:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("memprof: error:"),
        "expected one line `memprof: error: ...` on stderr, got {} lines:\n{stderr}",
        lines.len()
    );
    for word in words {
        assert!(
            lines[0].contains(word),
            "error message lacks {word:?}: {}",
            lines[0]
        );
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Headless Chromium on `url`: its DOM after its scripts ran, and a
/// screenshot of it (kept in `png`).
pub fn chromium(url: &str, png: &Path) -> String {
    let run = |extra: &[String]| {
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1280,1000",
                "--virtual-time-budget=5000",
            ])
            .args(extra)
            .arg(url)
            .stderr(Stdio::null())
            .output()
            .expect("cannot run chromium (cargo xtask setup installs it)")
    };
    let shot = run(&[
        "--force-device-scale-factor=2".to_string(),
        format!("--screenshot={}", png.display()),
    ]);
    assert!(shot.status.success(), "chromium --screenshot failed");
    let dom = run(&["--dump-dom".to_string()]);
    assert!(dom.status.success(), "chromium --dump-dom failed");
    String::from_utf8_lossy(&dom.stdout).into_owned()
}
