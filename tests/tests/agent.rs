//! `memprof agent`: every process followed, served while it runs, read by
//! the real clients: Prometheus (Debian's, scraping the agent), `go tool
//! pprof` (over HTTP), curl on the Unix socket (as root and as nobody).
//!
//! The fixture is `grow` (`fixtures/c/grow.c`), started after the agent:
//! 250 × malloc(64) per line on its stdin, all kept, nothing else
//! allocated. The agent runs with `--sample-bytes 0`: every figure exact.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memprof_tests::*;

/// One agent at a time: each follows every process of the machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A running `memprof agent --sample-bytes 0`, its socket in the test's
/// directory, on a loopback port.
struct Agent {
    child: ChildGuard,
    stderr: Lines,
    socket: PathBuf,
    port: u16,
}

impl Agent {
    fn start(dir: &TempDir, extra: &[&str]) -> Agent {
        let socket = dir.join("agent.sock");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        // The allocator functions probed (`--calls`): these tests' figures
        // are every call's (resident memory alone is `rss.rs`'s).
        let mut args = vec![
            OsStr::new("agent"),
            OsStr::new("--calls"),
            OsStr::new("--sample-bytes"),
            OsStr::new("0"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--listen"),
            OsStr::new(&listen),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let mut child = ChildGuard(
            memprof(args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("cannot start memprof agent"),
        );
        let mut stderr = Lines::new("memprof agent stderr", child.0.stderr.take().unwrap());
        stderr.wait_for("serving on", timeout());
        Agent {
            child,
            stderr,
            socket,
            port,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// GET `path` over TCP: status and body.
    fn get(&self, path: &str) -> (u16, Vec<u8>) {
        curl(&["-s", "-w", "\n%{http_code}", &self.url(path)])
    }

    /// Waits until `/api/processes` has a row `pred` accepts; that row.
    fn wait_for_row(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        poll(what, || {
            let text = self.get_text("/api/processes");
            let rows: Value = serde_json::from_str(&text).unwrap();
            rows.as_array()
                .unwrap()
                .iter()
                .find(|r| pred(r))
                .cloned()
                .ok_or(text)
        })
    }

    /// `memprof report --agent` of process `pid`, in tsv.
    fn report_tsv(&self, pid: i32) -> String {
        let pid = pid.to_string();
        let out = run_ok([
            OsStr::new("report"),
            OsStr::new("--agent"),
            self.socket.as_os_str(),
            OsStr::new("--pid"),
            OsStr::new(&pid),
            OsStr::new("--format"),
            OsStr::new("tsv"),
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn get_text(&self, path: &str) -> String {
        let (status, body) = self.get(path);
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// SIGTERM: it exits 0, its socket gone.
    fn stop(mut self) -> Vec<String> {
        self.child.signal(libc::SIGTERM);
        let status = self.child.wait_timeout(timeout());
        let lines = self.stderr.all();
        assert!(status.success(), "agent: {status}\n{}", lines.join("\n"));
        assert!(!self.socket.exists(), "the socket is left behind");
        lines
    }
}

/// curl with `args`, the body's last line its status (`-w`).
fn curl(args: &[&str]) -> (u16, Vec<u8>) {
    let output = Command::new("curl")
        .args(args)
        .output()
        .expect("cannot run curl (cargo xtask setup installs it)");
    let mut body = output.stdout;
    let cut = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let status = String::from_utf8_lossy(&body[cut..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(cut);
    (status, body)
}

/// `grow`, started now, and its stdin.
struct Grow {
    child: ChildGuard,
    stdin: ChildStdin,
    stdout: Lines,
    steps: u32,
}

impl Grow {
    fn start() -> Grow {
        let mut child = ChildGuard(
            Command::new(fixture::GROW)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdin = child.0.stdin.take().unwrap();
        let mut stdout = Lines::new("grow stdout", child.0.stdout.take().unwrap());
        stdout.wait_for("ready", timeout());
        Grow {
            child,
            stdin,
            stdout,
            steps: 0,
        }
    }

    fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// One more step: 250 × 64 bytes at `grow`.
    fn grow(&mut self) {
        writeln!(self.stdin, "go").unwrap();
        self.steps += 1;
        self.stdout
            .wait_for(&format!("grown {}", self.steps), timeout());
    }
}

/// Polls `what` until it gives `Some`, or panics after [`timeout()`] with
/// the last thing seen.
fn poll<T>(what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout();
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("{what}: never came; last:\n{last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The samples of a `/metrics` text for process `pid`: `name{…kind} value`.
fn metric(text: &str, name: &str, pid: i32, kind: &str) -> Option<u64> {
    let prefix = format!("{name}{{pid=\"{pid}\",");
    let kind = format!("kind=\"{kind}\"}}");
    text.lines()
        .find(|l| l.starts_with(&prefix) && l.contains(&kind))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn prometheus_scrapes_the_exact_live_bytes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-prometheus");
    let agent = Agent::start(&dir, &[]);
    let mut grow = Grow::start();
    grow.grow();
    grow.grow();
    let pid = grow.pid();

    // The exposition: the fixture's exact figures, and promtool accepts it.
    let text = poll("grow's live bytes in /metrics", || {
        let text = agent.get_text("/metrics");
        match metric(&text, "memprof_process_live_bytes", pid, "libc") {
            Some(32_000) => Ok(text),
            _ => Err(text),
        }
    });
    assert_eq!(
        metric(&text, "memprof_process_live_blocks", pid, "libc"),
        Some(500)
    );
    assert_eq!(
        metric(&text, "memprof_process_live_bytes", pid, "mmap"),
        Some(0)
    );
    let line = format!(
        "memprof_process_allocations_total{{pid=\"{pid}\",comm=\"grow\",exe=\"{}\"}} 500",
        fixture::GROW
    );
    assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    let metrics_file = dir.join("metrics.txt");
    std::fs::write(&metrics_file, &text).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&metrics_file).unwrap())
        .output()
        .expect("cannot run promtool (cargo xtask setup installs prometheus)");
    assert!(
        check.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // A real Prometheus scrapes it every second; its query API gives the figure.
    let prometheus_port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: memprof\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            agent.port
        ),
    )
    .unwrap();
    let _prometheus = ChildGuard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("cannot start prometheus (cargo xtask setup installs it)"),
    );
    let query = format!(
        "http://127.0.0.1:{prometheus_port}/api/v1/query?query=memprof_process_live_bytes%7Bpid%3D%22{pid}%22%2Ckind%3D%22libc%22%7D"
    );
    let answer = poll("Prometheus's answer", || {
        let (status, body) = curl(&["-s", "-w", "\n%{http_code}", &query]);
        let body = String::from_utf8_lossy(&body).into_owned();
        match status == 200 && body.contains("\"result\":[{") {
            true => Ok(body),
            false => Err(body),
        }
    });
    let json: Value = serde_json::from_str(&answer).unwrap();
    let result = &json["data"]["result"][0];
    assert_eq!(result["metric"]["comm"], "grow", "{answer}");
    assert_eq!(result["metric"]["job"], "memprof", "{answer}");
    assert_eq!(result["value"][1], "32000", "{answer}");

    // Let go: the fixture runs on, and grows on, untraced.
    agent.stop();
    grow.grow();
    assert!(grow.child.is_running());
}

/// `go tool pprof -raw URL`: its output.
fn pprof_raw(url: &str) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof", "-raw", url])
        .env("PPROF_TMPDIR", std::env::temp_dir())
        .output()
        .expect("cannot run go tool pprof (cargo xtask setup installs golang-go)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "go tool pprof -raw {url}: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// From `pprof -raw`: the values of the samples whose stack names
/// `function` (alloc_objects, alloc_space, inuse_objects, inuse_space;
/// the resident pages' own types after them, and their samples, are
/// left out).
fn samples_at(raw: &str, function: &str) -> Vec<[i64; 4]> {
    // Locations: "     3: 0x401156 M=1 grow /src/grow.c:30 s=0".
    let mut ids = Vec::new();
    let mut in_locations = false;
    for line in raw.lines() {
        if line.starts_with("Locations") {
            in_locations = true;
            continue;
        }
        if line.starts_with("Mappings") {
            break;
        }
        if in_locations && line.contains(&format!(" {function} ")) {
            if let Some(id) = line
                .split(':')
                .next()
                .and_then(|i| i.trim().parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
    }
    let mut samples = Vec::new();
    for line in raw.lines().take_while(|l| !l.starts_with("Locations")) {
        let Some((values, stack)) = line.split_once(':') else {
            continue;
        };
        let values: Vec<i64> = values
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        let Some(values) = values.get(..4).and_then(|v| <[i64; 4]>::try_from(v).ok()) else {
            continue;
        };
        if values == [0; 4] {
            continue; // resident pages
        }
        let stack: Vec<u64> = stack
            .split_whitespace()
            .filter_map(|i| i.parse().ok())
            .collect();
        if stack.iter().any(|i| ids.contains(i)) {
            samples.push(values);
        }
    }
    samples
}

#[test]
fn go_tool_pprof_reads_the_heap_and_what_a_window_allocated() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-pprof");
    let agent = Agent::start(&dir, &[]);
    let mut grow = Grow::start();
    grow.grow();
    grow.grow();
    let pid = grow.pid();

    let raw = pprof_raw(&agent.url(&format!("/debug/pprof/heap?pid={pid}")));
    assert!(
        raw.contains("alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes"),
        "{raw}"
    );
    assert_eq!(
        samples_at(&raw, "grow"),
        vec![[500, 32_000, 500, 32_000]],
        "{raw}"
    );
    // By program name: the same process.
    let by_name = pprof_raw(&agent.url("/debug/pprof/heap?comm=grow"));
    assert_eq!(
        samples_at(&by_name, "grow"),
        vec![[500, 32_000, 500, 32_000]],
        "{by_name}"
    );

    // ?seconds=3: only the step made within the window.
    let url = agent.url(&format!("/debug/pprof/heap?pid={pid}&seconds=3"));
    let window = std::thread::spawn(move || pprof_raw(&url));
    std::thread::sleep(Duration::from_millis(1500));
    grow.grow();
    let raw = window.join().unwrap();
    assert_eq!(
        samples_at(&raw, "grow"),
        vec![[250, 16_000, 250, 16_000]],
        "{raw}"
    );

    // `memprof report --agent`: any report format, of the live process.
    let tsv = agent.report_tsv(pid);
    assert!(
        tsv.lines()
            .any(|l| l.starts_with("750\t48000\t") && l.contains("in 'grow'")),
        "{tsv}"
    );
    let nobody = run([
        OsStr::new("report"),
        OsStr::new("--agent"),
        agent.socket.as_os_str(),
        OsStr::new("--pid"),
        OsStr::new("999999999"),
    ]);
    assert_one_line_error(&nobody, &["pid 999999999 is not followed"]);
    let no_agent = run(["report", "--agent", "/nonexistent/agent.sock", "--pid", "1"]);
    assert_one_line_error(
        &no_agent,
        &["--agent /nonexistent/agent.sock", "no agent answers there"],
    );

    // A process nobody follows: one line, 404.
    let (status, body) = agent.get("/debug/pprof/heap?pid=999999999");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let (status, body) = agent.get("/debug/pprof/heap");
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "memprof agent: say which process: ?pid=N or ?comm=NAME (GET /api/processes lists them)\n"
    );
    agent.stop();
}

#[test]
fn a_process_that_ended_is_served_with_its_exit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-ended");
    let agent = Agent::start(&dir, &[]);
    let status = Command::new(fixture::BASIC).status().unwrap();
    assert!(status.success());
    let row = agent.wait_for_row("basic among the ended processes", |r| {
        r["comm"] == "basic" && r["running"] == false
    });
    assert_eq!(row["exit"]["code"], 0, "{row}");
    assert_eq!(row["live_bytes"], 28_800, "{row}");
    assert_eq!(row["live_blocks"], 600, "{row}");
    let pid = row["pid"].as_u64().unwrap();
    let profile = dir.join("basic.json");
    std::fs::write(&profile, agent.get_text(&format!("/api/profile?pid={pid}"))).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let counts = Counts::of(group_at(&json, "libc", "make_foo"));
    assert_eq!(
        (
            counts.live_count,
            counts.live_bytes,
            counts.total_count,
            counts.total_bytes
        ),
        (600, 28_800, 1_000, 48_000)
    );
    // Its timeline ends with its figures as it ended.
    let samples = json["timeline"]["samples"].as_array().unwrap();
    let end = samples.last().unwrap();
    assert_eq!(
        end["live"]["libc"],
        serde_json::json!([600, 28_800]),
        "{end}"
    );
    assert_eq!(end["t_s"], json["processes"][0]["end_s"], "{end}");
    // Any format of `memprof report`: markdown names the site.
    let markdown = agent.get_text(&format!("/api/profile?pid={pid}&format=markdown"));
    assert!(markdown.contains("make_foo"), "{markdown}");

    // And `memprof report`'s filters, by their names.
    let groups = |query: &str| -> Vec<Value> {
        let text = agent.get_text(&format!("/api/profile?pid={pid}&{query}"));
        let json: Value = serde_json::from_str(&text).unwrap();
        json["groups"].as_array().unwrap().clone()
    };
    let kept = groups("function=^make_foo$");
    assert!(!kept.is_empty());
    assert_eq!(
        kept.iter()
            .filter(|g| !g["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["function"] == "make_foo"))
            .count(),
        0
    );
    let json: Value = serde_json::json!({ "groups": kept });
    let counts = Counts::of(group_at(&json, "libc", "make_foo"));
    assert_eq!((counts.live_count, counts.live_bytes), (600, 28_800));
    assert_eq!(groups("function=^no_such_function$").len(), 0);
    assert_eq!(groups("kind=mmap&function=^make_foo$").len(), 0);
    let tsv = agent.get_text(&format!(
        "/api/profile?pid={pid}&format=tsv&top=1&min_bytes=0"
    ));
    // The number of rows, then the one row: make_foo's.
    let lines: Vec<&str> = tsv.lines().collect();
    assert_eq!(lines.len(), 2, "{tsv}");
    assert_eq!(lines[0], "1");
    assert!(lines[1].starts_with("600\t28800\t"), "{tsv}");
    for (query, said) in [
        ("top=x", "invalid value 'x' for '--top <N>'"),
        ("output=/tmp/x", "output: not a parameter of a profile"),
        ("leaked=maybe", "leaked=maybe: true or false"),
        ("function=(", "--function"),
    ] {
        let (status, body) = agent.get(&format!("/api/profile?pid={pid}&{query}"));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(said), "{query}: {body}");
        assert_eq!(body.trim_end().lines().count(), 1, "{query}: {body}");
    }
    agent.stop();
}

/// curl on the Unix socket, as `user` (`None`: root).
fn curl_socket(socket: &Path, user: Option<&str>) -> std::process::Output {
    let mut command = match user {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    command
        .args(["-s", "-S", "-v", "--unix-socket"])
        .arg(socket)
        .arg("http://agent/metrics")
        .output()
        .unwrap()
}

#[test]
fn the_socket_is_roots_alone_and_a_remote_address_needs_a_flag() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-security");
    use std::os::unix::fs::PermissionsExt;
    let agent = Agent::start(&dir, &[]);
    let mode = std::fs::metadata(&agent.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let root = curl_socket(&agent.socket, None);
    assert!(root.status.success());
    assert!(
        String::from_utf8_lossy(&root.stdout).contains("# TYPE memprof_process_live_bytes gauge")
    );
    let nobody = curl_socket(&agent.socket, Some("nobody"));
    assert_eq!(nobody.status.code(), Some(7), "{nobody:?}");
    assert!(
        // curl shortens the path it shows.
        String::from_utf8_lossy(&nobody.stderr)
            .lines()
            .any(|l| l.starts_with("* Immediate connect fail for ")
                && l.ends_with(": Permission denied")),
        "{nobody:?}"
    );
    // A second agent on the same socket is refused, and the first serves on.
    let second = run([
        OsStr::new("agent"),
        OsStr::new("--socket"),
        agent.socket.as_os_str(),
    ]);
    assert_one_line_error(&second, &["another memprof agent serves there"]);
    assert!(curl_socket(&agent.socket, None).status.success());
    agent.stop();

    // Not a loopback address: refused before anything loads, in one line.
    let socket = dir.join("remote.sock");
    let remote = run([
        OsStr::new("agent"),
        OsStr::new("--socket"),
        socket.as_os_str(),
        OsStr::new("--listen"),
        OsStr::new("0.0.0.0:6060"),
    ]);
    assert_one_line_error(
        &remote,
        &[
            "--listen 0.0.0.0:6060",
            "not a loopback address",
            "--allow-remote",
        ],
    );
    assert!(!socket.exists());
    // A directory others can write to: refused (they could swap the socket).
    let open_dir = dir.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let in_open = run([
        OsStr::new("agent"),
        OsStr::new("--socket"),
        open_dir.join("agent.sock").as_os_str(),
    ]);
    assert_one_line_error(&in_open, &["writable by others", "refused"]);
    // Something that is not a socket where the socket goes: left alone.
    let file = dir.join("file");
    std::fs::write(&file, "mine").unwrap();
    let taken = run([
        OsStr::new("agent"),
        OsStr::new("--socket"),
        file.as_os_str(),
    ]);
    assert_one_line_error(&taken, &["not a socket", "not removed"]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// A memory cgroup of its own with a small limit (cgroup v1's memory
/// hierarchy where mounted, else v2's), removed on drop.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> MemoryCgroup {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, files): (PathBuf, &[&str]) = match v1.join("cgroup.procs").exists() {
            true => (
                v1.join(name),
                &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
            ),
            false => (
                Path::new("/sys/fs/cgroup").join(name),
                &["memory.max", "memory.swap.max"],
            ),
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (i, file) in files.iter().enumerate() {
            let path = dir.join(file);
            // No swap (v2), or swap and memory together (v1).
            let value = if i == 1 && file.starts_with("memory.swap") {
                0
            } else {
                limit
            };
            if path.exists() {
                std::fs::write(&path, value.to_string())
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
        MemoryCgroup(dir)
    }

    /// `program`, started in the cgroup.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            &format!("echo $$ > {}/cgroup.procs && exec \"$0\"", self.0.display()),
            program,
        ]);
        command
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_process_the_oom_killer_ends_is_served_marked_so() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-oom");
    let agent = Agent::start(&dir, &[]);
    let cgroup = MemoryCgroup::new(
        &format!("memprof-test-oom-{}", std::process::id()),
        64 << 20,
    );
    let mut child = ChildGuard(
        cgroup
            .command(fixture::OOM_GROWER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.pid();
    let mut stdin = child.0.stdin.take().unwrap();
    let mut stdout = Lines::new("oom_grower stdout", child.0.stdout.take().unwrap());
    stdout.wait_for("ready", timeout());
    writeln!(stdin, "go").unwrap();
    let status = child.wait_timeout(timeout());
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let lines = stdout.all();
    let said: u64 = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("allocated ")?.parse().ok())
        .unwrap_or_else(|| panic!("no 'allocated N' in {lines:?}"));
    assert!(
        (20..=64).contains(&said),
        "{said} MiB before the kill of a 64 MiB cgroup"
    );

    // Listed as ended, by the OOM killer.
    let row = agent.wait_for_row("oom_grower among the ended processes", |r| {
        r["pid"] == pid && r["comm"] == "oom_grower" && r["running"] == false
    });
    assert_eq!(row["exit"]["signal"], 9, "{row}");
    assert_eq!(row["exit"]["oom_killed"], true, "{row}");

    // Its profile: what it held live when killed, the growing function first.
    let json: Value =
        serde_json::from_str(&agent.get_text(&format!("/api/profile?pid={pid}"))).unwrap();
    assert_eq!(json["target"]["exit_signal"], 9, "{}", json["target"]);
    assert_eq!(json["target"]["oom_killed"], true, "{}", json["target"]);
    let counts = Counts::of(group_at(&json, "libc", "grow_until_killed"));
    assert!(
        counts.live_count == said || counts.live_count == said + 1,
        "{} live blocks at grow_until_killed, {said} said",
        counts.live_count
    );
    assert_eq!(counts.live_bytes, counts.live_count << 20);
    let markdown = agent.get_text(&format!("/api/profile?pid={pid}&format=markdown"));
    assert!(
        markdown.contains("killed by signal 9 (the OOM killer)"),
        "{markdown}"
    );
    let first_row = markdown
        .lines()
        .skip_while(|l| !l.starts_with("|---"))
        .nth(1)
        .unwrap_or_else(|| panic!("no first row in:\n{markdown}"));
    assert!(first_row.contains("grow_until_killed"), "{markdown}");
    let stderr = agent.stop();
    assert!(
        stderr.iter().any(|l| l.contains(&format!(
            "pid {pid} (oom_grower) was ended by the OOM killer"
        )) || l.contains("processes were ended by the OOM killer")),
        "{}",
        stderr.join("\n")
    );
}

#[test]
fn the_page_lists_the_process_and_a_click_shows_its_profile() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-page");
    // grow alone: Chromium's processes, followed, would be slow and rank first.
    let agent = Agent::start(&dir, &["--comm", "grow"]);
    let mut grow = Grow::start();
    grow.grow();
    let pid = grow.pid();
    agent.wait_for_row("grow in /api/processes", |r| {
        r["pid"] == pid && r["comm"] == "grow"
    });

    // `/#pid=N` clicks grow's row as the page loads.
    let png = dir.join("page.png");
    let dom = chromium(&agent.url(&format!("/#pid={pid}")), &png);
    let row = dom
        .lines()
        .find(|l| l.contains(&format!("<tr data-pid=\"{pid}\"")))
        .unwrap_or_else(|| panic!("no row of pid {pid} in:\n{dom}"));
    assert!(row.contains("class=\"chosen\""), "{row}");
    assert!(row.contains("<td>grow</td>"), "{row}");
    assert!(row.contains("<td class=\"n\">16,000</td>"), "{row}");
    // Its profile, drawn by the page from /api/profile?format=json.
    assert!(
        dom.contains(&format!(
            "<h2 id=\"title\">pid {pid}: {}</h2>",
            fixture::GROW
        )),
        "no title of pid {pid} in:\n{dom}"
    );
    assert!(
        dom.contains("16,000 bytes live in 250 blocks; 16,000 bytes allocated"),
        "no summary in:\n{dom}"
    );
    // The flamegraph: grow() holds all of it.
    let grow_frame = dom
        .split("<div class=\"f")
        .find(|f| f.contains(">grow</div>"))
        .unwrap_or_else(|| panic!("no grow frame in the flamegraph:\n{dom}"));
    assert!(
        grow_frame.contains("16,000 live bytes (100.00 %)"),
        "{grow_frame}"
    );
    // The top stacks: grow's, with its file and line.
    let stacks = &dom[dom.find("id=\"stacks\"").unwrap()..];
    let body = &stacks[stacks.find("<tbody>").unwrap()..];
    let first = &body[..body.find("</tr>").unwrap()];
    assert!(
        first.contains("<td>libc</td><td></td><td class=\"n\">16,000</td><td class=\"n\">250</td><td class=\"n\">16,000</td>"),
        "{first}"
    );
    assert!(first.contains("<code>grow (grow.c:"), "{first}");
    // The timeline: libc's line, and the scale's top is grow's bytes.
    let timeline = &dom[dom.find("id=\"timeline\"").unwrap()..dom.find("id=\"flamebar\"").unwrap()];
    assert!(timeline.contains(">libc</text>"), "{timeline}");
    assert!(timeline.contains(">16,000 B</text>"), "{timeline}");
    assert!(
        dom.contains("No live Boehm GC objects"),
        "no types table in:\n{dom}"
    );

    // And what a person sees: the page's title and grow's row, by OCR.
    let ocr = Command::new("tesseract")
        .arg(&png)
        .args(["stdout", "--psm", "11"])
        .stderr(Stdio::null())
        .output()
        .expect("cannot run tesseract (cargo xtask setup installs tesseract-ocr)");
    let text = String::from_utf8_lossy(&ocr.stdout);
    assert!(
        text.contains("memprof agent"),
        "OCR of {}:\n{text}",
        png.display()
    );
    assert!(text.contains("16,000"), "OCR of {}:\n{text}", png.display());
    agent.stop();
}

/// `Name:`-like field of /proc/PID/status.
fn status_field(pid: i32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// `idle_heap_debug` (an idle Crystal program: built its data,
/// collected, waits on its stdin) started, ready, and seen by `agent`
/// with its session (collections counted: a process without one has none).
struct IdleCrystal {
    child: ChildGuard,
    pid: i32,
    stdin: std::process::ChildStdin,
    stdout: Lines,
}

impl IdleCrystal {
    fn start(agent: &Agent) -> IdleCrystal {
        let mut child = ChildGuard(
            Command::new(fixture::crystal::IDLE_HEAP_DEBUG)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let pid = child.pid();
        let stdin = child.0.stdin.take().unwrap();
        let mut stdout = Lines::new("idle_heap_debug stdout", child.0.stdout.take().unwrap());
        stdout.wait_for("ready", timeout());
        agent.wait_for_row("idle_heap_debug's session", |r| {
            r["pid"] == pid && r["collections"].is_u64()
        });
        IdleCrystal {
            child,
            pid,
            stdin,
            stdout,
        }
    }
}

/// The agent's defaults: a Crystal program's session does not trace it
/// (refills judged by the kernel), so its exit is known only from the
/// kernel's: served with it, not as unknown.
#[test]
fn a_crystal_program_untraced_is_served_with_its_exit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-crystal-exit");
    let agent = Agent::start(&dir, &[]);
    let IdleCrystal {
        mut child,
        pid,
        mut stdin,
        mut stdout,
    } = IdleCrystal::start(&agent);
    assert_eq!(status_field(pid, "TracerPid"), "0");
    // Two collections while followed (it made none since its session
    // began: it waits, idle): counted running, and kept once it ended.
    for _ in 0..2 {
        writeln!(stdin, "collect").unwrap();
        stdout.wait_for("collected", timeout());
    }
    agent.wait_for_row("its two collections", |r| {
        r["pid"] == pid && r["collections"] == 2
    });
    drop(stdin);
    assert!(child.wait_timeout(timeout()).success());
    // Its session may end before the kernel's word is read: the row
    // is then served as ended, how not known yet, for a moment.
    let row = agent.wait_for_row("it, ended, with how", |r| {
        r["pid"] == pid
            && r["running"] == false
            && (r["exit"]["code"].is_i64() || r["exit"]["signal"].is_i64())
    });
    assert_eq!(row["exit"]["code"], 0, "{row}");
    assert_eq!(row["comm"], "idle_heap_debug", "{row}");
    assert_eq!(row["collections"], 2, "{row}");
    agent.stop();
}

#[test]
fn a_crystal_program_gets_its_session_and_its_classes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-crystal");
    let agent = Agent::start(&dir, &["--gc-sampling", "exact"]);
    // Kept to the end: let go, it is killed.
    let IdleCrystal {
        child: _child,
        pid,
        mut stdin,
        mut stdout,
    } = IdleCrystal::start(&agent);
    writeln!(stdin, "more 5000").unwrap();
    stdout.wait_for("allocated", timeout());

    // Its profile names the class, with the exact count.
    let extra = poll("5,000 Extra objects in its profile", || {
        let text = agent.get_text(&format!("/api/profile?pid={pid}"));
        let json: Value = serde_json::from_str(&text).unwrap();
        let found = groups(&json)
            .iter()
            .find(|g| g["type_name"] == "Extra" && g["total_count"] == 5000)
            .cloned();
        found.ok_or(text)
    });
    assert_eq!(extra["kind"], "gc_atomic", "{extra}");
    assert_eq!(extra["live_count"], 5000, "{extra}");
    let bytes = extra["total_bytes"].as_i64().unwrap();
    assert_eq!(bytes % 5000, 0, "{extra}");
    // pprof: the same figures at Extra.new.
    let raw = pprof_raw(&agent.url(&format!("/debug/pprof/heap?pid={pid}")));
    assert_eq!(
        samples_at(&raw, "Extra.new"),
        vec![[5000, bytes, 5000, bytes]],
        "{raw}"
    );
    let types = agent.get_text(&format!("/api/profile?pid={pid}&format=types"));
    assert!(
        types
            .lines()
            .any(|l| l.contains("| Extra") && l.contains("5,000")),
        "{types}"
    );

    // Another that ends while followed: served with its exit, which its
    // session (not tracing it) learns from the kernel.
    let IdleCrystal {
        child: mut other,
        pid: other_pid,
        stdin: other_stdin,
        ..
    } = IdleCrystal::start(&agent);
    drop(other_stdin);
    assert!(other.wait_timeout(timeout()).success());
    let row = agent.wait_for_row("the other, ended with its exit", |r| {
        r["pid"] == other_pid && r["running"] == false && r["exit"]["code"] == 0
    });
    assert_eq!(row["comm"], "idle_heap_debug", "{row}");

    // Let go: untraced, and it collects and answers on.
    agent.stop();
    assert_eq!(status_field(pid, "TracerPid"), "0");
    writeln!(stdin, "collect").unwrap();
    stdout.wait_for("collected", timeout());
}

/// A Crystal command-line tool that lives 0.3 s, run again every few
/// seconds: its session starts in ~0.5 s the first time (the kernel
/// verifies its programs), too late; from then on a spare load, verified
/// ahead, makes it ~0.08 s, and each run is served with its 2,000
/// objects, exactly.
#[test]
fn a_short_crystal_program_run_again_is_seen_from_its_second_session() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-short-crystal");
    let agent = Agent::start(&dir, &["--gc-sampling", "exact"]);
    let mut pids = Vec::new();
    for _ in 0..4 {
        let out = Command::new(fixture::crystal::SHORT_LIVED_DEBUG)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = out.id() as i32;
        let out = out.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "made 2000\n");
        pids.push(pid);
        // The next run starts once this one's end is served (its
        // session's, or the machine's row if it was missed), and a while
        // later, as a tool is run again: the spare its session started
        // loading (~0.45 s of the kernel's work) is ready by then. Runs
        // back to back would wait for part of it.
        agent.wait_for_row("the run, ended", |r| {
            r["pid"] == pid && r["running"] == false
        });
        std::thread::sleep(Duration::from_millis(1500));
    }
    // The first run's session loads the spare the others take (the
    // second's start may still meet its load): the last two are seen
    // from before their first Record.
    for &pid in &pids[2..] {
        let text = agent.get_text(&format!("/api/profile?pid={pid}"));
        let json: Value = serde_json::from_str(&text).unwrap();
        let records: Vec<&Value> = groups(&json)
            .iter()
            .filter(|g| g["type_name"] == "Record")
            .collect();
        assert_eq!(records.len(), 1, "pid {pid}: {text}");
        assert_eq!(records[0]["total_count"], 2000, "pid {pid}: {text}");
        assert_eq!(records[0]["live_count"], 2000, "pid {pid}: {text}");
    }
    agent.stop();
}

/// The rows of the tables `memprof top` appended to stdout (no terminal):
/// each table's rows as their words.
fn top_tables(stdout: &str) -> Vec<Vec<Vec<String>>> {
    let mut tables = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("memprof top:") {
            tables.push(Vec::new());
            continue;
        }
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        if words.first().is_some_and(|w| w.parse::<u32>().is_ok()) {
            tables.last_mut().expect("a table").push(words);
        }
    }
    tables
}

#[test]
fn top_reads_its_figures_from_the_agent() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-top");
    let agent = Agent::start(&dir, &["--comm", "grow"]);
    let mut grow = Grow::start();
    grow.grow();
    grow.grow();
    let pid = grow.pid();
    // The agent's figure: exact (every allocation followed).
    agent.wait_for_row("grow's 32,000 bytes", |r| {
        r["pid"] == pid && r["live_bytes"] == 32_000
    });

    let top = |filter: &[&str]| {
        let mut args = vec![
            OsStr::new("top"),
            OsStr::new("--agent"),
            agent.socket.as_os_str(),
            OsStr::new("--count"),
            OsStr::new("2"),
            OsStr::new("--interval"),
            OsStr::new("0.3"),
        ];
        args.extend(filter.iter().map(OsStr::new));
        let output = run_ok(args);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        (top_tables(&stdout), stdout)
    };
    // Every running process the agent follows: grow alone (--comm grow),
    // its 32,000 bytes as top writes them (31.25 KiB), grown by none
    // between the two refreshes.
    let (tables, stdout) = top(&[]);
    assert_eq!(tables.len(), 2, "{stdout}");
    let expected = |growth: &str| {
        let mut row = vec![pid.to_string(), "grow".into(), "31.2".into(), "KiB".into()];
        row.extend(growth.split(' ').map(String::from));
        row.extend(["0".into(), "0.0".into()]);
        row
    };
    assert_eq!(tables[0], vec![expected("0 B")], "{stdout}");
    assert_eq!(tables[1], vec![expected("0 B")], "{stdout}");
    assert!(
        stdout.contains("(the agent on "),
        "the heading names the agent: {stdout}"
    );
    // --pid and --comm choose the rows.
    let (tables, stdout) = top(&["--pid", &pid.to_string()]);
    assert_eq!(tables[1], vec![expected("0 B")], "{stdout}");
    let (tables, stdout) = top(&["--comm", "nothing_such"]);
    assert!(
        tables.len() == 2 && tables.iter().all(Vec::is_empty),
        "{stdout}"
    );

    // No agent there: one line.
    let none = run(["top", "--agent", "/nonexistent/agent.sock", "--count", "1"]);
    assert_one_line_error(
        &none,
        &["--agent /nonexistent/agent.sock", "no agent answers there"],
    );
    agent.stop();
}

/// The snapshot of process `pid` (of program `grow`) in `dir`, if there.
fn snapshot_file(dir: &Path, pid: i32) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{pid}-")) && n.ends_with("-grow.mprof"))
        })
}

/// The `.mprof` files of `dir`.
fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "mprof"))
        .collect();
    files.sort();
    files
}

/// Waits until `dir` has process `pid`'s snapshot and `memprof report`
/// reads `blocks` live blocks of 64 bytes at `grow` in it; its path.
fn wait_for_snapshot(dir: &Path, pid: i32, blocks: u64) -> PathBuf {
    let line = format!("{blocks}\t{}\t", blocks * 64);
    poll(
        &format!("pid {pid}'s snapshot with {blocks} blocks"),
        || {
            let Some(file) = snapshot_file(dir, pid) else {
                return Err(format!("{:?}", snapshot_files(dir)));
            };
            let output = run([
                OsStr::new("report"),
                file.as_os_str(),
                OsStr::new("--format"),
                OsStr::new("tsv"),
            ]);
            let tsv = String::from_utf8_lossy(&output.stdout).into_owned();
            match tsv
                .lines()
                .any(|l| l.starts_with(&line) && l.contains("in 'grow'"))
            {
                true => Ok(file),
                false => Err(format!("{}: {tsv}", file.display())),
            }
        },
    )
}

/// A `/metrics` sample without labels.
fn plain_metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
}

#[test]
fn a_restarted_agent_serves_the_processes_its_dir_kept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-dir");
    let snaps = dir.join("snapshots");
    let args = [
        "--comm",
        "grow",
        "--dir",
        snaps.to_str().unwrap(),
        "--dir-every",
        "1",
    ];
    let agent = Agent::start(&dir, &args);
    // Made by the agent, root's alone.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&snaps).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let mut grow = Grow::start();
    grow.grow();
    grow.grow();
    let pid = grow.pid();
    let file = wait_for_snapshot(&snaps, pid, 500);
    // The process ends (killed): its last profile, with its exit, is written.
    grow.child.signal(libc::SIGKILL);
    grow.child.wait_timeout(timeout());
    agent.wait_for_row("grow, ended", |r| r["pid"] == pid && r["running"] == false);
    let metrics = agent.get_text("/metrics");
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots_deleted_total"),
        Some(0),
        "{metrics}"
    );
    agent.stop();
    assert_eq!(snapshot_files(&snaps), vec![file.clone()]);

    // A second agent, the same --dir: the process is served again, ended.
    let mut again = Agent::start(&dir, &args);
    again
        .stderr
        .wait_for("1 snapshot of processes seen before", timeout());
    let row = again.wait_for_row("grow, from the dir", |r| r["pid"] == pid);
    assert_eq!(row["running"], false, "{row}");
    assert_eq!(row["comm"], "grow", "{row}");
    assert_eq!(row["live_bytes"], 32_000, "{row}");
    assert_eq!(row["live_blocks"], 500, "{row}");
    assert_eq!(row["exit"]["signal"], 9, "{row}");
    let json: Value =
        serde_json::from_str(&again.get_text(&format!("/api/profile?pid={pid}&format=json")))
            .unwrap();
    let counts = Counts::of(group_at(&json, "libc", "grow"));
    assert_eq!(
        (counts.live_count, counts.live_bytes),
        (500, 32_000),
        "{json}"
    );
    // The same bytes as the file, in the file's format.
    let (status, mprof) = again.get(&format!("/api/profile?pid={pid}&format=mprof"));
    assert_eq!(status, 200);
    assert_eq!(mprof, std::fs::read(&file).unwrap());
    let (status, _) = again.get(&format!("/debug/pprof/heap?pid={pid}"));
    assert_eq!(status, 200);
    let tsv = again.report_tsv(pid);
    assert!(
        tsv.lines()
            .any(|l| l.starts_with("500\t32000\t") && l.contains("in 'grow'")),
        "{tsv}"
    );
    again.stop();

    // A file that is not a profile: skipped, one line, counted; the rest served.
    std::fs::write(snaps.join("1-2-junk.mprof"), "not a profile").unwrap();
    let third = Agent::start(&dir, &args);
    let metrics = third.get_text("/metrics");
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots_unreadable"),
        Some(1),
        "{metrics}"
    );
    third.wait_for_row("grow, from the dir", |r| {
        r["pid"] == pid && r["live_bytes"] == 32_000
    });
    let lines = third.stop();
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("1-2-junk.mprof"))
        .collect();
    assert_eq!(said.len(), 1, "{lines:?}");
    assert!(said[0].contains("skipped"), "{said:?}");
}

