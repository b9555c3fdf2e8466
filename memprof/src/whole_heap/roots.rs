//! The roots of `--graph`: what outside the heap points to the graph's
//! objects — a global of a module (named by its symbol), the stack of the
//! thread the collection was held in (from its stack pointer), a register
//! of that thread, another thread's or a fiber's stack.
//!
//! The memory is copied while the collector is held ([`read`]): the
//! writable mappings of every module file and the anonymous `.bss` right
//! after them, the held thread's registers (`PTRACE_GETREGS`: it is
//! stopped for memprof) and its stack from its stack pointer to the end of
//! that mapping, and the resident pages of every other stack (an anonymous
//! mapping right above a `---p` guard page: other threads' and Crystal's
//! fiber stacks), whole: their stack pointers are not known, so stale
//! frames count too, as they do for the collector scanning a fiber.
use anyhow::{Context, Result};

use super::rss::Mapping;
use crate::modules::ModuleCache;
use crate::tracee::memory::vm_read;

/// Where a copied region is.
#[derive(Clone)]
enum Place {
    /// Data of a module file (its path).
    Global(String),
    /// The held thread's stack, from its stack pointer.
    Stack { tid: u32 },
    /// Another stack (a thread's or a fiber's): the mapping's range. Its
    /// resident pages are read whole, stale frames included.
    OtherStack { start: u64, end: u64 },
    /// The main thread's `[stack]`, while that thread runs on another
    /// (a fiber's, as an idle Crystal program's does in its event loop):
    /// read as another stack, named after the thread.
    MainStack { pid: u32 },
}

/// Memory that may hold roots, copied at the hold.
pub(crate) struct RootMemory {
    regions: Vec<(u64, Vec<u8>, Place)>,
    /// The held thread and its registers (name, value).
    registers: (u32, Vec<(&'static str, u64)>),
}

/// The red zone below the stack pointer (System V): live data too.
const RED_ZONE: u64 = 128;
/// Most bytes of root memory copied while the collector is held.
const MAX_ROOT_BYTES: u64 = 256 << 20;
const PAGE: u64 = 4096;

/// The runs of resident pages in `[start, end)` (`/proc/PID/pagemap`, bit 63).
fn resident_runs(pagemap: &std::fs::File, start: u64, end: u64) -> Vec<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let pages = ((end - start) / PAGE) as usize;
    let mut entries = vec![0u8; pages * 8];
    if pagemap
        .read_exact_at(&mut entries, start / PAGE * 8)
        .is_err()
    {
        return Vec::new();
    }
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (k, e) in entries.chunks_exact(8).enumerate() {
        if e[7] & 0x80 == 0 {
            continue;
        }
        let page = start + k as u64 * PAGE;
        match runs.last_mut() {
            Some((_, end)) if *end == page => *end += PAGE,
            _ => runs.push((page, page + PAGE)),
        }
    }
    runs
}

/// Copies the roots' memory of process `pid`, whose thread `tid` is held.
pub(crate) fn read(pid: u32, tid: u32, mappings: &[Mapping]) -> Result<RootMemory> {
    let regs = registers_of(tid)?;
    let mut regions = Vec::new();
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))
        .with_context(|| format!("cannot read /proc/{pid}/pagemap"))?;
    let mut copied = 0;
    for (i, m) in mappings.iter().enumerate() {
        let Some(place) = place_of(mappings, i, regs.rsp, (pid, tid)) else {
            continue;
        };
        let ranges = match place {
            Place::Stack { .. } => vec![(regs.rsp.saturating_sub(RED_ZONE).max(m.start), m.end)],
            Place::Global(_) => vec![(m.start, m.end)],
            // Fiber stacks are 8 MiB, mostly never touched: resident pages only.
            Place::OtherStack { .. } | Place::MainStack { .. } => {
                resident_runs(&pagemap, m.start, m.end)
            }
        };
        for (start, end) in ranges {
            if copied + (end - start) > MAX_ROOT_BYTES {
                break;
            }
            let mut data = vec![0u8; (end - start) as usize];
            // A mapping may go away meanwhile (another thread's munmap before
            // the world stopped is done): its roots are then not shown.
            if vm_read(pid, start, &mut data).is_ok() {
                copied += end - start;
                regions.push((start, data, place.clone()));
            }
        }
    }
    Ok(RootMemory {
        regions,
        registers: (tid, named_registers(&regs)),
    })
}

/// The registers of the held thread `tid` (`PTRACE_GETREGS`).
fn registers_of(tid: u32) -> Result<libc::user_regs_struct> {
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
    Ok(regs)
}

/// The general-purpose registers that may hold a pointer, by name.
fn named_registers(regs: &libc::user_regs_struct) -> Vec<(&'static str, u64)> {
    vec![
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
    ]
}

/// What mapping `i` of `mappings` is, if it may hold roots: a module's
/// data, the held thread's stack (it holds `rsp`), another stack; `None`
/// for the rest.
fn place_of(mappings: &[Mapping], i: usize, rsp: u64, (pid, tid): (u32, u32)) -> Option<Place> {
    let m = &mappings[i];
    if !m.perms.starts_with("rw") {
        return None;
    }
    let owner = if m.path.starts_with('/') {
        Some(m.path.clone())
    } else if m.path.is_empty() {
        // `.bss` past the file: right after a writable mapping of it.
        i.checked_sub(1)
            .map(|j| &mappings[j])
            .filter(|p| p.end == m.start && p.path.starts_with('/') && p.perms.starts_with("rw"))
            .map(|p| p.path.clone())
    } else {
        None
    };
    // A stack: `[stack]`, or anonymous right above a `---p` guard.
    let guarded = i
        .checked_sub(1)
        .map(|j| &mappings[j])
        .is_some_and(|p| p.end == m.start && p.perms.starts_with("---") && p.path.is_empty());
    let is_stack = m.path == "[stack]" || (m.path.is_empty() && guarded);
    match owner {
        Some(path) => Some(Place::Global(path)),
        None if (m.start..m.end).contains(&rsp) => Some(Place::Stack { tid }),
        None if m.path == "[stack]" => Some(Place::MainStack { pid }),
        None if is_stack => Some(Place::OtherStack {
            start: m.start,
            end: m.end,
        }),
        None => None,
    }
}

/// The roots pointing into `nodes` (`(address, bytes)`, ascending): per
/// node, what points to it, deduplicated, in the order found.
pub(crate) fn find(
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
                Place::MainStack { pid } => format!("stack of thread {pid}"),
                Place::OtherStack { start, end } => {
                    format!("stack {start:#x}-{end:#x} (another thread's or a fiber's)")
                }
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
