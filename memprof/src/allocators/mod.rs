//! Which functions to probe, and where they live in the target.
//!
//! Each allocator backend (today `libc`; the Boehm GC next) is a table of
//! [`AllocFn`]s: the symbol, the eBPF program that reads its arguments, the
//! [`AllocKind`](memprof_common::AllocKind) it produces and the argument registers the entry probe reads
//! (so [`crate::probes::placement`] knows which registers must still be intact).
//!
//! [`resolve`] looks every symbol up in the target's modules in load order,
//! the way the dynamic linker binds them: the first module that defines a
//! function wins (an executable or a preloaded allocator interposes libc).
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
mod alloc_fn;
pub mod boehm;
pub mod libc;

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::modules::{Module, ModuleCache};

pub use self::alloc_fn::{AllocFn, ArgReg};
pub use self::boehm::{BOEHM, BOEHM_REFILL};
pub use self::libc::LIBC;

/// A function found in a module of the target.
#[derive(Debug, Clone)]
pub struct ResolvedFn {
    pub func: &'static AllocFn,
    pub module: PathBuf,
    /// Virtual address in the module (st_value).
    pub address: u64,
    /// Offset of the first byte in the file: what uprobes attach to.
    pub file_offset: u64,
    /// The function's code, as far as the symbol size says (at most 4 KiB):
    /// decoded by [`crate::probes::placement`].
    pub code: Vec<u8>,
    /// Another function at the same address was resolved first (glibc's
    /// `aligned_alloc` is `memalign`): probing it twice would count twice.
    pub alias_of: Option<&'static str>,
}

/// Finds each function of `table` in the first of `modules` (in load order)
/// that defines it. Returns them in table order; functions found nowhere are
/// left out (the caller decides whether that is an error). The modules are
/// read through `cache`.
pub fn resolve(
    cache: &ModuleCache,
    modules: &[PathBuf],
    table: &'static [AllocFn],
) -> Result<Vec<ResolvedFn>> {
    let mut found: Vec<ResolvedFn> = Vec::new();
    let mut pending: Vec<&'static AllocFn> = table.iter().collect();
    for module in modules {
        if pending.is_empty() {
            break;
        }
        let Ok(file) = cache.get(module) else {
            continue; // vanished or unreadable: the target cannot use it either
        };
        pending.retain(|func| match lookup(&file, func.symbol) {
            Some((address, file_offset, code)) => {
                let alias_of = found
                    .iter()
                    .find(|f| f.module == *module && f.address == address)
                    .map(|f| f.func.symbol);
                found.push(ResolvedFn {
                    func,
                    module: module.clone(),
                    address,
                    file_offset,
                    code,
                    alias_of,
                });
                false
            }
            None => true,
        });
    }
    found.sort_by_key(|f| table.iter().position(|t| std::ptr::eq(t, f.func)));
    Ok(found)
}

/// Whether the program process `pid` runs allocates with the Boehm GC:
/// its executable imports or defines `GC_malloc` or `GC_init`.
pub fn program_uses_gc(pid: u32) -> bool {
    program_names(pid, &["GC_malloc", "GC_init"])
}

/// Whether the program process `pid` runs can start processes: its
/// executable imports or defines a function that forks or spawns.
pub fn program_starts_processes(pid: u32) -> bool {
    program_names(
        pid,
        &[
            "fork",
            "vfork",
            "posix_spawn",
            "posix_spawnp",
            "system",
            "popen",
        ],
    )
}

/// Whether the executable of process `pid` has a symbol (dynamic or
/// not, defined or imported) named one of `names` (read, as every
/// target file, never run).
fn program_names(pid: u32, names: &[&str]) -> bool {
    use object::{Object, ObjectSymbol};
    let Ok(file) = crate::modules::open_regular(std::path::Path::new(&format!("/proc/{pid}/exe")))
    else {
        return false;
    };
    // SAFETY: mapped read-only, as the modules are.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return false;
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return false;
    };
    let named = |s: object::Symbol| s.name().is_ok_and(|n| names.contains(&n));
    elf.dynamic_symbols().any(named) || elf.symbols().any(named)
}

/// Where `name` is defined in the ELF file at `path` (read through
/// `cache`): its address and file offset.
pub fn symbol_in(cache: &ModuleCache, path: &Path, name: &str) -> Option<(u64, u64)> {
    let file = cache.get(path).ok()?;
    lookup(&file, name).map(|(address, offset, _)| (address, offset))
}

/// Looks a defined function up in the dynamic and the static symbol table:
/// its address, file offset and code.
fn lookup(file: &Module, name: &str) -> Option<(u64, u64, Vec<u8>)> {
    let symbol = file.symbol(name)?;
    let address = symbol.address;
    let segment = file
        .segments()
        .iter()
        .find(|seg| address >= seg.address && address < seg.address + seg.mem_size)?;
    let file_offset = address - segment.address + segment.file_offset;
    let in_file = segment.file_offset + segment.file_size;
    let size = match symbol.size {
        0 => 64,
        n => n.min(4096),
    };
    let end = (file_offset + size)
        .min(in_file)
        .min(file.data().len() as u64);
    let code = file
        .data()
        .get(file_offset as usize..end as usize)?
        .to_vec();
    Some((address, file_offset, code))
}

/// Reads a module's path for messages: the file name is usually enough.
pub fn short(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The result of [`resolve`] checked for the functions a run cannot do without.
pub fn require(resolved: &[ResolvedFn], table: &[AllocFn], modules: &[PathBuf]) -> Result<()> {
    let missing: Vec<&str> = table
        .iter()
        .filter(|f| !f.optional && !resolved.iter().any(|r| r.func.symbol == f.symbol))
        .map(|f| f.symbol)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let searched: Vec<String> = modules.iter().map(|m| short(m)).collect();
    Err(anyhow::anyhow!(
        "no allocator in the target: {} not found in {} (is it a static binary without libc, or stripped of its symbol table?)",
        missing.join(", "),
        searched.join(", ")
    ))
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::{allocators, modules::ModuleCache};
        let modules = vec![
            "/usr/bin/ls".into(),
            "/lib/x86_64-linux-gnu/libc.so.6".into(),
        ];
        for f in allocators::resolve(&ModuleCache::default(), &modules, allocators::LIBC)? {
            println!(
                "{} in {} at file offset {:#x}",
                f.func.symbol,
                f.module.display(),
                f.file_offset
            );
        }
        Ok(())
    }
}
