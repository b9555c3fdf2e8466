//! Test support: C and Crystal programs built against Debian's libgc
//! (shared, and `libgc.a` linked in; the Crystal one stripped too), once
//! into `target/gc-fixtures/` and again when their source changes, and what
//! the tests read about them. They need `cc`, libgc-dev and `crystal`, which
//! `cargo xtask setup` installs.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use object::{Object, ObjectSymbol};

use crate::modules::maps;

pub const LIBGC_SO: &str = "/usr/lib/x86_64-linux-gnu/libgc.so.1";
pub const LIBGC_A: &str = "/usr/lib/x86_64-linux-gnu/libgc.a";

/// The module holding libgc in process `pid` (its libgc.so, else the
/// executable `exe`), and that module's load bias.
pub fn libgc_in(pid: u32, exe: &Path) -> (PathBuf, u64) {
    let exe = exe.canonicalize().unwrap();
    let module = maps::read(pid)
        .unwrap()
        .into_iter()
        .map(|m| m.path)
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("libgc.so")
        })
        .unwrap_or(exe);
    let bias = crate::modules::Module::open(&module)
        .unwrap()
        .load_bias(pid)
        .unwrap();
    (module, bias)
}

/// The link-time address of symbol `name` in `exe`.
pub fn symbol(exe: &Path, name: &str) -> u64 {
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file.symbols().find(|s| s.name() == Ok(name));
    symbol
        .unwrap_or_else(|| panic!("{name} in {}", exe.display()))
        .address()
}

pub fn fixtures() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/gc-fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `name` in the fixtures directory, built by `build(stamp, output)` unless
/// it was built from this very `source` already (the stamp holds the source
/// it was built from). Serialized: tests run in parallel and share fixtures.
pub fn build_once(name: &str, source: &str, build: impl FnOnce(&Path, &Path)) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fixtures();
    let out = dir.join(name);
    let stamp = dir.join(format!("{name}.source"));
    if out.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(source) {
        return out;
    }
    let tmp = dir.join(format!("{name}.tmp"));
    build(&stamp, &tmp);
    std::fs::rename(&tmp, &out).unwrap();
    out
}

pub fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[derive(Clone, Copy)]
pub enum Link {
    Shared,
    Static,
}

/// C program `source`, built as `<name>-c-shared` or `<name>-c-static`.
pub fn c_program(name: &str, source: &str, link: Link) -> PathBuf {
    let name = match link {
        Link::Shared => format!("{name}-c-shared"),
        Link::Static => format!("{name}-c-static"),
    };
    build_once(&name, source, |stamp, out| {
        let c = stamp.with_extension("c");
        std::fs::write(&c, source).unwrap();
        let mut cc = Command::new("cc");
        cc.args(["-O2", "-o"]).arg(out).arg(&c);
        match link {
            Link::Shared => cc.arg("-lgc"),
            Link::Static => cc.args([LIBGC_A, "-lpthread"]),
        };
        run(&mut cc);
        std::fs::write(stamp, source).unwrap();
    })
}

/// Crystal program `source` linked with Debian's libgc.a
/// (`<name>-crystal-static`), and a stripped copy (`<name>-crystal-stripped`).
pub fn crystal_program(name: &'static str, source: &'static str) -> (PathBuf, PathBuf) {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, (PathBuf, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    built
        .entry(name)
        .or_insert_with(|| {
            let exe = build_once(&format!("{name}-crystal-static"), source, |stamp, out| {
                let cr = stamp.with_extension("cr");
                std::fs::write(&cr, source).unwrap();
                // A directory holding only libgc.a, searched first: Crystal
                // links `-lgc` statically from it.
                let libs = fixtures().join("static-libgc");
                std::fs::create_dir_all(&libs).unwrap();
                std::fs::copy(LIBGC_A, libs.join("libgc.a")).unwrap();
                let default = Command::new("crystal")
                    .args(["env", "CRYSTAL_LIBRARY_PATH"])
                    .output()
                    .expect("crystal (cargo xtask setup installs it)");
                let default = String::from_utf8_lossy(&default.stdout).trim().to_string();
                run(Command::new("crystal")
                    .args(["build", "--no-color", "-o"])
                    .arg(out)
                    .arg(&cr)
                    .env(
                        "CRYSTAL_LIBRARY_PATH",
                        format!("{}:{default}", libs.display()),
                    ));
                std::fs::write(stamp, source).unwrap();
            });
            let stripped = build_once(&format!("{name}-crystal-stripped"), source, |stamp, out| {
                run(Command::new("strip").arg("-o").arg(out).arg(&exe));
                std::fs::write(stamp, source).unwrap();
            });
            (exe, stripped)
        })
        .clone()
}
