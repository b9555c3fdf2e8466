//! Recursion and full stack tables: every allocation keeps its attribution.
//! `fixtures/c/recursion.c` makes 262,143 malloc(48) in a function that
//! recurses from two call sites, each node on a path of its own: more
//! distinct stacks than the default stack table (65,536) holds.
use memprof_tests::*;

const NODES: u64 = (1 << 18) - 1;
const NODE_SIZE: u64 = 48;

fn profile(dir: &TempDir, extra: &[&str]) -> Value {
    let profile = dir.join("recursion.mprof");
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--heap"),
        OsStr::new("libc"),
    ];
    args.extend(extra.iter().map(OsStr::new));
    args.extend([OsStr::new("--"), OsStr::new(fixture::RECURSION)]);
    run_ok(args);
    report_json(&profile)
}

/// Every allocation seen and fully recorded, nothing lost, totals exact.
fn assert_all_recorded(json: &Value) {
    let c = |name: &str| uint(json, &format!("/counters/{name}"));
    assert_eq!(c("allocs"), NODES, "{json:#}");
    assert_eq!(uint(json, "/lost_events"), 0);
    assert_eq!(uint(json, "/recorded"), NODES);
    assert_eq!((c("stack_errors"), c("sites_map_full")), (0, 0));
    let (mut count, mut bytes, mut live) = (0, 0, 0);
    for g in groups(json) {
        let n = Counts::of(g);
        count += n.total_count;
        bytes += n.total_bytes;
        live += n.live_bytes;
    }
    assert_eq!(count, NODES, "{}", list_groups(json));
    assert_eq!(bytes, NODES * NODE_SIZE);
    assert_eq!(live, NODES * NODE_SIZE, "every node is live at the end");
}

#[test]
fn recursion_is_folded_into_one_stack_that_reaches_main() {
    let dir = TempDir::new("recursion-folded");
    let json = profile(&dir, &[]);
    assert_all_recorded(&json);
    let c = |name: &str| uint(&json, &format!("/counters/{name}"));
    // Every node but the root was allocated inside build() called by build().
    assert_eq!(c("folded_stacks"), NODES - 1);
    assert_eq!((c("stacks_degraded"), c("sites_overflowed")), (0, 0));
    assert_eq!(c("truncated_stacks"), 0);
    // Two stacks: the root's, [build, main, …], and every other node's, the
    // same frames with the recursion folded (a stack of its own: folded).
    let mut at_build = groups_at(&json, "libc", "build");
    at_build.sort_by_key(|g| uint(g, "/total_count"));
    assert_eq!(at_build.len(), 2, "{}", list_groups(&json));
    for (group, count) in at_build.iter().zip([1, NODES - 1]) {
        assert_eq!(
            Counts::of(group),
            Counts {
                live_count: count,
                live_bytes: count * NODE_SIZE,
                total_count: count,
                total_bytes: count * NODE_SIZE,
            }
        );
        assert_eq!(group["truncated"], false);
        let frames = functions(group);
        assert_eq!(&frames[..2], ["build", "main"], "{frames:?}");
    }
    assert_eq!(functions(at_build[0]), functions(at_build[1]));
    assert_eq!(groups(&json).len(), 2, "{}", list_groups(&json));
}

#[test]
fn with_keep_recursion_a_full_stack_table_keeps_the_innermost_frames() {
    let dir = TempDir::new("recursion-kept");
    let json = profile(&dir, &["--keep-recursion"]);
    assert_all_recorded(&json);
    let c = |name: &str| uint(&json, &format!("/counters/{name}"));
    assert_eq!(c("folded_stacks"), 0);
    // The stack table (65,536 by default) filled up; the later stacks are
    // recorded under their innermost 8 frames (a table of their own, with
    // room to spare: none falls back to the caller alone).
    assert_eq!(c("stacks_stored"), 1 << 16);
    let shortened = c("stacks_shortened");
    assert!(shortened >= NODES - (1 << 16), "{shortened}");
    assert_eq!(c("stacks_degraded"), 0);
    let short: Vec<&Value> = groups(&json)
        .iter()
        .filter(|g| g["truncated"] == true && !functions(g).is_empty())
        .collect();
    for group in &short {
        assert_eq!(functions(group)[0], "build", "{}", list_groups(&json));
    }
    let in_short: u64 = short.iter().map(|g| uint(g, "/total_count")).sum();
    assert_eq!(in_short, shortened);
    // Full stacks: build() as deep as the tree, then main.
    let deepest = groups_at(&json, "libc", "build")
        .into_iter()
        .map(functions)
        .max_by_key(Vec::len)
        .unwrap();
    assert_eq!(deepest.iter().filter(|f| **f == "build").count(), 18);
    assert!(deepest.contains(&"main"), "{deepest:?}");
    // A site the site table could not take at once (its on-demand
    // allocation can fail under a burst) is in the overflow group: no
    // frames, counted, totals still exact (checked above).
    let overflow: u64 = groups(&json)
        .iter()
        .filter(|g| functions(g).is_empty())
        .map(|g| uint(g, "/total_count"))
        .sum();
    assert_eq!(overflow, c("sites_overflowed"));
}
