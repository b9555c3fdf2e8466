//! Resident memory by stack (`--rss`): where memory grows, seen where the
//! kernel already pays for it, with nothing run per allocation call.
//!
//! 1. A page of a process written for the first time faults (not
//!    present, a write, from user mode): `page_fault` samples those by
//!    bytes (a page weighs 4 KiB in the same Poisson draw as
//!    `--sample-bytes`), unwinds the user stack from the faulting
//!    instruction and records the page in `LIVE` as a block of kind
//!    `rss` (key: the page's address with bit 0 set, never a block's),
//!    and its bit in `RSS_CHUNKS`.
//! 2. Memory given back (`munmap`, `madvise` discarding, `mmap` over a
//!    range with `MAP_FIXED`, `brk` lowering the heap's end, `mremap`
//!    shrinking) is looked through by `RSS_CHUNKS`: only the 2 MiB chunks
//!    holding sampled pages, and in them the pages sampled, are visited;
//!    each such page leaves `LIVE`. Seen where the kernel lowers the
//!    process's resident count (`rss_changed`, on tracepoint `rss_stat`,
//!    inside such a syscall: nothing run for any other syscall), or, on a
//!    kernel without that tracepoint, at each syscall's entry
//!    (`syscall_entry`, on `sys_enter`: every syscall of the machine then
//!    pays for the tracepoint, about 0.1 µs).
//!
//! A read of a page never written maps the shared zero page (no memory):
//! not counted. Pages shared after a `fork` are counted in the process
//! that wrote them first.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_task_btf, bpf_ktime_get_ns,
        bpf_task_pt_regs,
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use memprof_common::{host, AllocKind, AllocSite, NO_STACK};

use crate::counters::{bump, enabled};
use crate::host::{known_process, this_process_or_none};
use crate::layout;
use crate::record::{record_page, release_page};
use crate::sampling::page_sampled;
use crate::task_files::read_at;
use crate::unwind::dwarf_unwind_at;

const PAGE: u64 = 4096;
/// A chunk of `RSS_CHUNKS`: 512 pages, 2 MiB.
const CHUNK_SHIFT: u64 = 21;
/// Steps one range given back may take (each: a chunk skipped, 64
/// pages skipped, or a page looked at); beyond, `rss_releases_cut`.
const MAX_RELEASE_STEPS: u32 = 1 << 20;

/// x86's page-fault error code: the page was present, a write, from
/// user mode, an instruction fetch.
const PF_PROT: u64 = 1;
const PF_WRITE: u64 = 2;
const PF_USER: u64 = 4;
const PF_INSTR: u64 = 16;

/// `madvise` advice that gives pages back: `MADV_DONTNEED`, `MADV_FREE`,
/// `MADV_REMOVE`, `MADV_DONTNEED_LOCKED`.
const MADV_GIVE_BACK: [u64; 4] = [4, 8, 9, 24];
const MAP_FIXED: u64 = 0x10;

/// `(process index, chunk)` → the chunk's pages sampled and live, a bit
/// each. Sized by userspace.
#[map]
static RSS_CHUNKS: HashMap<u64, [u64; 8]> = HashMap::with_max_entries(1 << 16, 0);

/// A range being given back, between the steps of its walk.
#[derive(Clone, Copy)]
#[repr(C)]
struct Walk {
    index: u64,
    cursor: u64,
    end: u64,
}
#[map]
static RSS_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Per process index: what giving back needs of its samples.
#[derive(Clone, Copy)]
#[repr(C)]
struct Sampled {
    /// Pages sampled so far: a range looked through again only if more
    /// were sampled since (`rss_stat` fires once per page table a
    /// syscall empties).
    pages: u64,
    /// The highest heap end (`brk`) a page was sampled under: where
    /// `brk` lowering the end looks up to (the kernel has lowered
    /// `mm->brk` already when `rss_stat` fires).
    heap_end: u64,
    /// The address space that end is of: an index is given again to
    /// another process, whose heap may lie terabytes away.
    mm: u64,
}
/// Sized by userspace (one per process index).
#[map]
static RSS_SAMPLED: Array<Sampled> = Array::with_max_entries(1, 0);

/// Per CPU: the range last looked through, and for which thread.
#[derive(Clone, Copy)]
#[repr(C)]
struct LastWalk {
    thread: u64,
    syscall: u64,
    args: [u64; 3],
    pages: u64,
}
#[map]
static RSS_LAST_WALK: PerCpuArray<LastWalk> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn chunk_key(index: u64, page: u64) -> u64 {
    (index << 32) | (page >> CHUNK_SHIFT)
}

/// The page's bit: its word (of 8) and the bit in it.
#[inline(always)]
fn bit_of(page: u64) -> (usize, u64) {
    let n = (page >> 12) & 511;
    (((n >> 6) & 7) as usize, 1 << (n & 63))
}

