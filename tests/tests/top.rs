//! `memprof top`: two processes of one program, one growing, one steady;
//! the growing one ranks first within two refreshes of both being shown,
//! the steady one's live bytes stay at 0 (one block at most).

use memprof_tests::*;
use std::process::Command;

/// The tables `memprof top` appended to stdout (no terminal): each one's
/// rows as (pid, live column, growth column).
fn tables(stdout: &str) -> Vec<Vec<(i32, String, String)>> {
    let mut tables = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("memprof top:") {
            tables.push(Vec::new());
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(pid) = words.first().and_then(|w| w.parse::<i32>().ok()) else {
            continue;
        };
        // PID COMMAND LIVE(2 words) GROWTH(2 words) ALLOCS GC
        let live = format!("{} {}", words[2], words[3]);
        let growth = format!("{} {}", words[4], words[5]);
        tables
            .last_mut()
            .expect("a table")
            .push((pid, live, growth));
    }
    tables
}

/// The magnitude of "+12.5 KiB".
fn kib(column: &str) -> f64 {
    column
        .trim_start_matches(['+', '-'])
        .trim_end_matches(" KiB")
        .parse()
        .unwrap_or(f64::MAX)
}

#[test]
fn the_growing_process_ranks_first() {
    let start = |how: &str| {
        ChildGuard(
            Command::new(fixture::GROWER)
                .args([how, "40"])
                .spawn()
                .unwrap(),
        )
    };
    let (grow, steady) = (start("grow"), start("steady"));
    let output = run([
        "top",
        "--comm",
        "grower",
        "--interval",
        "0.5",
        "--count",
        "16",
    ]);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let tables = tables(&stdout);
    assert_eq!(tables.len(), 16, "{stdout}");
    // From the first table that shows both, within two refreshes.
    let both = tables
        .iter()
        .position(|t| t.len() == 2)
        .unwrap_or_else(|| panic!("never both processes:\n{}", describe(&output)));
    assert!(both + 2 < tables.len(), "{stdout}");
    for table in &tables[both + 2..] {
        let pids: Vec<i32> = table.iter().map(|r| r.0).collect();
        assert_eq!(pids, vec![grow.pid(), steady.pid()], "{stdout}");
        let (_, live, growth) = &table[1];
        assert!(
            live == "0 B" || live == "64.0 KiB",
            "steady live {live}:\n{stdout}"
        );
        // One block caught live at one refresh and not the other: 64 KiB
        // over the interval's length.
        assert!(
            growth == "0 B" || growth.ends_with(" KiB") && kib(growth) <= 256.0,
            "steady growth {growth}:\n{stdout}"
        );
        assert!(table[0].2.starts_with('+'), "grower's growth:\n{stdout}");
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("watched 2 processes"), "{stderr}");
    // Let go, untraced, still running.
    for child in [&grow, &steady] {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid())).unwrap();
        assert!(status.contains("TracerPid:\t0"), "{status}");
    }
}

#[test]
fn top_without_a_selection_or_with_sampling_is_one_clear_error() {
    assert_one_line_error(&run(["top"]), &["say which processes", "--comm"]);
    assert_one_line_error(
        &run(["top", "--comm", "grower", "--sample-bytes", "4096"]),
        &["without walking the tables", "--sample-bytes"],
    );
    assert_one_line_error(
        &run(["top", "--pid", "999999999"]),
        &["no process with pid 999999999"],
    );
}

/// In a terminal (tmux's): the table is drawn over the last one, one
/// table on the screen at a time, the growing process first.
#[test]
fn in_a_terminal_the_table_is_redrawn_in_place() {
    // Under another name (the test above selects `grower` by name): a
    // link, not a copy (a copy's write descriptor, inherited by a child
    // another test forks meanwhile, makes its exec fail: ETXTBSY).
    let dir = TempDir::new("top_terminal");
    let grower = dir.join("grows");
    std::os::unix::fs::symlink(fixture::GROWER, &grower).unwrap();
    let start = |how: &str| ChildGuard(Command::new(&grower).args([how, "40"]).spawn().unwrap());
    let (grow, steady) = (start("grow"), start("steady"));
    let session = format!("memprof-top-{}", std::process::id());
    let top = format!(
        "{} top --pid {} --pid {} --interval 0.5 --count 14",
        memprof_bin().display(),
        grow.pid(),
        steady.pid()
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
        "120",
        "-y",
        "30",
        &top,
    ]);
    assert!(made.status.success(), "{}", describe(&made));
    // The screen after 5 s (10 refreshes; both are shown from the 2nd).
    std::thread::sleep(std::time::Duration::from_secs(5));
    let shown = tmux(&["capture-pane", "-p", "-t", &session]);
    let _ = tmux(&["kill-session", "-t", &session]);
    let screen = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert_eq!(
        screen
            .lines()
            .filter(|l| l.starts_with("memprof top:"))
            .count(),
        1,
        "{screen}"
    );
    let pids: Vec<i32> = screen
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(pids, vec![grow.pid(), steady.pid()], "{screen}");
}
