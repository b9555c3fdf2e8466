//! `cargo xtask <command>`: memprof's developer tasks.
//!
//! ```text
//! cargo xtask setup     # install what a fresh Debian 12 machine lacks (idempotent),
//!                       #   Debian kernels and QEMU for `vm` included
//! cargo xtask build     # cargo build --release -p memprof
//! cargo xtask test      # setup, build, the tests (as root), then the smoke set in Debian's
//!                       #   6.1 and 6.12 kernels under QEMU (--long: the long runs too)
//! cargo xtask demo      # setup, build, profile demo/demo.c and print the report
//! cargo xtask bench     # setup, build, time bench_loop untraced and under memprof
//!                       #   (--baseline OLD_MEMPROF: the same ways with an earlier build too;
//!                       #    --agent-only: memprof agent's idle CPU, scrapes and RSS under churn;
//!                       #    --http-only: crystal-samples' http_server under wrk, beside each way;
//!                       #    --agent-cost: everyday programs untraced and under memprof agent)
//! cargo xtask fixtures  # compile the C test fixtures into target/fixtures
//! cargo xtask fuzz [TARGET] [--seconds N] [--keep]
//!                       # build the fuzz targets of fuzz/ and run each (or one) N seconds
//! cargo xtask vm 6.12 -- uname -r   # (hidden) run a command in a Debian kernel under QEMU
//! ```
//!
//! Every command runs from the workspace root, whatever the current directory.

mod apt;
mod bench;
mod demo;
#[path = "../../tests/fixtures/compile.rs"]
mod fixtures;
mod fuzz;
mod kernels;
mod matrix;
mod setup;

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};

#[derive(Parser)]
#[command(about = "memprof developer tasks", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the apt packages, the nightly rust-src component, bpf-linker, and
    /// virtme-ng, QEMU and the Debian 6.1 and 6.12 kernels (into target/), if missing.
    Setup,
    /// Build the memprof binary (target/release/memprof).
    Build,
    /// Set up, build, run the tests on this kernel, each fuzz target for
    /// 10 seconds, then the smoke set in each of Debian's kernels under
    /// QEMU (needs root: the tests load eBPF programs). About 20 minutes
    /// on 2 cores.
    Test {
        /// Also the long runs (the ten-minute soak, the 2,000-process
        /// storms) and each fuzz target for 5 minutes: about 50 minutes more.
        #[arg(long)]
        long: bool,
        /// Only the tests on this kernel, no kernel matrix (for a quick
        /// check while developing; CI runs the matrix).
        #[arg(long)]
        no_matrix: bool,
        /// No fuzzing.
        #[arg(long)]
        no_fuzz: bool,
    },
    /// Set up, build, profile the demo program and print its report.
    Demo,
    /// Set up, build, and compare the cost of a malloc/free pair untraced and traced.
    Bench {
        /// Also time this memprof binary (an earlier build, e.g. main's) in
        /// every traced way, in the same invocation: rows marked "(baseline)".
        #[arg(long, value_name = "MEMPROF")]
        baseline: Option<PathBuf>,
        /// Only `memprof agent`'s bounds (idle CPU, scrapes with 500
        /// processes, RSS under churn; MEMPROF_BENCH_CHURN_S sets the churn's length).
        #[arg(long)]
        agent_only: bool,
        /// Only crystal-samples' http_server under `wrk`: untraced, and
        /// beside each way memprof runs (`attach`, `attach --all`, `agent`).
        #[arg(long, conflicts_with = "agent_only")]
        http_only: bool,
        /// Only what `memprof agent` with its defaults costs everyday
        /// programs (gcc, python3, git, crystal, sort, a malloc loop, cargo,
        /// http_server under `wrk`): each untraced and under the agent.
        #[arg(long, conflicts_with_all = ["agent_only", "http_only"])]
        agent_cost: bool,
    },
    /// Compile the C test fixtures into target/fixtures.
    Fixtures,
    /// Build the fuzz targets of fuzz/ (cargo-fuzz, nightly) and run each
    /// one, or TARGET, for a while; a crash, hang or blow-up fails, naming
    /// the reproducer.
    Fuzz {
        /// One target (demangle, eh_frame, elf_module, symbolize,
        /// crystal_source, mprof, btf, agent_query); all by default.
        target: Option<String>,
        /// Seconds each target runs.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Then merge what the run found into the corpus kept in git
        /// (fuzz/corpus/TARGET), minimized.
        #[arg(long)]
        keep: bool,
    },
    /// Boot a Debian kernel set up by `setup` (6.1 or 6.12) under QEMU and
    /// run a shell command in it as root, the host's root read-only.
    #[command(hide = true)]
    Vm {
        /// The kernel series: 6.1 or 6.12.
        kernel: String,
        /// The one host folder the guest can write (default target/vm-rwdir).
        #[arg(long)]
        rwdir: Option<PathBuf>,
        /// Kill the VM after this many seconds, boot included.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// The command line, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Build memprof and the tests, then run only the kernel matrix (the
    /// smoke set in each of Debian's kernels under QEMU).
    #[command(hide = true)]
    Matrix,
}

