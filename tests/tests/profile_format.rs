//! The profile file itself (format version 3), read as written: stacks
//! interned as pprof does. `families` (fixtures/c/families.c) has six
//! libc groups; `grow_chain` allocates itself and through `grow_step`, so
//! those two stacks share the frames from `main` outwards. `recursion`
//! (fixtures/c/recursion.c): the folded stack of 262,142 nodes is the root
//! node's, marked folded.

use memprof_tests::*;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};

/// The header, the JSON and the end line of a profile file.
fn parts(bytes: &[u8]) -> (String, Value, String) {
    let text = std::str::from_utf8(bytes).expect("a profile is UTF-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "header, JSON, end line");
    let json = serde_json::from_str(lines[1]).expect("the body is JSON");
    (lines[0].to_string(), json, lines[2].to_string())
}

/// The functions of stack `id`, innermost first, walked through the nodes.
fn functions(stacks: &Value, id: u64) -> Vec<(String, u64)> {
    let nodes = stacks["nodes"].as_array().unwrap();
    let locations = stacks["locations"].as_array().unwrap();
    let strings = stacks["strings"].as_array().unwrap();
    let mut out = Vec::new();
    let mut node = id;
    while node != 0 {
        let pair = &nodes[node as usize - 1];
        let location = &locations[pair[0].as_u64().unwrap() as usize];
        for frame in location["frames"].as_array().unwrap() {
            let name = strings[frame["function"].as_u64().unwrap() as usize]
                .as_str()
                .unwrap();
            out.push((name.to_string(), location["address"].as_u64().unwrap()));
        }
        node = pair[1].as_u64().unwrap();
    }
    out
}

#[test]
fn stacks_are_interned_and_match_the_report() {
    let dir = TempDir::new("profile-format");
    let path = dir.join("families.mprof");
    profile_run(&path, &[fixture::FAMILIES]);
    let bytes = std::fs::read(&path).unwrap();
    let (header, json, end) = parts(&bytes);
    assert_eq!(header, "MEMPROF-PROFILE 3");
    assert!(end.starts_with("MEMPROF-END crc32="), "{end}");

    let stacks = &json["stacks"];
    let strings = stacks["strings"].as_array().unwrap();
    let locations = stacks["locations"].as_array().unwrap();
    let nodes = stacks["nodes"].as_array().unwrap();
    // Each string, each address and each node once.
    let distinct: HashSet<&str> = strings.iter().map(|s| s.as_str().unwrap()).collect();
    assert_eq!(distinct.len(), strings.len(), "{strings:?}");
    let addresses: HashSet<u64> = locations
        .iter()
        .map(|l| l["address"].as_u64().unwrap())
        .collect();
    assert_eq!(addresses.len(), locations.len(), "an address twice");
    let pairs: HashSet<(u64, u64)> = nodes
        .iter()
        .map(|n| (n[0].as_u64().unwrap(), n[1].as_u64().unwrap()))
        .collect();
    assert_eq!(pairs.len(), nodes.len(), "a node twice");
    // Ids in range, callers before callees.
    for (i, &(location, caller)) in pairs.iter().enumerate() {
        assert!((location as usize) < locations.len(), "node {i}");
        let own = nodes
            .iter()
            .position(|n| n[0] == location && n[1] == caller)
            .unwrap() as u64
            + 1;
        assert!(caller < own, "node {own}'s caller {caller}");
    }
    for l in locations {
        assert!((l["module"].as_u64().unwrap() as usize) < strings.len());
        for f in l["frames"].as_array().unwrap() {
            assert!((f["function"].as_u64().unwrap() as usize) < strings.len());
        }
    }

    // The groups in the file, resolved through the table, are the report's.
    let groups = json["groups"].as_array().unwrap();
    assert!(groups.iter().all(|g| g.get("frames").is_none()));
    let key = |kind: &Value, counts: [u64; 4], frames: Vec<(String, u64)>| {
        (kind.as_str().unwrap().to_string(), counts, frames)
    };
    let counts = |g: &Value| {
        ["live_count", "live_bytes", "total_count", "total_bytes"].map(|k| g[k].as_u64().unwrap())
    };
    let mut in_file: Vec<_> = groups
        .iter()
        .map(|g| {
            let stack = g["stack"].as_u64().unwrap();
            assert!((stack as usize) <= nodes.len());
            key(&g["kind"], counts(g), functions(stacks, stack))
        })
        .collect();
    let report = report_json(&path);
    let mut in_report: Vec<_> = memprof_tests::groups(&report)
        .iter()
        .map(|g| {
            let frames = g["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    let address = f["address"].as_str().unwrap().trim_start_matches("0x");
                    (
                        f["function"].as_str().unwrap().to_string(),
                        u64::from_str_radix(address, 16).unwrap(),
                    )
                })
                .collect();
            key(&g["kind"], counts(g), frames)
        })
        .collect();
    in_file.sort();
    in_report.sort();
    assert_eq!(in_file, in_report);

    // grow_chain's own malloc and its realloc through grow_step share the
    // node of the call in main.
    let by_function: BTreeMap<String, u64> = groups
        .iter()
        .filter(|g| g["kind"] == "libc")
        .map(|g| {
            let stack = g["stack"].as_u64().unwrap();
            (functions(stacks, stack)[0].0.clone(), stack)
        })
        .collect();
    let caller = |id: u64| nodes[id as usize - 1][1].as_u64().unwrap();
    let chain = by_function["grow_chain"];
    let step = by_function["grow_step"];
    assert_eq!(functions(stacks, caller(step))[0].0, "grow_chain");
    assert_eq!(caller(chain), caller(caller(step)));
}

