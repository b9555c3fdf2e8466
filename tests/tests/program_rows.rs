//! Rows that lead to the program, and methods named with their class, on
//! `fixtures/crystal/deep.cr` built in debug and `--release`: its
//! `Registry#fill` grows a `Set(String)` and a `Hash(String, Int32)` of
//! 20,000 keys, allocations made five frames and more inside the standard
//! library (`Set(String)#add` → `Hash#[]=` → `upsert` → `resize` →
//! `realloc_entries`), which the default `--depth` of 5 shows alone.
//! Every row names `deep.cr:LINE in 'Registry#fill'` all the same, and the
//! columns say they count what is live at the end.

use memprof_tests::fixture::crystal::*;
use memprof_tests::*;

/// The header of the markdown tables.
const HEADER: &str = "| Live at the end | Live bytes at the end | From the program | Context |";

/// `memprof run` of one build; the profile's directory and path.
fn profile(test: &str, exe: &str) -> (TempDir, std::path::PathBuf) {
    let name = std::path::Path::new(exe)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    // A directory per test: the tests of this file run at once, and a
    // directory is removed when its test is done with it.
    let dir = TempDir::new(&format!("program-rows-{test}-{name}"));
    let path = dir.join("deep.mprof");
    profile_run(&path, &[exe]);
    (dir, path)
}

/// The cells of the markdown row whose live bytes are `bytes`.
fn row(markdown: &str, bytes: u64) -> Vec<String> {
    let bytes = thousands(bytes);
    let rows: Vec<Vec<String>> = markdown
        .lines()
        .filter(|l| l.starts_with("| "))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .filter(|cells: &Vec<String>| cells.get(1) == Some(&bytes))
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "one row of {bytes} live bytes in:\n{markdown}"
    );
    rows.into_iter().next().unwrap()
}

/// What the program cell of a row from `deep.cr`'s line `mark` ends with.
fn fill_at(mark: &str) -> String {
    format!(
        "deep.cr:{} in 'Registry#fill'`",
        marked_line(DEEP_SOURCE, mark)
    )
}

#[test]
fn every_row_names_the_programs_line_whatever_the_depth() {
    for exe in [DEEP_DEBUG, DEEP_RELEASE] {
        let (_dir, path) = profile("rows", exe);
        for depth in [&[][..], &["--depth", "1"][..]] {
            let markdown = report(&path, "markdown", depth);
            assert!(markdown.contains(HEADER), "{exe}:\n{markdown}");
            assert!(
                !markdown.contains("| Allocations | Total size |"),
                "{markdown}"
            );
            // The Set's entries: 1 buffer of 32,768 16-byte entries, made
            // inside `Set(String)#add`, the program's line beyond the frames shown.
            let set = row(&markdown, 524_288);
            assert_eq!(set[0], "1", "{exe}: {set:?}");
            assert!(set[2].ends_with(&fill_at("set")), "{exe}: {set:?}");
            assert!(!set[3].contains("deep.cr"), "{exe}: frames shown: {set:?}");
            // The Hash's entries: 32,768 of 24 bytes.
            let hash = row(&markdown, 786_432);
            assert_eq!(hash[0], "1", "{exe}: {hash:?}");
            assert!(hash[2].ends_with(&fill_at("hash")), "{exe}: {hash:?}");
            // The 20,000 keys, each a String made by the interpolation.
            let keys = markdown
                .lines()
                .find(|l| l.starts_with("|          20,000 |"))
                .unwrap_or_else(|| panic!("{exe}: no row of 20,000 live in:\n{markdown}"));
            assert!(
                keys.split(" | ").nth(2).unwrap().ends_with(&fill_at("key")),
                "{exe}: {keys}"
            );
        }
        // TSV: the program's frame is the third field.
        let tsv = report(&path, "tsv", &[]);
        let line = tsv
            .lines()
            .find(|l| l.starts_with("1\t524288\t"))
            .unwrap_or_else(|| panic!("{exe}: no Set entries row in:\n{tsv}"));
        let program = line.split('\t').nth(2).unwrap();
        assert!(
            program.ends_with(fill_at("set").trim_end_matches('`')),
            "{exe}: {line}"
        );
        // JSON: `program_frame` of the group.
        let json = report_json(&path);
        let group = groups(&json)
            .iter()
            .find(|g| g["live_bytes"] == 786_432)
            .unwrap_or_else(|| panic!("{exe}: no Hash entries group in\n{}", list_groups(&json)));
        assert_eq!(group["program_frame"]["function"], "Registry#fill");
        assert_eq!(
            group["program_frame"]["line"],
            marked_line(DEEP_SOURCE, "hash")
        );
    }
}

/// The standard library's generic methods read `Hash(String, Int32)#resize`
/// in the markdown rows, the folded stacks and the JSON frames, in both
/// builds (release inlines `Set#add`, `upsert` and `[]=`: their class
/// then comes from the source, the frame that calls them and the type of
/// the object they are called on), and no method on the way reads a bare
/// name.
#[test]
fn generic_methods_carry_their_class() {
    for exe in [DEEP_DEBUG, DEEP_RELEASE] {
        let (_dir, path) = profile("methods", exe);
        let markdown = report(&path, "markdown", &[]);
        let folded = report(&path, "folded", &[]);
        for name in [
            "Hash(String, Int32)#resize",
            "Hash(String, Int32)#realloc_entries",
            "Hash(String, Nil)#resize",
            "Hash(String, Nil)#realloc_entries",
        ] {
            assert!(
                markdown.contains(&format!(" in '{name}'`")),
                "{exe}: no {name} in:\n{markdown}"
            );
            assert!(
                folded.contains(&format!(";{name};")) || folded.contains(&format!(";{name} ")),
                "{exe}: no {name} in:\n{folded}"
            );
        }
        // Symbols in debug; inlined in release, named from the source:
        // `Set(String)#add` called on `@seen = Set(String).new`,
        // `Hash(String, Nil)#[]=` on Set's `@hash : Hash(T, Nil)`, `upsert`
        // from the `[]=` of the same Hash.
        for name in [
            "Set(String)#add",
            "Hash(String, Int32)#[]=",
            "Hash(String, Int32)#upsert",
            "Hash(String, Nil)#[]=",
            "Hash(String, Nil)#upsert",
        ] {
            assert!(
                markdown.contains(&format!(" in '{name}'`")),
                "{exe}: no {name} in:\n{markdown}"
            );
        }
        // The methods on the way of these allocations, never bare
        // (top-level methods, `spawn`, are bare as they are written).
        let json = report_json(&path);
        let methods = [
            "fill",
            "add",
            "[]=",
            "upsert",
            "resize",
            "realloc_entries",
            "realloc_indices",
            "new",
            "initialize",
            "<<",
            "push",
            "to_s",
            "interpolation",
            "resize_to_capacity",
        ];
        for g in groups(&json) {
            for f in g["frames"].as_array().unwrap() {
                let function = f["function"].as_str().unwrap();
                assert!(
                    !methods.contains(&function),
                    "{exe}: a bare method name {function:?} ({})",
                    f["file"]
                );
            }
        }
    }
}
