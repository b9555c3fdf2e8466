//! `memprof run` on a shell that starts processes: every process that
//! `exec`s a program is profiled from its first instruction, each one
//! listed with its parent, program and exit, its allocations under its
//! own pid; `--no-follow` lists them without profiling them; the report's
//! `--pid`/`--comm` show one.

use memprof_tests::*;
use serde_json::Value;
use std::time::Duration;

/// sh starts basic twice and a second sh, which starts basic once more.
/// The trailing `:` keeps each shell from exec'ing its last command.
fn family() -> (Vec<String>, String) {
    let basic = fixture::BASIC;
    let inner = format!("{basic} three; :");
    let script = format!("{basic} one; {basic} two; /bin/sh -c '{inner}'; :");
    (vec!["/bin/sh".into(), "-c".into(), script], inner)
}

/// Runs the family under memprof with `extra` flags; returns the report's JSON.
fn profile_family(dir: &TempDir, name: &str, extra: &[&str]) -> (std::path::PathBuf, Value) {
    let profile = dir.join(name);
    let (command, _) = family();
    let mut args = vec!["run", "-o", profile.to_str().unwrap()];
    args.extend(extra);
    args.push("--");
    args.extend(command.iter().map(String::as_str));
    run_ok(&args);
    let json = report_json(&profile);
    (profile, json)
}

/// forker's worker_alloc and delayed's delayed_alloc: 500 × malloc(64), kept.
const KEPT_500: Counts = Counts {
    live_count: 500,
    live_bytes: 32_000,
    total_count: 500,
    total_bytes: 32_000,
};

/// The groups at `function`: one in each of `pids` (no other), each `counts`.
fn assert_once_in_each(json: &Value, function: &str, pids: &[u64], counts: Counts) {
    let at = groups_at(json, "libc", function);
    let mut found: Vec<u64> = at.iter().map(|g| uint(g, "/pid")).collect();
    found.sort();
    let mut pids = pids.to_vec();
    pids.sort();
    assert_eq!(found, pids, "{function}: {}", list_groups(json));
    for g in at {
        assert_eq!(Counts::of(g), counts, "{function} in {}", uint(g, "/pid"));
    }
}

/// One line per process, for failure messages.
fn summary(processes: &[Value]) -> Vec<String> {
    processes
        .iter()
        .map(|p| {
            let ns = &p["ns_pid"];
            format!(
                "pid {} (ns {ns}) ppid {} profiled {} {}",
                p["pid"], p["ppid"], p["profiled"], p["command"]
            )
        })
        .collect()
}

/// The processes in the order they started, checked against the family:
/// commands and parents. Returns their pids.
fn check_family(json: &Value, profiled: bool) -> Vec<u64> {
    let basic = fixture::BASIC;
    let (_, inner) = family();
    let processes = json["processes"].as_array().expect("processes");
    let summary = summary(processes);
    assert_eq!(processes.len(), 5, "{summary:#?}");
    let pid = |i: usize| uint(&processes[i], "/pid");
    assert_eq!(pid(0), uint(json, "/target/pid"));
    assert_eq!(processes[0]["profiled"], true);
    assert_eq!(processes[0]["comm"], "sh");
    assert_eq!(processes[0]["exit"]["code"], 0);
    let expected: [(Vec<String>, u64); 4] = [
        (vec![basic.into(), "one".into()], pid(0)),
        (vec![basic.into(), "two".into()], pid(0)),
        (vec!["/bin/sh".into(), "-c".into(), inner], pid(0)),
        (vec![basic.into(), "three".into()], pid(3)),
    ];
    for (i, (argv, parent)) in expected.iter().enumerate() {
        let p = &processes[i + 1];
        let command: Vec<String> = serde_json::from_value(p["command"].clone()).unwrap();
        assert_eq!(&command, argv, "{summary:#?}");
        assert_eq!(uint(p, "/ppid"), *parent, "{summary:#?}");
        assert_eq!(p["profiled"], profiled, "{summary:#?}");
        assert_eq!(p["exit"]["code"], 0, "{p:#}");
        let (start, end) = (p["start_s"].as_f64().unwrap(), p["end_s"].as_f64().unwrap());
        assert!(end >= start, "{p:#}");
    }
    (0..5).map(pid).collect()
}

