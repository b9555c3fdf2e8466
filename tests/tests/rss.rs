//! Resident memory by stack (`--rss`, issue #53): a page written for the
//! first time is recorded with the stack that wrote it, whatever
//! allocated it, and given back when its range is unmapped.
//!
//! - Every page followed (`--sample-bytes 0`): a user's program that maps
//!   100 MiB and writes each page at one function shows exactly 25,600
//!   pages, 104,857,600 bytes there; after its `munmap`, none.
//! - The agent at its defaults follows resident memory only: a user's
//!   program leaking 1 MiB/s in 4 KiB blocks beside a malloc/free churn of
//!   a million calls a second has the leak's stack first among its
//!   resident memory within 45 s, and not one of its allocation calls was
//!   seen (no allocator function is probed).
//! - Escalation: the same leak under `--escalate 8M/10 --escalate-for 20`
//!   gets libc's allocator functions probed for it alone: breakpoints in
//!   its libc text, none in an idle process's on the same file; its
//!   `leak_block` mallocs appear as a libc group; after the window the
//!   breakpoints are gone and no call is counted any more.
//! - `--examine NAME`: a process of that name gets the probes as long as
//!   it runs; the page (in Chromium) lists the window; it ends with it.
use memprof_tests::every_process::{at_site, process};
use memprof_tests::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// rss_touch's 100 MiB, in pages and bytes.
const PAGES: u64 = 25_600;
const BYTES: u64 = 100 << 20;

/// One session at a time: each follows every page fault of the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `program args` as user nobody (a user's program), its stdout piped.
fn as_nobody(program: &str, args: &[&str]) -> ChildGuard {
    ChildGuard(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(program)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}")),
    )
}

/// A copy of `fixture` named `name` in `dir`, readable and runnable by all.
fn copy_as(fixture: &str, dir: &TempDir, name: &str) -> String {
    let to = dir.join(name);
    std::fs::copy(fixture, &to).unwrap();
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir.join(""))
        .status();
    to.to_str().unwrap().to_string()
}

#[test]
fn every_page_written_is_counted_at_its_stack_and_given_back_every_way() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("rss_touch");
    let program = copy_as(fixture::RSS_TOUCH, &dir, "rss_touch");
    let profile = dir.join("rss.mprof");
    let mut memprof = ChildGuard(
        memprof([
            "attach",
            "--comm",
            "rss_touch",
            "--rss-only",
            "--sample-bytes",
            "0",
            "-o",
            profile.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut stderr = Lines::new("memprof attach", memprof.0.stderr.take().unwrap());
    stderr.wait_for("profiling every process", timeout());
    // One keeps its 100 MiB; the others give them back, each its own
    // way. All run on until memprof's end, which names them.
    let mut kept = as_nobody(&program, &["600"]);
    let ways = ["munmap", "dontneed", "fixed", "remap", "brk"];
    let mut given_back: Vec<ChildGuard> = ways
        .iter()
        .map(|how| as_nobody(&program, &["0", "600", how]))
        .collect();
    let said_by = |child: &mut ChildGuard, what: &str, line: &str| {
        let mut out = Lines::new(what, child.0.stdout.take().unwrap());
        out.wait_for(line, timeout());
    };
    said_by(&mut kept, "rss_touch (kept)", "touched");
    for (child, how) in given_back.iter_mut().zip(ways) {
        said_by(child, &format!("rss_touch ({how})"), "unmapped");
    }
    let pids = (kept.0.id(), given_back[0].0.id());
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    let said = stderr.all().join("\n");
    assert!(status.success(), "memprof: {status}\n{said}");
    let json = report_json(&profile);
    // No allocator function was probed: every figure is a page's.
    assert!(
        groups(&json).iter().all(|g| g["kind"] == "rss"),
        "{}",
        list_groups(&json)
    );
    let kept = at_site(&json, pids.0, "rss", "touch_pages");
    assert_eq!(
        kept,
        Counts {
            live_count: PAGES,
            live_bytes: BYTES,
            total_count: PAGES,
            total_bytes: BYTES,
        },
        "{}",
        list_groups(&json)
    );
    for (child, how) in given_back.iter().zip(ways) {
        // mremap keeps the first page.
        let left = u64::from(how == "remap");
        let gone = at_site(&json, child.0.id(), "rss", "touch_pages");
        assert_eq!(
            gone,
            Counts {
                live_count: left,
                live_bytes: left * 4096,
                total_count: PAGES,
                total_bytes: BYTES,
            },
            "given back by {how}: {}",
            list_groups(&json)
        );
    }
    assert_eq!(process(&json, pids.0)["comm"], "rss_touch");
    assert_eq!(uint(&json, "/counters/rss_pages_untracked"), 0);
    assert_eq!(uint(&json, "/counters/rss_releases_cut"), 0);
}

/// `GET path` from the agent on `socket`: the body.
fn get(socket: &Path, path: &str) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    match text.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_string(),
        None => panic!("no HTTP answer to {path}: {text:?}"),
    }
}

