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
//! (Example: `doc_examples::example_1` below, run by the tests.)
//!
//! Here the addresses are grouped by module and symbolized in batches
//! ([`locations`]: the groups are given their stacks in
//! [`crate::groups::named`]), each address's frames made and named;
//! [`inlined_new`] names the class an inlined Crystal `new` makes, for
//! [`type_ids`], which names the type ids the objects carry.
use std::collections::HashMap;

use std::path::PathBuf;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, Symbolizer};

use crate::crystal;
use crate::modules::maps::MapsCache;
use crate::modules::{Module, ModuleCache};
use crate::profile::{Frame, Stacks};

pub mod budget;
mod demangle;
mod inlined;
pub(crate) mod inlined_new;
pub mod type_ids;
pub mod worker;

pub use budget::Budget;
use demangle::{demangle, Demangled};
pub use worker::NameLosses;
use worker::{Address, ModuleWork, Worker};

/// The thread that names addresses, and what blazesym has read of the
/// files there, kept from one process's symbolization to the next
/// (`attach --all` symbolizes hundreds of processes of a few programs:
/// each file's symbols and DWARF are read once, not once per process).
/// Dropped, its thread ends after its job.
#[derive(Default)]
pub struct SymbolCache(Option<Worker>);

/// The location in `stacks` of each of `addresses` (a group's frames
/// number them), each distinct one symbolized once, on `cache`'s thread
/// within `budget`, and what could not be named.
pub fn locations(
    addresses: &[u64],
    (maps, modules): (&MapsCache, &ModuleCache),
    (progress, budget): (bool, Budget),
    stacks: &mut Stacks,
    cache: &mut SymbolCache,
) -> (HashMap<u64, u32>, NameLosses) {
    let (by_module, unknown) = addresses_by_module(addresses, maps);
    let total: usize = by_module.values().map(Vec::len).sum();
    if progress && total > 0 {
        eprintln!(
            "memprof: symbolizing {total} distinct addresses in {} modules",
            by_module.len()
        );
    }
    // The files as the session opened them (never another file at the
    // same path here): unreadable, no names.
    if budget.wait.is_none() {
        budget::take_earlier_stop();
    }
    let stopped = budget::stop_now(budget);
    let work: Vec<ModuleWork> = by_module
        .into_iter()
        .map(|(path, addrs)| ModuleWork {
            file: (!stopped).then(|| modules.get(&path).ok()).flatten(),
            addresses: addrs.iter().map(|&a| address(a, maps)).collect(),
            path,
        })
        .collect();
    // No bar at all when not asked: the agent symbolizes 500 processes
    // per scrape of a program's.
    let bar = match progress {
        true => crate::progress::bar(total as u64, "symbolizing"),
        false => indicatif::ProgressBar::hidden(),
    };
    let (named, losses) = worker::name(&mut cache.0, work, budget, &bar);
    bar.finish_and_clear();
    if progress && losses.unnamed > 0 {
        eprintln!(
            "memprof: {} addresses left unnamed (module+offset): naming was stopped or ran out of time",
            losses.unnamed
        );
    }
    let mut location_of: HashMap<u64, u32> = HashMap::with_capacity(total + unknown.len());
    // In address order: the locations are numbered as before.
    let mut named: Vec<(u64, Vec<Frame>)> = named.into_iter().collect();
    named.sort_unstable_by_key(|(a, _)| *a);
    for (addr, frames) in named {
        location_of.insert(addr, stacks.location(frames));
    }
    for addr in unknown {
        location_of.insert(addr, stacks.location(vec![unknown_frame(None, addr)]));
    }
    (location_of, losses)
}

/// `addr` with the file offsets of its call and of itself.
pub(crate) fn address(addr: u64, maps: &MapsCache) -> Address {
    let call = addr.saturating_sub(1);
    Address {
        address: addr,
        lookup: maps.find(call).map_or(0, |m| m.file_offset_of(call)),
        offset: maps.find(addr).map(|m| m.file_offset_of(addr)),
    }
}