#[test]
fn run_profiles_every_process_the_command_starts() {
    let dir = TempDir::new("processes");
    let (profile, json) = profile_family(&dir, "family.mprof", &[]);
    let pids = check_family(&json, true);
    let processes = json["processes"].as_array().unwrap();

    // basic's 1,000 × malloc(48) at make_foo, 400 freed: once per run of
    // it, each under its own pid; the shells have none.
    assert_once_in_each(&json, "make_foo", &[pids[1], pids[2], pids[4]], MAKE_FOO);
    // Each process's figures are its groups' sums; the counters add up.
    let all = groups(&json);
    let mut allocs = 0;
    for p in processes {
        let pid = uint(p, "/pid");
        let of_it: Vec<_> = all.iter().filter(|g| uint(g, "/pid") == pid).collect();
        assert!(!of_it.is_empty(), "no groups of {pid}");
        for field in ["live_count", "live_bytes", "total_count", "total_bytes"] {
            let sum: u64 = of_it.iter().map(|g| uint(g, &format!("/{field}"))).sum();
            assert_eq!(uint(p, &format!("/{field}")), sum, "{pid} {field}");
        }
        allocs += uint(p, "/counters/allocs");
    }
    assert_eq!(uint(&json, "/counters/allocs"), allocs);
    assert_eq!(uint(&json, "/lost_events"), 0);

    // One process: its stacks alone, as the target.
    let one = report(&profile, "json", &["--pid", &pids[2].to_string()]);
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(uint(&one, "/target/pid"), pids[2]);
    assert!(groups(&one).iter().all(|g| uint(g, "/pid") == pids[2]));
    assert_eq!(groups_at(&one, "libc", "make_foo").len(), 1);
    let by_name = report(&profile, "json", &["--comm", "basic"]);
    let by_name: Value = serde_json::from_str(&by_name).unwrap();
    assert_eq!(groups_at(&by_name, "libc", "make_foo").len(), 3);
    assert_eq!(by_name["processes"].as_array().unwrap().len(), 3);

    // Every frame of every process is in a module (a short program's
    // libraries included, mapped after it was let go at its `exec`).
    let all_rows = report(&profile, "markdown", &["--top", "10000"]);
    assert!(!all_rows.contains("[unknown]+0x"), "{all_rows}");

    // The markdown report lists them, each with its parent and figures.
    let markdown = report(&profile, "markdown", &[]);
    assert!(markdown.contains("Processes: 5, 5 profiled."), "{markdown}");
    for (i, p) in processes.iter().enumerate() {
        let row = format!("| {} | {} | ", pids[i], uint(p, "/ppid"));
        assert!(markdown.contains(&row), "no row {row:?} in\n{markdown}");
    }
    // A process not in the profile: one line, naming what it has.
    let output = run(["report", profile.to_str().unwrap(), "--pid", "1"]);
    assert_one_line_error(&output, &["no such process", &pids[0].to_string()]);
}

#[test]
fn no_follow_lists_the_processes_without_profiling_them() {
    let dir = TempDir::new("processes_no_follow");
    let (profile, json) = profile_family(&dir, "family.mprof", &["--no-follow"]);
    let pids = check_family(&json, false);
    for p in &json["processes"].as_array().unwrap()[1..] {
        assert_eq!(p["live_bytes"], Value::Null, "not profiled: no figures");
    }
    // Only the shell is profiled: basic's make_foo blocks are not here.
    assert!(groups_at(&json, "libc", "make_foo").is_empty());
    assert!(groups(&json).iter().all(|g| uint(g, "/pid") == pids[0]));
    let markdown = report(&profile, "markdown", &[]);
    assert!(
        markdown.contains("Processes: 5, 1 profiled; 4 not"),
        "{markdown}"
    );

    let child = pids[1].to_string();
    let output = run(["report", profile.to_str().unwrap(), "--pid", &child]);
    assert_one_line_error(&output, &[&child, "not profiled", "sh"]);
    let output = run(["report", profile.to_str().unwrap(), "--comm", "basic"]);
    assert_one_line_error(&output, &["basic", "not profiled"]);
}

