//! Files a user controls, read by root's system-wide memprof: a debug link
//! or a `.dwp` that is a FIFO, a separate debug file, compressed sections
//! that claim a terabyte, a program truncated after memprof opened it.
//! Each fixture is a user's (owned by and run as nobody, in nobody's
//! directory), each run is `attach --comm` or `--all`, and memprof must end
//! on its own terms, within 2 s of SIGTERM, with the exact profile.

use memprof_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SOURCE: &str = r#"#include <stdlib.h>
__attribute__((noinline)) void *hostile_alloc(int n) {
    return malloc(n);
}
int main(void) {
    for (int i = 0; i < 100; i++)
        hostile_alloc(1000);
    return 0;
}
"#;
/// The line of `malloc` in [`SOURCE`].
const ALLOC_LINE: u64 = 3;
/// What the fixture keeps: 100 blocks of 1,000 bytes.
const BLOCKS: u64 = 100;
const BYTES: u64 = 100_000;

/// A directory of nobody's, with the fixture compiled in it as `name`
/// (gcc `flags` added), owned by nobody.
fn users_program(test: &str, name: &str, flags: &[&str]) -> (TempDir, PathBuf) {
    let dir = TempDir::new(test);
    let source = dir.join("hostile.c");
    std::fs::write(&source, SOURCE).unwrap();
    let exe = dir.join(name);
    let output = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .output()
        .unwrap();
    assert!(output.status.success(), "gcc: {}", describe(&output));
    (dir, exe)
}

fn tool(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        describe(&output)
    );
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    tool("mkfifo", &[path.to_str().unwrap()]);
}

/// Gives `dir` and everything in it to nobody.
fn give_to_nobody(dir: &Path) {
    tool("chown", &["-R", "65534:65534", dir.to_str().unwrap()]);
}

/// Runs `exe` as nobody to its end; its pid.
fn run_as_nobody(exe: &Path) -> u64 {
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(exe)
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{exe:?} as nobody: {status}");
    u64::from(child.id())
}

/// What [`profile_while`] saw.
struct Seen {
    json: serde_json::Value,
    stderr: Vec<String>,
    /// memprof's peak resident memory, KiB.
    peak_kib: u64,
}