/// The distinct addresses (as the groups number them: stacks share most
/// of their frames) by the module mapped at each, and those in none.
fn addresses_by_module(ids: &[u64], maps: &MapsCache) -> (HashMap<PathBuf, Vec<u64>>, Vec<u64>) {
    let mut addresses = ids.to_vec();
    addresses.sort_unstable();
    let mut by_module: HashMap<PathBuf, Vec<u64>> = HashMap::new();
    let mut unknown: Vec<u64> = Vec::new();
    for &addr in &addresses {
        match maps.find(addr.saturating_sub(1)) {
            Some(m) => by_module.entry(m.path.clone()).or_default().push(addr),
            None => unknown.push(addr),
        }
    }
    (by_module, unknown)
}

/// The two blazesym symbolizers (symbol table names; DWARF lines and
/// inlined functions) and the Crystal sources read so far: the naming
/// thread's ([`worker`]).
struct Symbolizers {
    names: Symbolizer,
    lines: Symbolizer,
    sources: crystal::source::Sources,
}

impl Symbolizers {
    fn new() -> Symbolizers {
        // Demangling is ours (`display_name`): `raw_name` keeps the symbol as is.
        Symbolizers {
            names: Symbolizer::builder()
                .enable_code_info(false)
                .enable_demangling(false)
                .build(),
            lines: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(false)
                .build(),
            sources: crystal::source::Sources::default(),
        }
    }

    /// The frames of each address of `batch`, all in `module` (`file`, if
    /// it could be read), and how many of their names were left mangled.
    fn batch(
        &mut self,
        module_name: &str,
        file: Option<&Module>,
        batch: &[Address],
    ) -> (Vec<Vec<Frame>>, u64) {
        let offsets: Vec<u64> = batch.iter().map(|a| a.lookup).collect();
        let (symtab, dwarf) = match file {
            Some(module) => {
                let mut symtab = Elf::new(&module.debug_view().names);
                symtab.debug_syms = false;
                (
                    self.names
                        .symbolize(&Source::Elf(symtab), Input::FileOffset(&offsets))
                        .unwrap_or_default(),
                    dwarf_at(&self.lines, module, &offsets),
                )
            }
            None => (Vec::new(), Vec::new()),
        };
        let mut all = Vec::with_capacity(batch.len());
        let mut mangled = 0;
        for (i, a) in batch.iter().enumerate() {
            let mut symbol = found(&symtab, i).cloned();
            if let Some(sym) = symbol.as_mut().filter(|s| s.name.starts_with(['*', '~'])) {
                let names = file.map(|m| m.versioned_crystal_names());
                if let Some(name) = names.and_then(|names| names.get(&sym.addr)) {
                    sym.name = name.clone().into();
                }
            }
            let mut frames = sym_frames(symbol.as_ref(), found(&dwarf, i), module_name, a.address);
            let columns = columns(found(&dwarf, i), frames.len());
            inlined::name_inlined(&mut frames, &columns, &mut self.sources);
            for f in &mut frames {
                // The return address itself as an offset in the file (stable across runs).
                f.offset = a.offset;
                mangled += u64::from(left_mangled(&f.raw_name, &f.function));
            }
            all.push(frames);
        }
        (all, mangled)
    }
}

/// blazesym's answers (lines, inlined functions) for the file offsets
/// `offsets` of `module`, read from where its debug view says (the module
/// itself, or its separate debug file by link-time address); none when
/// its DWARF is not to be read.
pub(crate) fn dwarf_at<'s>(
    lines: &'s Symbolizer,
    module: &Module,
    offsets: &[u64],
) -> Vec<Symbolized<'s>> {
    let Some(dwarf) = &module.debug_view().lines else {
        return Vec::new();
    };
    let source = Source::Elf(Elf::new(&dwarf.path));
    let answers = if dwarf.by_address {
        let addresses: Vec<u64> = offsets
            .iter()
            .map(|&o| module.address_of_offset(o).unwrap_or(0))
            .collect();
        lines.symbolize(&source, Input::VirtOffset(&addresses))
    } else {
        lines.symbolize(&source, Input::FileOffset(offsets))
    };
    answers.unwrap_or_default()
}

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
    if let Some(name) = crystal::readable(raw) {
        return name;
    }
    match demangle(raw) {
        Demangled::Name(name) => name,
        Demangled::NotMangled => raw.to_string(),
        // Beyond the budget: the symbol itself, cut (shown escaped).
        Demangled::LeftMangled => demangle::cut(raw, demangle::MAX_SHOWN),
    }
}

