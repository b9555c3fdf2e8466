//! The roots of `--graph`: what outside the heap points to the graph's
//! objects — a global of a module (named by its symbol), the stack of the
//! thread the collection was held in (from its stack pointer), a register
//! of that thread.
//!
//! The memory is copied while the collector is held ([`read`]): the
//! writable mappings of every module file and the anonymous `.bss` right
//! after them, the held thread's registers (`PTRACE_GETREGS`: it is
//! stopped for memprof) and its stack from its stack pointer to the end of
//! that mapping. Other threads' and fibers' stacks are not read yet.
use anyhow::{Context, Result};

use super::rss::Mapping;
use crate::gc::census::vm_read;
use crate::modules::ModuleCache;

/// Where a copied region is.
enum Place {
    /// Data of a module file (its path).
    Global(String),
    /// The held thread's stack, from its stack pointer.
    Stack { tid: u32 },
}

/// Memory that may hold roots, copied at the hold.
pub struct RootMemory {
    regions: Vec<(u64, Vec<u8>, Place)>,
    /// The held thread and its registers (name, value).
    registers: (u32, Vec<(&'static str, u64)>),
}

/// The red zone below the stack pointer (System V): live data too.
const RED_ZONE: u64 = 128;

/// Copies the roots' memory of process `pid`, whose thread `tid` is held.
pub fn read(pid: u32, tid: u32, mappings: &[Mapping]) -> Result<RootMemory> {
    // SAFETY: a plain-data struct the kernel fills.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: `tid` is stopped under memprof's ptrace; `regs` is writable.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            tid as libc::pid_t,
            0,
            &mut regs as *mut libc::user_regs_struct,
        )
    };
    if r == -1 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the registers of thread {tid}"));
    }
    let registers = vec![
        ("rax", regs.rax),
        ("rbx", regs.rbx),
        ("rcx", regs.rcx),
        ("rdx", regs.rdx),
        ("rsi", regs.rsi),
        ("rdi", regs.rdi),
        ("rbp", regs.rbp),
        ("r8", regs.r8),
        ("r9", regs.r9),
        ("r10", regs.r10),
        ("r11", regs.r11),
        ("r12", regs.r12),
        ("r13", regs.r13),
        ("r14", regs.r14),
        ("r15", regs.r15),
    ];
    let mut regions = Vec::new();
    for (i, m) in mappings.iter().enumerate() {
        if !m.perms.starts_with("rw") {
            continue;
        }
        let owner = if m.path.starts_with('/') {
            Some(m.path.clone())
        } else if m.path.is_empty() {
            // `.bss` past the file: right after a writable mapping of it.
            i.checked_sub(1)
                .map(|j| &mappings[j])
                .filter(|p| {
                    p.end == m.start && p.path.starts_with('/') && p.perms.starts_with("rw")
                })
                .map(|p| p.path.clone())
        } else {
            None
        };
        let place = match owner {
            Some(path) => Place::Global(path),
            None if (m.start..m.end).contains(&regs.rsp) => Place::Stack { tid },
            None => continue,
        };
        let start = match place {
            Place::Stack { .. } => regs.rsp.saturating_sub(RED_ZONE).max(m.start),
            Place::Global(_) => m.start,
        };
        let mut data = vec![0u8; (m.end - start) as usize];
        // A mapping may go away meanwhile (another thread's munmap before
        // the world stopped is done): its roots are then not shown.
        if vm_read(pid, start, &mut data).is_ok() {
            regions.push((start, data, place));
        }
    }
    Ok(RootMemory {
        regions,
        registers: (tid, registers),
    })
}

/// The roots pointing into `nodes` (`(address, bytes)`, ascending): per
/// node, what points to it, deduplicated, in the order found.
pub fn find(
    memory: &RootMemory,
    nodes: &[(u64, u64)],
    modules: &ModuleCache,
    pid: u32,
) -> Vec<(u64, String)> {
    let node_of = |q: u64| {
        let i = nodes.partition_point(|&(a, _)| a <= q).checked_sub(1)?;
        let (a, n) = nodes[i];
        (q < a + n).then_some(a)
    };
    let mut roots: Vec<(u64, String)> = Vec::new();
    let mut add = |node: u64, what: String| {
        if !roots.iter().any(|(n, w)| *n == node && *w == what) {
            roots.push((node, what));
        }
    };
    let (tid, registers) = &memory.registers;
    for &(name, value) in registers {
        if let Some(node) = node_of(value) {
            add(node, format!("register {name} of thread {tid}"));
        }
    }
    for (start, data, place) in &memory.regions {
        for (k, word) in data.chunks_exact(8).enumerate() {
            let q = u64::from_le_bytes(word.try_into().unwrap());
            let Some(node) = node_of(q) else { continue };
            let at = start + 8 * k as u64;
            let what = match place {
                Place::Global(path) => global_name(modules, path, pid, at),
                // Where on the stack is noise (stale slots look alike).
                Place::Stack { tid, .. } => format!("stack of thread {tid}"),
            };
            add(node, what);
        }
    }
    roots
}

/// `global SYMBOL` (the symbol of module `path` covering `addr`), else
/// `global MODULE+0xOFFSET` (link-time address).
fn global_name(modules: &ModuleCache, path: &str, pid: u32, addr: u64) -> String {
    let short = path.rsplit('/').next().unwrap_or(path);
    let Ok(module) = modules.get(std::path::Path::new(path)) else {
        return format!("global in {short}");
    };
    let Ok(bias) = module.load_bias(pid) else {
        return format!("global in {short}");
    };
    let link = addr.wrapping_sub(bias);
    let symbol = module
        .symbols()
        .filter(|(_, s)| s.address <= link && link < s.address + s.size.max(1))
        .min_by_key(|(_, s)| s.size);
    match symbol {
        Some((name, s)) if link == s.address => format!("global {name}"),
        Some((name, s)) => format!("global {name}+{:#x}", link - s.address),
        None => format!("global {short}+{link:#x}"),
    }
}
