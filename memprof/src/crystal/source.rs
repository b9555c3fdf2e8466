//! The class an inlined `new` belongs to, from the program's source.
//!
//! Release builds inline `Node.new` into its caller, and the DWARF of the
//! inlined copy names it only `new` (Crystal writes no scope, no linkage
//! name and no class for it: `DW_AT_name ("new")` at the top of the unit).
//! Its `file:line` is inside the class body, though (the `def initialize`
//! that `new` is generated from, or the `def self.new`), so the class is the
//! innermost `class`/`struct`/`module` that encloses that line, read from
//! the source file as Crystal's formatter indents it.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use std::collections::HashMap;

/// The type whose body holds line `line` (1-based) of `lines`: the
/// enclosing `class`, `struct` (and `module`) names joined by `::`; `None`
/// when the line is at the top level (or out of range).
pub fn enclosing_type<S: AsRef<str>>(lines: &[S], line: usize) -> Option<String> {
    let (names, is_type) = enclosing(lines, line)?;
    // A method of a module (`def self.new` in `module Foo`) is not a class's.
    if names.is_empty() || !is_type {
        return None;
    }
    Some(path(&names))
}

/// Nested names joined as Crystal names the type: an enclosing generic
/// type's parameters are not part of it (`Stop` in `module Iterator(T)` is
/// `Iterator::Stop`, `Entry(K, V)` in `class Hash(K, V)` is `Hash::Entry(K, V)`).
fn path(names: &[&str]) -> String {
    let last = names.len().saturating_sub(1);
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if i < last {
                n.split('(').next().unwrap_or(n)
            } else {
                n
            }
        })
        .collect::<Vec<_>>()
        .join("::")
}

/// The `class`, `struct` or `module` whose body holds line `line`, modules
/// included (`Indexable(T)`, `Math`): where a method is defined.
pub fn enclosing_scope<S: AsRef<str>>(lines: &[S], line: usize) -> Option<String> {
    let (names, _) = enclosing(lines, line)?;
    (!names.is_empty()).then(|| path(&names))
}

/// The `def` of method `name` for code at line `line` (1-based): the `def`
/// whose body holds the line when it has that name, else the first `def` of
/// that name in the file (a method that yields has its body compiled into
/// its caller's, with its own lines: `Array#dup`'s code at a line of
/// `def self.build`). The `def`'s line and whether it is a class method
/// (`def self.name`); `None` when the file defines no method `name` (a
/// macro's `getter`).
pub fn definition<S: AsRef<str>>(lines: &[S], line: usize, name: &str) -> Option<(usize, bool)> {
    let is_def = |k: usize| -> Option<bool> {
        let (def_name, class_method) = def_of(lines.get(k)?.as_ref())?;
        (def_name == name).then_some(class_method)
    };
    let start = line.checked_sub(1).filter(|&l| l < lines.len())?;
    // The `def` holding the line: the line itself, else the nearest less
    // indented line above that is a `def` (a class's line ends the search).
    let mut k = Some(start);
    let mut limit = indent(lines[start].as_ref()) + 1;
    while let Some(at) = k {
        let text = lines[at].as_ref();
        if !text.trim().is_empty() && indent(text) < limit {
            limit = indent(text);
            if def_of(text).is_some() {
                if let Some(class_method) = is_def(at) {
                    return Some((at + 1, class_method));
                }
                break;
            }
            if opener(text).is_some() || limit == 0 {
                break;
            }
        }
        k = at.checked_sub(1);
    }
    (0..lines.len()).find_map(|k| is_def(k).map(|c| (k + 1, c)))
}

