//! Raw return addresses to function names and `file:line`, with blazesym.
//!
//! Addresses are mapped to (module, file offset) through the [`MapsCache`]
//! the session kept while the target ran, so this works after the target has
//! exited. Each module is symbolized in one batch. Return addresses point
//! after the call instruction, so `address - 1` is looked up (the line of the
//! call, not of the next statement). Inlined functions become frames of their
//! own, innermost first.
//!
//! Every module is looked up twice: in its ELF symbol table (`.symtab`, else
//! `.dynsym` of stripped binaries) for the function's name, and in its DWARF
//! for `file:line` and inlined functions. Crystal's DWARF names are short
//! (`new` for `*Foo::new<Int32>:Foo`), so the symbol table's full name wins;
//! inlined functions have only their DWARF name. In `.dynsym` the linker cut
//! Crystal names at `@`, taking the rest for a symbol version
//! (`*Array(Foo)@Array(T)#push…` became `*Array(Foo)` + version
//! `Array(T)#push…`): [`crate::modules::Module::versioned_crystal_names`] joins them again. A frame
//! keeps the symbol in `raw_name`, and shows [`crate::crystal::readable`] or
//! the demangled C++/Rust name in `function`:
//!
//! ```
//! use memprof::symbolize::display_name;
//! assert_eq!(display_name("*Foo::new<Int32>:Foo"), "Foo.new");
//! assert_eq!(display_name("_ZNK4llvm6Module4dumpEv"), "llvm::Module::dump() const");
//! assert_eq!(display_name("make_foo"), "make_foo");
//! ```
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, Symbolizer};
use memprof_common::AllocKind;

use crate::crystal;
use crate::heap::RawGroups;
use crate::modules::ModuleCache;
use crate::profile::{Frame, Group, Stacks};
use crate::target::maps::MapsCache;

/// Addresses symbolized in one blazesym call: bounds the memory its
/// results hold at once.
const BATCH: usize = 4096;

