//! The CFI unwinder, for code without frame pointers (Crystal, most
//! optimized C): it walks the user stack with compact CFI tables that
//! userspace builds from each module's `.eh_frame` (`UNWIND_ROWS`, located
//! through `MODULE_RANGES`), and stores each distinct stack once in
//! `DWARF_STACKS`, keyed by a hash of its frames.
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_probe_read_user, generated as gen},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    programs::ProbeContext,
};
use memprof_common::{
    cfa, errno, module_table, DwarfStack, UnwindRow, CALLER_ONLY, FOLD_WINDOW, MAX_FRAMES,
    MAX_STEPS, ROW_CACHE_SLOTS, SHORT_FRAMES,
};

use crate::branchless::{at_or_before, differ, select};
use crate::counters::bump;
use crate::module_maps::MODULE_RANGES;
use crate::settings::{FOLD_RECURSION, HOST};

/// Filled on demand (BPF_F_NO_PREALLOC): most runs use a fraction of it.
#[map]
static DWARF_STACKS: HashMap<u64, DwarfStack> =
    HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);
/// Where a stack goes, cut short, when `DWARF_STACKS` is full.
#[map]
static SHORT_STACKS: HashMap<u64, DwarfStack> =
    HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);
/// Mappable (`BPF_F_MMAPABLE`): userspace writes a file's rows with a
/// copy, not a syscall's copy per row.
#[map]
static UNWIND_ROWS: Array<UnwindRow> =
    Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// Per CPU, rows found by pc (see `cached_row`): one value holding
/// every slot, looked up once per stack, not once per frame.
#[map]
static ROW_CACHE: PerCpuArray<RowCache> = PerCpuArray::with_max_entries(1, 0);

/// 32 KiB: the most a per-CPU value can hold.
#[repr(C)]
struct RowCache {
    rows: [CachedRow; ROW_CACHE_SLOTS as usize],
}

/// A row of `ROW_CACHE`: 32 bytes, half a cache line.
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedRow {
    pc: u64,
    /// The row's rule (see [`rule_of`]).
    rule: u64,
    /// The function the row belongs to (its address in the target).
    func: u64,
    /// The module table (`MODULE_TABLE`) it was found in.
    packed: u64,
}

/// The part of a row the unwinder uses, in one word.
#[inline(always)]
fn rule_of(row: &UnwindRow) -> u64 {
    (row.cfa_offset as u32 as u64)
        | (row.rbp_offset as u16 as u64) << 32
        | (row.cfa_reg as u64) << 48
        | (row.rbp_saved as u64) << 56
}

/// The row back from [`rule_of`] (its `pc` and `func` left 0).
#[inline(always)]
fn row_of(rule: u64) -> UnwindRow {
    UnwindRow {
        pc: 0,
        cfa_offset: rule as u32 as i32,
        rbp_offset: (rule >> 32) as u16 as i16,
        cfa_reg: (rule >> 48) as u8,
        rbp_saved: (rule >> 56) as u8,
        func: 0,
    }
}

/// The stack being unwound (too big for the 512-byte BPF stack).
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// A [`DwarfStack`] with room behind its frames for every step of the
/// walk, so the unwinder writes at a masked index without a bounds branch.
#[repr(C)]
struct Scratch {
    stack: DwarfStack,
    spill: [u64; MAX_STEPS - MAX_FRAMES],
    /// The copy of the target's stack [`Window`] reads from.
    window: [u64; WINDOW_WORDS],
    /// The walk in progress.
    walk: Walk,
    /// Where the walk stopped for want of a row: the frame's return
    /// address, CFA and `%rbp` (`stop_pc` 0: it stopped otherwise).
    stop_pc: u64,
    stop_sp: u64,
    stop_bp: u64,
    /// Keys this CPU found in `DWARF_STACKS`, by their low bits:
    /// nothing is ever removed from it while recording, so a key seen
    /// there once needs no lookup again.
    known: [u64; KNOWN_STACKS],
}

/// Slots of `Scratch::known` (a power of two).
const KNOWN_STACKS: usize = 256;

impl Scratch {
    /// Frame slot `i` (of `MAX_STEPS`: past `MAX_FRAMES`, the spill).
    #[inline(always)]
    fn frame(&mut self, i: usize) -> &mut u64 {
        // `frames` is the last field of `stack`, `spill` follows it.
        let frames = core::mem::offset_of!(DwarfStack, frames);
        unsafe {
            let first = (self as *mut Scratch as *mut u8).add(frames) as *mut u64;
            &mut *first.add(i & (MAX_STEPS - 1))
        }
    }
}