#[test]
fn the_dir_stays_within_its_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-budget");
    // One snapshot's size, as written for a process of `grow` that grew once.
    let measure = dir.join("measure");
    let agent = Agent::start(
        &dir,
        &[
            "--comm",
            "grow",
            "--dir",
            measure.to_str().unwrap(),
            "--dir-every",
            "1",
        ],
    );
    let mut grow = Grow::start();
    grow.grow();
    let one = std::fs::metadata(wait_for_snapshot(&measure, grow.pid(), 250))
        .unwrap()
        .len();
    agent.stop();
    drop(grow);

    // A budget for one snapshot, not two.
    let budget = one * 3 / 2;
    let snaps = dir.join("snapshots");
    let agent = Agent::start(
        &dir,
        &[
            "--comm",
            "grow",
            "--dir",
            snaps.to_str().unwrap(),
            "--dir-every",
            "1",
            "--dir-budget",
            &budget.to_string(),
        ],
    );
    let mut a = Grow::start();
    a.grow();
    let a_file = wait_for_snapshot(&snaps, a.pid(), 250);
    // A second process's snapshot: the oldest (a's) is deleted.
    let mut b = Grow::start();
    b.grow();
    let b_file = wait_for_snapshot(&snaps, b.pid(), 250);
    poll("a's snapshot deleted", || match snapshot_files(&snaps) {
        files if files == vec![b_file.clone()] => Ok(()),
        files => Err(format!("{files:?}")),
    });
    let metrics = agent.get_text("/metrics");
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots_deleted_total"),
        Some(1),
        "{metrics}"
    );
    // a grows: its new snapshot, and b's (now the oldest) is deleted.
    a.grow();
    let a_again = wait_for_snapshot(&snaps, a.pid(), 500);
    assert_eq!(a_again, a_file);
    poll("b's snapshot deleted", || match snapshot_files(&snaps) {
        files if files == vec![a_file.clone()] => Ok(()),
        files => Err(format!("{files:?}")),
    });
    let metrics = agent.get_text("/metrics");
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots_deleted_total"),
        Some(2),
        "{metrics}"
    );
    assert_eq!(
        plain_metric(&metrics, "memprof_dir_snapshots"),
        Some(1),
        "{metrics}"
    );
    let bytes = plain_metric(&metrics, "memprof_dir_bytes").unwrap();
    assert_eq!(bytes, std::fs::metadata(&a_file).unwrap().len());
    assert!(bytes <= budget, "{bytes} > {budget}");
    agent.stop();
    let total: u64 = snapshot_files(&snaps)
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(total <= budget, "{total} > {budget}");
}

