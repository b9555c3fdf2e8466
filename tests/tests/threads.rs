//! `memprof run` on `fixtures/c/threads.c`: 4 threads × 100,000 malloc(32)
//! from one call site, 1,000 kept per thread. The 99,000 freed at once
//! per thread go back to the thread's own tcache, where the next malloc
//! finds them: memprof reads each result at the entry from that thread's
//! tcache (`predict.rs`), and the counts stay exact.

use memprof_tests::*;

#[test]
fn threads_lose_nothing() {
    let dir = TempDir::new("threads");
    let profile = dir.join("threads.mprof");
    profile_run(&profile, &[fixture::THREADS]);
    let json = report_json(&profile);

    assert_eq!(
        Counts::of(group_at(&json, "libc", "worker")),
        Counts {
            live_count: 4_000,
            live_bytes: 128_000,
            total_count: 400_000,
            total_bytes: 12_800_000
        }
    );
    assert_eq!(uint(&json, "/lost_events"), 0);
    // Every malloc after a free (4 × 98,999) finds its chunk in the
    // thread's tcache: each predicted, then recorded or checked.
    if let Some((predicted, checked)) = assert_predictions_right(&json) {
        assert!(predicted + checked >= 4 * 98_999, "{:#}", json["counters"]);
    }
}
