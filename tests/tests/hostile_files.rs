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
    // One session at a time: an `--all` one reads the rows of every
    // program another test starts meanwhile (5 of 440,000 rows took
    // its peak from 200 to 315 MB), and counts them in the user's share.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
    stderr.wait_for("profiling every process", timeout());
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

/// [`SOURCE`] that, given an argument, holds its blocks until its stdin
/// closes (saying `ready` first), with a function of `rows` unwind rows
/// (each `nop` its own CFA rule) beside it, never called.
fn rowful_program(dir: &Path, name: &str, rows: usize) -> PathBuf {
    let source = dir.join(format!("{name}.c"));
    std::fs::write(
        &source,
        r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) void *hostile_alloc(int n) {
    return malloc(n);
}
int main(int argc, char **argv) {
    for (int i = 0; i < 100; i++)
        hostile_alloc(1000);
    if (argc > 1) {
        char c;
        printf("ready\n");
        fflush(stdout);
        while (read(0, &c, 1) > 0) {}
    }
    return 0;
}
"#,
    )
    .unwrap();
    let mut asm = String::with_capacity(rows * 32 + 200);
    asm.push_str(".text\n.globl big_rows\n.type big_rows,@function\nbig_rows:\n.cfi_startproc\n");
    for i in 0..rows {
        asm.push_str(if i % 2 == 0 {
            "nop\n.cfi_adjust_cfa_offset 8\n"
        } else {
            "nop\n.cfi_adjust_cfa_offset -8\n"
        });
    }
    asm.push_str("ret\n.cfi_endproc\n");
    let asm_file = dir.join(format!("{name}.s"));
    std::fs::write(&asm_file, asm).unwrap();
    let object = dir.join(format!("{name}.o"));
    tool(
        "gcc",
        &[
            "-c",
            asm_file.to_str().unwrap(),
            "-o",
            object.to_str().unwrap(),
        ],
    );
    let exe = dir.join(name);
    tool(
        "gcc",
        &[
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            "-o",
            exe.to_str().unwrap(),
            source.to_str().unwrap(),
            object.to_str().unwrap(),
        ],
    );
    exe
}

/// `exe` started as nobody holding its blocks (it said `ready`): ends
/// when dropped.
struct Holder(ChildGuard);

impl Holder {
    fn start(exe: &Path) -> Holder {
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(exe)
            .arg("hold")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = Lines::new("holder", child.stdout.take().unwrap());
        out.wait_for("ready", timeout());
        Holder(ChildGuard(child))
    }

    /// Its stdin closed: it ends; its pid.
    fn end(mut self) -> u64 {
        drop(self.0 .0.stdin.take());
        let status = self.0.wait_timeout(timeout());
        assert!(status.success(), "holder: {status}");
        self.0.pid() as u64
    }
}

/// The group of process `pid` at `hostile_alloc` is exact and whole:
/// 100 blocks of 1,000 bytes, not truncated, down to `_start`.
fn assert_whole(json: &serde_json::Value, pid: u64, what: &str) {
    fixture_frame(json, pid);
    let group = groups_at(json, "libc", "hostile_alloc")
        .into_iter()
        .find(|g| uint(g, "/pid") == pid)
        .unwrap();
    let frames = functions(group);
    assert_eq!(group["truncated"], false, "{what}: {frames:?}");
    assert_eq!(frames.last(), Some(&"_start"), "{what}: {frames:?}");
}

/// One user's programs with big unwind tables (5 of 900,000 rows, more
/// than the kernel's table of 4,194,304 holds) hold no more than half of
/// it: a program of root's with 800,000 rows started after them still
/// gets its rows, and its stack is whole. The user's first two programs
/// get rows; the others are said, and unwound by memprof itself. Once the
/// user's programs have ended, their rows are let go for another of
/// theirs, started later: it gets the room.
#[test]
fn one_users_files_hold_half_of_the_unwind_table() {
    let dir = TempDir::new("hostile_rows");
    let first = rowful_program(&dir.join(""), "rowful", 900_000);
    let mut copies = vec![first.clone()];
    for i in 1..6 {
        let copy = dir.join(&format!("rowful{i}"));
        std::fs::copy(&first, &copy).unwrap();
        copies.push(copy);
    }
    give_to_nobody(&dir.join(""));
    let roots = TempDir::new("root_rows");
    let root_program = rowful_program(&roots.join(""), "roots", 800_000);
    let mut pids = Vec::new();
    let mut root_pid = 0;
    let mut later = 0;
    let seen = profile_while(&dir, &["--all"], || {
        let holders: Vec<Holder> = copies[..5].iter().map(|c| Holder::start(c)).collect();
        let mut root = Command::new(&root_program).spawn().unwrap();
        assert!(root.wait().unwrap().success());
        root_pid = u64::from(root.id());
        pids = holders.into_iter().map(Holder::end).collect();
        // Their rows no longer named (unused 5 s, looked at every 2 s):
        // let go for the room the next of theirs wants.
        std::thread::sleep(Duration::from_secs(9));
        later = run_as_nobody(&copies[5]);
    });
    assert_whole(&seen.json, root_pid, "root's program");
    // Its rows in the kernel's table (memprof finishes the stacks of a
    // file refused, but cannot in time for a short process on a busy
    // machine): refused, it is said.
    assert_eq!(
        said(&seen.stderr, &["roots", "gets no unwind rows"]),
        0,
        "{:#?}",
        seen.stderr
    );
    for &pid in &pids {
        assert_whole(&seen.json, pid, "a user's program");
    }
    assert_whole(&seen.json, later, "the user's program after");
    assert_eq!(
        said(&seen.stderr, &["gets no unwind rows", "user 65534"]),
        1,
        "{:#?}",
        seen.stderr
    );
    assert!(
        seen.stderr
            .iter()
            .any(|l| l.contains("files got no unwind rows: over their owner's share")),
        "{:#?}",
        seen.stderr
    );
}

