//! `memprof run` on `fixtures/c/families.c`: calloc, realloc chains,
//! posix_memalign, aligned_alloc and a failed realloc, one function each.

use memprof_tests::*;

#[test]
fn allocator_families() {
    let dir = TempDir::new("families");
    let profile = dir.join("families.mprof");
    profile_run(&profile, &[fixture::FAMILIES]);
    let json = report_json(&profile);

    let counts = |function| Counts::of(group_at(&json, "libc", function));
    let once = |bytes| Counts {
        live_count: 1,
        live_bytes: bytes,
        total_count: 1,
        total_bytes: bytes,
    };

    assert_eq!(counts("use_calloc"), once(1_000), "calloc(10, 100)");
    assert_eq!(
        counts("use_posix_memalign"),
        once(1_000),
        "posix_memalign(64, 1000)"
    );
    assert_eq!(
        counts("use_aligned_alloc"),
        once(512),
        "aligned_alloc(64, 512)"
    );
    // The malloc(16) that starts the chain was moved by the first realloc.
    assert_eq!(
        counts("grow_chain"),
        Counts {
            live_count: 0,
            live_bytes: 0,
            total_count: 1,
            total_bytes: 16
        }
    );
    // 8 reallocs 32, 64, …, 4,096: each counts as an allocation of its new size.
    assert_eq!(
        counts("grow_step"),
        Counts {
            live_count: 1,
            live_bytes: 4_096,
            total_count: 8,
            total_bytes: 8_160
        }
    );
    // A failed realloc leaves the original block live and adds no group.
    assert_eq!(
        counts("failed_realloc"),
        once(100),
        "malloc(100) then a failing realloc"
    );
    assert_eq!(uint(&json, "/counters/failed_allocs"), 1);
    assert_eq!(uint(&json, "/lost_events"), 0);
}
