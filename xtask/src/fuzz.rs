//! `cargo xtask fuzz`: memprof's fuzz targets (`fuzz/`, cargo-fuzz and
//! libFuzzer), one per reader of outside input, each run for a while.
//!
//! The targets are built once with cargo-fuzz on the nightly toolchain
//! (address sanitizer, debug assertions and overflow checks) into
//! `target/fuzz/`, then each binary runs for its time:
//!
//! - the corpus it grows is `target/fuzz/corpus/TARGET/` (kept from run
//!   to run on a machine), the one kept in git `fuzz/corpus/TARGET/` is
//!   read as seeds (`--keep` merges what the run found into it,
//!   minimized, at most [`KEPT_BYTES`]: what to commit), and so are the
//!   inputs that found bugs, `fuzz/regressions/TARGET/` (never minimized
//!   away);
//! - an input that panics, takes more than [`TIMEOUT_S`] or more than
//!   [`RSS_LIMIT_MB`], or leaks, fails the run, which names the target and the
//!   reproducer (`target/fuzz/artifacts/TARGET/crash-…`), and prints the
//!   end of the target's log (`target/fuzz/logs/TARGET.log`).
//!
//! ```text
//! fuzz: demangle ... 10 s, 182,311 runs, corpus 412
//! fuzz: eh_frame ... FAILED: crash (exit status: 77), reproducer target/fuzz/artifacts/eh_frame/crash-1a2b… (…)
//! ```

use crate::bench::thousands;
use crate::{root, run, show, target_dir};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// One fuzz target of `fuzz/fuzz_targets/` and the longest input it is given.
pub struct Target {
    pub name: &'static str,
    max_len: usize,
}

/// Every target, in the order they run.
pub const TARGETS: &[Target] = &[
    // Names: the longest symbols are under 4 KiB (and what is shown of
    // them is checked against 8 KiB).
    Target {
        name: "demangle",
        max_len: 4096,
    },
    Target {
        name: "eh_frame",
        max_len: 32 << 10,
    },
    Target {
        name: "elf_module",
        max_len: 32 << 10,
    },
    Target {
        name: "symbolize",
        max_len: 32 << 10,
    },
    Target {
        name: "crystal_source",
        max_len: 16 << 10,
    },
    Target {
        name: "mprof",
        max_len: 64 << 10,
    },
    Target {
        name: "btf",
        max_len: 8 << 10,
    },
    Target {
        name: "agent_query",
        max_len: 4096,
    },
];

/// An input that takes longer than this many seconds is a hang.
const TIMEOUT_S: u32 = 2;
/// An input that takes memprof past this much resident memory is a blow-up.
const RSS_LIMIT_MB: u32 = 1024;

/// The most a corpus kept in git may hold, in bytes (`--keep`).
const KEPT_BYTES: u64 = 1 << 20;

/// Seconds each target runs in `cargo xtask test`, and in `test --long`.
pub const TEST_SECONDS: u64 = 10;
pub const LONG_SECONDS: u64 = 300;

