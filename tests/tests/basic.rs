//! `memprof run` on `fixtures/c/basic.c`: 1,000 × malloc(48) at make_foo, 400 freed.

use memprof_tests::*;

#[test]
fn basic_counts_and_report_formats() {
    let dir = TempDir::new("basic");
    let profile = dir.join("basic.mprof");
    profile_run(&profile, &[fixture::BASIC]);

    let json = report_json(&profile);
    let make_foo = group_at(&json, "libc", "make_foo");
    assert_eq!(
        Counts::of(make_foo),
        Counts {
            live_count: 600,
            live_bytes: 28_800,
            total_count: 1_000,
            total_bytes: 48_000
        }
    );
    assert_eq!(uint(&json, "/lost_events"), 0);

    // Markdown: the make_foo row shows the live count and size with separators.
    let markdown = report(&profile, "markdown", &[]);
    assert!(
        markdown
            .lines()
            .any(|row| row.contains("make_foo") && row.contains("600") && row.contains("28,800")),
        "no make_foo row with 600 / 28,800 in:\n{markdown}"
    );

    // TSV: the first line is the number of rows, then `count\tbytes\tframes...`.
    let tsv = report(&profile, "tsv", &[]);
    let mut lines = tsv.lines();
    let rows: usize = lines
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("first line is no count:\n{tsv}"));
    let rest: Vec<&str> = lines.collect();
    assert_eq!(
        rows,
        rest.len(),
        "row count line disagrees with the rows:\n{tsv}"
    );
    assert!(
        rest.iter().any(|l| l.starts_with("600\t28800\t")),
        "no `600\\t28800\\t` row in:\n{tsv}"
    );
}