/// A user's program with more unwind rows than a file may have
/// (2,700,000, the most 2,097,152): refused while read, before its rows
/// cost much memory (memprof stays under 300 MB); its allocations are counted
/// exactly (its stack cut at the file), and a program started after it is
/// exact and whole.
#[test]
fn a_file_with_too_many_unwind_rows_is_refused_while_read() {
    let dir = TempDir::new("hostile_too_many_rows");
    let exe = rowful_program(&dir.join(""), "toomany", 2_700_000);
    give_to_nobody(&dir.join(""));
    let roots = TempDir::new("root_after_too_many");
    let after = rowful_program(&roots.join(""), "after", 10);
    let (mut hostile, mut later) = (0, 0);
    let seen = profile_while(&dir, &["--all"], || {
        hostile = run_as_nobody(&exe);
        let mut child = Command::new(&after).spawn().unwrap();
        assert!(child.wait().unwrap().success());
        later = u64::from(child.id());
    });
    fixture_frame(&seen.json, hostile);
    assert_whole(&seen.json, later, "the program after");
    assert!(
        said(&seen.stderr, &["toomany", "gets no unwind rows", "2097152"]) == 1,
        "{:#?}",
        seen.stderr
    );
    eprintln!("memprof's peak: {} KiB", seen.peak_kib);
    assert!(seen.peak_kib < 300 * 1024, "peak {} KiB", seen.peak_kib);
}

/// `data` through zlib stream `c` with `flush`, all of its output.
fn deflate(c: &mut flate2::Compress, data: &[u8], flush: flate2::FlushCompress) -> Vec<u8> {
    let mut out = Vec::new();
    let start = c.total_in();
    loop {
        out.reserve(1 << 20);
        let consumed = (c.total_in() - start) as usize;
        let status = c.compress_vec(&data[consumed..], &mut out, flush).unwrap();
        let all_in = (c.total_in() - start) as usize == data.len();
        if status == flate2::Status::StreamEnd || (all_in && out.len() < out.capacity()) {
            return out;
        }
    }
}

/// A real zlib stream of `gib` GiB of zeros, ~1 MB a GiB: blocks of 64
/// MiB flushed whole (each the same, referring to nothing before it),
/// repeated, and the checksum of the whole.
fn zeros_zlib(gib: u64) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    const BLOCK: u64 = 64 << 20;
    let zeros = vec![0u8; BLOCK as usize];
    let mut c = Compress::new(Compression::best(), true);
    let mut stream = deflate(&mut c, &zeros, FlushCompress::Full);
    let again = deflate(&mut c, &zeros, FlushCompress::Full);
    for _ in 2..(gib << 30) / BLOCK {
        stream.extend_from_slice(&again);
    }
    stream.extend_from_slice(&again);
    let mut end = deflate(&mut c, &[], FlushCompress::Finish);
    // Adler-32 of n zeros: a = 1, b = n mod 65521.
    let adler = (((gib << 30) % 65521) << 16 | 1) as u32;
    let at = end.len() - 4;
    end[at..].copy_from_slice(&adler.to_be_bytes());
    stream.extend_from_slice(&end);
    stream
}

/// A real zlib bomb: `.debug_info` 4 GiB of zeros in 4 MB, claiming
/// its size (more than memprof reads), then claiming 1 MiB (within the
/// budgets, but blazesym inflates a section whole whatever it claims:
/// memprof went to 4.23 GB). Not read either time (said once), memprof
/// under 300 MB, the function named from `.symtab`.
#[test]
fn a_zlib_bomb_is_not_inflated() {
    let stream = zeros_zlib(4);
    for (claimed, words) in [
        (4u64 << 30, ["claims", "4.0 GiB"]),
        (1 << 20, ["inflates to more than it claims", "1.0 MiB"]),
    ] {
        let (dir, exe) = users_program("hostile-bomb", "bomb", &["-gz=zlib"]);
        // Elf64_Chdr: ELFCOMPRESS_ZLIB, its size, its alignment.
        let mut section = Vec::with_capacity(stream.len() + 24);
        section.extend_from_slice(&1u32.to_le_bytes());
        section.extend_from_slice(&0u32.to_le_bytes());
        section.extend_from_slice(&claimed.to_le_bytes());
        section.extend_from_slice(&1u64.to_le_bytes());
        section.extend_from_slice(&stream);
        let contents = dir.join("debug_info.bin");
        std::fs::write(&contents, section).unwrap();
        let update = format!(".debug_info={}", contents.to_str().unwrap());
        tool(
            "objcopy",
            &["--update-section", &update, exe.to_str().unwrap()],
        );
        give_to_nobody(&dir.join(""));
        let mut pid = 0;
        let seen = profile_while(&dir, &["--comm", "bomb"], || pid = run_as_nobody(&exe));
        let frame = fixture_frame(&seen.json, pid);
        assert_eq!(frame["function"], "hostile_alloc", "{frame}");
        let mut words = words.to_vec();
        words.extend(["bomb", ".debug_info", "not read"]);
        assert_eq!(said(&seen.stderr, &words), 1, "{:#?}", seen.stderr);
        assert!(
            seen.peak_kib < 300 << 10,
            "memprof peaked at {} KiB",
            seen.peak_kib
        );
    }
}