/// `cargo xtask fuzz [TARGET] [--seconds N] [--keep]`.
pub fn fuzz(target: Option<&str>, seconds: u64, keep: bool) -> Result<()> {
    let targets: Vec<&Target> = match target {
        None => TARGETS.iter().collect(),
        Some(name) => match TARGETS.iter().find(|t| t.name == name) {
            Some(t) => vec![t],
            None => bail!(
                "no fuzz target {name}: one of {}",
                TARGETS
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    let bin = build(target)?;
    let mut failed = Vec::new();
    for t in targets {
        if let Err(e) = run_target(&bin, t, seconds) {
            println!("fuzz: {} ... FAILED: {e:#}", t.name);
            failed.push(t.name);
            continue;
        }
        if keep {
            keep_corpus(&bin, t)?;
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Builds the targets (or the one) with cargo-fuzz; the folder of the binaries.
fn build(target: Option<&str>) -> Result<PathBuf> {
    let dir = target_dir().join("fuzz");
    let mut build = nightly_cargo();
    build.args(["fuzz", "build", "--release", "--debug-assertions"]);
    build.arg("--target-dir").arg(&dir);
    build.args(target);
    run(&mut build)?;
    Ok(dir.join("x86_64-unknown-linux-gnu/release"))
}

/// The cargo of the nightly toolchain (cargo-fuzz builds with sanitizer
/// flags, nightly only), in the workspace root.
fn nightly_cargo() -> Command {
    let mut command = Command::new("rustup");
    command.args(["run", "nightly", "cargo"]);
    // The stable cargo that runs xtask says it is cargo; nightly's must.
    command.env_remove("CARGO").env_remove("RUSTUP_TOOLCHAIN");
    command.current_dir(root());
    command
}

/// The folders of one target: its growing corpus, its artifacts, its log.
fn folders(t: &Target) -> (PathBuf, PathBuf, PathBuf) {
    let fuzz = target_dir().join("fuzz");
    (
        fuzz.join("corpus").join(t.name),
        fuzz.join("artifacts").join(t.name),
        fuzz.join("logs").join(format!("{}.log", t.name)),
    )
}

/// The corpus kept in git.
fn kept_corpus(t: &Target) -> PathBuf {
    root().join("fuzz/corpus").join(t.name)
}

/// libFuzzer's limits, the same for a run and a merge.
fn limits(command: &mut Command, t: &Target) {
    command.arg(format!("-timeout={TIMEOUT_S}"));
    command.arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"));
    command.arg(format!("-max_len={}", t.max_len));
}

/// Runs one target for `seconds`; fails naming the reproducer.
fn run_target(bin: &Path, t: &Target, seconds: u64) -> Result<()> {
    let (corpus, artifacts, log) = folders(t);
    for dir in [&corpus, &artifacts, log.parent().unwrap()] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let before = files(&artifacts);
    let mut fuzz = Command::new(bin.join(t.name));
    fuzz.arg(&corpus).arg(kept_corpus(t));
    let regressions = root().join("fuzz/regressions").join(t.name);
    if regressions.is_dir() {
        fuzz.arg(regressions);
    }
    limits(&mut fuzz, t);
    fuzz.env("LSAN_OPTIONS", lsan_options());
    fuzz.arg(format!("-max_total_time={seconds}"));
    fuzz.arg(format!("-artifact_prefix={}/", artifacts.display()));
    fuzz.arg("-print_final_stats=1");
    // The target's own messages (memprof's, on bad files) go to the log too.
    let file = std::fs::File::create(&log)?;
    fuzz.stdout(file.try_clone()?).stderr(file);
    print!("fuzz: {} ... ", t.name);
    let started = Instant::now();
    let status = fuzz
        .status()
        .with_context(|| format!("cannot run {}", show(&fuzz)))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // Whatever the status says (libFuzzer has ended 0 after writing a
    // leak's input): a new input in the artifacts is a failure.
    let found: Vec<PathBuf> = files(&artifacts)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if status.success() && found.is_empty() {
        let runs = final_stat(&text, "stat::number_of_executed_units:").unwrap_or(0);
        let size = std::fs::read_dir(&corpus).map_or(0, |d| d.count());
        println!(
            "{} s, {} runs, corpus {size}",
            started.elapsed().as_secs(),
            thousands(runs)
        );
        return Ok(());
    }
    let tail: Vec<&str> = text.lines().rev().take(60).collect();
    for line in tail.iter().rev() {
        eprintln!("  | {line}");
    }
    let what = [
        ("ERROR: libFuzzer: timeout", "hang"),
        ("ERROR: libFuzzer: out-of-memory", "out of memory"),
        ("ERROR: LeakSanitizer: detected memory leaks", "leak"),
    ]
    .into_iter()
    .find(|(said, _)| text.contains(said))
    .map_or("crash", |(_, what)| what);
    let written = text
        .lines()
        .find_map(|l| l.split("Test unit written to ").nth(1))
        .map(str::to_string)
        .or_else(|| found.first().map(|f| f.display().to_string()));
    match written {
        Some(reproducer) => bail!(
            "{what} ({status}), reproducer {reproducer} (run it again: {} {reproducer}; the log: {})",
            bin.join(t.name).display(),
            log.display()
        ),
        None => bail!("{} ({status}), see {}", show(&fuzz), log.display()),
    }
}

/// The files of `dir` (none if it cannot be read).
fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map_or(Vec::new(), |d| {
        d.filter_map(|e| e.ok().map(|e| e.path())).collect()
    })
}

/// LeakSanitizer's options: `fuzz/lsan.supp`'s suppressions (what memprof
/// keeps on purpose), and the caller's own options.
fn lsan_options() -> String {
    let suppressions = format!("suppressions={}", root().join("fuzz/lsan.supp").display());
    match std::env::var("LSAN_OPTIONS") {
        Ok(theirs) if !theirs.is_empty() => format!("{suppressions}:{theirs}"),
        _ => suppressions,
    }
}

/// Merges what runs found into the corpus kept in git, minimized (the
/// inputs that add coverage, as `cargo fuzz cmin` keeps them).
fn keep_corpus(bin: &Path, t: &Target) -> Result<()> {
    let (corpus, _, log) = folders(t);
    let kept = kept_corpus(t);
    let merged = target_dir().join("fuzz/merged").join(t.name);
    let _ = std::fs::remove_dir_all(&merged);
    std::fs::create_dir_all(&merged)?;
    let mut merge = Command::new(bin.join(t.name));
    merge.arg("-merge=1").arg(&merged).arg(&kept).arg(&corpus);
    limits(&mut merge, t);
    merge.env("LSAN_OPTIONS", lsan_options());
    let file = std::fs::File::create(log.with_extension("merge.log"))?;
    merge.stdout(file.try_clone()?).stderr(file);
    run(&mut merge)?;
    // Smallest first, within the budget (libFuzzer prefers them too).
    let mut inputs: Vec<(u64, PathBuf)> = files(&merged)
        .into_iter()
        .map(|f| (f.metadata().map_or(0, |m| m.len()), f))
        .collect();
    inputs.sort();
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept)?;
    let (mut count, mut bytes) = (0, 0);
    for (size, input) in &inputs {
        if bytes + size > KEPT_BYTES {
            break;
        }
        std::fs::copy(input, kept.join(input.file_name().unwrap()))?;
        (count, bytes) = (count + 1, bytes + size);
    }
    println!(
        "fuzz: {} ... corpus kept in {}: {count} inputs of {}, {} KiB",
        t.name,
        kept.display(),
        inputs.len(),
        bytes >> 10
    );
    Ok(())
}

/// A number of libFuzzer's final statistics (`stat::NAME: N`).
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|n| n.trim().parse().ok())
}
