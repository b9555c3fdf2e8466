//! One address's frames: its symbol-table and DWARF results as
//! [`Frame`]s, innermost first, with the names to show (Crystal's readable
//! form, demangled C++ and Rust, inlined Crystal `new`s named after their class).
use blazesym::symbolize::{CodeInfo, Sym, Symbolized};

use crate::crystal;
use crate::profile::Frame;

/// Addresses symbolized in one blazesym call: bounds the memory its
/// results hold at once.
pub(super) const BATCH: usize = 4096;

/// The `i`-th result of a batch, if a symbol was found.
pub(super) fn found<'a>(results: &'a [Symbolized<'a>], i: usize) -> Option<&'a Sym<'a>> {
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
pub(super) fn sym_frames(
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

/// Crystal release builds inline `Foo.new` and DWARF names the copy `new`
/// alone: named `Foo.new` from the class its source line is in
/// ([`crystal::source`]), `raw_name` kept as DWARF's. The same for
/// `new:named_args` and for `initialize` (`Foo#initialize`).
pub(super) fn name_inlined_new(frames: &mut [Frame], sources: &mut crystal::source::Sources) {
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

pub(super) fn unknown_frame(module: Option<&str>, addr: u64) -> Frame {
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
