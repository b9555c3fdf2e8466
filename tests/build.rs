//! Compiles the C fixtures (`fixtures/c/*.c`) into OUT_DIR and exports each
//! path as `FIXTURE_<NAME>` (e.g. `FIXTURE_BASIC`), read with `env!` in
//! `src/lib.rs`.

#[path = "fixtures/compile.rs"]
mod compile;

use std::path::{Path, PathBuf};

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
}