/// The most bytes of the target's stack copied at once.
const WINDOW_BYTES: u64 = 2048;
const WINDOW_WORDS: usize = WINDOW_BYTES as usize / 8;
const _: () = assert!(WINDOW_BYTES.is_power_of_two() && 4096 % WINDOW_BYTES == 0);

/// The part of the target's stack copied into `Scratch::window`:
/// `[start, end)` (empty: none yet). Each `bpf_probe_read_user` costs
/// ~0.1 µs whatever its size (the fault-safe copy and its checks) and
/// the unwinder reads one or two words a frame, all upward from
/// `%rsp`: a copy runs from the first word missed to the end of its
/// page (a copy past the top of a stack, the end of its mapping, would
/// fail), at most `WINDOW_BYTES`, so most walks need one copy.
struct Window {
    start: u64,
    end: u64,
}

impl Window {
    /// The word at `addr` in the target's stack: from the copy, or
    /// copying from `addr` first. A misaligned slot (no compiler
    /// makes one: `%rsp` and `%rbp` stay 8-aligned) is not followed.
    #[inline(always)]
    fn word(&mut self, copy: &mut [u64; WINDOW_WORDS], addr: u64) -> Option<u64> {
        if addr & 7 != 0 {
            return None;
        }
        if addr.wrapping_sub(self.start) >= self.end.wrapping_sub(self.start) {
            let mut len = 4096 - (addr & 4095);
            if len > WINDOW_BYTES {
                len = WINDOW_BYTES;
            }
            let dst = copy.as_mut_ptr() as *mut core::ffi::c_void;
            let src = addr as *const core::ffi::c_void;
            if unsafe { gen::bpf_probe_read_user(dst, len as u32, src) } != 0 {
                self.end = self.start;
                return None;
            }
            self.start = addr;
            self.end = addr + len;
        }
        Some(copy[(addr.wrapping_sub(self.start) >> 3) as usize & (WINDOW_WORDS - 1)])
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Unwinds the user stack from the probe (at function entry) with the
/// CFI tables and stores it in `DWARF_STACKS`. Returns its key, or
/// [`CALLER_ONLY`] when the table has no room for a new stack (the site
/// keeps its caller: attribution degrades, nothing is lost).
///
/// Recursion is folded (unless `FOLD_RECURSION` is 0): a frame whose
/// function is one of the last [`FOLD_WINDOW`] kept is left out, so
/// every path through a recursive function is one stack, its innermost
/// occurrence, and the walk goes on to the callers (up to `MAX_STEPS`
/// frames walked, `MAX_FRAMES` kept).
///
/// A function of its own: its frame is beside the entry's other work in
/// the call chain's 512 bytes of stack, not added to it.
#[inline(never)]
pub(crate) fn dwarf_unwind(ctx: &ProbeContext, packed: u32) -> (u64, Option<u64>) {
    let regs = unsafe { &*ctx.regs };
    unwind_regs(0, regs.rsp, regs.rbp, packed)
}

/// [`dwarf_unwind`] from an instruction inside a function (a page
/// fault's, at `ip`, with `%rsp` and `%rbp` there). The first frame is
/// `ip + 1`, as if it were a return address: its row is looked up at
/// `ip` and userspace names it at `ip`, as every frame.
#[inline(never)]
pub(crate) fn dwarf_unwind_at(ip: u64, sp: u64, bp: u64, packed: u32) -> (u64, Option<u64>) {
    unwind_regs(ip, sp, bp, packed)
}

/// The walk from registers: at a function's entry (`ip` 0) or inside one.
#[inline(always)]
fn unwind_regs(ip: u64, rsp: u64, rbp: u64, packed: u32) -> (u64, Option<u64>) {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        let caller = match ip {
            0 => unsafe { bpf_probe_read_user(rsp as *const u64) }.unwrap_or(0),
            ip => ip + 1,
        };
        return (caller, None);
    };
    // At entry the CFA is %rsp + 8 and the return address, the
    // caller, is at %rsp; inside, the frame is the instruction's own.
    // The stack is read a window at a time.
    let caller = {
        let scratch = unsafe { &mut *scratch };
        let mut window = Window { start: 0, end: 0 };
        let (caller, sp) = match ip {
            0 => (window.word(&mut scratch.window, rsp).unwrap_or(0), rsp + 8),
            ip => (ip + 1, rsp),
        };
        scratch.walk = Walk {
            pc: caller,
            sp,
            bp: rbp,
            hash: FNV_OFFSET,
            len: 0,
            truncated: 1,
            folded: 0,
            recent: [u64::MAX; FOLD_WINDOW],
            packed: packed as u64,
            window_start: window.start,
            window_end: window.end,
        };
        scratch.stop_pc = 0;
        caller
    };
    if caller == 0 {
        return (0, None); // unreadable
    }
    (caller, Some(unwind_from(scratch)))
}

/// [`dwarf_unwind`] from the caller's frame, set up in `scratch.walk`.
#[inline(always)]
fn unwind_from(scratch: *mut Scratch) -> u64 {
    // One step per `bpf_loop` call: the verifier checks a step once,
    // not once per frame (a loop of `MAX_STEPS` inline was more than
    // Linux 6.1's million instructions to verify).
    unsafe {
        gen::bpf_loop(
            MAX_STEPS as u32,
            walk_step as *mut _,
            core::ptr::null_mut(),
            0,
        )
    };
    // The step wrote through its own pointer: read it again.
    let scratch = unsafe { &mut *core::hint::black_box(scratch) };
    let walk = unsafe { core::ptr::read_volatile(&scratch.walk) };
    scratch.stack.len = walk.len as u32;
    scratch.stack.truncated = walk.truncated as u32;
    scratch.stack.folded = walk.folded as u32;
    let mut hash = walk.hash;
    if walk.truncated == 1 {
        bump(|c| &mut c.truncated_stacks);
        hash ^= 1; // same frames, but a truncated stack is another stack
    }
    if walk.folded == 1 {
        bump(|c| &mut c.folded_stacks);
        hash ^= 2; // and so is a folded one
    }
    let key = store(scratch, hash);
    if HOST.load() == 1 && walk.truncated == 1 && scratch.stop_pc != 0 {
        crate::deferred::send(key, scratch.stop_pc, scratch.stop_sp, scratch.stop_bp);
    }
    key
}

/// A walk between two of its steps (in `Scratch`: a `bpf_loop` step
/// keeps nothing in registers).
#[repr(C)]
#[derive(Clone, Copy)]
struct Walk {
    /// The frame to step from: its pc (0: the stack ended), CFA, `%rbp`.
    pc: u64,
    sp: u64,
    bp: u64,
    /// The hash of the frames kept so far, and how many.
    hash: u64,
    len: u64,
    /// 1 until the walk reaches the outermost frame.
    truncated: u64,
    /// 1 once a frame was folded.
    folded: u64,
    /// Functions of the last kept frames, newest first (none: MAX, no
    /// function's address).
    recent: [u64; FOLD_WINDOW],
    /// The module table searched.
    packed: u64,
    /// The part of the target's stack in `Scratch::window` ([`Window`]).
    window_start: u64,
    window_end: u64,
}

/// One step of the walk (a `bpf_loop` callback): the frame in
/// `scratch.walk` kept (or folded) and its caller's found; 1 when the
/// walk is over.
extern "C" fn walk_step(_index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let (Some(scratch), Some(cache)) = (SCRATCH.get_ptr_mut(0), ROW_CACHE.get_ptr_mut(0)) else {
        return 1;
    };
    step(unsafe { &mut *scratch }, unsafe { &mut *cache })
}

/// [`walk_step`]: 0 to go on, 1 when the walk is over.
#[inline(always)]
fn step(scratch: &mut Scratch, cache: &mut RowCache) -> i64 {
    let Walk {
        pc,
        sp,
        bp,
        hash,
        len,
        recent,
        packed,
        ..
    } = scratch.walk;
    if pc == 0 {
        scratch.walk.truncated = 0;
        return 1;
    }
    let len = len as usize;
    // A return address points after the call: look up the call itself.
    let Some((row, func)) = cached_row(cache, pc - 1, packed as u32) else {
        // No rule for it: the last frame.
        scratch.stop_pc = pc;
        scratch.stop_sp = sp;
        scratch.stop_bp = bp;
        if len < MAX_FRAMES {
            *scratch.frame(len) = pc;
            scratch.walk.len = len as u64 + 1;
            scratch.walk.hash = (hash ^ pc).wrapping_mul(FNV_PRIME);
        }
        return 1;
    };
    // Whether a frame is kept or folded is computed, not branched on
    // (`select`): fewer paths for the verifier to walk.
    let fold = u64::from(FOLD_RECURSION.load()) & 1;
    let new = differ(func, recent[0])
        & differ(func, recent[1])
        & differ(func, recent[2])
        & differ(func, recent[3]);
    let keep = new | (fold ^ 1);
    if keep & (len as u64 >> MAX_FRAMES.trailing_zeros()) != 0 {
        return 1; // MAX_FRAMES kept, another to keep: truncated
    }
    // Written either way; a folded frame's slot is the next frame's.
    *scratch.frame(len) = pc;
    scratch.walk.len = len as u64 + keep;
    scratch.walk.folded |= keep ^ 1;
    scratch.walk.hash = select(keep, (hash ^ pc).wrapping_mul(FNV_PRIME), hash);
    scratch.walk.recent = [
        select(keep, func, recent[0]),
        select(keep, recent[0], recent[1]),
        select(keep, recent[1], recent[2]),
        select(keep, recent[2], recent[3]),
    ];
    let mut window = Window {
        start: scratch.walk.window_start,
        end: scratch.walk.window_end,
    };
    let caller = caller_frame(&row, sp, bp, &mut window, &mut scratch.window);
    scratch.walk.window_start = window.start;
    scratch.walk.window_end = window.end;
    match caller {
        Ok((sp, bp, pc)) => {
            scratch.walk.sp = sp;
            scratch.walk.bp = bp;
            scratch.walk.pc = pc;
            0
        }
        Err(outermost) => {
            if outermost {
                scratch.walk.truncated = 0;
            }
            1
        }
    }
}

/// The caller's `(sp, bp, pc)` of the frame whose CFI row is `row`, from
/// its `sp` and `bp`; `Err(true)` at the outermost frame (the stack ends
/// there), `Err(false)` when the walk cannot go on.
#[inline(always)]
fn caller_frame(
    row: &UnwindRow,
    sp: u64,
    bp: u64,
    window: &mut Window,
    copy: &mut [u64; WINDOW_WORDS],
) -> Result<(u64, u64, u64), bool> {
    let base = match row.cfa_reg {
        cfa::RSP => sp,
        cfa::RBP => bp,
        cfa::END => return Err(true),
        _ => return Err(false),
    };
    let frame = base.wrapping_add(row.cfa_offset as i64 as u64);
    let mut bp = bp;
    if row.rbp_saved == 1 {
        let at = frame.wrapping_add(row.rbp_offset as i64 as u64);
        bp = window.word(copy, at).ok_or(false)?;
    }
    let pc = window.word(copy, frame - 8).ok_or(false)?;
    Ok((frame, bp, pc))
}

/// Stores the stack in `scratch` in `DWARF_STACKS` under `hash`; returns
/// its key: `hash`, or when the table has no room, the key of its
/// shortened copy, or [`CALLER_ONLY`].
#[inline(always)]
fn store(scratch: &mut Scratch, hash: u64) -> u64 {
    // A known stack (the usual case) takes no lock, and one this CPU
    // saw no lookup (0 is an empty slot, never a key seen).
    let known = &mut scratch.known[hash as usize & (KNOWN_STACKS - 1)];
    if *known == hash && hash != 0 {
        return hash;
    }
    if DWARF_STACKS.get_ptr(&hash).is_some() {
        *known = hash;
        return hash;
    }
    match DWARF_STACKS.insert(&hash, &scratch.stack, BPF_NOEXIST as u64) {
        Ok(()) => {
            bump(|c| &mut c.stacks_stored);
            hash
        }
        Err(e) if e == -errno::EEXIST => hash, // stored meanwhile
        Err(_) => match shortened(&mut scratch.stack) {
            // Full (or no memory): keep the innermost frames.
            Some(key) => {
                bump(|c| &mut c.stacks_shortened);
                key
            }
            // That table too: the innermost frame, the caller.
            None => {
                bump(|c| &mut c.stacks_degraded);
                CALLER_ONLY
            }
        },
    }
}

/// Stores `stack` cut to its innermost `SHORT_FRAMES` frames (marked
/// truncated) in `SHORT_STACKS`; returns its key, `None` if that table
/// has no room either.
#[inline(always)]
fn shortened(stack: &mut DwarfStack) -> Option<u64> {
    let mut hash = FNV_OFFSET;
    let mut kept: u32 = 0;
    for i in 0..SHORT_FRAMES {
        if i as u32 >= stack.len {
            break;
        }
        hash = (hash ^ stack.frames[i]).wrapping_mul(FNV_PRIME);
        kept += 1;
    }
    stack.len = kept;
    stack.truncated = 1;
    hash ^= 1;
    if stack.folded == 1 {
        hash ^= 2;
    }
    if SHORT_STACKS.get_ptr(&hash).is_some() {
        return Some(hash);
    }
    match SHORT_STACKS.insert(&hash, &*stack, BPF_NOEXIST as u64) {
        Ok(()) => Some(hash),
        Err(e) if e == -errno::EEXIST => Some(hash),
        Err(_) => None,
    }
}

/// [`find_row`] through this CPU's cache of rows by pc: most
/// allocations come from a few call paths, whose return addresses hit
/// (one load instead of a binary search of 33 steps). An entry is
/// valid for the module table it was found in (`packed`, which counts
/// the tables written). Both ways end reading the entry, so the
/// verifier sees one state after it, not two. (One slot per map entry
/// cost a second dependent load per frame, the per-CPU pointer, and
/// both missed the CPU's caches: a quarter of the entry program's
/// time on binary-trees.)
#[inline(always)]
fn cached_row(cache: &mut RowCache, pc: u64, packed: u32) -> Option<(UnwindRow, u64)> {
    let slot = ((pc ^ (pc >> 12)) as usize) & (ROW_CACHE_SLOTS as usize - 1);
    let entry = &mut cache.rows[slot];
    if (entry.pc != pc || entry.packed != packed as u64) && !fill_entry(entry, pc, packed) {
        return None;
    }
    Some((row_of(entry.rule), entry.func))
}

/// Fills the cache entry `entry` with the row of `pc` in module table
/// `packed`; false when there is none. A function of its own: the two
/// unrolled binary searches keep many values live across map lookups,
/// and their spills, inlined, would be on the frame of every function
/// that walks a stack (the 512-byte limit is per call chain).
#[inline(never)]
fn fill_entry(entry: &mut CachedRow, pc: u64, packed: u32) -> bool {
    // `count` is a mask, not min(): the searches stay prunable.
    let modules = module_table::count(packed);
    let table = module_table::first_slot(packed);
    let Some((row, func)) = find_row(pc, table, modules) else {
        return false;
    };
    *entry = CachedRow {
        pc,
        rule: rule_of(&row),
        func,
        packed: packed as u64,
    };
    true
}

/// The CFI row covering `pc` and the function it belongs to (its start,
/// as an address in the target): binary search for the module, then for
/// the last row starting at or before `pc`.
///
/// Both searches are branch-free (a fixed number of halvings, the
/// comparison turned into 0/1 arithmetically): a data-dependent branch per
/// step multiplies the paths the verifier must walk.
#[inline(always)]
fn find_row(pc: u64, table: u32, modules: u32) -> Option<(UnwindRow, u64)> {
    if modules == 0 {
        return None;
    }
    // Module: the last range with start <= pc (ranges are sorted).
    let mut base: u32 = 0;
    let mut len: u32 = modules;
    for _ in 0..module_table::MODULE_SEARCH_STEPS {
        let half = len >> 1;
        let m = MODULE_RANGES.get(table + base + half)?;
        base += half * at_or_before(m.start, pc);
        len -= half;
    }
    let module = MODULE_RANGES.get(table + base)?;
    if pc < module.start || pc >= module.end || module.row_count == 0 {
        return None;
    }
    // Below 2^32 (pc is in the module), but not masked: LLVM would turn
    // `at_or_before` on two known 32-bit values into a branch.
    let rel = pc.wrapping_sub(module.bias);
    let mut base = module.row_start;
    let mut len = module.row_count;
    for _ in 0..module_table::ROW_SEARCH_STEPS {
        let half = len >> 1;
        let row = UNWIND_ROWS.get(base + half)?;
        base += half * at_or_before(row.pc as u64, rel);
        len -= half;
    }
    let row = UNWIND_ROWS.get(base)?;
    if row.pc as u64 > rel {
        return None;
    }
    Some((*row, module.bias.wrapping_add(row.func as u64)))
}