fn main() -> ExitCode {
    cargo_bin_on_path();
    match task(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo install` puts bpf-linker in `$CARGO_HOME/bin`, which a CI shell
/// may not have on PATH; aya-build (run by memprof's build script, a child of
/// this process) looks for it there.
fn cargo_bin_on_path() {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(bin) = cargo_home.map(|h| h.join("bin")) else {
        return;
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|p| p == bin) {
        let joined = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))
            .expect("PATH entries");
        // Single-threaded at this point.
        std::env::set_var("PATH", joined);
    }
}

fn task(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::setup(),
        Task::Build => build_memprof().map(drop),
        Task::Test {
            long,
            no_matrix,
            no_fuzz,
        } => test(long, !no_matrix, !no_fuzz),
        Task::Demo => demo::demo(),
        Task::Bench {
            baseline,
            agent_only,
            http_only,
            agent_cost,
        } => bench::bench(baseline, agent_only, http_only, agent_cost),
        Task::Fixtures => {
            let built = fixtures::compile_all(&fixtures_src(), &target_dir().join("fixtures"))
                .map_err(anyhow::Error::msg)?;
            for (_, exe) in built {
                println!("fixtures: built {}", exe.display());
            }
            Ok(())
        }
        Task::Fuzz {
            target,
            seconds,
            keep,
        } => {
            setup::fuzz_tools()?;
            fuzz::fuzz(target.as_deref(), seconds, keep)
        }
        Task::Matrix => {
            setup::setup()?;
            let memprof = build_memprof()?;
            matrix::run(&memprof, false)
        }
        Task::Vm {
            kernel,
            rwdir,
            timeout,
            command,
        } => kernels::vm(
            &kernel,
            &command.join(" "),
            rwdir,
            std::time::Duration::from_secs(timeout),
        ),
    }
}

/// Runs the tests: they attach real uprobes, hence the root check up front.
/// `long`: the long runs too; `fuzz`: then each fuzz target ([`fuzz::TEST_SECONDS`]
/// each, [`fuzz::LONG_SECONDS`] with `long`); `matrix`: then the smoke set
/// in each kernel.
fn test(long: bool, matrix: bool, fuzz: bool) -> Result<()> {
    ensure!(
        is_root()?,
        "cargo xtask test must run as root: the integration tests load eBPF programs and attach uprobes"
    );
    setup::setup()?;
    let memprof = build_memprof()?;
    let mut tests = cargo();
    tests.args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "memprof-ebpf",
        // Run every test binary even if one fails: CI shows all failures.
        "--no-fail-fast",
    ]);
    if long {
        tests.args(["--features", "memprof-tests/long"]);
    }
    let here = run(tests
        .args(["--", "--test-threads=2"])
        .env("MEMPROF_BIN", &memprof));
    // Fuzzing and the matrix run even when a test failed here: CI shows all.
    let fuzzed = match fuzz {
        true => fuzz::fuzz(
            None,
            match long {
                true => fuzz::LONG_SECONDS,
                false => fuzz::TEST_SECONDS,
            },
            false,
        ),
        false => Ok(()),
    };
    let kernels = if matrix {
        matrix::run(&memprof, long)
    } else {
        Ok(())
    };
    here.and(fuzzed).and(kernels)
}

/// The workspace root (the parent of this crate).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` or `<root>/target`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// Where the C fixtures' sources are.
fn fixtures_src() -> PathBuf {
    root().join("tests/fixtures/c")
}

/// A cargo command (the cargo that runs us, if known) in the workspace root.
fn cargo() -> Command {
    let mut command =
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")));
    command.current_dir(root());
    command
}

/// Builds memprof in release mode; returns the absolute path of the binary.
fn build_memprof() -> Result<PathBuf> {
    run(cargo().args(["build", "--release", "-p", "memprof"]))?;
    let bin = target_dir().join("release/memprof");
    ensure!(
        bin.exists(),
        "cargo build succeeded but {} is missing",
        bin.display()
    );
    Ok(bin)
}

/// Runs a command with inherited stdio; fails unless it exits 0.
fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {}", show(command)))?;
    ensure!(status.success(), "{} failed ({status})", show(command));
    Ok(())
}

/// Runs a command and captures its output; fails only if it cannot start.
fn output(command: &mut Command) -> Result<Output> {
    command
        .output()
        .with_context(|| format!("cannot run {}", show(command)))
}

/// A command line as a user would type it, for messages.
fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether this process runs with effective uid 0 (from /proc, to need no libc crate).
fn is_root() -> Result<bool> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    // "Uid:\treal\teffective\tsaved\tfs"
    let Some(effective) = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
    else {
        bail!("no Uid line in /proc/self/status");
    };
    Ok(effective == "0")
}
