//! crystal-samples' havlak `--release` (131M GC allocations, ~2M live at
//! the end) under `memprof run --gc-sampling refill`: every one of the 10
//! biggest markdown rows says which line of havlak.cr the memory comes
//! from, though most are made inside `Array`, `Hash` and `Set`.

use memprof_tests::fixture::crystal::HAVLAK_RELEASE;
use memprof_tests::*;

#[test]
fn the_top_rows_of_havlak_name_its_lines() {
    let dir = TempDir::new("havlak");
    let path = dir.join("havlak.mprof");
    let profile = path.to_str().unwrap();
    run_ok([
        "run",
        "--gc-sampling",
        "refill",
        "-o",
        profile,
        "--",
        HAVLAK_RELEASE,
    ]);
    let markdown = report(&path, "markdown", &["--top", "10"]);
    let rows: Vec<&str> = markdown
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Live at the end"))
        .collect();
    assert_eq!(rows.len(), 10, "{markdown}");
    for row in rows {
        let program = row.split(" | ").nth(2).unwrap();
        assert!(
            program.starts_with('`') && program.contains("havlak.cr:") && program.ends_with("'`"),
            "a row without a havlak.cr line: {row}\n{markdown}"
        );
        // The methods on the way name their class: no bare `'[]='`, `'upsert'`.
        for bare in ["'[]='", "'upsert'", "'<<'", "'push'", "'new'", "'to_s'"] {
            assert!(!row.contains(bare), "{bare} in {row}");
        }
    }
}