/// memprof `selection` (e.g. `--comm NAME` or `--all`) while `between` runs
/// (fixtures as nobody); ended by SIGTERM, which it must obey within 2 s
/// (every BPF program it loaded gone), then writes its profile.
fn profile_while(dir: &TempDir, selection: &[&str], between: impl FnOnce()) -> Seen {
    let profile = dir.join("hostile.mprof");
    let mut args = vec!["attach"];
    args.extend(selection);
    args.extend(["--sample-bytes", "0", "-o", profile.to_str().unwrap()]);
    let child = memprof(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof attach", memprof.0.stderr.take().unwrap());
    stderr.wait_for("profiling every process", TIMEOUT);
    between();
    // Its events read (the fixtures ended before this).
    std::thread::sleep(Duration::from_millis(500));
    let pid = memprof.pid();
    let programs = bpf_of(pid, "prog_id:");
    assert!(!programs.is_empty(), "memprof holds no BPF program");
    assert!(
        !bpf_of(pid, "link_id:").is_empty(),
        "memprof holds no BPF link"
    );
    let asked = Instant::now();
    memprof.signal(libc::SIGTERM);
    // Its probes detached (every link closed) within 2 s; the profile
    // written after.
    while !bpf_of(pid, "link_id:").is_empty() && asked.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = asked.elapsed();
    let (status, peak_kib) = wait_with_peak(pid, Duration::from_secs(120));
    std::mem::forget(memprof);
    let stderr = stderr.all();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}: {stderr:#?}"
    );
    // Freed once the last reference goes, after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(5);
    while programs.iter().any(|&id| program_exists(id)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = programs
        .into_iter()
        .filter(|&id| program_exists(id))
        .collect();
    assert_eq!(left, Vec::<u32>::new(), "BPF programs left loaded");
    assert!(
        took < Duration::from_secs(2),
        "probes attached {took:?} after SIGTERM: {stderr:#?}"
    );
    Seen {
        json: report_json(&profile),
        stderr,
        peak_kib,
    }
}

/// The ids of the BPF objects process `pid` holds descriptors of, by
/// their fdinfo's `key` (`prog_id:`, `link_id:`); none once it exited.
fn bpf_of(pid: i32, key: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some(id) = text
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
        {
            ids.push(id);
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

/// Whether BPF program `id` is still loaded (`BPF_PROG_GET_FD_BY_ID`).
fn program_exists(id: u32) -> bool {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: `attr` is the union's prefix this command reads, with its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor just returned to us.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT)
}

/// Reaps child `pid`: its wait status and peak resident memory (KiB).
fn wait_with_peak(pid: i32, timeout: Duration) -> (i32, u64) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: plain out-parameters.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            return (status, usage.ru_maxrss as u64);
        }
        assert!(
            Instant::now() < deadline,
            "memprof still running after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The fixture's one group: its exact blocks and bytes, first frame
/// `hostile_alloc`. Returns that frame.
fn fixture_frame(json: &serde_json::Value, pid: u64) -> serde_json::Value {
    let found: Vec<&serde_json::Value> = groups_at(json, "libc", "hostile_alloc")
        .into_iter()
        .filter(|g| uint(g, "/pid") == pid)
        .collect();
    assert_eq!(found.len(), 1, "{}", list_groups(json));
    let counts = Counts::of(found[0]);
    assert_eq!(
        (counts.live_count, counts.live_bytes),
        (BLOCKS, BYTES),
        "{}",
        list_groups(json)
    );
    found[0]["frames"][0].clone()
}

fn said(lines: &[String], words: &[&str]) -> usize {
    lines
        .iter()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

/// A stripped program whose `.gnu_debuglink` names a FIFO beside it: the
/// FIFO is skipped (said once), the function named from `.symtab`.
#[test]
fn a_fifo_named_by_a_debug_link_is_skipped() {
    for selection in [&["--comm", "fifolink"][..], &["--all"][..]] {
        let (dir, exe) = users_program("hostile-fifolink", "fifolink", &[]);
        let debug = dir.join("fifolink.debug");
        let (exe_s, debug_s) = (exe.to_str().unwrap(), debug.to_str().unwrap());
        tool("objcopy", &["--only-keep-debug", exe_s, debug_s]);
        tool("strip", &["--strip-debug", exe_s]);
        tool(
            "objcopy",
            &[&format!("--add-gnu-debuglink={debug_s}"), exe_s],
        );
        mkfifo(&debug);
        give_to_nobody(&dir.join(""));
        let mut pid = 0;
        let seen = profile_while(&dir, selection, || pid = run_as_nobody(&exe));
        let frame = fixture_frame(&seen.json, pid);
        assert_eq!(frame["function"], "hostile_alloc", "{frame}");
        assert_eq!(
            said(&seen.stderr, &["fifolink.debug", "a FIFO, not read"]),
            1,
            "{selection:?}: {:#?}",
            seen.stderr
        );
    }
}

/// A program with its DWARF, and a FIFO `PROGRAM.dwp` beside it: never
/// opened; the line comes from the program's own DWARF.
#[test]
fn a_fifo_dwp_beside_the_program_is_never_opened() {
    {
        let selection = &["--comm", "fifodwp"][..];
        let (dir, exe) = users_program("hostile-fifodwp", "fifodwp", &[]);
        mkfifo(&dir.join("fifodwp.dwp"));
        give_to_nobody(&dir.join(""));
        let mut pid = 0;
        let seen = profile_while(&dir, selection, || pid = run_as_nobody(&exe));
        let frame = fixture_frame(&seen.json, pid);
        assert_eq!(frame["function"], "hostile_alloc", "{frame}");
        assert_eq!(frame["line"], ALLOC_LINE, "{frame}");
    }
}

/// A user's program with its debug info split off beside it, as
/// `objcopy --only-keep-debug` makes it: followed by memprof (CRC checked),
/// names and lines back.
#[test]
fn a_users_separate_debug_file_gives_the_lines() {
    let (dir, exe) = users_program("hostile-debugfile", "debugfile", &[]);
    let debug = dir.join("debugfile.debug");
    let (exe_s, debug_s) = (exe.to_str().unwrap(), debug.to_str().unwrap());
    tool("objcopy", &["--only-keep-debug", exe_s, debug_s]);
    tool("strip", &["--strip-all", exe_s]);
    tool(
        "objcopy",
        &[&format!("--add-gnu-debuglink={debug_s}"), exe_s],
    );
    give_to_nobody(&dir.join(""));
    let mut pid = 0;
    let seen = profile_while(&dir, &["--comm", "debugfile"], || pid = run_as_nobody(&exe));
    let frame = fixture_frame(&seen.json, pid);
    assert_eq!(
        frame["function"], "hostile_alloc",
        "{frame} {:#?}",
        seen.stderr
    );
    assert_eq!(frame["line"], ALLOC_LINE, "{frame}");
}

/// Patches the uncompressed size that `exe`'s compressed `.debug_info`
/// claims (its `Elf64_Chdr.ch_size`) to `claimed`.
fn claim(exe: &Path, claimed: u64) {
    let output = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(" .debug_info "))
        .unwrap_or_else(|| panic!("no .debug_info in {exe:?}: {text}"));
    // [Nr] Name Type Address Off Size ES Flg …: Off is the 4th field after the name.
    let fields: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
    assert!(fields[6].contains('C'), "not compressed: {line}");
    let offset = u64::from_str_radix(fields[3], 16).unwrap();
    let mut bytes = std::fs::read(exe).unwrap();
    let at = offset as usize + 8;
    bytes[at..at + 8].copy_from_slice(&claimed.to_le_bytes());
    std::fs::write(exe, bytes).unwrap();
}

/// Compressed `.debug_info` claiming 1 TiB, then 2^64 − 1 bytes: not read
/// (said once), memprof lives, the function named from `.symtab`.
#[test]
fn compressed_sections_claiming_terabytes_are_not_read() {
    for (claimed, shown) in [(1u64 << 40, "1024.0 GiB"), (u64::MAX, "GiB")] {
        let (dir, exe) = users_program("hostile-claims", "claims", &["-gz=zlib"]);
        claim(&exe, claimed);
        give_to_nobody(&dir.join(""));
        let mut pid = 0;
        let seen = profile_while(&dir, &["--comm", "claims"], || pid = run_as_nobody(&exe));
        let frame = fixture_frame(&seen.json, pid);
        assert_eq!(frame["function"], "hostile_alloc", "{frame}");
        assert_eq!(
            said(&seen.stderr, &["claims", ".debug_info", shown, "not read"]),
            1,
            "{:#?}",
            seen.stderr
        );
        assert!(
            seen.peak_kib < 300 << 10,
            "memprof peaked at {} KiB",
            seen.peak_kib
        );
    }
}

/// A user's 99 MB program truncated to 64 KiB after memprof opened it (the
/// process ended, memprof reads its names at the end): memprof lives and
/// profiles the other program exactly; the truncated one keeps its figures.
#[test]
fn a_program_truncated_under_memprof_is_an_error_for_that_file_only() {
    let (dir, exe) = users_program("hostile-truncated", "truncated", &[]);
    let pad = dir.join("pad");
    std::fs::write(&pad, vec![0x5au8; 99 << 20]).unwrap();
    let exe_s = exe.to_str().unwrap();
    tool(
        "objcopy",
        &["--add-section", &format!(".pad={}", pad.display()), exe_s],
    );
    std::fs::remove_file(&pad).unwrap();
    let other = dir.join("untouched");
    std::fs::copy(&exe, &other).unwrap();
    give_to_nobody(&dir.join(""));
    let mut pids = (0u64, 0u64);
    let seen = profile_while(
        &dir,
        &["--comm", "truncated", "--comm", "untouched"],
        || {
            pids = (run_as_nobody(&exe), run_as_nobody(&other));
            let status = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .args(["truncate", "-s", "64K"])
                .arg(&exe)
                .status()
                .unwrap();
            assert!(status.success());
        },
    );
    let json = &seen.json;
    let frame = fixture_frame(json, pids.1);
    assert_eq!(
        frame["function"], "hostile_alloc",
        "{frame} {:#?}",
        seen.stderr
    );
    // The truncated program's blocks are all there, whatever its names.
    let truncated: Vec<&serde_json::Value> = groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == pids.0)
        .collect();
    assert_eq!(truncated.len(), 1, "{}", list_groups(json));
    let counts = Counts::of(truncated[0]);
    assert_eq!((counts.live_count, counts.live_bytes), (BLOCKS, BYTES));
    assert!(
        seen.peak_kib < 300 << 10,
        "memprof peaked at {} KiB",
        seen.peak_kib
    );
}