/// A user page fault at `address` (`regs`: the user registers).
#[inline(always)]
pub(crate) fn page_fault(address: u64, regs: u64, error_code: u64) -> i32 {
    // The error code first: most faults of the machine end on it,
    // before any map lookup.
    if error_code & (PF_PROT | PF_WRITE | PF_USER | PF_INSTR) != PF_WRITE | PF_USER || !enabled() {
        return 0;
    }
    if !page_sampled(PAGE) {
        return 0;
    }
    // No table built here: this program runs inside the fault, where
    // the task's memory map must not be walked. A process's first
    // samples before userspace gave its table stop at their first frame.
    let Some(process) = this_process_or_none() else {
        return 0;
    };
    let page = address & !(PAGE - 1);
    let reg = |offset: usize| read_at(regs, offset as u32);
    let ip = reg(core::mem::offset_of!(pt_regs, rip));
    let sp = reg(core::mem::offset_of!(pt_regs, rsp));
    let bp = reg(core::mem::offset_of!(pt_regs, rbp));
    let (caller, stack) = dwarf_unwind_at(ip, sp, bp, process.modules);
    let stack_id = match stack {
        Some(id) => id,
        None => {
            bump(|c| &mut c.stack_errors);
            NO_STACK
        }
    };
    if !mark(process.index as u64, page) {
        bump(|c| &mut c.rss_pages_untracked);
        return 0;
    }
    if let Some(sampled) = RSS_SAMPLED.get_ptr_mut(process.index) {
        let mm = read_at(unsafe { bpf_get_current_task() }, layout!(task_mm));
        let brk = read_at(mm, layout!(mm_brk));
        unsafe {
            (*sampled).pages += 1;
            if (*sampled).mm != mm {
                (*sampled).mm = mm;
                (*sampled).heap_end = 0;
            }
            if page < brk && brk > (*sampled).heap_end {
                (*sampled).heap_end = brk;
            }
        }
    }
    let site = AllocSite {
        caller,
        stack_id,
        kind: AllocKind::Rss as u8,
        _pad: [0; 3],
        process: process.index,
    };
    record_page(host::live_key(page | 1, process.index), &site, PAGE);
    0
}

/// Sets `page`'s bit; false when the chunk table has no room.
#[inline(always)]
fn mark(index: u64, page: u64) -> bool {
    let key = chunk_key(index, page);
    let (word, bit) = bit_of(page);
    if RSS_CHUNKS.get_ptr(&key).is_none() {
        // Another CPU may add it meanwhile: the lookup after finds it.
        let _ = RSS_CHUNKS.insert(&key, &[0; 8], aya_ebpf::bindings::BPF_NOEXIST as u64);
    }
    match RSS_CHUNKS.get_ptr_mut(&key) {
        Some(bits) => {
            unsafe { (*bits)[word] |= bit };
            true
        }
        None => false,
    }
}

/// The `idx`th argument (0 to 3) of a syscall, from the user's registers.
#[inline(always)]
fn syscall_arg(regs: u64, idx: usize) -> u64 {
    let offset = match idx {
        0 => core::mem::offset_of!(pt_regs, rdi),
        1 => core::mem::offset_of!(pt_regs, rsi),
        2 => core::mem::offset_of!(pt_regs, rdx),
        _ => core::mem::offset_of!(pt_regs, r10),
    };
    read_at(regs, offset as u32)
}

/// x86-64 syscall numbers.
const SYS_MMAP: u64 = 9;
const SYS_MUNMAP: u64 = 11;
const SYS_BRK: u64 = 12;
const SYS_MREMAP: u64 = 25;
const SYS_MADVISE: u64 = 28;

/// `-ENOSYS`: a syscall's return value while it runs (set at its entry).
const RUNNING: u64 = -38i64 as u64;

/// The kernel changed the resident count of `mm`: if it did so inside a
/// syscall of the calling process that gives memory back, that
/// syscall's range is given back (once per syscall, unless pages were
/// sampled since).
#[inline(always)]
pub(crate) fn rss_changed(mm: u64) -> i32 {
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    // In a fault, `orig_ax` is -1.
    let syscall = read_at(regs, core::mem::offset_of!(pt_regs, orig_rax) as u32);
    if !matches!(
        syscall,
        SYS_MMAP | SYS_MUNMAP | SYS_BRK | SYS_MREMAP | SYS_MADVISE
    ) || read_at(regs, core::mem::offset_of!(pt_regs, rax) as u32) != RUNNING
        || !enabled()
        || read_at(unsafe { bpf_get_current_task() }, layout!(task_mm)) != mm
    {
        return 0;
    }
    let Some(index) = known_process() else {
        return 0;
    };
    let pages = RSS_SAMPLED.get(index).map_or(0, |s| s.pages);
    let now = LastWalk {
        thread: bpf_get_current_pid_tgid(),
        syscall,
        args: [
            syscall_arg(regs, 0),
            syscall_arg(regs, 1),
            syscall_arg(regs, 2),
        ],
        pages,
    };
    let Some(last) = RSS_LAST_WALK.get_ptr_mut(0) else {
        return 0;
    };
    let last = unsafe { &mut *last };
    if last.thread == now.thread
        && last.syscall == now.syscall
        && last.args == now.args
        && last.pages == now.pages
    {
        return 0;
    }
    *last = now;
    if syscall == SYS_BRK {
        brk_lowered(index, mm, syscall_arg(regs, 0));
        return 0;
    }
    syscall_entry(regs, syscall)
}