/// The type of the receiver an expression starting `text` (at line `line`,
/// 1-based) calls a method on, as the source writes it: an instance
/// variable declared (`@hash : Hash(T, Nil)`, also as a parameter) or
/// assigned a construction (`@counts = Hash(String, Int32).new`) in the
/// body of the same type, or a local variable assigned one (`list = [] of
/// Node`) in the lines above in the same `def`. `None` otherwise.
pub fn receiver_type<S: AsRef<str>>(lines: &[S], line: usize, text: &str) -> Option<String> {
    let ivar = text.starts_with('@');
    let name_end = text
        .char_indices()
        .skip(usize::from(ivar))
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map_or(text.len(), |(i, _)| i);
    let name = &text[..name_end];
    if name.len() <= usize::from(ivar) || name.starts_with(|c: char| c.is_ascii_uppercase()) {
        return None;
    }
    // `name : Type` (not `::`), or `name = construction`, at `at` in `l`.
    let typed = |l: &str, at: usize| -> Option<String> {
        let after = &l[at + name.len()..];
        if after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let after = after.trim_start();
        if let Some(ty) = after.strip_prefix(':').filter(|a| !a.starts_with(':')) {
            return type_expr(ty.trim_start()).map(|(t, _)| t.to_string());
        }
        let value = after
            .strip_prefix('=')
            .filter(|a| !a.starts_with(['=', '~']))?;
        constructed(value.trim_start())
    };
    let find = |l: &str| -> Option<String> {
        l.match_indices(name).find_map(|(at, _)| {
            let before = l[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@' || c == '.')
            {
                return None;
            }
            typed(l, at)
        })
    };
    if ivar {
        let scope = enclosing(lines, line)?.0.join("::");
        return lines.iter().enumerate().find_map(|(k, l)| {
            let l = l.as_ref();
            if !l.contains(name)
                || enclosing(lines, k + 1).map(|(n, _)| n.join("::")) != Some(scope.clone())
            {
                return None;
            }
            find(l)
        });
    }
    // A local: the lines above, up to the `def`.
    for l in lines[..line.checked_sub(1)?]
        .iter()
        .rev()
        .map(AsRef::as_ref)
    {
        if let Some(ty) = find(l) {
            return Some(ty);
        }
        if def_of(l).is_some() {
            break;
        }
    }
    None
}

/// `def name(…)`, `private def self.name`, … → (name, is a class method).
fn def_of(text: &str) -> Option<(&str, bool)> {
    let mut rest = text.trim_start();
    for word in ["private ", "protected ", "abstract "] {
        rest = rest.strip_prefix(word).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("def ")?.trim_start();
    let (rest, class_method) = match rest.strip_prefix("self.") {
        Some(rest) => (rest, true),
        None => (rest, false),
    };
    let end = rest.find(['(', ' ', ':', ';']).unwrap_or(rest.len());
    Some((&rest[..end], class_method)).filter(|(n, _)| !n.is_empty())
}

/// The `class`/`struct`/`module` names enclosing line `line`, outermost
/// first, and whether one is not a module.
fn enclosing<S: AsRef<str>>(lines: &[S], line: usize) -> Option<(Vec<&str>, bool)> {
    let start = lines.get(line.checked_sub(1)?)?.as_ref();
    let mut limit = indent(start);
    let mut names: Vec<&str> = Vec::new();
    let mut is_type = false;
    for text in lines[..line - 1].iter().rev().map(AsRef::as_ref) {
        if text.trim().is_empty() || indent(text) >= limit {
            continue;
        }
        // A line less indented than the block we are in opens that block.
        limit = indent(text);
        if let Some((keyword, name)) = opener(text) {
            is_type |= keyword != "module";
            names.push(name);
        }
        if limit == 0 {
            break;
        }
    }
    names.reverse();
    Some((names, is_type))
}

/// The type an expression starting `text` constructs, as the source
/// writes it: `Foo.new(…)` → `Foo`, `Array(Foo).new` → `Array(Foo)`,
/// `[] of Foo` → `Array(Foo)`, `{} of K => V` → `Hash(K, V)`; `None` for
/// anything else. (Type arguments the compiler infers, as in
/// `Array.new(3, 0)`, stay unwritten: `Array`.)
///
/// (Example: `doc_examples::example_2` below, run by the tests.)
pub fn constructed(text: &str) -> Option<String> {
    if let Some(rest) = text.strip_prefix("[] of ") {
        return Some(format!("Array({})", type_expr(rest)?.0));
    }
    if let Some(rest) = text.strip_prefix("{} of ") {
        let (key, rest) = type_expr(rest)?;
        let (value, _) = type_expr(rest.trim_start().strip_prefix("=>")?.trim_start())?;
        return Some(format!("Hash({key}, {value})"));
    }
    let (ty, rest) = type_expr(text)?;
    rest.starts_with(".new").then(|| ty.to_string())
}

/// A type at the start of `text` (`Foo::Bar`, with balanced `(…)`
/// arguments), and the text after it.
fn type_expr(text: &str) -> Option<(&str, &str)> {
    let bytes = text.as_bytes();
    let mut end = 0;
    loop {
        // One path segment: a constant.
        if !bytes.get(end)?.is_ascii_uppercase() {
            return None;
        }
        while bytes
            .get(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            end += 1;
        }
        if text[end..].starts_with("::") {
            end += 2;
        } else {
            break;
        }
    }
    if bytes.get(end) == Some(&b'(') {
        let mut depth = 0;
        for (i, b) in text[end..].bytes().enumerate() {
            match b {
                b'(' => depth += 1,
                b')' => depth -= 1,
                b'\n' => return None,
                _ => {}
            }
            if depth == 0 {
                end += i + 1;
                break;
            }
        }
        if depth != 0 {
            return None;
        }
    }
    Some((&text[..end], &text[end..]))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// `class Node < Base`, `abstract struct Foo(T)`, `private module M` →
/// (keyword, name).
fn opener(line: &str) -> Option<(&str, &str)> {
    let mut words = line.split_whitespace();
    let mut word = words.next()?;
    while matches!(word, "private" | "abstract") {
        word = words.next()?;
    }
    if !matches!(word, "class" | "struct" | "module") {
        return None;
    }
    let rest = line.trim_start();
    let rest = rest[rest.find(word)? + word.len()..].trim_start();
    // The path, then its type parameters whole: `Hash(K, V)` has a space
    // inside (split at spaces, it read `Hash(K,`); `class Foo<Bar` has
    // no space before `<`; `Foo;` ends a one-liner.
    let mut end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    if rest[end..].starts_with('(') {
        end += crate::crystal::symbol::balanced_end(&rest[end..])?;
    }
    Some((word, &rest[..end])).filter(|(_, n)| !n.is_empty())
}

/// Source files read once per symbolization (`None`: unreadable).
#[derive(Default)]
pub struct Sources {
    files: HashMap<String, Option<Vec<String>>>,
}

impl Sources {
    /// The type enclosing `file:line`, if the file can be read.
    pub fn enclosing_type(&mut self, file: &str, line: u32) -> Option<String> {
        enclosing_type(self.lines(file)?, line as usize)
    }

    /// The type or module enclosing `file:line` ([`enclosing_scope`]).
    pub fn enclosing_scope(&mut self, file: &str, line: u32) -> Option<String> {
        enclosing_scope(self.lines(file)?, line as usize)
    }

    /// The `def` of method `name` for code at `file:line` ([`definition`]).
    pub fn definition(&mut self, file: &str, line: u32, name: &str) -> Option<(u32, bool)> {
        let (at, class_method) = definition(self.lines(file)?, line as usize, name)?;
        Some((at as u32, class_method))
    }

    /// The type of the receiver of the call starting `text` at `file:line`
    /// ([`receiver_type`]).
    pub fn receiver_type(&mut self, file: &str, line: u32, text: &str) -> Option<String> {
        receiver_type(self.lines(file)?, line as usize, text)
    }

    /// The names of the `class`es, `struct`s and `module`s enclosing
    /// `file:line`, outermost first, without type parameters.
    pub fn namespace(&mut self, file: &str, line: u32) -> Vec<String> {
        let Some(lines) = self.lines(file) else {
            return Vec::new();
        };
        let names = enclosing(lines, line as usize).map_or(Vec::new(), |(n, _)| n);
        names
            .iter()
            .flat_map(|n| n.split("::"))
            .map(|n| n.split('(').next().unwrap_or(n).to_string())
            .collect()
    }

    /// The text of `file:line` (1-based), if the file can be read.
    pub fn line(&mut self, file: &str, line: u32) -> Option<&str> {
        let lines = self.lines(file)?;
        lines
            .get((line as usize).checked_sub(1)?)
            .map(String::as_str)
    }

    fn lines(&mut self, file: &str) -> Option<&[String]> {
        let lines = self.files.entry(file.to_string()).or_insert_with(|| {
            // Sources are small; a huge file is not a Crystal source. The
            // path comes from the program's DWARF: opened as a regular
            // file only, without blocking, its size read on the descriptor.
            use std::io::Read;
            let opened = crate::modules::open_regular(std::path::Path::new(file)).ok()?;
            if opened.metadata().ok()?.len() > 16 << 20 {
                return None;
            }
            let mut text = String::new();
            opened.take(16 << 20).read_to_string(&mut text).ok()?;
            Some(text.lines().map(str::to_string).collect())
        });
        lines.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_generic_and_module_scopes() {
        let src = "\
module App
  abstract class Shape(T) < Base
    def self.new(x : T)
      new(x, 0)
    end
  end

  def self.new
  end
end
";
        let lines: Vec<&str> = src.lines().collect();
        assert_eq!(enclosing_type(&lines, 4).as_deref(), Some("App::Shape(T)"));
        // Parameters with spaces between them, whole (`Hash(K,` was read).
        let hash = ["class Hash(K, V)", "  def initialize", "  end", "end"];
        assert_eq!(enclosing_type(&hash, 2).as_deref(), Some("Hash(K, V)"));
        let one_liner = ["struct Pair(A, B); def x; end; end"];
        assert_eq!(opener(one_liner[0]), Some(("struct", "Pair(A, B)")));
        assert_eq!(opener("class Node<Base"), Some(("class", "Node")));
        assert_eq!(
            opener("abstract class Foo::Bar(T) < Baz(T)"),
            Some(("class", "Foo::Bar(T)"))
        );
        assert_eq!(enclosing_type(&lines, 3).as_deref(), Some("App::Shape(T)"));
        let nested = [
            "module Iterator(T)",
            "  class Stop",
            "    INSTANCE = new",
            "  end",
            "end",
        ];
        assert_eq!(
            enclosing_type(&nested, 3).as_deref(),
            Some("Iterator::Stop")
        );
        // A module's own method: no class, but a scope.
        assert_eq!(enclosing_type(&lines, 8), None);
        assert_eq!(enclosing_scope(&lines, 8).as_deref(), Some("App"));
        assert_eq!(definition(&lines, 4, "new"), Some((3, true)));
        assert_eq!(definition(&lines, 3, "new"), Some((3, true)));
        let instance = [
            "class A",
            "  def run",
            "    while x",
            "      y",
            "    end",
            "  end",
            "  getter z",
            "  def self.build(n) : self",
            "    yield new",
            "  end",
            "  def dup",
            "    A.build(3) { }",
            "  end",
            "  def []=(k, v)",
            "  end",
            "end",
        ];
        assert_eq!(definition(&instance, 4, "run"), Some((2, false)));
        assert_eq!(definition(&instance, 7, "z"), None);
        // `dup`'s code at a line of the `build` it yields to.
        assert_eq!(definition(&instance, 9, "dup"), Some((11, false)));
        assert_eq!(definition(&instance, 9, "build"), Some((8, true)));
        assert_eq!(definition(&instance, 15, "[]="), Some((14, false)));
        let set = [
            "struct Set(T)",
            "  def initialize(initial_capacity = nil)",
            "    @hash = Hash(T, Nil).new(initial_capacity: initial_capacity)",
            "  end",
            "  protected def initialize(*, using_hash @hash : Hash(T, Nil))",
            "  end",
            "  def add(object : T) : self",
            "    list = [] of T",
            "    @hash[object] = nil",
            "    list << object",
            "  end",
            "end",
        ];
        assert_eq!(
            receiver_type(&set, 9, "@hash[object] = nil").as_deref(),
            Some("Hash(T, Nil)")
        );
        assert_eq!(
            receiver_type(&set, 10, "list << object").as_deref(),
            Some("Array(T)")
        );
        // A parameter of the `def` is declared there.
        assert_eq!(receiver_type(&set, 10, "object.hash").as_deref(), Some("T"));
        assert_eq!(receiver_type(&set, 10, "other.hash"), None);
        assert_eq!(receiver_type(&set, 9, "@other[1]"), None);
        assert_eq!(enclosing_type(&lines, 99), None);
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::crystal::source::enclosing_type;
        let src =
            "class Tree\n  class Node\n    def initialize(@key : Int32)\n    end\n  end\nend\n";
        let lines: Vec<&str> = src.lines().collect();
        assert_eq!(enclosing_type(&lines, 3).as_deref(), Some("Tree::Node"));
        assert_eq!(enclosing_type(&lines, 1), None);
    }
    #[test]
    fn example_2() {
        use crate::crystal::source::constructed;
        assert_eq!(constructed("Output.new(@io)").as_deref(), Some("Output"));
        assert_eq!(
            constructed("Hash(Key, String | Array(String)).new").as_deref(),
            Some("Hash(Key, String | Array(String))")
        );
        assert_eq!(
            constructed("[] of BasicBlock").as_deref(),
            Some("Array(BasicBlock)")
        );
        assert_eq!(
            constructed("{} of Int32 => BasicBlock").as_deref(),
            Some("Hash(Int32, BasicBlock)")
        );
        assert_eq!(constructed("foo.new"), None);
    }
}
