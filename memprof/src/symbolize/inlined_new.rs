//! Naming the class an inlined Crystal `new` makes at an instruction
//! ([`inlined_new_owners`]), from the source its DWARF lines point to: the
//! constructor's call as its caller writes it, type parameters of generic
//! code substituted, paths qualified as Crystal looks them up.
use std::collections::HashSet;

use blazesym::symbolize::{Sym, Symbolizer};

use super::inlined::name_inlined;
use super::worker::BATCH;
use super::{found, sym_frames};
use crate::crystal;
use crate::crystal::generics::{has_parameter, same_generic, substitute};
use crate::crystal::source::Sources;
use crate::modules::Module;
use crate::profile::Frame;

/// The class of the innermost inlined `new` at each link-time address of
/// `module` (an instruction, not a return address), named from the source
/// as [`super::symbolize`] names frames; `None` where there is none, or where the
/// source names a generic class (`Array(T)`: which `T` is not known).
pub(crate) fn inlined_new_owners(module: &Module, vaddrs: &[u64]) -> Vec<Option<String>> {
    let lines = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build();
    let mut sources = Sources::default();
    let name = crate::text::lossy_path(module.path());
    let mut owners = Vec::with_capacity(vaddrs.len());
    if vaddrs.is_empty() {
        return owners;
    }
    let types = ProgramTypes::of(module);
    for batch in vaddrs.chunks(BATCH) {
        let offsets: Vec<u64> = batch
            .iter()
            .map(|&a| module.file_offset(a).unwrap_or(0))
            .collect();
        let dwarf = super::dwarf_at(&lines, module, &offsets);
        for (i, &addr) in batch.iter().enumerate() {
            let owner = found(&dwarf, i)
                .and_then(|sym| owner_of_new(sym, addr, &name, &types, &mut sources));
            owners.push(owner);
        }
    }
    owners
}

/// The methods of the program's types: (address, size, owner), by
/// address; and the types (`Foo::Bar`, arguments dropped).
struct ProgramTypes<'a> {
    methods: Vec<(u64, u64, &'a str)>,
    known: HashSet<String>,
}

impl<'a> ProgramTypes<'a> {
    fn of(module: &'a Module) -> ProgramTypes<'a> {
        let mut methods: Vec<(u64, u64, &str)> = module
            .symbols()
            .filter_map(|(n, sym)| Some((sym.address, sym.size, crystal::parse_method(n)?.owner?)))
            .collect();
        methods.sort_unstable();
        let known: HashSet<String> = methods
            .iter()
            .map(|(_, _, o)| o.split('(').next().unwrap_or(o).to_string())
            .collect();
        ProgramTypes { methods, known }
    }

    /// The type whose method holds `addr` (release DWARF names it `[]`).
    fn owner_at(&self, addr: u64) -> Option<&'a str> {
        let i = self
            .methods
            .partition_point(|m| m.0 <= addr)
            .checked_sub(1)?;
        let (start, size, owner) = self.methods[i];
        (addr < start + size.max(1)).then_some(owner)
    }
}

fn is_new(f: &Frame) -> bool {
    f.raw_name == "new" || f.raw_name.starts_with("new:")
}

/// The class the innermost inlined `new` of `sym` (at `addr`) makes.
fn owner_of_new(
    sym: &Sym<'_>,
    addr: u64,
    module: &str,
    types: &ProgramTypes<'_>,
    sources: &mut Sources,
) -> Option<String> {
    let mut frames = sym_frames(None, Some(sym), module, addr);
    let columns = super::columns(Some(sym), frames.len());
    name_inlined(&mut frames, &columns, sources);
    // The innermost `new` only.
    let at = frames.iter().position(is_new);
    // First, what its caller's source says it makes, at the call's
    // column (`Foo.new`, `Array(Foo).new`, `[] of Foo`): DWARF names
    // no instantiated type, and the class whose `def initialize`
    // a `new` comes from may be a superclass.
    let calls = Calls {
        frames: &frames,
        columns: &columns,
        types,
    };
    if let Some(made) = at.and_then(|k| calls.made(k, addr, sources)) {
        return Some(made);
    }
    // Else, when its line is the class's own `def initialize` /
    // `def self.new`: a `new` the compiler generates has the
    // caller's line, in another class.
    defining_class(&frames[at?], sources)
}

/// The frames of one address, with their columns, read against the source.
struct Calls<'a> {
    frames: &'a [Frame],
    columns: &'a [Option<u16>],
    types: &'a ProgramTypes<'a>,
}

