//! memprof runs as root on other users' processes: what it must never do
//! (execute a file of the target's, follow a planted link, leave an empty or
//! half-written file), what it must refuse in one line, and reports that a
//! hostile name cannot break.

use memprof_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The unprivileged user of these tests.
const NOBODY: &str = "65534";

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A directory anyone can write to, as `/tmp` is.
fn shared_dir(test: &str) -> TempDir {
    let dir = TempDir::new(test);
    std::fs::set_permissions(dir.join(""), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// `setpriv` running `program` as user nobody, with `caps` (e.g. "+sys_admin").
fn as_nobody(program: &Path, caps: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOBODY}"),
        "--clear-groups",
    ]);
    if !caps.is_empty() {
        command.args([
            format!("--inh-caps={caps}"),
            format!("--ambient-caps={caps}"),
        ]);
    }
    command.arg(program);
    command
}

fn chown_nobody(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(
        unsafe { libc::chown(c.as_ptr(), 65534, 65534) },
        0,
        "chown {path:?}"
    );
}

/// Compiles `source` with gcc and `flags` into `exe`.
fn gcc(source: &Path, exe: &Path, flags: &[&str]) {
    let output = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer"])
        .args(flags)
        .arg("-o")
        .arg(exe)
        .arg(source)
        .output()
        .expect("cannot run gcc");
    assert!(output.status.success(), "gcc failed\n{}", describe(&output));
}

fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/c")
        .join(name)
}

/// The dynamic linker of this machine's x86-64 programs.
fn system_ld_so() -> PathBuf {
    std::fs::canonicalize("/lib64/ld-linux-x86-64.so.2").expect("no /lib64/ld-linux-x86-64.so.2")
}

