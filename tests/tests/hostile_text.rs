//! Text from users is data: a process of user nobody whose file name and
//! command line carry terminal escapes (`\e]0;…\a` sets a terminal's title,
//! `\e[2J` clears it), a `|` (a markdown cell's end) and a Latin-1 byte.
//! Root profiles it: no ESC or BEL byte reaches memprof's stdout, stderr,
//! reports or `top`'s screen (the escapes are shown as `\u{1b}`, the
//! Latin-1 byte as `\xe9`), tables keep their columns, and the process is
//! profiled, not refused for its name.

use memprof_tests::*;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The program's file name: the kernel's name of the process (`comm`) is
/// its first 15 bytes, `ev\e]0;pwned\a\e[2`; the Latin-1 byte is past them.
const NAME: &[u8] = b"ev\x1b]0;pwned\x07\x1b[2J|\xe9x";
/// How memprof shows [`NAME`].
const NAME_SHOWN: &str = r"ev\u{1b}]0;pwned\u{7}\u{1b}[2J|\xe9x";
/// Its source file's name, which the frames carry (`file:line`).
const SOURCE: &[u8] = b"src\x1b[2J|\x07.c";
/// An argument.
const ARG: &[u8] = b"a\x1b]0;argv\x07|\xe9";

/// A directory nobody can write to and read, with the fixture built from
/// `attach_target.c` (100 x malloc(64) at make_before, then "ready"; each
/// SIGUSR1: 300 x malloc(80) at make_during, then "done") under the
/// hostile names. Built by gcc itself (a copy written by this process could
/// be held open by a child another test forks: ETXTBSY at its exec).
fn hostile_program(test: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(test);
    std::fs::set_permissions(dir.join(""), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let source = dir.join("").join(std::ffi::OsStr::from_bytes(SOURCE));
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/c/attach_target.c");
    std::fs::copy(fixture, &source).unwrap();
    let exe = dir.join("").join(std::ffi::OsStr::from_bytes(NAME));
    let built = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&source)
        .output()
        .expect("cannot run gcc");
    assert!(built.status.success(), "gcc failed\n{}", describe(&built));
    (dir, exe)
}