/// Symbolizes every group's stack and names the class each GC group
/// allocates. Each distinct address is symbolized once and becomes one
/// [`crate::profile::Location`]; the groups name their stacks in the returned table.
pub fn symbolize(
    raw: RawGroups,
    maps: &MapsCache,
    modules: &ModuleCache,
    progress: bool,
) -> (Vec<Group>, Stacks) {
    // Distinct addresses only (as the groups number them): stacks share
    // most of their frames.
    let RawGroups {
        groups: raw,
        addresses: ids,
    } = raw;
    let mut addresses = ids.clone();
    addresses.sort_unstable();
    let mut by_module: HashMap<PathBuf, Vec<u64>> = HashMap::new();
    let mut unknown: Vec<u64> = Vec::new();
    for &addr in &addresses {
        match maps.find(addr.saturating_sub(1)) {
            Some(m) => by_module.entry(m.path.clone()).or_default().push(addr),
            None => unknown.push(addr),
        }
    }
    drop(addresses);
    let total: usize = by_module.values().map(Vec::len).sum();
    if progress && total > 0 {
        eprintln!(
            "memprof: symbolizing {total} distinct addresses in {} modules",
            by_module.len()
        );
    }

    // Demangling is ours (`display_name`): `raw_name` keeps the symbol as is.
    let names = Symbolizer::builder()
        .enable_code_info(false)
        .enable_demangling(false)
        .build();
    let lines = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build();
    let mut stacks = Stacks::default();
    let mut sources = crystal::source::Sources::default();
    let mut location_of: HashMap<u64, u32> = HashMap::with_capacity(total + unknown.len());
    // A bar on a terminal: thousands of addresses in big modules take seconds.
    let bar = crate::progress::bar(if progress { total as u64 } else { 0 }, "symbolizing");
    if !progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    for (module, addrs) in by_module {
        bar.set_message(format!("symbolizing {}", crate::allocators::short(&module)));
        let module_name = module.display().to_string();
        // The file the target mapped, as the session opened it (never
        // another file at the same path here): unreadable, no names.
        let file = modules.get(&module).ok();
        let path = file.as_ref().map(|f| f.symbol_path());
        for batch in addrs.chunks(BATCH) {
            let mapping = |a: u64| maps.find(a.saturating_sub(1));
            let offsets: Vec<u64> = batch
                .iter()
                .map(|&a| mapping(a).map_or(0, |m| m.file_offset_of(a.saturating_sub(1))))
                .collect();
            let (symtab, dwarf) = match &path {
                Some(path) => {
                    let mut symtab = Elf::new(path);
                    symtab.debug_syms = false;
                    (
                        names
                            .symbolize(&Source::Elf(symtab), Input::FileOffset(&offsets))
                            .unwrap_or_default(),
                        lines
                            .symbolize(&Source::Elf(Elf::new(path)), Input::FileOffset(&offsets))
                            .unwrap_or_default(),
                    )
                }
                None => (Vec::new(), Vec::new()),
            };
            for (i, &addr) in batch.iter().enumerate() {
                let mut symbol = found(&symtab, i).cloned();
                if let Some(sym) = symbol.as_mut().filter(|s| s.name.starts_with(['*', '~'])) {
                    let names = file.as_ref().map(|m| m.versioned_crystal_names());
                    if let Some(name) = names.and_then(|names| names.get(&sym.addr)) {
                        sym.name = name.clone().into();
                    }
                }
                let mut frames = sym_frames(symbol.as_ref(), found(&dwarf, i), &module_name, addr);
                name_inlined_new(&mut frames, &mut sources);
                // The return address itself as an offset in the file (stable across runs).
                let offset = mapping(addr).map(|m| m.file_offset_of(addr));
                for f in &mut frames {
                    f.offset = offset;
                }
                location_of.insert(addr, stacks.location(frames));
            }
            bar.inc(batch.len() as u64);
        }
    }
    bar.finish_and_clear();
    for addr in unknown {
        location_of.insert(addr, stacks.location(vec![unknown_frame(None, addr)]));
    }

    // The class each stack allocates, found once per stack.
    let mut types: HashMap<u32, Option<String>> = HashMap::new();
    // Each stack's addresses are given back as its locations are made:
    // a big program's stacks are tens of megabytes either way.
    let location_of: Vec<u32> = ids.iter().map(|a| location_of[a]).collect();
    drop(ids);
    let mut raw = raw;
    let mut locations: Vec<u32> = Vec::with_capacity(raw.iter().map(|g| g.frames.len()).sum());
    let mut ends = Vec::with_capacity(raw.len());
    for g in &mut raw {
        locations.extend(g.frames.iter().map(|&id| location_of[id as usize]));
        ends.push(locations.len());
        g.frames = Arc::from([]);
    }
    let ids = stacks.stacks(&locations, &ends);
    drop((locations, ends));
    // Taken from the end, the raw groups' array shrinking as it goes: the
    // two arrays are not both whole at once.
    let mut ids = ids;
    let mut groups: Vec<Group> = Vec::with_capacity(raw.len());
    while let (Some(g), Some(stack)) = (raw.pop(), ids.pop()) {
        if raw.len().is_multiple_of(RELEASE_EVERY) {
            raw.shrink_to_fit();
        }
        groups.push({
            // Classes are a GC heap notion; libc and mmap rows keep their call site.
            let type_name = match g.kind() {
                AllocKind::Gc | AllocKind::GcAtomic => types
                    .entry(stack)
                    .or_insert_with(|| {
                        let head: Vec<Frame> =
                            stacks.frames(stack).take(TYPE_FRAMES).cloned().collect();
                        crystal::allocated_type(&head)
                    })
                    .clone(),
                AllocKind::Libc | AllocKind::Mmap => None,
            };
            Group {
                pid: 0,
                kind: g.kind().name().to_string(),
                live_count: g.live_count,
                live_bytes: g.live_bytes,
                total_count: g.total_count,
                total_bytes: g.total_bytes,
                type_name,
                stack,
                truncated: g.truncated,
                folded: g.folded,
                overflow: g.overflow,
                collected_count: g.collected_count,
                collected_bytes: g.collected_bytes,
                marked_count: g.marked_count,
                marked_bytes: g.marked_bytes,
                lifetimes: g.lifetimes,
                gc_history: g.gc_history,
                v2_frames: Vec::new(),
            }
        });
    }
    groups.reverse();
    (groups, stacks)
}

/// Raw groups taken between two shrinks of their array.
const RELEASE_EVERY: usize = 8192;

/// Frames enough to name the class a stack allocates: the allocator
/// plumbing (a handful of frames) and the frame above it.
const TYPE_FRAMES: usize = 32;

/// The `i`-th result of a batch, if a symbol was found.
fn found<'a>(results: &'a [Symbolized<'a>], i: usize) -> Option<&'a Sym<'a>> {
    match results.get(i) {
        Some(Symbolized::Sym(sym)) => Some(sym),
        _ => None,
    }
}

