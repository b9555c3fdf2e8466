//! The walls between memprof's modules: each top-level module of
//! `memprof/src` and `memprof-ebpf/src` stands on a layer that
//! `docs/ARCHITECTURE.md` ("Layers") names, and imports only from its own
//! layer or those below; no two top-level modules import each other, even
//! through others. Read from the source's `crate::` paths (`use` lines and
//! paths in code), tests and comments left out.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One import that breaks a wall: where it is, and what it names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    file: String,
    from: String,
    to: String,
}

#[test]
fn memprof_modules_import_only_from_their_layer_or_below() {
    check_tree("memprof/src");
}

#[test]
fn kernel_side_modules_import_only_from_their_layer_or_below() {
    check_tree("memprof-ebpf/src");
}

/// The check fails, naming the import, on an upward import and on two
/// modules that import each other.
#[test]
fn an_upward_import_and_a_circle_are_named() {
    let layers = parse_layers(
        "<!-- layers: src -->\n\
         | layer | modules | what |\n|---|---|---|\n\
         | 1 | `text` | ground |\n\
         | 2 | `profile`, `report` | the file |\n\
         | 3 | `session` | sessions |\n\
         <!-- end layers -->\n",
        "src",
    );
    let files = [
        ("text.rs", "pub fn visible() {}\n"),
        (
            "profile/mod.rs",
            "use crate::session::census::When; // upward\n\
             use crate::{report::{self, json}, text};\n\
             mod model;\n",
        ),
        ("profile/model.rs", "use super::super::report::Row;\n"),
        (
            "report/mod.rs",
            "use crate::profile::Profile;\n#[cfg(test)]\nmod tests {\n    use crate::session::x;\n}\n",
        ),
        ("session/census.rs", "// crate::report in a comment\nuse crate::text;\n"),
    ];
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect();
    let failures = failures("src", &layers, &files);
    assert_eq!(
        failures,
        [
            "src/profile/mod.rs: `crate::session` — profile (layer 2) imports session, a layer above (3)",
            "profile and report import each other: src/profile/mod.rs → report, src/profile/model.rs → report, src/report/mod.rs → profile",
        ]
    );
}

fn check_tree(tree: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let layers = parse_layers(&doc, tree);
    let files = sources(&root.join(tree));
    let failures = failures(tree, &layers, &files);
    assert!(
        failures.is_empty(),
        "the layers of {tree} (docs/ARCHITECTURE.md, \"Layers\") are broken:\n{}",
        failures.join("\n")
    );
}

/// The layer of each top-level module of `tree`, from the table between
/// `<!-- layers: TREE -->` and `<!-- end layers -->`: the layer's number in
/// the first column, its modules in backticks in the second.
fn parse_layers(doc: &str, tree: &str) -> BTreeMap<String, u32> {
    let start = format!("<!-- layers: {tree} -->");
    let table = doc
        .split_once(&start)
        .and_then(|(_, rest)| rest.split_once("<!-- end layers -->"))
        .unwrap_or_else(|| panic!("docs/ARCHITECTURE.md has no table {start}"))
        .0;
    let mut layers = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Ok(layer) = cells[1].parse::<u32>() else {
            continue;
        };
        for module in cells[2].split('`').skip(1).step_by(2) {
            layers.insert(module.to_string(), layer);
        }
    }
    layers
}

/// Every `.rs` file under `dir`, as (path from `dir`, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

/// The top-level modules of `files` (the crate's roots are none).
fn top_modules(files: &[(String, String)]) -> BTreeSet<String> {
    files
        .iter()
        .filter_map(|(path, _)| module_path(path).into_iter().next())
        .collect()
}

/// The imports from one top-level module to another, of every file but
/// the crate's roots and the files only tests compile.
fn imports_of(files: &[(String, String)]) -> Vec<Import> {
    let test_only = test_only_files(files);
    let modules = top_modules(files);
    let mut imports = Vec::new();
    for (path, text) in files {
        let module = module_path(path);
        if module.is_empty() || test_only.contains(path) {
            continue;
        }
        for to in top_modules_named(&code_of(text), &module) {
            // A name at the crate's root that is no module (a macro).
            if to != module[0] && modules.contains(&to) {
                imports.push(Import {
                    file: path.clone(),
                    from: module[0].clone(),
                    to,
                });
            }
        }
    }
    imports.sort();
    imports.dedup();
    imports
}

/// The module path of a file (`session/machine/mod.rs`: `session::machine`);
/// empty for the crate's roots.
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// Files declared `#[cfg(test)] mod name;`, and those under them.
fn test_only_files(files: &[(String, String)]) -> BTreeSet<String> {
    let mut prefixes = Vec::new();
    for (path, text) in files {
        // Where its `mod name;` files are: beside a `mod.rs` or a root,
        // else in the folder named like the file.
        let dir = match path.ends_with("/mod.rs") || module_path(path).is_empty() {
            true => path
                .rsplit_once('/')
                .map_or(String::new(), |(d, _)| format!("{d}/")),
            false => format!("{}/", path.trim_end_matches(".rs")),
        };
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let next = lines.by_ref().find(|l| !l.starts_with("#["));
            if let Some(name) = next
                .and_then(|l| l.strip_prefix("mod "))
                .and_then(|l| l.strip_suffix(';'))
            {
                prefixes.push(format!("{dir}{name}"));
            }
        }
    }
    files
        .iter()
        .map(|(p, _)| p)
        .filter(|p| {
            prefixes
                .iter()
                .any(|t| p.as_str() == format!("{t}.rs") || p.starts_with(&format!("{t}/")))
        })
        .cloned()
        .collect()
}

