//! `memprof run` on a shell that starts processes: each one is listed with
//! its parent, its program and its exit; only the command's own process is
//! profiled, and the report's `--pid`/`--comm` say so in one line.

use memprof_tests::*;
use serde_json::Value;

#[test]
fn run_lists_the_processes_the_command_starts() {
    let dir = TempDir::new("processes");
    let profile = dir.join("family.mprof");
    let basic = fixture::BASIC;
    // sh starts basic twice and a second sh, which starts basic once more.
    // The trailing `:` keeps each shell from exec'ing its last command.
    let inner = format!("{basic} three; :");
    let script = format!("{basic} one; {basic} two; /bin/sh -c '{inner}'; :");
    profile_run(&profile, &["/bin/sh", "-c", &script]);
    let json = report_json(&profile);

    let processes = json["processes"].as_array().expect("processes");
    let summary: Vec<String> = processes
        .iter()
        .map(|p| format!("{} {} {}", p["pid"], p["ppid"], p["command"]))
        .collect();
    assert_eq!(processes.len(), 5, "{summary:#?}");
    let pid = |i: usize| uint(&processes[i], "/pid");
    let root = &processes[0];
    assert_eq!(pid(0), uint(&json, "/target/pid"));
    assert_eq!(root["profiled"], true);
    assert_eq!(root["comm"], "sh");
    assert_eq!(root["exit"]["code"], 0);
    let command = |i: usize| -> Vec<String> {
        serde_json::from_value(processes[i]["command"].clone()).unwrap()
    };
    // In the order they started, each with its parent.
    let expected: [(Vec<String>, u64); 4] = [
        (vec![basic.into(), "one".into()], pid(0)),
        (vec![basic.into(), "two".into()], pid(0)),
        (vec!["/bin/sh".into(), "-c".into(), inner.clone()], pid(0)),
        (vec![basic.into(), "three".into()], pid(3)),
    ];
    for (i, (argv, parent)) in expected.iter().enumerate() {
        let p = &processes[i + 1];
        assert_eq!(&command(i + 1), argv, "{summary:#?}");
        assert_eq!(uint(p, "/ppid"), *parent, "{summary:#?}");
        assert_eq!(p["profiled"], false);
        assert_eq!(p["exit"]["code"], 0, "{p:#}");
        assert_eq!(p["live_bytes"], Value::Null, "not profiled: no figures");
        let (start, end) = (p["start_s"].as_f64().unwrap(), p["end_s"].as_f64().unwrap());
        assert!(end >= start, "{p:#}");
    }
    // Only the shell is profiled: basic's 1,000 make_foo blocks are not here,
    // and every group is the shell's; its figures are the groups' sums.
    assert!(groups_at(&json, "libc", "make_foo").is_empty());
    let all = groups(&json);
    assert!(all.iter().all(|g| uint(g, "/pid") == pid(0)));
    let sum = |field: &str| all.iter().map(|g| uint(g, &format!("/{field}"))).sum::<u64>();
    for field in ["live_count", "live_bytes", "total_count", "total_bytes"] {
        assert_eq!(uint(root, &format!("/{field}")), sum(field), "{field}");
    }

    // The markdown report lists them, each with its parent.
    let markdown = report(&profile, "markdown", &["--comm", "sh"]);
    assert!(
        markdown.contains("Processes: 5 in all; the command started 4 that memprof did not profile"),
        "{markdown}"
    );
    for (i, p) in processes.iter().enumerate().skip(1) {
        let row = format!("| {} | {} | ", pid(i), uint(p, "/ppid"));
        assert!(markdown.contains(&row), "no row {row:?} in\n{markdown}");
    }

    // A process listed but not profiled, and one not in the profile at all:
    // one line each, naming what the profile has.
    let child = pid(1).to_string();
    let output = run(["report", profile.to_str().unwrap(), "--pid", &child]);
    assert_one_line_error(&output, &[&child, "not profiled", "sh"]);
    let output = run(["report", profile.to_str().unwrap(), "--comm", "basic"]);
    assert_one_line_error(&output, &["basic", "not profiled"]);
    let output = run(["report", profile.to_str().unwrap(), "--pid", "1"]);
    assert_one_line_error(&output, &["no such process", &pid(0).to_string()]);
}