/// The name to show for a symbol: Crystal's readable form, else the
/// demangled C++ or Rust name, else the symbol itself.
pub fn display_name(raw: &str) -> String {
    crystal::readable(raw)
        .or_else(|| demangle(raw))
        .unwrap_or_else(|| raw.to_string())
}

/// Rust (legacy `_ZN…E` and v0 `_R…`) and C++ (`_Z…`) names, demangled.
fn demangle(raw: &str) -> Option<String> {
    if raw.starts_with("_R") || raw.starts_with("_ZN") {
        if let Ok(name) = rustc_demangle::try_demangle(raw) {
            return Some(format!("{name:#}"));
        }
    }
    // Only `_Z` names: cpp_demangle also reads bare type codes (`i` → `int`).
    if raw.starts_with("_Z") {
        return cpp_demangle::Symbol::new(raw).ok()?.demangle().ok();
    }
    None
}

/// The frames of one address, innermost first: the functions DWARF says
/// were inlined there, then the function the symbol table names.
fn sym_frames(
    symtab: Option<&Sym<'_>>,
    dwarf: Option<&Sym<'_>>,
    module: &str,
    addr: u64,
) -> Vec<Frame> {
    let outer_name = match (symtab, dwarf) {
        (Some(sym), _) | (None, Some(sym)) => sym.name.to_string(),
        (None, None) => return vec![unknown_frame(Some(module), addr)],
    };
    let frame = |raw: &str, info: Option<&CodeInfo<'_>>| {
        let (file, line) = match info {
            Some(info) => (Some(info.to_path().display().to_string()), info.line),
            None => (None, None),
        };
        Frame {
            function: display_name(raw),
            raw_name: raw.to_string(),
            file,
            line,
            module: module.to_string(),
            address: addr,
            offset: None,
        }
    };
    let mut frames = Vec::new();
    if let Some(dwarf) = dwarf {
        for inlined in dwarf.inlined.iter().rev() {
            frames.push(frame(&inlined.name, inlined.code_info.as_ref()));
        }
    }
    frames.push(frame(
        &outer_name,
        dwarf.and_then(|d| d.code_info.as_deref()),
    ));
    frames
}