/// Process `pid`'s resident-memory groups, the most live bytes first.
fn rss_groups(json: &Value, pid: u32) -> Vec<&Value> {
    let mut rss: Vec<&Value> = groups(json)
        .iter()
        .filter(|g| g["kind"] == "rss" && uint(g, "/pid") == u64::from(pid))
        .collect();
    rss.sort_by_key(|g| std::cmp::Reverse(uint(g, "/live_bytes")));
    rss
}

#[test]
fn the_agent_at_its_defaults_finds_a_users_leak_with_nothing_per_call() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("rss_agent");
    let program = copy_as(fixture::RSS_LEAK, &dir, "rss_leak");
    let socket = dir.join("agent.sock");
    let mut agent = ChildGuard(
        memprof([
            std::ffi::OsStr::new("agent"),
            std::ffi::OsStr::new("--socket"),
            socket.as_os_str(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut stderr = Lines::new("memprof agent", agent.0.stderr.take().unwrap());
    let said = stderr.wait_for("serving on", timeout());
    assert!(said.contains("no allocator function probed"), "{said}");
    let leak = as_nobody(&program, &["120"]);
    let pid = leak.0.id();
    let started = Instant::now();
    let limit = Duration::from_secs(45) * slower();
    let (found, json) = loop {
        std::thread::sleep(Duration::from_secs(2));
        let body = get(&socket, &format!("/api/profile?pid={pid}&format=json"));
        if let Ok(json) = serde_json::from_str::<Value>(&body) {
            let top = rss_groups(&json, pid)
                .first()
                .map(|g| functions(g).join(" < "));
            if top.as_deref().is_some_and(|f| f.contains("leak_block")) {
                break (top.unwrap(), json);
            }
            if started.elapsed() > limit {
                panic!(
                    "after {limit:?}, the top resident stack of pid {pid} is {top:?}:\n{}",
                    list_groups(&json)
                );
            }
        } else if started.elapsed() > limit {
            panic!("after {limit:?}, no profile of pid {pid}: {body}");
        }
    };
    assert!(found.contains("main"), "{found}");
    // Not one of its million calls a second was seen: no allocator
    // function is probed (only the dynamic linker's library loads are).
    assert_eq!(uint(&json, "/counters/unsampled_allocs"), 0);
    assert!(
        groups(&json).iter().all(|g| g["kind"] == "rss"),
        "{}",
        list_groups(&json)
    );
    drop(leak);
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_timeout(timeout()).success());
}

/// `memprof agent --socket SOCKET ARGS`, serving: the agent and its stderr.
fn agent_on(socket: &Path, args: &[&str]) -> (ChildGuard, Lines) {
    let mut agent = ChildGuard(
        memprof(
            ["agent", "--socket", socket.to_str().unwrap()]
                .iter()
                .chain(args),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut stderr = Lines::new("memprof agent", agent.0.stderr.take().unwrap());
    stderr.wait_for("serving on", timeout());
    (agent, stderr)
}

/// The bytes of process `pid`'s libc text (its executable mapping, read
/// through /proc/PID/mem) that differ from the file's: a uprobe's
/// breakpoint (`int3`) is written into the memory of each process it
/// probes, and of no other.
fn libc_bytes_changed(pid: u32) -> usize {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.contains("r-xp") && l.contains("/libc.so.6"))
        .unwrap_or_else(|| panic!("pid {pid} maps no libc text:\n{maps}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (start, end) = fields[0].split_once('-').unwrap();
    let start = u64::from_str_radix(start, 16).unwrap();
    let end = u64::from_str_radix(end, 16).unwrap();
    let offset = u64::from_str_radix(fields[2], 16).unwrap();
    let path = fields[5..].join(" ");
    let mut in_memory = vec![0u8; (end - start) as usize];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.read_exact_at(&mut in_memory, start).unwrap();
    let file = std::fs::File::open(format!("/proc/{pid}/root{path}")).unwrap();
    let mut on_disk = vec![0u8; in_memory.len()];
    let read = file.read_at(&mut on_disk, offset).unwrap();
    in_memory[..read]
        .iter()
        .zip(&on_disk[..read])
        .filter(|(a, b)| a != b)
        .count()
}

/// Process `pid`'s groups of `kind` whose stack has `function`: their
/// total allocations.
fn allocations_at(json: &Value, pid: u32, kind: &str, function: &str) -> u64 {
    groups(json)
        .iter()
        .filter(|g| g["kind"] == kind && uint(g, "/pid") == u64::from(pid))
        .filter(|g| functions(g).iter().any(|f| *f == function))
        .map(|g| uint(g, "/total_count"))
        .sum()
}

#[test]
fn a_process_whose_memory_keeps_growing_gets_its_own_allocator_probes_for_a_window() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("rss_escalate");
    let program = copy_as(fixture::RSS_LEAK, &dir, "rss_leak");
    let socket = dir.join("agent.sock");
    let (mut agent, mut stderr) =
        agent_on(&socket, &["--escalate", "8M/10", "--escalate-for", "20"]);
    // A process that does not grow, on the same libc: it must never get
    // a breakpoint.
    let idle = as_nobody("/bin/sleep", &["300"]);
    let leak = as_nobody(&program, &["150"]);
    let pid = leak.0.id();
    let said = stderr.wait_for(&format!("pid {pid} "), Duration::from_secs(45) * slower());
    assert!(said.contains("resident memory grew"), "{said}");
    assert!(said.contains("allocator functions probed"), "{said}");
    assert!(said.contains("libc.so.6"), "{said}");
    assert!(said.contains("for 20 s"), "{said}");
    let escalations: Value = serde_json::from_str(&get(&socket, "/api/escalations")).unwrap();
    let row = &escalations[0];
    assert_eq!(uint(row, "/pid"), u64::from(pid), "{escalations}");
    assert_eq!(row["why"], "growth", "{escalations}");
    assert_eq!(row["end_unix_s"], Value::Null, "{escalations}");
    let metrics = get(&socket, "/metrics");
    assert!(
        metrics.contains(&format!(
            "memprof_process_calls_probed{{pid=\"{pid}\",comm=\"rss_leak\",why=\"growth\"}} 1\n"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("memprof_escalations_total 1\n"),
        "{metrics}"
    );
    // Breakpoints in the escalated process's libc, none in the other's.
    assert_ne!(libc_bytes_changed(pid), 0);
    assert_eq!(libc_bytes_changed(idle.0.id()), 0);
    // Its exact calls follow: leak_block's mallocs (a libc group), beside
    // its resident pages.
    let started = Instant::now();
    let json = loop {
        std::thread::sleep(Duration::from_secs(2));
        let body = get(&socket, &format!("/api/profile?pid={pid}&format=json"));
        let json: Value = serde_json::from_str(&body).unwrap();
        if allocations_at(&json, pid, "libc", "leak_block") > 0 {
            break json;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60) * slower(),
            "no libc group at leak_block within 60 s:\n{}",
            list_groups(&json)
        );
    };
    assert!(
        rss_groups(&json, pid)
            .first()
            .is_some_and(|g| functions(g).iter().any(|f| *f == "leak_block")),
        "{}",
        list_groups(&json)
    );
    // The window ends: the probes come off, the process runs on.
    let said = stderr.wait_for(&format!("pid {pid} "), Duration::from_secs(40) * slower());
    assert!(said.contains("probes came off"), "{said}");
    let escalations: Value = serde_json::from_str(&get(&socket, "/api/escalations")).unwrap();
    assert!(escalations[0]["end_unix_s"].is_number(), "{escalations}");
    assert!(get(&socket, "/metrics").contains("memprof_escalations_total 1\n"));
    // Detached on a thread of the agent's: gone within a few seconds.
    let off = Instant::now();
    while libc_bytes_changed(pid) != 0 {
        assert!(off.elapsed() < Duration::from_secs(10) * slower());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(libc_bytes_changed(idle.0.id()), 0);
    // Nothing more is counted at its calls.
    let profile = |socket: &Path| -> Value {
        serde_json::from_str(&get(socket, &format!("/api/profile?pid={pid}&format=json"))).unwrap()
    };
    let before = allocations_at(&profile(&socket), pid, "libc", "leak_block");
    std::thread::sleep(Duration::from_secs(3));
    let json = profile(&socket);
    let after = allocations_at(&json, pid, "libc", "leak_block");
    assert_eq!(before, after);
    // What they recorded still live was let go with them (its frees
    // would not be seen): no libc block is live, and the blocks let go
    // are leak_block's (never freed) and a few others (the churn holds
    // one at a time).
    let libc_live: u64 = groups(&json)
        .iter()
        .filter(|g| g["kind"] != "rss" && uint(g, "/pid") == u64::from(pid))
        .map(|g| uint(g, "/live_count"))
        .sum();
    assert_eq!(libc_live, 0, "{}", list_groups(&json));
    // Sampled by bytes, counted as the figures count them: leak_block's
    // (rounded once, not per group: within 1 of each group's), plus a
    // churn block (64 bytes: it weighs 8,192.5) if one sampled was live
    // at that moment.
    let let_go = uint(&json, "/counters/calls_live_let_go");
    let groups_at = groups(&json)
        .iter()
        .filter(|g| g["kind"] == "libc" && uint(g, "/pid") == u64::from(pid))
        .count() as u64;
    assert!(
        [0, 8_193]
            .iter()
            .any(|churn| let_go.abs_diff(after + churn) <= groups_at),
        "{let_go} blocks let go, leak_block made {after}"
    );
    drop(leak);
    drop(idle);
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_timeout(timeout()).success());
}

#[test]
fn a_process_named_by_examine_gets_its_own_allocator_probes_while_it_runs() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("rss_examine");
    let program = copy_as(fixture::RSS_LEAK, &dir, "rss_leak");
    let socket = dir.join("agent.sock");
    let listen = format!("127.0.0.1:{}", free_port());
    let (mut agent, mut stderr) = agent_on(
        &socket,
        &[
            "--listen",
            &listen,
            "--examine",
            "rss_leak",
            "--escalate",
            "off",
        ],
    );
    let idle = as_nobody("/bin/sleep", &["300"]);
    let mut leak = as_nobody(&program, &["20"]);
    let pid = leak.0.id();
    let said = stderr.wait_for(&format!("pid {pid} "), Duration::from_secs(20) * slower());
    assert!(
        said.ends_with(&format!(
            "pid {pid} (rss_leak): named by --examine; its allocator functions probed (/usr/lib/x86_64-linux-gnu/libc.so.6) as long as it runs"
        )),
        "{said}"
    );
    assert_ne!(libc_bytes_changed(pid), 0);
    assert_eq!(libc_bytes_changed(idle.0.id()), 0);
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let body = get(&socket, &format!("/api/profile?pid={pid}&format=json"));
        let json: Value = serde_json::from_str(&body).unwrap();
        if allocations_at(&json, pid, "libc", "leak_block") > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10) * slower(),
            "no libc group at leak_block:\n{}",
            list_groups(&json)
        );
    }
    // The page lists it, in a real browser.
    let dom = chromium(&format!("http://{listen}/"), &dir.join("page.png"));
    let table = &dom[dom
        .find("id=\"escalated\"")
        .expect("no escalations on the page")..];
    assert!(!table.starts_with("id=\"escalated\" hidden"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains(&format!("<tr data-pid=\"{pid}\"")))
        .unwrap_or_else(|| panic!("pid {pid} is not listed:\n{table}"));
    assert!(
        row.contains("<td>rss_leak</td><td>named: named by --examine</td>"),
        "{row}"
    );
    assert!(row.contains("libc.so.6</td>"), "{row}");
    assert!(row.contains("<td>on now</td>"), "{row}");
    // It ends: its window with it.
    assert!(leak.0.wait().unwrap().success());
    let ended = Instant::now();
    loop {
        let rows: Value = serde_json::from_str(&get(&socket, "/api/escalations")).unwrap();
        assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
        assert_eq!(uint(&rows[0], "/pid"), u64::from(pid), "{rows}");
        assert_eq!(rows[0]["why"], "named", "{rows}");
        if rows[0]["end_unix_s"].is_number() {
            break;
        }
        assert!(
            ended.elapsed() < Duration::from_secs(15) * slower(),
            "{rows}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(idle);
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_timeout(timeout()).success());
}