impl Calls<'_> {
    /// What the caller of the `new` at frame `k` constructs, and the
    /// generic type (`Set(T)`) whose code that caller is, if any.
    fn made_at(&self, k: usize, sources: &mut Sources) -> Option<(String, Option<String>)> {
        let caller = self.frames.get(k + 1)?;
        let (file, line) = (caller.file.as_deref()?, caller.line?);
        let column = usize::from((*self.columns.get(k + 1)?)?);
        let generic = sources.enclosing_type(file, line);
        let text = sources.line(file, line)?.get(column.checked_sub(1)?..)?;
        // A bare `new(…)` in a class method makes its own class.
        let made = match text.strip_prefix("new") {
            Some(rest) if !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') => {
                generic.clone()?
            }
            _ => crystal::source::constructed(text)?,
        };
        let made = qualify(&made, &sources.namespace(file, line), &self.types.known);
        Some((made, generic))
    }

    /// What the `new` at frame `k` (of the code at `addr`) makes, the
    /// parameters of the generic code it is in substituted.
    fn made(&self, k: usize, addr: u64, sources: &mut Sources) -> Option<String> {
        let frames = self.frames;
        let (mut made, mut generic) = self.made_at(k, sources)?;
        // `Hash(T, Nil).new` in `Set(T)`: T is what the next `new`
        // out made its `Set` of (`Set(BasicBlock).new`), a few
        // levels out at most.
        let mut from = k + 1;
        // Or an outer function is a method of one (the symbol
        // `*Array(Author)@Array(T)#[]<…>` for `Array(T).new` in `[]`).
        for _ in 0..3 {
            if !has_parameter(&made) {
                break;
            }
            let Some(within) = generic.take() else {
                break;
            };
            let mut instance = None;
            if let Some(j) = (from..frames.len()).find(|&j| is_new(&frames[j])) {
                instance = self
                    .made_at(j, sources)
                    .map(|(instance, next)| (instance, next, j + 1));
            } else if let Some(owner) = self
                .types
                .owner_at(addr)
                .filter(|o| same_generic(o, &within))
            {
                instance = Some((owner.to_string(), None, frames.len()));
            }
            let Some((instance, next, after)) = instance else {
                break;
            };
            made = substitute(&made, &within, &instance);
            (generic, from) = (next, after);
        }
        Some(made)
    }
}

/// The class of `new`'s frame `f` when its line is that class's own `def
/// initialize` / `def self.new`.
fn defining_class(f: &Frame, sources: &mut Sources) -> Option<String> {
    let def = sources.line(f.file.as_deref()?, f.line?)?.trim_start();
    if !(def.starts_with("def initialize") || def.starts_with("def self.new")) {
        return None;
    }
    let owner = f.function.strip_suffix(".new")?;
    (!owner.is_empty() && !owner.contains('(')).then(|| owner.to_string())
}

/// `made` (a type as a source line writes it) with its path completed
/// as Crystal looks constants up from the namespace `within` (`Output`
/// in `HTTP::Server::Response` is `HTTP::Server::Response::Output`): the
/// innermost scope where a type of that path has methods in the program,
/// for the type and each of its arguments;
/// as written when none has.
fn qualify(made: &str, within: &[String], known: &HashSet<String>) -> String {
    let one = |path: &str| {
        (0..within.len())
            .rev()
            .map(|n| format!("{}::{path}", within[..=n].join("::")))
            .find(|full| known.contains(full))
            .unwrap_or_else(|| path.to_string())
    };
    // Each path in it: the type and its arguments.
    let mut out = String::new();
    let mut path = String::new();
    for c in made.chars().chain(['\0']) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            path.push(c);
            continue;
        }
        if path.starts_with(|c: char| c.is_ascii_uppercase()) {
            out.push_str(&one(&path));
        } else {
            out.push_str(&path);
        }
        path.clear();
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constructed_type_is_qualified_and_its_parameters_substituted() {
        let known: HashSet<String> = ["HTTP::Server::Response::Output", "HTTP::Headers::Key"]
            .map(String::from)
            .into();
        let within = ["HTTP", "Server", "Response"].map(String::from);
        assert_eq!(
            qualify("Output", &within, &known),
            "HTTP::Server::Response::Output"
        );
        let headers = ["HTTP", "Headers"].map(String::from);
        assert_eq!(
            qualify("Hash(Key, String | Array(String))", &headers, &known),
            "Hash(HTTP::Headers::Key, String | Array(String))"
        );
        // Nothing of that path: as written.
        assert_eq!(qualify("Output", &[], &known), "Output");
    }
}