/// The class of the innermost inlined `new` at each link-time address of
/// `module` (an instruction, not a return address), named from the source
/// as [`symbolize`] names frames; `None` where there is none, or where the
/// source names a generic class (`Array(T)`: which `T` is not known).
pub(crate) fn inlined_new_owners(
    module: &crate::modules::Module,
    vaddrs: &[u64],
) -> Vec<Option<String>> {
    let lines = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build();
    let mut sources = crystal::source::Sources::default();
    let path = module.symbol_path();
    let name = module.path().display().to_string();
    let mut owners = Vec::with_capacity(vaddrs.len());
    if vaddrs.is_empty() {
        return owners;
    }
    // The methods of the program's types: (address, size, owner), by
    // address; and the types (`Foo::Bar`, arguments dropped).
    let mut methods: Vec<(u64, u64, &str)> = module
        .symbols()
        .filter_map(|(n, sym)| Some((sym.address, sym.size, crystal::parse_method(n)?.owner?)))
        .collect();
    methods.sort_unstable();
    let known: HashSet<String> = methods
        .iter()
        .map(|(_, _, o)| o.split('(').next().unwrap_or(o).to_string())
        .collect();
    // The type whose method holds `addr` (release DWARF names it `[]`).
    let owner_at = |addr: u64| {
        let i = methods.partition_point(|m| m.0 <= addr).checked_sub(1)?;
        let (start, size, owner) = methods[i];
        (addr < start + size.max(1)).then_some(owner)
    };
    for batch in vaddrs.chunks(BATCH) {
        let offsets: Vec<u64> = batch
            .iter()
            .map(|&a| module.file_offset(a).unwrap_or(0))
            .collect();
        let dwarf = lines
            .symbolize(&Source::Elf(Elf::new(&path)), Input::FileOffset(&offsets))
            .unwrap_or_default();
        for (i, &addr) in batch.iter().enumerate() {
            let Some(sym) = found(&dwarf, i) else {
                owners.push(None);
                continue;
            };
            let mut frames = sym_frames(None, Some(sym), &name, addr);
            // Each frame's column, as `sym_frames` orders them.
            let columns: Vec<Option<u16>> = sym
                .inlined
                .iter()
                .rev()
                .map(|i| i.code_info.as_ref().and_then(|c| c.column))
                .chain([sym.code_info.as_deref().and_then(|c| c.column)])
                .collect();
            name_inlined_new(&mut frames, &mut sources);
            // The innermost `new` only.
            let at = frames
                .iter()
                .position(|f| f.raw_name == "new" || f.raw_name.starts_with("new:"));
            // First, what its caller's source says it makes, at the call's
            // column (`Foo.new`, `Array(Foo).new`, `[] of Foo`): DWARF names
            // no instantiated type, and the class whose `def initialize`
            // a `new` comes from may be a superclass.
            let is_new = |f: &Frame| f.raw_name == "new" || f.raw_name.starts_with("new:");
            // What the caller of the `new` at frame `k` constructs, and the
            // generic type (`Set(T)`) whose code that caller is, if any.
            let mut made_at = |k: usize| -> Option<(String, Option<String>)> {
                let caller = frames.get(k + 1)?;
                let (file, line) = (caller.file.as_deref()?, caller.line?);
                let column = usize::from((*columns.get(k + 1)?)?);
                let generic = sources.enclosing_type(file, line);
                let text = sources.line(file, line)?.get(column.checked_sub(1)?..)?;
                // A bare `new(…)` in a class method makes its own class.
                let made = match text.strip_prefix("new") {
                    Some(rest) if !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') => {
                        generic.clone()?
                    }
                    _ => crystal::source::constructed(text)?,
                };
                let made = qualify(&made, &sources.namespace(file, line), &known);
                Some((made, generic))
            };
            let made = at.and_then(|k| {
                let (mut made, mut generic) = made_at(k)?;
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
                    let mut found = None;
                    if let Some(j) = (from..frames.len()).find(|&j| is_new(&frames[j])) {
                        found = made_at(j).map(|(instance, next)| (instance, next, j + 1));
                    } else if let Some(owner) = owner_at(addr).filter(|o| same_generic(o, &within))
                    {
                        found = Some((owner.to_string(), None, frames.len()));
                    }
                    let Some((instance, next, after)) = found else {
                        break;
                    };
                    made = substitute(&made, &within, &instance);
                    (generic, from) = (next, after);
                }
                Some(made)
            });
            if made.is_some() {
                owners.push(made);
                continue;
            }
            // Else, when its line is the class's own `def initialize` /
            // `def self.new`: a `new` the compiler generates has the
            // caller's line, in another class.
            let innermost = at.map(|k| &frames[k]);
            let owner = innermost.and_then(|f| {
                let def = sources.line(f.file.as_deref()?, f.line?)?.trim_start();
                if !(def.starts_with("def initialize") || def.starts_with("def self.new")) {
                    return None;
                }
                let owner = f
                    .function
                    .strip_suffix(f.raw_name.as_str())?
                    .strip_suffix('.')?;
                (!owner.is_empty() && !owner.contains('(')).then(|| owner.to_string())
            });
            owners.push(owner);
        }
    }
    owners
}

/// Whether a type name still has a type parameter in it (`Hash(T, Nil)`):
/// an argument that is one capital letter, as the standard library names them.
pub(crate) fn has_parameter(name: &str) -> bool {
    name.split(['(', ')', ',', '|', ' '])
        .any(|w| w.len() == 1 && w.as_bytes()[0].is_ascii_uppercase())
}

