//! `cargo xtask demo`: profiles `demo/demo.c`, a small C program with a few
//! recognizable allocation patterns: `memprof run` prints the markdown table,
//! then `memprof report` shows the same profile as tab-separated rows. Then
//! `demo/demo.cr`, a Crystal request loop with a leak among its garbage:
//! the Boehm GC heap judged by mark bits after every collection, and
//! `memprof report --leaks` naming the leaking stack.

use crate::{build_memprof, root, run, setup::setup, target_dir};
use anyhow::{Context, Result};
use std::process::Command;

pub fn demo() -> Result<()> {
    println!("demo: checking the build tools (cargo xtask setup)");
    setup()?;
    println!("demo: building memprof (cargo build --release -p memprof)");
    let memprof = build_memprof()?;

    let out_dir = target_dir().join("demo");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let exe = out_dir.join("demo");
    let profile = out_dir.join("demo.mprof");

    println!(
        "demo: compiling demo/demo.c with frame pointers and debug info into {}",
        exe.display()
    );
    run(Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(root().join("demo/demo.c")))?;

    println!(
        "demo: running it under memprof, which writes the profile to {}",
        profile.display()
    );
    run(Command::new(&memprof)
        .arg("run")
        .arg("-o")
        .arg(&profile)
        .arg("--")
        .arg(&exe))?;

    println!(
        "demo: the same profile read back for scripts (memprof report {} --format tsv --depth 3)",
        profile.display()
    );
    run(Command::new(&memprof)
        .arg("report")
        .arg(&profile)
        .args(["--format", "tsv", "--depth", "3"]))?;

    let crystal_exe = out_dir.join("demo-crystal");
    let crystal_profile = out_dir.join("demo-crystal.mprof");
    println!(
        "\ndemo: compiling demo/demo.cr (crystal build) into {}",
        crystal_exe.display()
    );
    run(Command::new("crystal")
        .args(["build", "-o"])
        .arg(&crystal_exe)
        .arg(root().join("demo/demo.cr")))?;
    println!(
        "demo: running it under memprof (GC heap only): dead objects are found from the collector's mark bits after each collection"
    );
    run(Command::new(&memprof)
        .args(["run", "--heap", "gc", "--top", "5", "-o"])
        .arg(&crystal_profile)
        .arg("--")
        .arg(&crystal_exe))?;
    println!(
        "demo: which stacks leak? (memprof report {} --leaks --top 3)",
        crystal_profile.display()
    );
    run(Command::new(&memprof)
        .arg("report")
        .arg(&crystal_profile)
        .args(["--leaks", "--top", "3"]))
}