#[test]
fn a_dir_others_could_write_to_is_refused() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("agent-dir-refused");
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o770)).unwrap();
    let agent = |d: &Path| {
        run([
            OsStr::new("agent"),
            OsStr::new("--calls"),
            OsStr::new("--comm"),
            OsStr::new("grow"),
            OsStr::new("--socket"),
            dir.join("agent.sock").as_os_str(),
            OsStr::new("--dir"),
            d.as_os_str(),
        ])
    };
    assert_one_line_error(&agent(&link), &["--dir", "is a symbolic link", "refused"]);
    assert_one_line_error(
        &agent(&shared),
        &[
            "--dir",
            "writable by others than root (mode 770)",
            "refused",
        ],
    );
    assert!(!dir.join("agent.sock").exists());
}

/// `memprof_files{state=…}` of a `/metrics` text: (parsed, unwind_rows).
fn files_held(text: &str) -> (u64, u64) {
    let value = |state: &str| {
        let prefix = format!("memprof_files{{state=\"{state}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no memprof_files{{state=\"{state}\"}} in:\n{text}"))
    };
    (value("parsed"), value("unwind_rows"))
}

/// A machine runs ever new files (a build's every binary): what the
/// agent parsed of a program's files is let go once no process followed
/// maps them. The build that kept every file it had parsed grew by the
/// file's symbols and mapping per new binary, for ever (a headless
/// Chromium left the agent 100 MB bigger). Their unwind rows stay, for
/// the next process that maps them (a build runs its compiler again and
/// again): a copy run again gets no new file's rows.
#[test]
fn the_files_of_programs_that_ended_are_let_go() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("agent-files");
    // Five copies of one program: five files, one program name.
    let copies: Vec<std::path::PathBuf> = (0..5)
        .map(|i| {
            let sub = dir.join(&format!("copy{i}"));
            std::fs::create_dir(&sub).unwrap();
            let path = sub.join("fresh_binary");
            std::fs::copy(fixture::BASIC, &path).unwrap();
            path
        })
        .collect();
    let agent = Agent::start(&dir, &["--comm", "fresh_binary"]);
    let ended = |n: usize| {
        poll("the copies listed ended", || {
            let text = agent.get_text("/api/processes");
            let rows: Value = serde_json::from_str(&text).unwrap();
            let ended = rows
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["comm"] == "fresh_binary" && r["running"] == false)
                .count();
            if ended == n {
                Ok(())
            } else {
                Err(text)
            }
        })
    };
    for copy in &copies {
        assert!(Command::new(copy).status().unwrap().success());
    }
    ended(5);
    // While the copies end, they are held: each copy's file, and the
    // libraries they mapped (libc, the dynamic linker).
    let during = files_held(&agent.get_text("/metrics"));
    eprintln!("files held with the copies ended: {during:?}");
    // Then none parsed: no process followed maps any file. Their rows
    // stay, every one.
    let none_parsed = || {
        poll("the files let go", || {
            let held = files_held(&agent.get_text("/metrics"));
            if held.0 == 0 {
                Ok(held)
            } else {
                Err(format!("{held:?}"))
            }
        })
    };
    assert_eq!(none_parsed(), (0, during.1));
    // A copy run again maps files with rows: none added.
    assert!(Command::new(&copies[0]).status().unwrap().success());
    ended(6);
    assert_eq!(none_parsed(), (0, during.1));
    // The profiles of the ended copies stay, named.
    let text = agent.get_text("/api/processes");
    let rows: Value = serde_json::from_str(&text).unwrap();
    let pid = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["comm"] == "fresh_binary")
        .unwrap()["pid"]
        .clone();
    let markdown = agent.get_text(&format!("/api/profile?pid={pid}&format=markdown"));
    assert!(markdown.contains("make_foo"), "{markdown}");
    agent.stop();
}
