//! Raw return addresses to function names and `file:line`, with blazesym.
//!
//! Addresses are mapped to (module, file offset) through the [`MapsCache`]
//! the session kept while the target ran, so this works after the target has
//! exited. Each module is symbolized in one batch. Return addresses point
//! after the call instruction, so `address - 1` is looked up (the line of the
//! call, not of the next statement). Inlined functions become frames of their
//! own, innermost first.
use std::collections::HashMap;
use std::path::PathBuf;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::heap::RawGroup;
use crate::profile::{Frame, Group};
use crate::target::maps::MapsCache;

/// Symbolizes every group's stack.
pub fn symbolize(raw: Vec<RawGroup>, maps: &MapsCache, progress: bool) -> Vec<Group> {
    let mut by_module: HashMap<PathBuf, Vec<(u64, u64)>> = HashMap::new();
    let mut unknown: Vec<u64> = Vec::new();
    for &addr in raw.iter().flat_map(|g| &g.frames) {
        match maps.find(addr.saturating_sub(1)) {
            Some(m) => by_module
                .entry(m.path.clone())
                .or_default()
                .push((addr, m.file_offset_of(addr - 1))),
            None => unknown.push(addr),
        }
    }
    let total: usize = by_module.values().map(Vec::len).sum();
    if progress && total > 0 {
        eprintln!(
            "memprof: symbolizing {total} addresses in {} modules",
            by_module.len()
        );
    }

    let symbolizer = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build();
    let mut resolved: HashMap<u64, Vec<Frame>> = HashMap::new();
    for (module, mut addrs) in by_module {
        addrs.sort_unstable();
        addrs.dedup();
        let offsets: Vec<u64> = addrs.iter().map(|&(_, off)| off).collect();
        let module_name = module.display().to_string();
        let source = Source::Elf(Elf::new(&module));
        let results = symbolizer
            .symbolize(&source, Input::FileOffset(&offsets))
            .unwrap_or_default();
        for (i, &(addr, _)) in addrs.iter().enumerate() {
            let frames = match results.get(i) {
                Some(Symbolized::Sym(sym)) => sym_frames(sym, &module_name, addr),
                _ => vec![unknown_frame(Some(&module_name), addr)],
            };
            resolved.insert(addr, frames);
        }
    }
    for addr in unknown {
        resolved.insert(addr, vec![unknown_frame(None, addr)]);
    }

    raw.into_iter()
        .map(|g| Group {
            kind: g.kind().name().to_string(),
            live_count: g.live_count,
            live_bytes: g.live_bytes,
            total_count: g.total_count,
            total_bytes: g.total_bytes,
            frames: g
                .frames
                .iter()
                .flat_map(|a| resolved.get(a).cloned().unwrap_or_default())
                .collect(),
            truncated: g.truncated,
            type_name: None,
        })
        .collect()
}

/// The frames of one address: inlined callees first, then the function itself.
fn sym_frames(sym: &blazesym::symbolize::Sym<'_>, module: &str, addr: u64) -> Vec<Frame> {
    let location = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| match info {
        Some(info) => (Some(info.to_path().display().to_string()), info.line),
        None => (None, None),
    };
    let mut frames = Vec::with_capacity(sym.inlined.len() + 1);
    for inlined in sym.inlined.iter().rev() {
        let (file, line) = location(inlined.code_info.as_ref());
        frames.push(Frame {
            function: inlined.name.to_string(),
            raw_name: inlined.name.to_string(),
            file,
            line,
            module: module.to_string(),
            address: addr,
        });
    }
    let (file, line) = location(sym.code_info.as_deref());
    frames.push(Frame {
        function: sym.name.to_string(),
        raw_name: sym.name.to_string(),
        file,
        line,
        module: module.to_string(),
        address: addr,
    });
    frames
}

fn unknown_frame(module: Option<&str>, addr: u64) -> Frame {
    Frame {
        function: "[unknown]".into(),
        raw_name: String::new(),
        file: None,
        line: None,
        module: module.unwrap_or("[unknown]").to_string(),
        address: addr,
    }
}