/// The top-level arguments of `Name(A, B(C))`: `["A", "B(C)"]`.
fn type_args(name: &str) -> Vec<&str> {
    let Some(open) = name.find('(') else {
        return Vec::new();
    };
    let inner = &name[open + 1..name.len().saturating_sub(1)];
    let (mut args, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, b) in inner.bytes().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b',' if depth == 0 => {
                args.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(inner[start..].trim());
    args
}

/// The last path segment of a type, without arguments (`Set` of `Foo::Set(T)`).
fn generic_base(name: &str) -> &str {
    let path = name.split('(').next().unwrap_or(name);
    path.rsplit("::").next().unwrap_or(path)
}

/// Whether two types are the same generic (`Set(T)`, `Set(Int32)`).
fn same_generic(a: &str, b: &str) -> bool {
    generic_base(a) == generic_base(b)
}

/// `made` with the parameters of the generic type `within` (`Set(T)`)
/// replaced by the arguments of its `instance` (`Set(BasicBlock)`), when
/// both are the same generic type.
fn substitute(made: &str, within: &str, instance: &str) -> String {
    let (params, args) = (type_args(within), type_args(instance));
    if !same_generic(within, instance) || params.len() != args.len() || params.is_empty() {
        return made.to_string();
    }
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let arg = params
            .iter()
            .position(|p| *p == word.as_str())
            .map(|i| args[i]);
        out.push_str(arg.unwrap_or(word));
        word.clear();
    };
    for c in made.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
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

/// Crystal release builds inline `Foo.new` and DWARF names the copy `new`
/// alone: named `Foo.new` from the class its source line is in
/// ([`crystal::source`]), `raw_name` kept as DWARF's. The same for
/// `new:named_args` and for `initialize` (`Foo#initialize`).
fn name_inlined_new(frames: &mut [Frame], sources: &mut crystal::source::Sources) {
    for f in frames {
        let separator = match f.raw_name.as_str() {
            "new" => '.',
            raw if raw.starts_with("new:") => '.',
            "initialize" => '#',
            _ => continue,
        };
        let (Some(file), Some(line)) = (f.file.as_deref(), f.line) else {
            continue;
        };
        if !file.ends_with(".cr") {
            continue;
        }
        if let Some(owner) = sources.enclosing_type(file, line) {
            f.function = format!("{owner}{separator}{}", f.raw_name);
        }
    }
}

fn unknown_frame(module: Option<&str>, addr: u64) -> Frame {
    Frame {
        function: "[unknown]".into(),
        raw_name: String::new(),
        file: None,
        line: None,
        module: module.unwrap_or("[unknown]").to_string(),
        address: addr,
        offset: None,
    }
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

        assert!(has_parameter("Hash(T, Nil)"));
        assert!(has_parameter("Deque(T)"));
        assert!(!has_parameter("Hash(Thread, Crystal::Event)"));
        assert!(!has_parameter("Time::Location"));
        assert_eq!(type_args("Hash(K, Array(V))"), vec!["K", "Array(V)"]);
        assert_eq!(
            substitute("Hash(T, Nil)", "Set(T)", "Set(BasicBlock)"),
            "Hash(BasicBlock, Nil)"
        );
        assert_eq!(
            substitute(
                "Hash(K, Array(V))",
                "Foo::Multi(K, V)",
                "Multi(Int32, String)"
            ),
            "Hash(Int32, Array(String))"
        );
        // Another generic, or other arity: unchanged.
        assert_eq!(
            substitute("Hash(T, Nil)", "Set(T)", "Array(Int32)"),
            "Hash(T, Nil)"
        );
    }

    #[test]
    fn names_to_show() {
        assert_eq!(
            display_name("*Array(Int32)@Array(T)#push<Int32>:Array(Int32)"),
            "Array(Int32)#push"
        );
        assert_eq!(display_name("__crystal_main"), "__crystal_main");
        assert_eq!(display_name("_Znwm"), "operator new(unsigned long)");
        assert_eq!(
            display_name("_ZN3std2rt10lang_start17h0123456789abcdefE"),
            "std::rt::lang_start"
        );
        // Not mangled, even if cpp_demangle would read it as a type.
        assert_eq!(display_name("i"), "i");
        assert_eq!(display_name("_Zgarbage"), "_Zgarbage");
    }

    /// The test binary itself: its symbol table names `display_name`, its
    /// DWARF gives this file.
    #[test]
    fn symbolizes_an_address_of_this_binary() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let addr = display_name as fn(&str) -> String as usize as u64;
        // The file offset of `addr`, from the mapping that holds it.
        let offset = maps
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (range, _, off) = (f.next()?, f.next()?, f.next()?);
                let (start, end) = range.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                let path = f.nth(2)?;
                (path == exe.to_str()? && (start..end).contains(&addr))
                    .then(|| addr - start + u64::from_str_radix(off, 16).unwrap())
            })
            .next()
            .expect("a mapping of the test binary holds display_name");
        let names = Symbolizer::builder().enable_demangling(false).build();
        let mut elf = Elf::new(&exe);
        elf.debug_syms = false;
        let symtab = names
            .symbolize_single(&Source::Elf(elf), Input::FileOffset(offset))
            .unwrap();
        let Symbolized::Sym(sym) = symtab else {
            panic!("no symbol for display_name")
        };
        let frames = sym_frames(Some(&sym), None, "self", addr);
        assert_eq!(frames.len(), 1);
        assert!(frames[0].raw_name.starts_with("_ZN"), "{:?}", frames[0]);
        assert!(
            frames[0].function.ends_with("symbolize::display_name"),
            "{:?}",
            frames[0]
        );
    }
}
