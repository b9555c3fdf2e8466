//! A name any user can give a function is data (issue #52): a C program of
//! user nobody whose allocating function carries a 451-byte C++ name whose
//! back-references double at each of its 39 levels (some 14 TB demangled,
//! `fixtures/c/hostile.c`). Root's memprof profiles it and stays itself:
//! `attach --all` writes its profile on time under 200 MB, the frame named
//! by the raw name cut (its first 256 bytes and `…`), counted in
//! `names_left_mangled`; the agent answers `/metrics` within a second
//! throughout, under 200 MB, and SIGTERM ends it within 2 s.
//!
//! memprof's memory is watched from outside every 100 ms: past 1 GB it is
//! killed (the test fails on it) before it takes the machine.
//!
//! The limits are those of a machine that runs the tests alone (as
//! `cargo xtask test` does): `--all` and the agent read the files of every
//! process, and a big program running beside them (a rustc with its
//! libLLVM, a Crystal compiler) takes even a harmless run past 200 MB and
//! its answers past a second; the messages say memprof's memory when the
//! program started, and the answers' worst before it.

use memprof_tests::every_process::{at_site, process};
use memprof_tests::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Levels of `S0_IS<k>_S<k>_E` after `_Z1f1A1BIS_S_E`.
const LEVELS: u32 = 39;
/// How much of a name left mangled memprof shows (then `…`).
const CUT: usize = 256;
/// memprof's resident memory must stay under this (200 MB), in KiB.
const RSS_LIMIT_KIB: u64 = 200_000_000 / 1024;
/// Past this (1 GB), in KiB, memprof is killed.
const RSS_KILL_KIB: u64 = 1_000_000_000 / 1024;
/// The fixture's blocks kept at `hostile`, of 64 bytes, and its calls per round.
const KEPT: u64 = 1_000;
const SIZE: u64 = 64;
const BATCH: u64 = 100;
/// The fixture's source, for the line of its malloc.
const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/c/hostile.c");

/// One session at a time: each follows every process of the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// `n` in base 36, digits 0-9A-Z: a substitution's seq-id.
fn base36(n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let digit = char::from(DIGITS[(n % 36) as usize]);
    match n / 36 {
        0 => digit.to_string(),
        high => format!("{}{digit}", base36(high)),
    }
}

/// `f(A, B<A, A>, …)` with `levels` levels, each `B<S, S>` of the one
/// before: S_ is A, S0_ is B, S1_ is B<A, A>, level n is B<S<n>_, S<n>_>.
fn mangled(levels: u32) -> String {
    let mut name = String::from("_Z1f1A1BIS_S_E");
    for n in 1..=levels {
        let k = base36(n);
        name += &format!("S0_IS{k}_S{k}_E");
    }
    name
}

/// The fixture's function's name, and how memprof shows it.
fn hostile_name() -> String {
    mangled(LEVELS)
}

fn hostile_name_cut() -> String {
    format!("{}…", &hostile_name()[..CUT])
}

/// The fixture's program line of its malloc.
fn malloc_line() -> u64 {
    u64::from(marked_line_after(SOURCE, "//", "hostile_malloc"))
}

/// `setpriv` running `program args` as user nobody.
fn as_nobody(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(program)
        .args(args);
    command
}

/// nobody can run the fixture where the build put it (every directory
/// above it searchable by others).
fn assert_nobody_can_run(program: &str) {
    let status = as_nobody("/bin/sh", &["-c", "test -x \"$1\"", "sh", program])
        .status()
        .expect("cannot run setpriv");
    assert!(
        status.success(),
        "user nobody cannot run {program}: every directory above it must be searchable by others"
    );
}

/// memprof (or any child), its resident memory watched every 100 ms from
/// a thread: the highest seen, and SIGKILL past [`RSS_KILL_KIB`]. Reaped
/// by [`Watched::wait`], which gives its exit status and its peak (the
/// kernel's `ru_maxrss`); killed and reaped on drop otherwise.
struct Watched {
    child: Option<ChildGuard>,
    started: Instant,
    stop: Arc<AtomicBool>,
    /// The highest VmRSS seen, KiB.
    highest: Arc<AtomicU64>,
    /// When the watch first saw it above 200 MB, and when it killed it,
    /// ms after `started` (0: it did not).
    over_at_ms: Arc<AtomicU64>,
    killed_at_ms: Arc<AtomicU64>,
    watch: Option<JoinHandle<()>>,
}