/// The forked workers of `profile` (a parent and `count` workers): each
/// profiled from its fork, its exit known, exactly its 500 blocks at
/// worker_alloc under its own pid and no frame unnamed.
fn check_workers(profile: &std::path::Path, count: usize) {
    let json = report_json(profile);
    let processes = json["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), count + 1, "{processes:#?}");
    let parent = uint(&processes[0], "/pid");
    let mut workers = Vec::new();
    for p in &processes[1..] {
        assert_eq!(uint(p, "/ppid"), parent);
        assert_eq!(p["profiled"], true, "{p:#}");
        // Followed from its fork, not attached to later.
        assert_eq!(p["profiled_from_s"], Value::Null, "{p:#}");
        assert_eq!(p["exit"]["code"], 0, "{p:#}");
        workers.push(uint(p, "/pid"));
    }
    // Each worker's 500 × malloc(64), under its own pid; none in the parent.
    assert_once_in_each(&json, "worker_alloc", &workers, KEPT_500);
    let markdown = report(profile, "markdown", &[]);
    let all = format!("Processes: {}, {} profiled.", count + 1, count + 1);
    assert!(markdown.contains(&all), "{markdown}");
    assert!(!markdown.contains("[unknown]"), "{markdown}");
}

#[test]
fn forked_workers_are_followed_from_their_fork() {
    let dir = TempDir::new("processes_forker");
    let profile = dir.join("forker.mprof");
    profile_run(&profile, &[fixture::FORKER]);
    check_workers(&profile, 2);
}

#[test]
fn workers_forked_at_once_and_gone_in_milliseconds_are_followed() {
    let dir = TempDir::new("processes_quick_forker");
    for round in 0..3 {
        let profile = dir.join(&format!("quick_forker{round}.mprof"));
        profile_run(&profile, &[fixture::QUICK_FORKER]);
        check_workers(&profile, 8);
    }
}

#[test]
fn processes_in_a_new_pid_namespace_are_followed_with_both_pids() {
    let dir = TempDir::new("processes_namespace");
    let profile = dir.join("ns.mprof");
    let inner = format!("{} one; :", fixture::BASIC);
    profile_run(
        &profile,
        &[
            "unshare",
            "-m",
            "-p",
            "--fork",
            "--mount-proc",
            "/bin/sh",
            "-c",
            &inner,
        ],
    );
    let json = report_json(&profile);
    let processes = json["processes"].as_array().expect("processes");
    let summary = summary(processes);
    assert_eq!(processes.len(), 3, "{summary:#?}");
    // unshare itself (the host's namespace), then the shell it forked as
    // pid 1 of the new namespace, then basic as its pid 2.
    assert_eq!(processes[0]["ns_pid"], Value::Null, "{summary:#?}");
    assert_eq!(processes[1]["ns_pid"], 1, "{summary:#?}");
    assert_eq!(processes[2]["ns_pid"], 2, "{summary:#?}");
    assert_eq!(uint(&processes[1], "/ppid"), uint(&processes[0], "/pid"));
    assert_eq!(uint(&processes[2], "/ppid"), uint(&processes[1], "/pid"));
    assert!(
        processes.iter().all(|p| p["profiled"] == true),
        "{summary:#?}"
    );
    // basic's allocations, exact, under its host pid.
    assert_once_in_each(&json, "make_foo", &[uint(&processes[2], "/pid")], MAKE_FOO);
    let markdown = report(&profile, "markdown", &[]);
    let row = format!("| {} (2 in its namespace) |", uint(&processes[2], "/pid"));
    assert!(markdown.contains(&row), "no {row:?} in\n{markdown}");
}

#[test]
fn attach_by_program_name_takes_running_and_new_processes() {
    let dir = TempDir::new("processes_comm");
    let profile = dir.join("delayed.mprof");
    // Its allocations come after memprof attached, on a slower machine too.
    let wait = (4 * slower()).to_string();
    let start = || {
        ChildGuard(
            std::process::Command::new(fixture::DELAYED)
                .arg(&wait)
                .spawn()
                .unwrap(),
        )
    };
    let early = [start(), start()];
    let (mut memprof, mut stderr) = {
        let child = memprof([
            "attach",
            "--comm",
            "delayed",
            "--duration",
            &(8 * slower()).to_string(),
            "--sample-bytes",
            "0",
            "-o",
            profile.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut guard = ChildGuard(child);
        let stderr = Lines::new("attach --comm", guard.0.stderr.take().unwrap());
        (guard, stderr)
    };
    stderr.wait_for("profiling every process of --comm delayed", timeout());
    // One started while memprof watches.
    let late = start();
    let status = memprof.wait_timeout(Duration::from_secs(60) * slower());
    assert!(status.success(), "{:#?}", stderr.all());
    let json = report_json(&profile);
    let processes = json["processes"].as_array().expect("processes");
    let mut pids: Vec<u64> = processes.iter().map(|p| uint(p, "/pid")).collect();
    pids.sort();
    let mut expected: Vec<u64> = early
        .iter()
        .chain([&late])
        .map(|c| c.pid() as u64)
        .collect();
    expected.sort();
    assert_eq!(pids, expected, "{processes:#?}");
    assert!(processes
        .iter()
        .all(|p| p["profiled"] == true && p["comm"] == "delayed"));
    // Each one's 500 × malloc(64), under its own pid.
    assert_once_in_each(&json, "delayed_alloc", &expected, KEPT_500);
    let one = report(&profile, "json", &["--pid", &late.pid().to_string()]);
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(groups_at(&one, "libc", "delayed_alloc").len(), 1);

    // Without --sample-bytes, a selection is sampled; one that matched
    // nothing is a one-line error after the start line.
    let output = run(["attach", "--comm", "no-such-program", "--duration", "0.3"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("sampled (--sample-bytes 524288; 0: every allocation)"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("memprof: error: no process of --comm no-such-program"),
        "{stderr}"
    );
}

/// `memprof run -- /bin/sh -c SCRIPT`: what memprof printed, and the report's JSON.
fn run_script(dir: &TempDir, script: &str) -> (std::process::Output, Value) {
    let profile = dir.join("script.mprof");
    let output = run_ok([
        "run",
        "-o",
        profile.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    (output, report_json(&profile))
}

/// A pipeline forks its programs at once: the second `exec`s while memprof
/// starts the first one's session (~0.5 s). It is still followed from its
/// `exec` (it once was taken for a forked worker by its age, let go, and
/// missed).
#[test]
fn both_programs_of_a_pipeline_are_followed() {
    let dir = TempDir::new("processes_pipeline");
    let basic = fixture::BASIC;
    let (output, json) = run_script(&dir, &format!("{basic} one | {basic} two; :"));
    let processes = json["processes"].as_array().expect("processes");
    let summary = summary(processes);
    assert_eq!(processes.len(), 3, "{summary:#?}");
    assert!(
        processes.iter().all(|p| p["profiled"] == true),
        "{summary:#?}\n{}",
        describe(&output)
    );
    let mut commands: Vec<Vec<String>> = processes[1..]
        .iter()
        .map(|p| serde_json::from_value(p["command"].clone()).unwrap())
        .collect();
    commands.sort();
    assert_eq!(
        commands,
        vec![
            vec![basic.to_string(), "one".to_string()],
            vec![basic.to_string(), "two".to_string()]
        ],
        "{summary:#?}"
    );
    let pids: Vec<u64> = processes[1..].iter().map(|p| uint(p, "/pid")).collect();
    assert_once_in_each(&json, "make_foo", &pids, MAKE_FOO);
}

/// A shell script's loop of short programs (`true`, gone in a
/// millisecond, allocating nothing of its own): each is a fork of the
/// shell (which allocates in it) that `exec`s. Each row names the program
/// the pid became, with its arguments, its parent and exit; none is
/// named after the shell's binary or the program's path alone (once,
/// /proc was read after the `exec`, or after the exit).
#[test]
fn a_scripts_short_children_are_named_by_their_commands() {
    let dir = TempDir::new("processes_short_children");
    let (output, json) = run_script(
        &dir,
        "sleep 0.3; for i in $(seq 30); do /bin/true arg$i 'two words'; done",
    );
    let processes = json["processes"].as_array().expect("processes");
    let summary = summary(processes);
    // sh, sleep, seq's subshell (it `exec`s seq) and 30 `true`s.
    assert_eq!(processes.len(), 33, "{summary:#?}\n{}", describe(&output));
    let sh = uint(&processes[0], "/pid");
    let trues: Vec<&Value> = processes
        .iter()
        .filter(|p| p["exe"] == "/usr/bin/true")
        .collect();
    assert_eq!(trues.len(), 30, "{summary:#?}");
    for (i, p) in trues.iter().enumerate() {
        let command: Vec<String> = serde_json::from_value(p["command"].clone()).unwrap();
        let arg = format!("arg{}", i + 1);
        assert_eq!(command, ["/bin/true", &arg, "two words"], "{summary:#?}");
        assert_eq!(uint(p, "/ppid"), sh, "{p:#}");
        assert_eq!(p["exit"]["code"], 0, "{p:#}");
    }
    let others: Vec<Vec<String>> = processes[1..]
        .iter()
        .filter(|p| p["exe"] != "/usr/bin/true")
        .map(|p| serde_json::from_value(p["command"].clone()).unwrap())
        .collect();
    assert_eq!(
        others,
        [vec!["sleep", "0.3"], vec!["seq", "30"]],
        "{summary:#?}"
    );
}

/// A script that ends in `exec ./app` (a container's entrypoint): the
/// command's own process becomes `app`, and is profiled as it from its
/// `exec`, every probe its own; what the script started before stays
/// followed.
#[test]
fn the_command_exec_ing_a_program_is_profiled_as_that_program() {
    let dir = TempDir::new("processes_exec");
    let basic = fixture::BASIC;
    let (output, json) = run_script(&dir, &format!("{basic} one; exec {basic} two"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the command, exec'd") && stderr.contains("not in the profile"),
        "{stderr}"
    );
    let argv = |v: &Value| -> Vec<String> { serde_json::from_value(v.clone()).unwrap() };
    assert_eq!(
        argv(&json["target"]["command"]),
        vec![basic.to_string(), "two".to_string()]
    );
    assert_eq!(json["target"]["exit_code"], 0);
    let processes = json["processes"].as_array().expect("processes");
    let summary = summary(processes);
    assert_eq!(processes.len(), 2, "{summary:#?}");
    assert!(
        processes.iter().all(|p| p["profiled"] == true),
        "{summary:#?}"
    );
    let command = uint(&processes[0], "/pid");
    assert_eq!(command, uint(&json, "/target/pid"));
    assert_eq!(
        argv(&processes[1]["command"]),
        vec![basic.to_string(), "one".to_string()]
    );
    let pids = [command, uint(&processes[1], "/pid")];
    assert_once_in_each(&json, "make_foo", &pids, MAKE_FOO);
}

/// `attach --exe` on a static Crystal program (libgc linked in) started
/// after memprof: found, attached to, its GC allocations made since
/// followed exactly and judged by the collector's mark bits.
#[test]
fn attach_by_executable_takes_a_static_program_started_later() {
    use std::io::Write;
    let dir = TempDir::new("processes_exe");
    let profile = dir.join("static.mprof");
    let exe = fixture::crystal::ATTACH_CENSUS_STATIC;
    let child = memprof([
        "attach",
        "--exe",
        exe,
        "--sample-bytes",
        "0",
        "--gc-sampling",
        "exact",
        "--census",
        "off",
        "-o",
        profile.to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("attach --exe", memprof.0.stderr.take().unwrap());
    stderr.wait_for("profiling every process of --exe", timeout());
    let child = std::process::Command::new(exe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    let mut stdin = target.0.stdin.take().unwrap();
    let mut stdout = Lines::new("attach_census stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready ", timeout());
    stderr.wait_for(&format!("following pid {}", target.pid()), timeout());
    // 2,500 Late objects, kept; then a collection.
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    stdout.wait_for("collected ", timeout());
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    assert!(status.success(), "{:#?}", stderr.all());
    let json = report_json(&profile);
    assert_late_kept(&json, &mut target);
    assert_eq!(json["processes"][0]["exe"], exe);
}

/// The attach_census fixture's one process, `target`, in the profile,
/// with the 2,500 `Late` objects it made after `go`, each kept (a class
/// variable holds them): marked at the collection. It runs on.
fn assert_late_kept(json: &Value, target: &mut ChildGuard) {
    let processes = json["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{processes:#?}");
    assert_eq!(uint(&processes[0], "/pid"), target.pid() as u64);
    let late: Vec<&Value> = groups(json)
        .iter()
        .filter(|g| {
            g["kind"] == "gc"
                && g["frames"]
                    .as_array()
                    .is_some_and(|f| f.first().is_some_and(|f| f["function"] == "Late.new"))
        })
        .collect();
    assert_eq!(late.len(), 1, "{}", list_groups(json));
    let counts = Counts::of(late[0]);
    assert_eq!(
        (counts.live_count, counts.total_count),
        (2_500, 2_500),
        "{}",
        list_groups(json)
    );
    assert_eq!(json["gc"]["liveness"], "mark bits", "{:#}", json["gc"]);
    assert!(target.is_running(), "the program died");
}

/// `attach --comm` on a Crystal program that ran before memprof and
/// allocates only with the Boehm GC (a server between requests calls no
/// libc allocator the probes would see it by): found in /proc, given its
/// session (collections held, mark bits read), its GC allocations made
/// since followed exactly.
#[test]
fn attach_by_name_takes_a_crystal_program_running_before() {
    use std::io::Write;
    let dir = TempDir::new("processes_comm_crystal");
    let profile = dir.join("crystal.mprof");
    let exe = fixture::crystal::ATTACH_CENSUS_DEBUG;
    let child = std::process::Command::new(exe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = ChildGuard(child);
    let mut stdin = target.0.stdin.take().unwrap();
    let mut stdout = Lines::new("attach_census stdout", target.0.stdout.take().unwrap());
    stdout.wait_for("ready ", timeout());
    let child = memprof([
        "attach",
        "--comm",
        "attach_census_debug",
        "--sample-bytes",
        "0",
        "--gc-sampling",
        "exact",
        "--census",
        "off",
        "-o",
        profile.to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut memprof = ChildGuard(child);
    let mut stderr = Lines::new("attach --comm", memprof.0.stderr.take().unwrap());
    stderr.wait_for(&format!("following pid {}", target.pid()), timeout());
    // 2,500 Late objects, kept; then a collection.
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    stdout.wait_for("collected ", timeout());
    memprof.signal(libc::SIGINT);
    let status = memprof.wait_timeout(timeout());
    assert!(status.success(), "{:#?}", stderr.all());
    let json = report_json(&profile);
    assert_late_kept(&json, &mut target);
}
