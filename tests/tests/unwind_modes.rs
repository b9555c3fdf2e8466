//! The DWARF unwinder (default) and the frame-pointer walk must agree on the
//! C fixtures, which have frame pointers: the same groups, with the same
//! counts and the same frames from the allocation site up to `main`.
//! (Below `main` the DWARF unwinder goes further, to `_start`.)

use std::collections::BTreeMap;

use memprof_tests::*;
use serde_json::Value;

/// (kind, functions from the allocation site to `main`) → (live count, live bytes, total count, total bytes).
type Summary = BTreeMap<(String, Vec<String>), (u64, u64, u64, u64)>;

fn summarize(json: &Value) -> Summary {
    let mut summary = Summary::new();
    for g in json["groups"].as_array().expect("groups") {
        let functions: Vec<String> = g["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("").to_string())
            .collect();
        let Some(main) = functions.iter().position(|f| f == "main") else {
            continue; // made outside the fixture's own code (libc start-up)
        };
        let key = (
            g["kind"].as_str().unwrap().to_string(),
            functions[..=main].to_vec(),
        );
        let n = |k: &str| g[k].as_u64().unwrap();
        let entry = summary.entry(key).or_default();
        entry.0 += n("live_count");
        entry.1 += n("live_bytes");
        entry.2 += n("total_count");
        entry.3 += n("total_bytes");
    }
    summary
}

/// Profiles `fixture` with `--unwind unwind`; returns the profile's path and its JSON report.
fn profile(fixture: &str, unwind: &str, dir: &TempDir) -> (std::path::PathBuf, Value) {
    let path = dir.join(&format!("{unwind}.mprof"));
    let out = run([
        "run",
        "--unwind",
        unwind,
        "-o",
        path.to_str().unwrap(),
        "--",
        fixture,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let json = report_json(&path);
    assert_eq!(json["unwind"], unwind);
    (path, json)
}

fn same_results(name: &str, fixture: &str) {
    let dir = TempDir::new(&format!("unwind-{name}"));
    let fp = summarize(&profile(fixture, "fp", &dir).1);
    let dwarf = summarize(&profile(fixture, "dwarf", &dir).1);
    assert!(!fp.is_empty(), "no groups reach main");
    assert_eq!(fp, dwarf, "frame pointers and DWARF disagree");
}

#[test]
fn basic_same_with_fp_and_dwarf() {
    same_results("basic", fixture::BASIC);
}

#[test]
fn families_same_with_fp_and_dwarf() {
    same_results("families", fixture::FAMILIES);
}

#[test]
fn threads_same_with_fp_and_dwarf() {
    let dir = TempDir::new("unwind-threads");
    for unwind in ["fp", "dwarf"] {
        let (_path, json) = profile(fixture::THREADS, unwind, &dir);
        assert_eq!(
            Counts::of(group_at(&json, "libc", "worker")),
            Counts {
                live_count: 4_000,
                live_bytes: 128_000,
                total_count: 400_000,
                total_bytes: 12_800_000
            },
            "--unwind {unwind}"
        );
        if unwind == "dwarf" {
            // Thread stacks unwind to the thread's start (clone3), not truncated.
            let worker = group_at(&json, "libc", "worker");
            assert_eq!(worker["truncated"], false, "{worker}");
        }
    }
}