/// How a watched process ended.
#[derive(Debug)]
struct Ended {
    /// Its wait status (`WIFEXITED` &c.).
    status: i32,
    /// Its peak resident memory, KiB.
    peak_kib: u64,
    /// When, after it started.
    at: Duration,
}

impl Ended {
    fn exited_0(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }
}

/// `kib` KiB in MB, for messages.
fn mb(kib: u64) -> String {
    format!("{:.0} MB", kib as f64 * 1024.0 / 1e6)
}

/// Whether child `pid` has exited (left a zombie, not reaped).
fn has_exited(pid: i32) -> bool {
    // SAFETY: plain out-parameter; WNOWAIT leaves the child to be reaped.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() == pid
    }
}

/// The VmRSS of process `pid`, KiB (None once it has exited).
fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl Watched {
    fn new(child: ChildGuard) -> Watched {
        let pid = child.pid();
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let highest = Arc::new(AtomicU64::new(0));
        let over_at_ms = Arc::new(AtomicU64::new(0));
        let killed_at_ms = Arc::new(AtomicU64::new(0));
        let watch = {
            let (stop, highest, over_at_ms, killed_at_ms) = (
                stop.clone(),
                highest.clone(),
                over_at_ms.clone(),
                killed_at_ms.clone(),
            );
            let now_ms = move || started.elapsed().as_millis().max(1) as u64;
            // Until told to stop, and the child is not reaped before
            // (`wait` and drop stop this first): the pid is still its.
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) && !has_exited(pid) {
                    if let Some(kib) = rss_kib(pid) {
                        highest.fetch_max(kib, Ordering::SeqCst);
                        if kib > RSS_LIMIT_KIB && over_at_ms.load(Ordering::SeqCst) == 0 {
                            over_at_ms.store(now_ms(), Ordering::SeqCst);
                        }
                        if kib > RSS_KILL_KIB && killed_at_ms.load(Ordering::SeqCst) == 0 {
                            killed_at_ms.store(now_ms(), Ordering::SeqCst);
                            // SAFETY: kill(2) of our unreaped child.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Watched {
            child: Some(child),
            started,
            stop,
            highest,
            over_at_ms,
            killed_at_ms,
            watch: Some(watch),
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("not reaped").pid()
    }

    fn running(&self) -> bool {
        !has_exited(self.pid())
    }

    /// The highest resident memory seen so far, KiB.
    fn highest_kib(&self) -> u64 {
        self.highest.load(Ordering::SeqCst)
    }

    /// What the watch saw, for failure messages.
    fn verdict(&self) -> String {
        let at = |ms: &AtomicU64| match ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(ms as f64 / 1000.0),
        };
        let mut verdict = format!("resident memory at most {} seen", mb(self.highest_kib()));
        if let Some(s) = at(&self.over_at_ms) {
            verdict += &format!(", above 200 MB {s:.1} s after its start");
        }
        if let Some(s) = at(&self.killed_at_ms) {
            verdict += &format!(", KILLED by the test at {s:.1} s, past 1 GB");
        }
        verdict
    }

    fn stop_watch(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(watch) = self.watch.take() {
            let _ = watch.join();
        }
    }

    /// Waits up to `timeout` for it to exit; reaps it. None if it is
    /// still running then (it is left running: drop kills it).
    fn wait(&mut self, timeout: Duration) -> Option<Ended> {
        let pid = self.pid();
        let deadline = Instant::now() + timeout;
        while !has_exited(pid) {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let at = self.started.elapsed();
        self.stop_watch();
        let mut status = 0;
        // SAFETY: plain out-parameters; our exited child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
        // Reaped here: its guard must not kill (a pid now free) nor wait.
        std::mem::forget(self.child.take());
        Some(Ended {
            status,
            peak_kib: (usage.ru_maxrss as u64).max(self.highest_kib()),
            at,
        })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // The watch first: the guard's drop reaps the pid.
        self.stop_watch();
    }
}

/// `nm`'s names of `program`'s functions.
fn functions_of(program: &str) -> Vec<String> {
    let out = Command::new("nm")
        .arg(program)
        .output()
        .expect("cannot run nm");
    assert!(out.status.success(), "nm {program}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "T" | "t", name] => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// `c++filt NAME`'s answer.
fn cxxfilt(name: &str) -> String {
    let out = Command::new("c++filt")
        .arg(name)
        .output()
        .expect("cannot run c++filt");
    assert!(out.status.success(), "c++filt: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The fixture is what the tests say: its function carries the 451-byte
/// name, a valid C++ name whose demangled form doubles at each level
/// (c++filt on 8 and 9 levels; on 39 it would not end).
#[test]
fn the_fixture_carries_the_hostile_name() {
    let name = hostile_name();
    assert_eq!(name.len(), 451);
    assert!(name.ends_with("S0_ISZ_SZ_ES0_IS10_S10_ES0_IS11_S11_ES0_IS12_S12_ES0_IS13_S13_E"));
    let functions = functions_of(fixture::HOSTILE);
    let ours: Vec<&String> = functions.iter().filter(|f| f.starts_with("_Z1f")).collect();
    assert_eq!(ours, [&name], "{functions:?}");
    assert!(!functions.iter().any(|f| f == "hostile"), "{functions:?}");
    let eight = cxxfilt(&mangled(8));
    let nine = cxxfilt(&mangled(9));
    assert!(
        eight.starts_with("f(A, B<A, A>, B<B<A, A>, B<A, A> >, "),
        "{eight}"
    );
    assert_eq!(eight.len(), 6_611);
    assert!(nine.len() > 2 * eight.len(), "{} bytes", nine.len());
    assert_eq!(
        hostile_name_cut().len(),
        CUT + '…'.len_utf8(),
        "{}",
        hostile_name_cut()
    );
}

/// The groups of process `pid` that hold a frame named `function`.
fn groups_with<'a>(json: &'a Value, pid: u32, function: &str) -> Vec<&'a Value> {
    groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid) && functions(g).contains(&function))
        .collect()
}

/// Process `pid` (the fixture) is named by the cut name: at its one call
/// site (the innermost frame, at the malloc's line), one address; no
/// frame of it named with more than 16 KiB (memprof's cap). Returns how
/// many distinct addresses carry the cut name.
fn assert_named_cut(json: &Value, pid: u32) -> usize {
    let cut = hostile_name_cut();
    let mine = groups_with(json, pid, &cut);
    assert!(
        !mine.is_empty(),
        "no frame of pid {pid} named {cut:?}; the groups:\n{}",
        list_groups(json)
    );
    let mut addresses = Vec::new();
    for g in &mine {
        let frame = &g["frames"][0];
        assert_eq!(frame["function"], cut.as_str(), "{g:#}");
        assert_eq!(frame["line"], malloc_line(), "{frame:#}");
        for f in g["frames"].as_array().unwrap() {
            if f["function"] == cut.as_str() {
                addresses.push(f["address"].as_str().unwrap().to_string());
            }
        }
    }
    for g in groups(json)
        .iter()
        .filter(|g| uint(g, "/pid") == u64::from(pid))
    {
        for name in functions(g) {
            assert!(
                name.len() <= 16 << 10,
                "a name of {} bytes: {g:#}",
                name.len()
            );
        }
    }
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), 1, "one call site: {addresses:?}");
    addresses.len()
}

/// `attach --all --duration 8` while nobody's program runs (1,000 blocks
/// kept at `hostile`, then 10,000 more made, each freeing the oldest):
/// memprof ends on time (8 s + 15 s) and exits 0, never above 200 MB; the
/// process is there with its exact counts at the frame named by the cut
/// name, and the profile counts the name left mangled, exactly for the
/// process (one address) where it counts per process.
#[test]
fn attach_all_shows_a_hostile_cpp_name_cut_and_ends_on_time() {
    let _one = one_at_a_time();
    assert_nobody_can_run(fixture::HOSTILE);
    let dir = TempDir::new("hostile_names_all");
    let profile = dir.join("all.mprof");
    let duration = Duration::from_secs(8 * u64::from(slower()));
    let seconds = duration.as_secs().to_string();
    let rounds: u64 = 100;
    let child = memprof([
        "attach",
        "--all",
        "--sample-bytes",
        "0",
        "--duration",
        &seconds,
        "-o",
        profile.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("cannot start memprof attach --all");
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("memprof stderr", memprof.0.stderr.take().unwrap());
    let mut memprof = Watched::new(memprof);
    stderr.wait_for("profiling every process", timeout());

    let rss_before = rss_kib(memprof.pid()).unwrap_or(0);
    let mut program = ChildGuard(
        as_nobody(fixture::HOSTILE, &[&rounds.to_string()])
            .spawn()
            .expect("cannot run setpriv"),
    );
    let pid = program.pid() as u32;
    let status = program.wait_timeout(timeout());
    assert!(status.success(), "hostile as nobody: {status}");

    // On time: its duration, and 15 s to write the profile.
    let margin = Duration::from_secs(15) * slower();
    let ended = memprof.wait((duration + margin).saturating_sub(memprof.started.elapsed()));
    let Some(ended) = ended else {
        let verdict = memprof.verdict();
        let before = mb(rss_before);
        drop(memprof);
        panic!(
            "memprof attach --all --duration {seconds} still running {:?} after its start (its duration + {margin:?}): {verdict} ({before} as the program started)\n{}",
            duration + margin,
            stderr.all().join("\n")
        );
    };
    let verdict = format!(
        "{} ({} as the program started)",
        memprof.verdict(),
        mb(rss_before)
    );
    let said = stderr.all().join("\n");
    assert!(
        ended.exited_0(),
        "memprof ended with status {:#x} after {:.1} s: {verdict}\n{said}",
        ended.status,
        ended.at.as_secs_f64()
    );
    assert!(
        ended.peak_kib < RSS_LIMIT_KIB,
        "memprof's peak resident memory {} (limit 200 MB): {verdict}\n{said}",
        mb(ended.peak_kib)
    );
    assert!(profile.exists(), "no profile written\n{said}");

    let json = report_json(&profile);
    let p = process(&json, pid);
    assert_eq!(p["comm"], "hostile", "{p:#}");
    assert_eq!(p["exe"], fixture::HOSTILE, "{p:#}");
    assert_eq!(p["exit"]["code"], 0, "{p:#}");
    let cut = hostile_name_cut();
    let made = KEPT + BATCH * rounds;
    assert_eq!(
        at_site(&json, pid, "libc", &cut),
        Counts {
            live_count: KEPT,
            live_bytes: KEPT * SIZE,
            total_count: made,
            total_bytes: made * SIZE,
        },
        "{}",
        list_groups(&json)
    );
    let addresses = assert_named_cut(&json, pid) as u64;
    // The machine's count: this process's name, and any other process's.
    assert!(
        uint(&json, "/counters/names_left_mangled") >= addresses,
        "{:#}",
        json["counters"]
    );
    // The process's own, where the profile counts per process.
    if let Some(own) = p["counters"].get("names_left_mangled") {
        assert_eq!(own.as_u64(), Some(addresses), "{p:#}");
    }
    eprintln!(
        "attach --all --duration {seconds}: ended after {:.1} s, peak resident memory {}; {verdict}",
        ended.at.as_secs_f64(),
        mb(ended.peak_kib)
    );
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.0), the whole answer within
/// `limit`: its status and body, or why not.
fn http_get(port: u16, path: &str, limit: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + limit;
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&address, limit).map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no whole answer within {limit:?}"));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("{e}"))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!("no whole answer within {limit:?}"));
            }
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not HTTP: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status: {head:?}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// A chunked body's data.
fn dechunk(mut body: &str) -> String {
    let mut data = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        data += &rest[..size];
        body = rest[size..].trim_start_matches("\r\n");
    }
    data
}

/// The sum of a `/metrics` text's samples of `name` (with labels or not).
fn metric_sum(text: &str, name: &str) -> Option<u64> {
    let samples: Vec<u64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// `at` as "1.2 s" after the agent started, or "-".
fn seconds(at: Option<Duration>) -> String {
    at.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// What the scrapes of `/metrics` every 200 ms met.
#[derive(Default)]
struct Scrapes {
    answered: u32,
    /// When the first and the last answers came.
    first: Option<Duration>,
    last_at: Option<Duration>,
    /// The longest an answer took.
    worst: Duration,
    /// Each request: when it was made, how long it took.
    took: Vec<(Duration, Duration)>,
    /// The requests not answered (200) in time: when, and why.
    failed: Vec<String>,
    /// The last body.
    last: String,
}

/// Scrapes `/metrics` every 200 ms until `stop`: each answer may take
/// 5 s (× slower) before it counts as none; failures timed from `start`.
fn scrape(port: u16, start: Instant, stop: Arc<AtomicBool>) -> JoinHandle<Scrapes> {
    std::thread::spawn(move || {
        let mut seen = Scrapes::default();
        while !stop.load(Ordering::SeqCst) {
            let asked = Instant::now();
            let answer = http_get(port, "/metrics", Duration::from_secs(5) * slower());
            let took = asked.elapsed();
            seen.worst = seen.worst.max(took);
            seen.took.push((asked.duration_since(start), took));
            match answer {
                Ok((200, body)) => {
                    seen.answered += 1;
                    seen.first.get_or_insert(start.elapsed());
                    seen.last_at = Some(start.elapsed());
                    seen.last = body;
                }
                Ok((status, body)) => seen.failed.push(format!(
                    "at {:.1} s: {status} after {took:?}: {body}",
                    start.elapsed().as_secs_f64()
                )),
                Err(why) => seen.failed.push(format!(
                    "at {:.1} s: {why} (after {took:?})",
                    start.elapsed().as_secs_f64()
                )),
            }
            std::thread::sleep(Duration::from_millis(200).saturating_sub(took));
        }
        seen
    })
}

/// `memprof agent` (sampled by default) while two runs of nobody's
/// program allocate (after their 1,000 blocks, 640 KB/s made and freed at
/// `hostile`), one for 8 s, one on until the end: `/metrics`, scraped
/// every 200 ms for 10 s and until the agent counted the name of the run
/// that ended, answers each time within a second; the running one's
/// profile, asked of the agent (which names its frames then), shows the
/// frame by the cut name; `memprof_names_left_mangled_total` counts the
/// ended one's (the agent counts the processes that ended); SIGTERM ends
/// the agent within 2 s; its memory stays under 200 MB throughout.
#[test]
fn the_agent_answers_throughout_and_obeys_sigterm() {
    let _one = one_at_a_time();
    assert_nobody_can_run(fixture::HOSTILE);
    let dir = TempDir::new("hostile_names_agent");
    let socket = dir.join("agent.sock");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = memprof([
        OsStr::new("agent"),
        OsStr::new("--calls"),
        OsStr::new("--socket"),
        socket.as_os_str(),
        OsStr::new("--listen"),
        OsStr::new(&listen),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("cannot start memprof agent");
    let mut agent = ChildGuard(child);
    let mut stderr = Lines::new("memprof agent stderr", agent.0.stderr.take().unwrap());
    let mut agent = Watched::new(agent);
    stderr.wait_for("serving on", timeout());

    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = scrape(port, agent.started, stop.clone());
    // Answering before the programs, for the record.
    std::thread::sleep(Duration::from_secs(1));
    let start = |rounds: &str| {
        ChildGuard(
            as_nobody(fixture::HOSTILE, &[rounds])
                .spawn()
                .expect("cannot run setpriv"),
        )
    };
    // 800 rounds: 8 s; 6,000: a minute, past the end of the test.
    let mut ends = start("800");
    let runs = start("6000");
    let pid = runs.pid() as u32;
    let programs_started = Instant::now();
    let programs_at = agent.started.elapsed();
    let rss_before = rss_kib(agent.pid()).unwrap_or(0);

    // The running one's profile, asked of the agent: named now; until one
    // of its allocations is sampled, the agent may have none of it.
    let cut = hostile_name_cut();
    let deadline = Instant::now() + timeout();
    let mut last = String::new();
    let mut profile: Option<Value> = None;
    while profile.is_none() && Instant::now() < deadline && agent.running() {
        match http_get(
            port,
            &format!("/api/profile?pid={pid}"),
            Duration::from_secs(10) * slower(),
        ) {
            Ok((200, body)) => {
                let json: Value = serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("/api/profile is not JSON ({e}): {body}"));
                if groups_with(&json, pid, &cut).is_empty() {
                    last = list_groups(&json);
                } else {
                    profile = Some(json);
                }
            }
            Ok((status, body)) => last = format!("{status}: {body}"),
            Err(why) => last = why,
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let named_at = programs_started.elapsed();
    // Scraped on for 10 s of the programs' run at least, and until the
    // name of the one that ended is counted.
    while programs_started.elapsed() < Duration::from_secs(10) && agent.running() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = ends.wait_timeout(timeout());
    assert!(status.success(), "hostile 800 as nobody: {status}");
    let deadline = Instant::now() + timeout();
    let mut metrics = Err("not asked".to_string());
    while Instant::now() < deadline && agent.running() {
        metrics = http_get(port, "/metrics", Duration::from_secs(5) * slower());
        if let Ok((200, text)) = &metrics {
            if metric_sum(text, "memprof_names_left_mangled_total").is_some_and(|n| n >= 1) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let counted_at = programs_started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let scrapes = scrapes.join().expect("the scrapes' thread");

    // SIGTERM: gone within 2 s.
    let alive = agent.running();
    if alive {
        // SAFETY: kill(2) of our unreaped child.
        unsafe { libc::kill(agent.pid(), libc::SIGTERM) };
    }
    let asked = Instant::now();
    let ended = agent.wait(Duration::from_secs(2) * slower());
    let took = asked.elapsed();
    let verdict = agent.verdict();
    drop(agent);
    drop(runs);
    let said = stderr.all().join("\n");
    let failed = &scrapes.failed;
    let summary = format!(
        "agent: {verdict}; the programs started at {:.1} s, the agent's resident memory {} then; \
         /metrics answered {} times (from {} to {}), worst {:?} ({:?} before the programs), \
         {} unanswered{}; \
         the running one's profile {} {:.1} s after they started, \
         the name counted in /metrics by {:.1} s; SIGTERM {}\n\
         --- agent stderr ---\n{said}",
        programs_at.as_secs_f64(),
        mb(rss_before),
        scrapes.answered,
        seconds(scrapes.first),
        seconds(scrapes.last_at),
        scrapes.worst,
        scrapes
            .took
            .iter()
            .filter(|(at, _)| *at < programs_at)
            .map(|&(_, took)| took)
            .max()
            .unwrap_or_default(),
        failed.len(),
        failed
            .iter()
            .take(3)
            .chain(failed.last().filter(|_| failed.len() > 3))
            .map(|f| format!("\n  - {f}"))
            .collect::<String>(),
        if profile.is_some() {
            "named"
        } else {
            "never named"
        },
        named_at.as_secs_f64(),
        counted_at.as_secs_f64(),
        match (&ended, alive) {
            (_, false) => "not sent: the agent had ended".to_string(),
            (Some(e), true) => format!("obeyed in {took:?}, status {:#x}", e.status),
            (None, true) => format!("NOT obeyed within {took:?}"),
        },
    );
    assert!(alive, "{summary}");
    let ended = ended.unwrap_or_else(|| panic!("{summary}"));
    assert!(ended.exited_0(), "{summary}");
    assert!(!socket.exists(), "the socket is left behind: {summary}");
    assert!(
        ended.peak_kib < RSS_LIMIT_KIB,
        "peak resident memory {} (limit 200 MB): {summary}",
        mb(ended.peak_kib)
    );
    assert!(
        scrapes.failed.is_empty() && scrapes.worst < Duration::from_secs(1) * slower(),
        "{summary}"
    );
    // The scrapes ran throughout: every 200 ms for 10 s, each under 1 s.
    assert!(scrapes.answered >= 8, "{summary}");

    let profile = profile.unwrap_or_else(|| panic!("last /api/profile: {last}\n{summary}"));
    assert_named_cut(&profile, pid);
    let (status, text) = metrics.unwrap_or_else(|why| panic!("/metrics: {why}\n{summary}"));
    assert_eq!(status, 200, "{text}");
    let left_mangled = metric_sum(&text, "memprof_names_left_mangled_total");
    assert!(
        left_mangled.is_some_and(|n| n >= 1),
        "memprof_names_left_mangled_total: {left_mangled:?}\n{text}"
    );
    eprintln!(
        "agent: peak resident memory {}; {}",
        mb(ended.peak_kib),
        summary.lines().next().unwrap_or_default()
    );
}