/// `text` without comments, string and character literals, and the items
/// under `#[cfg(test)]`.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            ('r', Some('#' | '"'))
                if i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_') =>
            {
                // A raw string: r"…", r#"…"#.
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                let close: String = std::iter::once('"')
                    .chain("#".repeat(hashes).chars())
                    .collect();
                let body = i + 2 + hashes;
                let rest: String = chars[body.min(chars.len())..].iter().collect();
                let len = rest.find(&close).map_or(rest.len(), |at| at + close.len());
                i = body + rest[..len].chars().count();
                code.push_str("\"\"");
            }
            ('"', _) => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("\"\"");
            }
            ('\'', Some(c)) if chars.get(i + 2) == Some(&'\'') || c == '\\' => {
                // A character literal ('{', '\n', '\''), not a lifetime.
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("' '");
            }
            (c, _) => {
                code.push(c);
                i += 1;
            }
        }
    }
    without_test_items(&code)
}

/// `code` without each item that follows `#[cfg(test)]`: up to its `;`,
/// or its braces when it opens any first.
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The top-level modules that `code`, in module `module`, names through
/// `crate::` (and `super::` paths that climb to the crate's root).
fn top_modules_named(code: &str, module: &[String]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !is_ident(bytes[i]) || (i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'$')) {
            i += 1;
            continue;
        }
        let word_end = (i..bytes.len())
            .find(|&j| !is_ident(bytes[j]))
            .unwrap_or(bytes.len());
        let word = &code[i..word_end];
        // Where the path stands after `crate::` or its `super::`s.
        let mut depth = match word {
            "crate" => Some(0),
            "super" => Some(module.len().saturating_sub(1)),
            _ => None,
        };
        let mut at = word_end;
        while let Some(d) = depth {
            if !code[at..].starts_with("::") {
                depth = None;
                break;
            }
            at += 2;
            if d > 0 && code[at..].starts_with("super") {
                depth = Some(d - 1);
                at += "super".len();
            } else {
                break;
            }
        }
        if depth == Some(0) {
            if code[at..].starts_with('{') {
                named.extend(group_heads(&code[at..]));
            } else {
                let end = (at..bytes.len())
                    .find(|&j| !is_ident(bytes[j]))
                    .unwrap_or(bytes.len());
                named.insert(code[at..end].to_string());
            }
        }
        i = word_end;
    }
    named.remove("");
    named.remove("self");
    named
}

/// The first name of each path of a `{a, b::c, d::{e}}` group.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut start) = (0, 1);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let head: String = group[start..i]
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                heads.push(head);
                start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    heads
}

/// What breaks the walls: a module not placed on a layer, an import from a
/// layer above, top-level modules that import each other (through others
/// too).
fn failures(tree: &str, layers: &BTreeMap<String, u32>, files: &[(String, String)]) -> Vec<String> {
    let imports = &imports_of(files);
    let mut failures = Vec::new();
    for m in &top_modules(files) {
        if !layers.contains_key(m) {
            failures.push(format!(
                "{tree}: module `{m}` is on no layer of docs/ARCHITECTURE.md"
            ));
        }
    }
    for i in imports {
        let (Some(&from), Some(&to)) = (layers.get(&i.from), layers.get(&i.to)) else {
            continue;
        };
        if to > from {
            failures.push(format!(
                "{tree}/{}: `crate::{}` — {} (layer {from}) imports {}, a layer above ({to})",
                i.file, i.to, i.from, i.to
            ));
        }
    }
    for circle in circles(imports) {
        let ties: Vec<String> = imports
            .iter()
            .filter(|i| circle.contains(&i.from) && circle.contains(&i.to))
            .map(|i| format!("{tree}/{} → {}", i.file, i.to))
            .collect();
        let names: Vec<&str> = circle.iter().map(String::as_str).collect();
        failures.push(format!(
            "{} import each other: {}",
            names.join(" and "),
            ties.join(", ")
        ));
    }
    failures
}

/// The sets of top-level modules that reach each other through imports.
fn circles(imports: &[Import]) -> Vec<BTreeSet<String>> {
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in imports {
        edges.entry(&i.from).or_default().insert(&i.to);
        edges.entry(&i.to).or_default();
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            for &n in &edges[m] {
                if seen.insert(n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = edges.keys().map(|&m| (m, reach(m))).collect();
    let mut circles: Vec<BTreeSet<String>> = Vec::new();
    for (&m, r) in &reached {
        let circle: BTreeSet<String> = r
            .iter()
            .filter(|&&n| reached[n].contains(m))
            .map(|n| n.to_string())
            .collect();
        if circle.len() > 1 && !circles.contains(&circle) {
            circles.push(circle);
        }
    }
    circles
}