/// fixtures/c/recursion.c: 262,143 nodes of 48 bytes built by a recursive
/// `build`; folded (the default) every node but the root has its recursion
/// folded away, so the two groups have one stack, told apart by `folded`.
#[test]
fn folded_recursion_shares_its_stack_and_is_marked() {
    const NODES: u64 = 262_143;
    let dir = TempDir::new("profile-recursion");
    let path = dir.join("recursion.mprof");
    profile_run(&path, &[env!("FIXTURE_RECURSION")]);

    let json_report = report_json(&path);
    assert_eq!(uint(&json_report, "/counters/folded_stacks"), NODES - 1);
    assert_eq!(uint(&json_report, "/folded_groups"), 1);
    let mut at_build: Vec<(bool, [u64; 2])> = groups_at(&json_report, "libc", "build")
        .iter()
        .map(|g| {
            let c = Counts::of(g);
            assert_eq!((c.live_count, c.live_bytes), (c.total_count, c.total_bytes));
            (
                g["folded"].as_bool().unwrap(),
                [c.total_count, c.total_bytes],
            )
        })
        .collect();
    at_build.sort();
    assert_eq!(
        at_build,
        [(false, [1, 48]), (true, [NODES - 1, (NODES - 1) * 48])],
        "{}",
        list_groups(&json_report)
    );

    // In the file: one stack for both, each address once, a single chain.
    let (_, json, _) = parts(&std::fs::read(&path).unwrap());
    let stacks: Vec<u64> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["stack"].as_u64().unwrap())
        .collect();
    assert_eq!(stacks.len(), 2);
    assert_eq!(stacks[0], stacks[1]);
    let frames = functions(&json["stacks"], stacks[0]);
    let depth = groups_at(&json_report, "libc", "build")[0]["frames"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(frames.len(), depth);
    assert_eq!(
        frames[..2].iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["build", "main"]
    );
    let locations = json["stacks"]["locations"].as_array().unwrap();
    let nodes = json["stacks"]["nodes"].as_array().unwrap();
    assert_eq!((locations.len(), nodes.len()), (depth, depth));

    // Every report marks the folded stack, and only it.
    let folded = report(&path, "folded", &[]);
    let lines: Vec<&str> = folded.lines().collect();
    assert_eq!(lines.len(), 2, "{folded}");
    assert!(
        lines.iter().any(|l| l.ends_with(";main;build 48")),
        "{folded}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(";main;build;[recursion folded] 12582816")),
        "{folded}"
    );
    let markdown = report(&path, "markdown", &["--min-bytes", "0"]);
    assert_eq!(
        markdown.matches("`…(recursion folded)`").count(),
        1,
        "{markdown}"
    );
    assert!(
        markdown.contains(
            "allocations with recursion folded (repeated frames shown once): 262,142 (stacks marked folded: 1)"
        ),
        "{markdown}"
    );
}
