//! `memprof attach --all` beside a process that loads and unloads a
//! library all the time: its loads are read at a bounded rate, and the
//! programs the others start are each in the profile, exact, as without
//! it.

use memprof_tests::every_process::*;
use memprof_tests::*;
use std::path::Path;
use std::process::Command;

/// Loads and unloads the library of its first argument 25 times a
/// second (4 `_dl_debug_state` calls each), until SIGUSR1 (exit 0).
const CHURNER: &str = r#"
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

static volatile sig_atomic_t stop;

static void on_usr1(int sig) {
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv) {
    struct timespec pause = {0, 40 * 1000 * 1000};
    signal(SIGUSR1, on_usr1);
    while (!stop) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        dlclose(lib);
        nanosleep(&pause, NULL);
    }
    return 0;
}
"#;

/// The library it loads: one function, no allocation.
const TINY: &str = "int tiny(int x) { return x + 1; }\n";

/// Compiles C `source` with gcc and `flags` into `out`.
fn gcc(dir: &TempDir, source: &str, out: &Path, flags: &[&str]) {
    let file = dir.join(&format!("{}.c", out.file_name().unwrap().to_string_lossy()));
    std::fs::write(&file, source).unwrap();
    let output = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(&file)
        .output()
        .expect("cannot run gcc");
    assert!(output.status.success(), "gcc failed\n{}", describe(&output));
}

/// The issue's case: a process loading and unloading a small library 25
/// times a second blinded memprof to every other process (0 of 300
/// short programs right). Beside it, 100 runs of a short program (new to
/// memprof) are each in the profile under their own pid and name, with
/// their exact counts and whole stacks; the churner is there too, and
/// the end says how many of its loads were read together.
#[test]
fn a_library_churner_blinds_no_one() {
    let dir = TempDir::new("churn");
    let library = dir.join("libtiny.so");
    gcc(&dir, TINY, &library, &["-shared", "-fPIC"]);
    let churner = dir.join("churner");
    gcc(&dir, CHURNER, &churner, &["-ldl"]);
    let short = dir.join("shorty");
    std::fs::copy(fixture::BASIC, &short).unwrap();
    let short = short.to_str().unwrap().to_string();
    let profile = dir.join("churn.mprof");

    let (memprof, stderr, _) = start_all(&profile, &["--sample-bytes", "0"]);

    let churning = ChildGuard(
        Command::new(&churner)
            .arg(&library)
            .spawn()
            .expect("cannot start the churner"),
    );
    // A second of loads (100 `_dl_debug_state` calls) before the others.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let pids: Vec<u32> = (0..100).map(|_| run_to_end(&short, &[])).collect();
    let mut churning = churning;
    assert!(churning.is_running(), "the churner stopped early");
    churning.signal(libc::SIGUSR1);
    assert!(
        churning.wait_timeout(timeout()).success(),
        "the churner failed"
    );
    let churner_pid = churning.pid() as u32;

    let (json, said) = stop_with_stderr(memprof, stderr, &profile);
    assert!(
        said.lines().any(|l| l.contains("library loads and unloads")
            && l.contains("read together with a later one of their process")),
        "{said}"
    );
    let exact = pids
        .iter()
        .filter(|&&pid| {
            std::panic::catch_unwind(|| assert_exact_basic(&json, pid, "shorty", &short)).is_ok()
        })
        .count();
    assert_eq!(exact, 100, "of 100 runs beside the churner");
    let p = process(&json, churner_pid);
    assert_eq!(p["comm"], "churner", "{p:#}");
    assert_eq!(p["exit"]["code"], 0, "{p:#}");
}