/// A user links their program with their own dynamic linker, starts it,
/// then swaps that file for a script. Root attaching to it (or asking where
/// the probes go) must not run the script: memprof reads the process's own
/// mappings and never executes a file of the target's.
#[test]
fn planted_interpreter_is_never_executed() {
    let dir = shared_dir("planted-interp");
    let ld = dir.join("myld.so");
    std::fs::copy(system_ld_so(), &ld).unwrap();
    chown_nobody(&ld);
    let app = dir.join("app");
    gcc(
        &fixture_source("attach_target.c"),
        &app,
        &[&format!("-Wl,--dynamic-linker={}", ld.display())],
    );
    let child = as_nobody(&app, "")
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start the app as nobody");
    let mut target = ChildGuard(child);
    let mut stdout = Lines::new("app stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());

    // The owner swaps their interpreter for a script.
    let marker = dir.join("marker");
    let script = dir.join("script");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    chown_nobody(&script);
    std::fs::rename(&script, &ld).unwrap();

    let pid = target.pid().to_string();
    let probes = run_ok(["probes", "--pid", &pid]);
    assert!(
        String::from_utf8_lossy(&probes.stdout).contains("malloc"),
        "{}",
        describe(&probes)
    );
    let profile = dir.join("app.mprof");
    let (mut memprof, mut stderr) = attach(&pid, &profile, &[]);
    target.signal(libc::SIGUSR1);
    stdout.wait_for("done", timeout());
    memprof.signal(libc::SIGINT);
    assert!(
        memprof.wait_timeout(timeout()).success(),
        "{:?}",
        stderr.all()
    );

    assert!(
        !marker.exists(),
        "memprof executed the target's interpreter"
    );
    let json = report_json(&profile);
    assert_eq!(
        Counts::of(group_at(&json, "libc", "make_during")),
        Counts {
            live_count: 300,
            live_bytes: 24_000,
            total_count: 300,
            total_bytes: 24_000
        }
    );
    assert!(target.is_running(), "the target did not survive");
}

/// Every output replaces a link planted at its name instead of writing
/// through it; a failed run leaves the destination as it was; nothing is
/// world-writable whatever the umask.
#[test]
fn outputs_never_follow_links_and_are_written_whole() {
    let dir = shared_dir("outputs");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let untouched = |what: &str| {
        let content = std::fs::read(&victim).unwrap();
        assert_eq!(String::from_utf8_lossy(&content), "precious", "{what}");
        assert_eq!(
            std::fs::metadata(&victim).unwrap().mode() & 0o777,
            0o600,
            "{what}"
        );
    };

    // run -o LINK, with umask 0.
    let profile = dir.join("out.mprof");
    std::os::unix::fs::symlink(&victim, &profile).unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg("umask 0; exec \"$@\"")
        .arg("sh")
        .arg(memprof_bin())
        .args([
            os("run"),
            os("-o"),
            profile.as_os_str(),
            os("--"),
            os(fixture::BASIC),
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    untouched("run -o through a link");
    let meta = std::fs::symlink_metadata(&profile).unwrap();
    assert!(meta.is_file(), "the link was not replaced");
    assert_eq!(meta.mode() & 0o777, 0o644, "profile mode with umask 0");
    let json = report_json(&profile);
    assert_eq!(
        uint(group_at(&json, "libc", "make_foo"), "/live_bytes"),
        28_800
    );

    // report -o LINK.
    let report_out = dir.join("report.md");
    std::os::unix::fs::symlink(&victim, &report_out).unwrap();
    run_ok([
        os("report"),
        profile.as_os_str(),
        os("-o"),
        report_out.as_os_str(),
    ]);
    untouched("report -o through a link");
    assert!(std::fs::read_to_string(&report_out)
        .unwrap()
        .contains("make_foo"));

    // A run that fails leaves the destination as it was, and no other file.
    let kept = dir.join("kept.mprof");
    std::fs::write(&kept, b"before").unwrap();
    let before: Vec<_> = std::fs::read_dir(dir.join("")).unwrap().collect();
    let failed = run([
        os("run"),
        os("-o"),
        kept.as_os_str(),
        os("--"),
        os(fixture::NO_LIBC),
    ]);
    assert!(!failed.status.success());
    assert_eq!(std::fs::read(&kept).unwrap(), b"before");
    assert_eq!(
        std::fs::read_dir(dir.join("")).unwrap().count(),
        before.len()
    );
}

/// A 32-bit x86 program (assembled here: `pause` in a loop).
fn program_32bit(dir: &TempDir) -> PathBuf {
    let source = dir.join("t32.s");
    std::fs::write(
        &source,
        "    .globl _start\n_start:\n    mov $29, %eax\n    int $0x80\n    jmp _start\n",
    )
    .unwrap();
    let object = dir.join("t32.o");
    let exe = dir.join("t32");
    for (program, args) in [
        (
            "as",
            vec![os("--32"), os("-o"), object.as_os_str(), source.as_os_str()],
        ),
        (
            "ld",
            vec![
                os("-m"),
                os("elf_i386"),
                os("-o"),
                exe.as_os_str(),
                object.as_os_str(),
            ],
        ),
    ] {
        let output = Command::new(program).args(args).output().unwrap();
        assert!(output.status.success(), "{program}\n{}", describe(&output));
    }
    exe
}

/// What memprof cannot profile is refused in one line, before anything is
/// attached; a script is profiled as the program it becomes.
#[test]
fn refusals_are_one_line() {
    let dir = TempDir::new("refusals");
    let fails = |args: &[&OsStr], words: &[&str]| assert_one_line_error(&run(args), words);
    fails(
        &[os("run"), os("--"), dir.join("").as_os_str()],
        &["is a directory"],
    );
    let plain = dir.join("plain.txt");
    std::fs::write(&plain, "not a program\n").unwrap();
    fails(
        &[os("run"), os("--"), plain.as_os_str()],
        &["not executable"],
    );
    fails(
        &[os("run"), os("--pid"), os("1"), os("/bin/true")],
        &["--pid", "memprof attach"],
    );
    fails(
        &[os("run"), os("--duration"), os("5"), os("/bin/true")],
        &["--duration", "memprof attach"],
    );
    let t32 = program_32bit(&dir);
    fails(
        &[os("run"), os("--"), t32.as_os_str()],
        &["32-bit", "x86-64"],
    );
    let mut target = ChildGuard(Command::new(&t32).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let pid = target.pid().to_string();
    fails(
        &[os("attach"), os("--pid"), os(&pid)],
        &["32-bit", "x86-64"],
    );
    assert!(target.is_running(), "the 32-bit program did not survive");

    // A shebang script: profiled as its interpreter, its exit code passed on.
    let script = dir.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 7\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let profile = dir.join("script.mprof");
    let output = run([
        os("run"),
        os("-o"),
        profile.as_os_str(),
        os("--"),
        script.as_os_str(),
    ]);
    assert_eq!(output.status.code(), Some(7), "{}", describe(&output));
    let json = report_json(&profile);
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    assert_eq!(json["target"]["exe"], sh.display().to_string());
    assert_eq!(json["target"]["command"][0], script.display().to_string());
}

/// Names and command lines with markup are shown as text in every table.
#[test]
fn markup_in_names_is_escaped() {
    let dir = TempDir::new("escaping");
    let profile = dir.join("esc.mprof");
    profile_run(&profile, &[fixture::ESCAPING, "a|<i>b</i>"]);
    let table = report(&profile, "markdown", &[]);
    assert!(
        table.contains("# memprof: ") && table.contains(" a\\|&lt;i&gt;b&lt;/i&gt; (pid "),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.contains("bold"))
        .unwrap_or_else(|| panic!("no row for the odd name:\n{table}"));
    assert!(
        row.starts_with("|             100 |                 6,400 | `")
            && row.contains("escaping.c:19 in 'make\\|<b>bold</b>'x'*y*'`"),
        "{row}"
    );
    // Three cell borders, none inside the cells (the program's frame, the stack).
    assert_eq!(row.matches(" | ").count(), 3, "{row}");
    let types = report(&profile, "types", &[]);
    assert!(
        types.contains(
            "|          100 |      6,400 | in make\\|&lt;b&gt;bold&lt;/b&gt;\\`x\\`\\*y\\* (escaping.c:19) |"
        ),
        "{types}"
    );
    let tsv = report(&profile, "tsv", &[]);
    let line = tsv.lines().find(|l| l.contains("bold")).unwrap();
    assert!(line.starts_with("100\t6400\t"), "{line}");
}

/// A changed byte anywhere in a profile is refused; a report cut short by
/// its reader is not an error.
#[test]
fn corrupt_profiles_and_closed_pipes() {
    let dir = TempDir::new("corrupt");
    let profile = dir.join("basic.mprof");
    profile_run(&profile, &[fixture::BASIC]);
    let bytes = std::fs::read(&profile).unwrap();
    // A digit changed inside the JSON: still valid JSON, wrong totals.
    let text = String::from_utf8(bytes.clone()).unwrap();
    let at = text
        .find("\"live_bytes\":28800")
        .expect("make_foo's live bytes")
        + 14;
    let mut flipped = bytes.clone();
    flipped[at] = b'9';
    let path = dir.join("flipped.mprof");
    std::fs::write(&path, &flipped).unwrap();
    assert_one_line_error(
        &run([os("report"), path.as_os_str()]),
        &["corrupt", "checksum"],
    );

    // `memprof report … | head -c 10`
    let mut child = memprof([
        os("report"),
        profile.as_os_str(),
        os("--format"),
        os("json"),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = [0u8; 10];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");

    assert_one_line_error(
        &run([
            os("report"),
            os("--diff"),
            profile.as_os_str(),
            profile.as_os_str(),
            os("--format"),
            os("html"),
        ]),
        &["markdown or json, not html"],
    );
}

/// Capabilities, not uid 0: user nobody holding CAP_SYS_ADMIN and
/// CAP_SYS_PTRACE profiles exactly what root does.
#[test]
fn capabilities_not_uid() {
    let dir = shared_dir("caps");
    let profile = dir.join("basic.mprof");
    let output = as_nobody(&memprof_bin(), "+sys_admin,+sys_ptrace")
        .args([
            os("run"),
            os("-o"),
            profile.as_os_str(),
            os("--"),
            os(fixture::BASIC),
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let json = report_json(&profile);
    assert_eq!(
        Counts::of(group_at(&json, "libc", "make_foo")),
        Counts {
            live_count: 600,
            live_bytes: 28_800,
            total_count: 1_000,
            total_bytes: 48_000
        }
    );
    assert_eq!(std::fs::metadata(&profile).unwrap().uid(), 65534);
}

/// SIGINT or SIGTERM at any moment of an attach ends it cleanly: a
/// complete profile (or one error line), the target running and untraced;
/// SIGKILL leaves no file at all.
#[test]
fn signals_at_any_moment() {
    let dir = TempDir::new("signals");
    for (i, (signal, delay_ms)) in [
        (libc::SIGINT, 0),
        (libc::SIGTERM, 5),
        (libc::SIGINT, 30),
        (libc::SIGTERM, 100),
        (libc::SIGINT, 300),
        (libc::SIGKILL, 0),
        (libc::SIGKILL, 50),
        (libc::SIGKILL, 300),
    ]
    .into_iter()
    .enumerate()
    {
        let child = Command::new(fixture::ATTACH_TARGET)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut target = ChildGuard(child);
        let mut stdout = Lines::new("attach_target stdout", target.0.stdout.take().unwrap());
        stdout.wait_for("ready", timeout());
        let profile = dir.join(&format!("p{i}.mprof"));
        let pid = target.pid().to_string();
        let (mut memprof, stderr) = spawn_attach(&pid, &profile, &[]);
        if signal != libc::SIGKILL {
            // From the moment memprof has taken over SIGINT and SIGTERM
            // (before that, like any program, they end it by default).
            wait_blocked(memprof.pid(), signal);
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        memprof.signal(signal);
        let status = memprof.wait_timeout(timeout());
        let what = format!("signal {signal} after {delay_ms} ms");
        if signal == libc::SIGKILL {
            assert!(!profile.exists(), "{what}: a file was left");
        } else {
            assert!(
                status.success() || status.code() == Some(1),
                "{what}: {status}"
            );
            if profile.exists() {
                report_json(&profile);
            } else {
                let mut stderr = stderr;
                let errors = stderr.all();
                assert!(
                    errors.iter().any(|l| l.starts_with("memprof: error:")),
                    "{what}: no profile and no error: {errors:?}"
                );
            }
        }
        let leftovers: Vec<_> = std::fs::read_dir(dir.join(""))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".mprof"))
            .collect();
        assert!(leftovers.is_empty(), "{what}: left {leftovers:?}");
        // The target runs on, untraced.
        std::thread::sleep(Duration::from_millis(50));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains("TracerPid:\t0\n"), "{what}: still traced");
        assert!(target.is_running(), "{what}: the target died");
        target.signal(libc::SIGUSR1);
        stdout.wait_for("done", timeout());
    }
}

/// Waits until process `pid` blocks `signal` (its `SigBlk` mask).
fn wait_blocked(pid: i32, signal: i32) {
    let deadline = std::time::Instant::now() + timeout();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if blocked & (1 << (signal - 1)) != 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} never blocked signal {signal}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