/// Whether a frame shows its symbol left mangled ([`display_name`] cut
/// it, or gave it as it is while it is a C++ or Rust name).
fn left_mangled(raw: &str, shown: &str) -> bool {
    (raw.starts_with("_Z") || raw.starts_with("_R"))
        && (shown == raw || shown == demangle::cut(raw, demangle::MAX_SHOWN))
        && matches!(demangle(raw), Demangled::LeftMangled)
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
            Some(info) => (Some(crate::text::lossy_path(&info.to_path())), info.line),
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

/// Each frame's column, in [`sym_frames`]' order (the columns of the calls
/// the frames make); `None` without DWARF.
fn columns(dwarf: Option<&Sym<'_>>, frames: usize) -> Vec<Option<u16>> {
    let Some(sym) = dwarf else {
        return vec![None; frames];
    };
    sym.inlined
        .iter()
        .rev()
        .map(|i| i.code_info.as_ref().and_then(|c| c.column))
        .chain([sym.code_info.as_deref().and_then(|c| c.column)])
        .collect()
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

    /// C++ symbols from `nm` of `fixtures/cxx_names.cc` (g++ 12, `-O0 -g`:
    /// templates in templates, lambdas, the anonymous namespace, operators,
    /// the standard library's containers), each with what the GNU
    /// demangler reads (`c++filt`'s text, but for the standard typedefs
    /// `c++filt` expands: `std::ostream` is `std::basic_ostream<char, …>`).
    const CXX_SYMBOLS: &str = include_str!("fixtures/cxx_symbols.txt");

    /// Whether `()`, `<>`, `[]` and `{}` pair up in a demangled C++ name,
    /// the operators whose names are brackets (`operator<<`, `operator()`,
    /// `operator->`, …) skipped.
    fn cxx_balanced(name: &str) -> bool {
        const OPERATORS: [&str; 13] = [
            "operator<<=",
            "operator>>=",
            "operator<=>",
            "operator<<",
            "operator>>",
            "operator<=",
            "operator>=",
            "operator->*",
            "operator->",
            "operator<",
            "operator>",
            "operator()",
            "operator[]",
        ];
        let mut stack = Vec::new();
        let mut rest = name;
        while let Some(c) = rest.chars().next() {
            if let Some(op) = OPERATORS.iter().find(|op| rest.starts_with(**op)) {
                rest = &rest[op.len()..];
                continue;
            }
            match c {
                '(' | '<' | '[' | '{' => stack.push(c),
                ')' | '>' | ']' | '}' => {
                    let open = match c {
                        ')' => '(',
                        '>' => '<',
                        ']' => '[',
                        _ => '{',
                    };
                    if stack.pop() != Some(open) {
                        return false;
                    }
                }
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
        }
        stack.is_empty()
    }

    #[test]
    fn real_cxx_names_read_whole_as_cxxfilt_reads_them() {
        let mut n = 0;
        for line in CXX_SYMBOLS.lines() {
            let (mangled, want) = line.split_once('\t').unwrap();
            let shown = display_name(mangled);
            assert_eq!(shown, want, "{mangled}");
            assert!(cxx_balanced(&shown), "{shown}");
            n += 1;
        }
        assert!(n > 150, "{n}");
        // The GNU demangler was there (else cpp_demangle's forms would differ).
        assert!(demangle::gnu().is_some());
        assert!(cxx_balanced(
            "std::vector<std::pair<int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > >, std::allocator<std::pair<int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > > > >::push_back(std::pair<int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > >&&)"
        ));
        assert!(!cxx_balanced("Hash(K,.new"));
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

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::symbolize::display_name;
        assert_eq!(display_name("*Foo::new<Int32>:Foo"), "Foo.new");
        assert_eq!(
            display_name("_ZNK4llvm6Module4dumpEv"),
            "llvm::Module::dump() const"
        );
        assert_eq!(display_name("make_foo"), "make_foo");
    }
}