/// The program started as user nobody with [`ARG`], once it said "ready".
fn start_as_nobody(exe: &Path) -> (ChildGuard, Lines) {
    let mut child = ChildGuard(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(exe)
            .arg(OsString::from_vec(ARG.to_vec()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot run setpriv"),
    );
    let mut said = Lines::new("target stdout", child.0.stdout.take().unwrap());
    said.wait_for("ready", timeout());
    (child, said)
}

/// memprof with `args`, its stderr to `log` (read as bytes, not lines).
fn spawn_logged(args: &[&std::ffi::OsStr], log: &Path) -> ChildGuard {
    let file = std::fs::File::create(log).unwrap();
    ChildGuard(
        memprof(args)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("cannot start memprof"),
    )
}

/// Waits until `log` has `needle`.
fn wait_in(log: &Path, needle: &str) {
    let deadline = Instant::now() + timeout();
    loop {
        let text = std::fs::read(log).unwrap_or_default();
        if String::from_utf8_lossy(&text).contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in memprof's stderr:\n{}",
            String::from_utf8_lossy(&text)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No ESC, BEL or C1 control (UTF-8 `c2 80`..`c2 9f`) in `bytes`: none of
/// the target's escapes came through.
fn assert_inert(what: &str, bytes: &[u8]) {
    let c1 = bytes
        .windows(2)
        .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]));
    assert!(
        !bytes.contains(&0x1b) && !bytes.contains(&0x07) && !c1,
        "{what} carries the target's control bytes:\n{}",
        String::from_utf8_lossy(bytes).escape_debug()
    );
}

/// The `|` of `row` that are cell borders (not `\|`).
fn borders(row: &str) -> usize {
    let bytes = row.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\'))
        .count()
}

/// Every row of every table of `markdown` has as many borders as its header.
fn assert_tables_whole(markdown: &str) {
    let mut header: Option<usize> = None;
    for line in markdown.lines() {
        if !line.starts_with('|') {
            header = None;
            continue;
        }
        match header {
            None => header = Some(borders(line)),
            Some(n) => assert_eq!(borders(line), n, "a row broken:\n{line}\n\n{markdown}"),
        }
    }
}

/// `memprof report PROFILE --format FORMAT`'s bytes (not read as UTF-8).
fn report_bytes(profile: &Path, format: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec![
        OsStr::new("report"),
        profile.as_os_str(),
        OsStr::new("--format"),
        OsStr::new(format),
    ];
    args.extend(extra.iter().map(OsStr::new));
    let out = run_ok(args);
    assert_inert(&format!("report {format}'s stderr"), &out.stderr);
    out.stdout
}

/// `attach --pid`: the process is profiled (its mapped file's name is not
/// UTF-8), and every report shows the names escaped: markdown with whole
/// rows, tsv, folded, pprof (labels and functions, read back with `go tool
/// pprof`).
#[test]
fn attach_pid_profiles_it_and_every_report_shows_its_names_escaped() {
    let (dir, exe) = hostile_program("hostile_attach");
    let (target, mut said) = start_as_nobody(&exe);
    let profile = dir.join("hostile.mprof");
    let log = dir.join("attach.log");
    let pid = target.pid().to_string();
    let mut attach = spawn_logged(
        &[
            OsStr::new("attach"),
            OsStr::new("--pid"),
            OsStr::new(&pid),
            OsStr::new("-o"),
            profile.as_os_str(),
        ],
        &log,
    );
    wait_in(&log, "attached");
    target.signal(libc::SIGUSR1);
    said.wait_for("done", timeout());
    attach.signal(libc::SIGINT);
    let status = attach.wait_timeout(timeout());
    let stderr = std::fs::read(&log).unwrap();
    assert!(
        status.success(),
        "{status}:\n{}",
        String::from_utf8_lossy(&stderr)
    );
    assert_inert("attach's stderr", &stderr);

    let source_shown = r"src\u{1b}[2J\|\u{7}.c:";
    let markdown = String::from_utf8(report_bytes(&profile, "markdown", &[])).unwrap();
    assert_inert("markdown", markdown.as_bytes());
    // The title: the command line, escaped for markdown too (`\` → `\\`).
    let title = markdown.lines().next().unwrap();
    assert!(
        title.contains(
            r"ev\\u{1b}\]0;pwned\\u{7}\\u{1b}\[2J\|\\xe9x a\\u{1b}\]0;argv\\u{7}\|\\xe9 (pid "
        ),
        "{title}"
    );
    let row = markdown
        .lines()
        .find(|l| l.contains("in 'make_during'"))
        .unwrap_or_else(|| panic!("no make_during row:\n{markdown}"));
    assert!(
        row.starts_with("|             300 |                24,000 | `")
            && row.contains(source_shown),
        "{row}"
    );
    assert_eq!(borders(row), 5, "{row}");
    assert_tables_whole(&markdown);

    let tsv = String::from_utf8(report_bytes(&profile, "tsv", &[])).unwrap();
    assert_inert("tsv", tsv.as_bytes());
    let line = tsv.lines().find(|l| l.contains("'make_during'")).unwrap();
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields[..2], ["300", "24000"], "{line}");
    assert!(fields[2].contains(r"src\u{1b}[2J|\u{7}.c:"), "{line}");
    assert!(fields[2].ends_with(" in 'make_during'"), "{line}");

    let folded = String::from_utf8(report_bytes(&profile, "folded", &[])).unwrap();
    assert_inert("folded", folded.as_bytes());
    let line = folded
        .lines()
        .find(|l| l.contains(";make_during "))
        .unwrap_or_else(|| panic!("no make_during stack:\n{folded}"));
    assert!(line.ends_with(";make_during 24000"), "{line}");

    let pprof = dir.join("hostile.pb.gz");
    report_bytes(&profile, "pprof", &["-o", pprof.to_str().unwrap()]);
    let raw = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&pprof)
        .output()
        .expect("cannot run go tool pprof (cargo xtask setup installs golang-go)");
    assert!(raw.status.success(), "{}", describe(&raw));
    assert_inert("go tool pprof -raw", &raw.stdout);
    let raw = String::from_utf8_lossy(&raw.stdout);
    assert!(raw.contains(&format!("comm:[{NAME_SHOWN}]")), "{raw}");
    assert!(
        raw.lines()
            .any(|l| l.contains(" make_during ") && l.contains(r"src\u{1b}[2J|\u{7}.c:")),
        "{raw}"
    );

    // json: structured, its strings escaped by JSON itself; the names kept.
    let json = report_json(&profile);
    assert_eq!(
        json["target"]["command"][1], "a\u{1b}]0;argv\u{7}|\\xe9",
        "{}",
        json["target"]
    );
    assert_eq!(
        Counts::of(group_at(&json, "libc", "make_during")).live_bytes,
        24_000
    );
}

