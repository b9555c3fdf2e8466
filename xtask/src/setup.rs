//! `cargo xtask setup`: everything a fresh Debian 12 machine needs to build
//! and test memprof. Idempotent: each step checks first and skips what is
//! already there, printing one line per step:
//!
//! ```text
//! setup: crystal ... already installed
//! setup: rust-src (nightly) ... installing
//! ```
//!
//! cargo-fuzz builds the fuzz targets (`fuzz.rs`). The last steps
//! (kernels/mod.rs) bring virtme-ng, QEMU and Debian's 6.1 and 6.12
//! kernels into target/, to run tests on those kernels.

use crate::apt::apt_packages;
use crate::{output, run};
use anyhow::{Context, Result};
use std::process::Command;

/// Debian packages: Crystal and Boehm GC (Crystal targets and fixtures),
/// Crystal sample programs (real workloads), Go (`go tool pprof` reads the
/// pprof reports back), Chromium (renders the HTML report headless),
/// Tesseract (reads the fixture's names off the page's screenshot), C
/// and C++ toolchains (fixtures), wrk (loads crystal-samples'
/// http_server in the benchmark), tmux (the terminal `memprof top` is
/// tested in), Prometheus and promtool (scrape `memprof agent`, check its
/// metrics), curl (asks the agent over its Unix socket), and Python and
/// git (everyday programs the agent-cost bench times, with gcc, crystal
/// and cargo).
const APT_PACKAGES: &[&str] = &[
    "crystal",
    "libgc-dev",
    "crystal-samples",
    "golang-go",
    "chromium",
    "tesseract-ocr",
    "gcc",
    "g++",
    "make",
    "wrk",
    "tmux",
    "prometheus",
    "curl",
    "python3",
    "git",
];

/// cargo-fuzz, which builds and runs the fuzz targets of fuzz/ (with the
/// nightly toolchain).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// The newest bpf-linker that works with the Rust toolchain's own LLVM here
/// (see docs/ARCHITECTURE.md, "Toolchain facts").
const BPF_LINKER_VERSION: &str = "0.10.4";

pub fn setup() -> Result<()> {
    apt_packages(APT_PACKAGES)?;
    rust_src()?;
    bpf_linker()?;
    cargo_fuzz()?;
    crate::kernels::setup()
}

/// The eBPF crate is built with nightly `-Z build-std=core`, which needs rust-src.
fn rust_src() -> Result<()> {
    let mut list = Command::new("rustup");
    list.args(["+nightly", "component", "list", "--installed"]);
    let out = output(&mut list)?;
    if out.status.success()
        && String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == "rust-src")
    {
        println!("setup: rust-src (nightly) ... already installed");
        return Ok(());
    }
    println!("setup: rust-src (nightly) ... installing");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// aya-build links the eBPF object with bpf-linker, found on PATH.
fn bpf_linker() -> Result<()> {
    let installed = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .any(|word| word == BPF_LINKER_VERSION)
        })
        .unwrap_or(false); // not on PATH
    if installed {
        println!("setup: bpf-linker {BPF_LINKER_VERSION} ... already installed");
        return Ok(());
    }
    println!("setup: bpf-linker {BPF_LINKER_VERSION} ... installing (takes a few minutes)");
    // `cargo install` ignores the workspace's .cargo/config.toml, as it should.
    let mut install = crate::cargo();
    install.args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION]);
    run(&mut install)?;
    output(Command::new("bpf-linker").arg("--version"))
        .context("bpf-linker was installed but is not on PATH (add ~/.cargo/bin to PATH)")?;
    Ok(())
}

/// What `cargo xtask fuzz` needs: the targets link memprof, whose build
/// builds the eBPF programs (rust-src, bpf-linker), and are built by
/// cargo-fuzz.
pub fn fuzz_tools() -> Result<()> {
    rust_src()?;
    bpf_linker()?;
    cargo_fuzz()
}

/// `cargo xtask fuzz` builds and runs the fuzz targets with cargo-fuzz.
fn cargo_fuzz() -> Result<()> {
    let installed = Command::new("cargo-fuzz")
        .arg("--version")
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .any(|word| word == CARGO_FUZZ_VERSION)
        })
        .unwrap_or(false); // not on PATH
    if installed {
        println!("setup: cargo-fuzz {CARGO_FUZZ_VERSION} ... already installed");
        return Ok(());
    }
    println!("setup: cargo-fuzz {CARGO_FUZZ_VERSION} ... installing");
    let mut install = crate::cargo();
    install.args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
    ]);
    run(&mut install)?;
    output(Command::new("cargo-fuzz").arg("--version"))
        .context("cargo-fuzz was installed but is not on PATH (add ~/.cargo/bin to PATH)")?;
    Ok(())
}
