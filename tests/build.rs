//! Compiles the C fixtures (`fixtures/c/*.c`) into OUT_DIR and exports each
//! path as `FIXTURE_<NAME>` (e.g. `FIXTURE_BASIC`), and the Crystal fixtures
//! (`fixtures/crystal/*.cr`) in each build flavour as
//! `FIXTURE_CR_<NAME>_<FLAVOUR>` (e.g. `FIXTURE_CR_ALLOCS_RELEASE`), read with
//! `env!` in `src/lib.rs`. The C++ fixtures (`fixtures/cpp/*.cc`, -O2) are
//! `FIXTURE_CXX_<NAME>`. Also builds crystal-samples' binary-trees.cr
//! (`FIXTURE_CR_BINARY_TREES_RELEASE`) and havlak.cr
//! (`FIXTURE_CR_HAVLAK_RELEASE`).

#[path = "fixtures/compile.rs"]
mod compile;

use std::path::{Path, PathBuf};

/// crystal-samples' binary-trees, exported as `FIXTURE_CR_BINARY_TREES_RELEASE`.
const BINARY_TREES: &str = "/usr/share/doc/crystal/examples/binary-trees.cr";
/// crystal-samples' havlak (gzipped as Debian ships it), exported as
/// `FIXTURE_CR_HAVLAK_RELEASE`.
const HAVLAK: &str = "/usr/share/doc/crystal/examples/havlak.cr.gz";

fn main() {
    let src_dir = Path::new("fixtures/c");
    println!("cargo:rerun-if-changed=fixtures");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
        .join("fixtures");
    let built = compile::compile_all(src_dir, &out_dir).unwrap_or_else(|e| panic!("{e}"));
    for (name, exe) in built {
        println!(
            "cargo:rustc-env=FIXTURE_{}={}",
            name.to_uppercase(),
            exe.display()
        );
    }
    // C++ fixtures (`fixtures/cpp/*.cc`, -O2): `FIXTURE_CXX_<NAME>`.
    let built = compile::compile_cxx_all(Path::new("fixtures/cpp"), &out_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    for (name, exe) in built {
        println!(
            "cargo:rustc-env=FIXTURE_{}={}",
            name.to_uppercase(),
            exe.display()
        );
    }
    let built = compile::compile_crystal_all(Path::new("fixtures/crystal"), &out_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    // crystal-samples' binary-trees (GC-heavy), as shipped.
    let binary_trees = Path::new(BINARY_TREES);
    println!("cargo:rerun-if-changed={BINARY_TREES}");
    if !binary_trees.exists() {
        panic!("{BINARY_TREES} not found (install crystal-samples: `cargo xtask setup`)");
    }
    let mut built = built;
    for (flavour, exe) in compile::compile_crystal(binary_trees, &out_dir.join("crystal"))
        .unwrap_or_else(|e| panic!("{e}"))
    {
        built.push(("binary_trees".into(), flavour, exe));
    }
    // crystal-samples' havlak, unpacked next to its build.
    println!("cargo:rerun-if-changed={HAVLAK}");
    let samples = out_dir.join("crystal-samples");
    std::fs::create_dir_all(&samples).unwrap_or_else(|e| panic!("{}: {e}", samples.display()));
    let havlak = samples.join("havlak.cr");
    let unpacked = std::process::Command::new("gzip")
        .args(["-dc", HAVLAK])
        .output()
        .unwrap_or_else(|e| panic!("gzip: {e}"));
    if !unpacked.status.success() {
        panic!("{HAVLAK} not unpacked (install crystal-samples: `cargo xtask setup`)");
    }
    if std::fs::read(&havlak).ok().as_deref() != Some(&unpacked.stdout[..]) {
        std::fs::write(&havlak, &unpacked.stdout)
            .unwrap_or_else(|e| panic!("{}: {e}", havlak.display()));
    }
    for (flavour, exe) in compile::compile_crystal(&havlak, &out_dir.join("crystal"))
        .unwrap_or_else(|e| panic!("{e}"))
    {
        built.push(("havlak".into(), flavour, exe));
    }
    for (name, flavour, exe) in built {
        println!(
            "cargo:rustc-env=FIXTURE_CR_{}_{}={}",
            name.to_uppercase(),
            flavour.name().to_uppercase(),
            exe.display()
        );
    }
}