/// `attach --comm` with the kernel's name of the process, control
/// characters and all: it is found and profiled; stderr stays inert.
#[test]
fn attach_comm_finds_it_by_its_hostile_name() {
    let (dir, exe) = hostile_program("hostile_comm");
    let (target, mut said) = start_as_nobody(&exe);
    let profile = dir.join("comm.mprof");
    let log = dir.join("comm.log");
    let comm = std::ffi::OsStr::from_bytes(&NAME[..15]);
    let mut attach = spawn_logged(
        &[
            OsStr::new("attach"),
            OsStr::new("--comm"),
            comm,
            OsStr::new("--sample-bytes"),
            OsStr::new("0"),
            OsStr::new("-o"),
            profile.as_os_str(),
        ],
        &log,
    );
    wait_in(&log, "Ctrl-C to stop");
    // Rounds of allocations; those made before a scan of /proc found the
    // process are not seen, the others whole.
    for _ in 0..6 {
        target.signal(libc::SIGUSR1);
        said.wait_for("done", timeout());
        std::thread::sleep(Duration::from_millis(300));
    }
    attach.signal(libc::SIGINT);
    let status = attach.wait_timeout(timeout());
    let stderr = std::fs::read(&log).unwrap();
    assert!(
        status.success(),
        "{status}:\n{}",
        String::from_utf8_lossy(&stderr)
    );
    assert_inert("attach --comm's stderr", &stderr);
    let json = report_json(&profile);
    let during = Counts::of(group_at(&json, "libc", "make_during"));
    // Whole rounds of 300 x 80 bytes.
    assert!(
        during.live_count > 0 && during.live_count.is_multiple_of(300),
        "{}",
        list_groups(&json)
    );
    assert_eq!(during.live_bytes, during.live_count * 80);
    let markdown = report(&profile, "markdown", &[]);
    assert_inert("markdown", markdown.as_bytes());
    assert_tables_whole(&markdown);
}

/// `top` in a terminal (tmux's): the COMMAND column shows the name
/// escaped; the terminal's title is not the one the name sets.
#[test]
fn top_shows_the_name_escaped_and_the_title_stays() {
    let (_dir, exe) = hostile_program("hostile_top");
    let (target, _said) = start_as_nobody(&exe);
    let session = format!("memprof-hostile-{}", std::process::id());
    let top = format!(
        "{} top --pid {} --interval 0.5",
        memprof_bin().display(),
        target.pid()
    );
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(args)
            .output()
            .expect("cannot run tmux")
    };
    let made = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "200",
        "-y",
        "30",
        &top,
    ]);
    assert!(made.status.success(), "{}", describe(&made));
    // Until the row is drawn.
    let deadline = Instant::now() + timeout();
    let row_start = format!("{:>8}  ", target.pid());
    let screen = loop {
        let shown = tmux(&["capture-pane", "-p", "-t", &session]);
        let screen = String::from_utf8_lossy(&shown.stdout).into_owned();
        if screen.lines().any(|l| l.starts_with(&row_start)) || Instant::now() > deadline {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let title = tmux(&["display-message", "-p", "-t", &session, "#{pane_title}"]);
    let _ = tmux(&["kill-session", "-t", &session]);
    let row = screen
        .lines()
        .find(|l| l.starts_with(&row_start))
        .unwrap_or_else(|| panic!("no row of pid {}:\n{screen}", target.pid()));
    // The program's file name, its first 16 characters as shown.
    assert!(row.contains(r" ev\u{1b}]0;pwned "), "{row}");
    let title = String::from_utf8_lossy(&title.stdout);
    assert!(
        !title.contains("pwned"),
        "the target set the title: {title}"
    );
}

/// `heap` of a Crystal program under the hostile name (a link to the
/// census fixture): the heap is read, its markdown tables keep their
/// columns, the name shows escaped in the title and the RSS table.
#[test]
fn heap_reads_it_and_its_tables_stay_whole() {
    let dir = TempDir::new("hostile_heap");
    std::fs::set_permissions(dir.join(""), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let exe = dir.join("").join(std::ffi::OsStr::from_bytes(NAME));
    // A link, not a copy: nothing of this process holds it open for writing.
    std::fs::hard_link(fixture::crystal::HEAP_CENSUS_DEBUG, &exe).unwrap();
    let mut target = ChildGuard(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot run setpriv"),
    );
    let mut said = Lines::new("heap_census stdout", target.0.stdout.take().unwrap());
    let ready = said.wait_for("ready", timeout());
    // `ready` then 17 numbers; the 6th is the bytes of the 300 Notes.
    let note_bytes: u64 = ready.split_whitespace().nth(6).unwrap().parse().unwrap();
    let pid = target.pid().to_string();
    let out = run_ok(["heap", "--pid", &pid, "--format", "markdown"]);
    assert_inert("heap's stderr", &out.stderr);
    assert_inert("heap's markdown", &out.stdout);
    let md = String::from_utf8(out.stdout).unwrap();
    let shown = r"ev\\u{1b}\]0;pwned\\u{7}\\u{1b}\[2J\|\\xe9x";
    let title = md.lines().next().unwrap();
    assert!(
        title.starts_with(&format!("# memprof heap: pid {pid} (")) && title.contains(shown),
        "{title}"
    );
    let note = format!("| 300 | {} | normal | Note |", thousands(note_bytes));
    assert!(md.contains(&note), "no {note:?} in:\n{md}");
    assert!(
        md.lines()
            .any(|l| l.starts_with("| ") && l.ends_with(&format!(" | {shown}: code |"))),
        "no RSS row of the program's code:\n{md}"
    );
    assert_tables_whole(&md);
}
