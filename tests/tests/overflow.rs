//! Honest numbers when the kernel's tables overflow: every allocation is
//! counted once, in one category (`fixtures/c/overflow.c` makes 500 in a
//! known order; `--max-sites 2 --max-live 150` make both tables overflow:
//! sites beyond the site table go to their kind's overflow group).
use memprof_tests::*;

#[test]
fn each_allocation_is_counted_once_when_both_tables_overflow() {
    let dir = TempDir::new("overflow");
    let profile = dir.join("overflow.mprof");
    let output = run_ok([
        OsStr::new("run"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--heap"),
        OsStr::new("libc"),
        OsStr::new("--max-sites"),
        OsStr::new("2"),
        OsStr::new("--max-live"),
        OsStr::new("150"),
        OsStr::new("--"),
        OsStr::new(fixture::OVERFLOW),
    ]);
    let json = report_json(&profile);
    let c = |name: &str| uint(&json, &format!("/counters/{name}"));
    // The fixture's sequence (see overflow.c), category by category.
    assert_eq!(c("allocs"), 500, "{json:#}");
    assert_eq!(c("frees"), 100);
    assert_eq!(
        c("live_map_full"),
        250,
        "not tracked as live, in the totals"
    );
    // A full site table sends sites to the kind's overflow site: in the
    // totals, not a loss.
    assert_eq!(c("sites_overflowed"), 200);
    assert_eq!((c("sites_map_full"), c("both_maps_full")), (0, 0));
    assert_eq!((c("pending_full"), c("stale_calls")), (0, 0));
    assert_eq!((c("unknown_frees"), c("failed_allocs")), (0, 0));
    assert_eq!(c("sites_stored"), 2);
    assert_eq!(uint(&json, "/recorded"), 250);
    // Seen = recorded + each loss category, nothing counted twice.
    assert_eq!(
        uint(&json, "/recorded") + c("live_map_full") + c("sites_map_full") + c("both_maps_full"),
        c("allocs")
    );
    assert_eq!(uint(&json, "/lost_events"), 250);
    assert_eq!(json["live_is_lower_bound"], true);
    for name in [
        "live_map_full",
        "sites_map_full",
        "both_maps_full",
        "pending_full",
        "stale_calls",
    ] {
        assert!(
            json.pointer(&format!("/loss_categories/{name}"))
                .and_then(Value::as_str)
                .is_some(),
            "no meaning for {name}: {json:#}"
        );
    }

    // What each table kept: kept() in both (its second round only in the
    // totals), other() in the overflow group (no frames), freed() only in
    // the totals.
    let kept = Counts::of(group_at(&json, "libc", "kept"));
    assert_eq!((kept.live_count, kept.total_count), (100, 200));
    let freed = Counts::of(group_at(&json, "libc", "freed"));
    assert_eq!((freed.live_count, freed.total_count), (0, 100));
    let overflow: Vec<&Value> = groups(&json)
        .iter()
        .filter(|g| g["frames"].as_array().is_some_and(Vec::is_empty))
        .collect();
    assert_eq!(overflow.len(), 1, "{}", list_groups(&json));
    assert_eq!(overflow[0]["kind"], "libc");
    let other = Counts::of(overflow[0]);
    assert_eq!(
        other,
        Counts {
            live_count: 50,
            live_bytes: 800,
            total_count: 200,
            total_bytes: 3200
        }
    );
    assert!(groups_at(&json, "libc", "other").is_empty());
    assert_eq!(groups(&json).len(), 3, "{}", list_groups(&json));
    // The overflow group is marked truncated; no stack was cut short.
    assert_eq!(uint(&json, "/truncated_groups"), 1);
    assert_eq!(c("truncated_stacks"), 0);

    // The markdown header: lower bounds said so, separators, categories.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let markdown = report(&profile, "markdown", &[]);
    for text in [&*stderr, &markdown] {
        assert!(
            text.contains("Live at the end: at least 150 blocks, at least 2,400 bytes (the live table was full: lower bounds)"),
            "{text}"
        );
        assert!(
            text.contains("Allocations seen: 500 (fully recorded: 250), frees: 100."),
            "{text}"
        );
        assert!(
            text.contains("Lost events: 250 (each counted once: not tracked as live, live table full: 250; missing from the stack totals, site table full: 0; in neither table: 0; calls not followed, in-flight table full: 0; returns missed: 0)"),
            "{text}"
        );
        assert!(
            text.contains(
                "allocations in their kind's overflow group (site table full, --max-sites, or no kernel memory for a new entry): 200"
            ),
            "{text}"
        );
    }
}

#[test]
fn figures_have_thousands_separators_and_no_lower_bound_without_overflow() {
    let dir = TempDir::new("overflow-none");
    let profile = dir.join("threads.mprof");
    profile_run(&profile, &[fixture::THREADS]);
    let json = report_json(&profile);
    assert_eq!(json["live_is_lower_bound"], false);
    assert_eq!(uint(&json, "/lost_events"), 0);
    let seen = uint(&json, "/counters/allocs");
    assert!(seen >= 400_000, "{seen}");
    assert_eq!(uint(&json, "/recorded"), seen);
    let markdown = report(&profile, "markdown", &[]);
    let separated = thousands(seen);
    assert!(
        markdown.contains(&format!(
            "Allocations seen: {separated} (fully recorded: {separated}), frees: "
        )),
        "{markdown}"
    );
    assert!(!markdown.contains("at least"), "{markdown}");
}