/// `brk(new)` lowered the heap's end of `mm`, `mm->brk` already `new`:
/// the pages sampled above it, up to the highest end any was sampled
/// under.
#[inline(always)]
fn brk_lowered(index: u32, mm: u64, new: u64) {
    let Some(sampled) = RSS_SAMPLED.get_ptr_mut(index) else {
        return;
    };
    if unsafe { (*sampled).mm } != mm {
        return; // no page of this process sampled in its heap
    }
    let from = page_up(new);
    let to = page_up(unsafe { (*sampled).heap_end });
    if to > from {
        unsafe { (*sampled).heap_end = from };
        give_back(from, to - from);
    }
}

/// A syscall's entry (`regs`: the user's registers): those that give
/// memory back.
#[inline(always)]
pub(crate) fn syscall_entry(regs: u64, id: u64) -> i32 {
    match id {
        SYS_MUNMAP => give_back(syscall_arg(regs, 0), syscall_arg(regs, 1)),
        SYS_MADVISE if MADV_GIVE_BACK.contains(&syscall_arg(regs, 2)) => {
            give_back(syscall_arg(regs, 0), syscall_arg(regs, 1))
        }
        // With `MAP_FIXED`, what was mapped there goes.
        SYS_MMAP if syscall_arg(regs, 3) & MAP_FIXED != 0 => {
            give_back(syscall_arg(regs, 0), syscall_arg(regs, 1))
        }
        SYS_BRK => brk(syscall_arg(regs, 0)),
        SYS_MREMAP => remap(regs),
        _ => {}
    }
    0
}

/// `brk(new)` below the heap's end: the pages above go.
#[inline(always)]
fn brk(new: u64) {
    if new == 0 || !enabled() {
        return;
    }
    let mm = read_at(unsafe { bpf_get_current_task() }, layout!(task_mm));
    let old = read_at(mm, layout!(mm_brk));
    let from = page_up(new);
    let to = page_up(old);
    if to > from {
        give_back(from, to - from);
    }
}

/// `mremap(old, old_len, new_len, …)` shrinking: its tail goes. (A
/// range it moves keeps its pages counted at their old addresses, its
/// return not being probed: given back when those are unmapped or
/// written again.)
#[inline(always)]
fn remap(regs: u64) {
    let (old, old_len, new_len) = (
        syscall_arg(regs, 0),
        syscall_arg(regs, 1),
        syscall_arg(regs, 2),
    );
    if new_len < old_len {
        give_back(old.saturating_add(new_len), old_len - new_len);
    }
}

#[inline(always)]
fn page_up(addr: u64) -> u64 {
    addr.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// The pages of `[start, start + len)` sampled and live leave `LIVE`
/// for the calling process if followed.
#[inline(never)]
fn give_back(start: u64, len: u64) {
    if len == 0 || !enabled() {
        return;
    }
    let Some(index) = known_process() else {
        return;
    };
    let Some(walk) = RSS_WALK.get_ptr_mut(0) else {
        return;
    };
    let start = start & !(PAGE - 1);
    unsafe {
        *walk = Walk {
            index: index as u64,
            cursor: start,
            end: start.saturating_add(len),
        };
        aya_ebpf::helpers::generated::bpf_loop(
            MAX_RELEASE_STEPS,
            release_step as *mut _,
            core::ptr::null_mut(),
            0,
        );
    }
    let walk = unsafe { &*core::hint::black_box(walk) };
    if walk.cursor < walk.end {
        bump(|c| &mut c.rss_releases_cut);
    }
}

/// One step of [`give_back`] (a `bpf_loop` callback): a chunk with no
/// page sampled skipped, 64 pages with none skipped, or a page looked
/// at; 1 when the range is done.
extern "C" fn release_step(_index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let Some(walk) = RSS_WALK.get_ptr_mut(0) else {
        return 1;
    };
    let w = unsafe { &mut *walk };
    if w.cursor >= w.end {
        return 1;
    }
    let key = chunk_key(w.index, w.cursor);
    let Some(bits) = RSS_CHUNKS.get_ptr_mut(&key) else {
        w.cursor = ((w.cursor >> CHUNK_SHIFT) + 1) << CHUNK_SHIFT;
        return 0;
    };
    let (word, bit) = bit_of(w.cursor);
    let set = unsafe { (*bits)[word] };
    if set & !(bit - 1) == 0 {
        // None from here to the word's end: to the next 64 pages.
        w.cursor = (w.cursor | ((64 * PAGE) - 1)) + 1;
        return 0;
    }
    if set & bit != 0 {
        unsafe { (*bits)[word] = set & !bit };
        let live = host::live_key(w.cursor | 1, w.index as u32);
        release_page(live, unsafe { bpf_ktime_get_ns() });
        let bits = unsafe { &*bits };
        if bits.iter().all(|&b| b == 0) {
            let _ = RSS_CHUNKS.remove(&key);
        }
    }
    w.cursor += PAGE;
    0
}
