//! Boehm GC collections. Objects are never freed: `gc_collection` (on
//! `GC_gc_no++`, the end of a collection's marking, world stopped) counts
//! the collection in `GC_EPOCH` and either stops the collecting thread with
//! a signal memprof takes (it traces the target; `GC_HOLD`), so memprof
//! reads the mark bits while the world is still stopped, or
//! (`GC_VERDICTS`) judges the objects of `GC_SLOTS` by the mark bits
//! itself and streams its verdicts. Every allocation is tagged with the
//! epoch it was made in: only older ones are judged.
use aya_ebpf::{
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_send_signal_thread, generated as gen,
    },
    macros::map,
    maps::{Array, HashMap},
    programs::ProbeContext,
    EbpfContext,
};
use memprof_common::{gc_event, GcEvent, KernelMarks, FIRST_WORD_READ, HOLD_SIGNAL};

use crate::counters::{bump, enabled};
use crate::gc_copy::send_gc_event;
use crate::settings::GC_VERDICTS;

/// Collections seen (see `gc_collection`).
#[map]
pub(crate) static GC_EPOCH: Array<u64> = Array::with_max_entries(1, 0);
/// Threads memprof traces (tid → 1): only those can be held.
#[map]
static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);
/// tid → epoch of the collection it is being held at.
#[map]
static HELD: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// 1: hold the collecting thread at the end of each collection's marking
/// (if traced), for memprof's mark-bit pass. Written by userspace while
/// running (off before its tracer lets the threads go).
#[map]
static GC_HOLD: Array<u32> = Array::with_max_entries(1, 0);

/// Where the collector keeps its mark bits (`GC_VERDICTS`):
/// written by userspace before any probe is attached.
#[map]
static GC_MARKS: Array<KernelMarks> = Array::with_max_entries(1, 0);
/// The GC objects judged at each collection (`GC_VERDICTS`),
/// in `GC_SLOTS[..GC_SLOT_COUNT]`: a collection walks those it has, not
/// a table's capacity (a hash table's walk visits every bucket: 2.4 ms
/// a collection at 2^17 entries). Few: refill samples, large objects.
/// No index by address: an object freed, or whose address is allocated
/// again, keeps its slot until a collection finds it unmarked; the
/// slots of one address get the same verdict (the address's mark), and
/// userspace applies it to the object the address holds.
#[map]
static GC_SLOTS: Array<JudgedSlot> = Array::with_max_entries(JUDGED_SLOTS, 0);
/// `[0]`: slots in use (the first `n` of `GC_SLOTS`; may run past the
/// end, the objects that found none are counted). `[1]`: the slots
/// kept so far by a collection's walk (counted here, not in the walk's
/// own state: the verifier would follow every value).
#[map]
static GC_SLOT_COUNT: Array<u64> = Array::with_max_entries(2, 0);
const JUDGED_SLOTS: u32 = 1 << 18;
/// Longest block index hash chain a verdict follows (they are a few
/// entries long; a longer one fails the verdict, counted).
const MAX_CHAIN: usize = 8;

/// One GC object judged at each collection.
#[repr(C)]
#[derive(Clone, Copy)]
struct JudgedSlot {
    addr: u64,
    /// `GC_EPOCH` at its allocation.
    epoch: u32,
    /// 1: its size went to userspace (its first `gc_event::MARKED`;
    /// a live object's size does not change).
    size_sent: u32,
}

/// On `GC_gc_no++`: a collection finished marking; the world is stopped
/// and the mark bits are the collector's verdict. Count it, and hold
/// the collecting thread (a signal to it, which memprof's tracer takes)
/// so memprof reads the marks before anything changes them.
#[inline(always)]
pub(crate) fn collection(ctx: &ProbeContext) -> u32 {
    if !enabled() {
        return 0;
    }
    let Some(slot) = GC_EPOCH.get_ptr_mut(0) else {
        return 0;
    };
    // One collector at a time, world stopped: a plain add is safe.
    let epoch = unsafe {
        *slot += 1;
        *slot
    };
    bump(|c| &mut c.gc_collections);
    let judged_here = GC_VERDICTS.load() == 1;
    if judged_here {
        // The cookie is the increment's link-time address.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let ip = unsafe { (*ctx.regs).rip };
        judge_all(epoch, ip.wrapping_sub(cookie));
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if GC_HOLD.get(0).copied().unwrap_or(0) == 1
        && TRACED.get_ptr(&tid).is_some()
        && HELD.insert(&tid, &epoch, 0).is_ok()
    {
        unsafe { bpf_send_signal_thread(HOLD_SIGNAL) };
    } else if !judged_here {
        bump(|c| &mut c.gc_not_held);
    }
    0
}

/// Has the GC object at `addr`, allocated in `epoch`, judged at the
/// collections from the next on (`GC_VERDICTS`).
#[inline(always)]
pub(crate) fn judge_later(addr: u64, epoch: u64) {
    let Some(count) = GC_SLOT_COUNT.get_ptr_mut(0) else {
        return;
    };
    // Threads allocate at once: each takes its own slot.
    let mut i = 1u64;
    unsafe {
        core::arch::asm!(
            "{i} = atomic_fetch_add((u64 *)({p} + 0), {i})",
            p = in(reg) count,
            i = inout(reg) i,
        )
    };
    match GC_SLOTS.get_ptr_mut(i as u32) {
        Some(slot) if i < JUDGED_SLOTS as u64 => unsafe {
            *slot = JudgedSlot {
                addr,
                epoch: epoch as u32,
                size_sent: 0,
            }
        },
        _ => bump(|c| &mut c.gc_unjudged),
    }
}

/// State of one collection's judging, for `judge_one`.
#[repr(C)]
struct Judging {
    epoch: u64,
    /// `GC_arrays` and `GC_all_nils` in the target.
    arrays: u64,
    nils: u64,
    /// The last region (`addr >> key_shift`) looked up, and its bottom
    /// index: objects share a few regions (4 MiB each).
    region: u64,
    bottom_index: u64,
    /// The last heap block looked up, and its header, object size and
    /// whether it holds objects: objects allocated one after another
    /// share blocks, and then only their mark byte is read.
    block: u64,
    header: u64,
    size: u64,
    objects: u64,
}

/// The end of collection `epoch`'s marking, world stopped (no thread
/// allocates meanwhile): every object of `GC_SLOTS` allocated before it
/// gets the collector's verdict (`GC_base(p) == p && GC_is_marked(p)`);
/// the collected are streamed (`gc_event::COLLECTED`) and forgotten,
/// then `gc_event::JUDGED`.
#[inline(always)]
fn judge_all(epoch: u64, bias: u64) {
    let (Some(marks), Some(count)) = (GC_MARKS.get(0), GC_SLOT_COUNT.get_ptr_mut(0)) else {
        return;
    };
    let start = unsafe { bpf_ktime_get_ns() };
    let arrays = if marks.arrays_in_slot != 0 {
        read_word(marks.arrays.wrapping_add(bias)).unwrap_or(0)
    } else {
        marks.arrays.wrapping_add(bias)
    };
    let nils = read_word(arrays.wrapping_add(marks.all_nils)).unwrap_or(0);
    let mut judging = Judging {
        epoch,
        arrays,
        nils,
        region: u64::MAX,
        bottom_index: 0,
        block: u64::MAX,
        header: 0,
        size: 0,
        objects: 0,
    };
    let used = unsafe { *count }.min(JUDGED_SLOTS as u64);
    let Some(kept) = GC_SLOT_COUNT.get_ptr_mut(1) else {
        return;
    };
    unsafe { *kept = 0 };
    unsafe {
        gen::bpf_loop(
            used as u32,
            judge_one as *mut _,
            &mut judging as *mut Judging as *mut _,
            0,
        )
    };
    unsafe { *count = *kept };
    let gc_no_at = if marks.gc_no_in_slot != 0 {
        read_word(marks.gc_no.wrapping_add(bias)).unwrap_or(0)
    } else {
        marks.gc_no.wrapping_add(bias)
    };
    // The probe is on the increment, before it: this collection is one more.
    let gc_no = read_word(gc_no_at).unwrap_or(0).wrapping_add(1);
    let now = unsafe { bpf_ktime_get_ns() };
    let done = GcEvent {
        addr: gc_no,
        caller: 0,
        stack_id: 0,
        size: now.wrapping_sub(start),
        timestamp_ns: start,
        replaces: 0,
        typed: 0,
        epoch: epoch as u32,
        typed_word: 0,
        kind: 0,
        op: gc_event::JUDGED,
        _pad: 0,
        objects: 0,
    };
    send_gc_event(&done);
}

/// Slot `index` of `GC_SLOTS` (a `bpf_loop` callback): judged if its
/// object was allocated before the collection; moved down to the
/// first slot not kept yet (`GC_SLOT_COUNT[1]`) unless collected.
extern "C" fn judge_one(index: u64, judging: *mut Judging) -> i64 {
    let judging = unsafe { &mut *judging };
    let (Some(slot), Some(kept)) = (
        GC_SLOTS.get(index as u32).copied(),
        GC_SLOT_COUNT.get_ptr_mut(1),
    ) else {
        return 1;
    };
    let size_sent = match judge_slot(&slot, judging) {
        Judged::Keep(size_sent) => size_sent,
        Judged::Gone => return 0,
    };
    let to = unsafe { *kept };
    unsafe { *kept = to + 1 };
    if to != index || size_sent != slot.size_sent {
        if let Some(dst) = GC_SLOTS.get_ptr_mut(to as u32) {
            unsafe { *dst = JudgedSlot { size_sent, ..slot } };
        }
    }
    0
}

/// What a slot's judging decided.
enum Judged {
    /// Still tracked; whether its size was sent.
    Keep(u32),
    /// Collected, and userspace told.
    Gone,
}

#[inline(always)]
fn judge_slot(slot: &JudgedSlot, judging: &mut Judging) -> Judged {
    // Objects allocated since the collection started are not judged.
    if slot.epoch >= judging.epoch as u32 {
        return Judged::Keep(slot.size_sent);
    }
    let Some(marks) = GC_MARKS.get(0) else {
        return Judged::Keep(slot.size_sent);
    };
    let Some((marked, size)) = verdict(marks, judging, slot.addr) else {
        bump(|c| &mut c.gc_verdicts_failed);
        return Judged::Keep(slot.size_sent);
    };
    // Only the collected are sent, and a marked object's size once.
    if marked && slot.size_sent != 0 {
        return Judged::Keep(1);
    }
    let event = GcEvent {
        addr: slot.addr,
        // Before the sweep: a collected object still holds its class.
        caller: first_word(slot.addr),
        stack_id: 0,
        size,
        timestamp_ns: 0,
        replaces: 0,
        typed: 0,
        epoch: judging.epoch as u32,
        typed_word: 0,
        kind: 0,
        op: if marked {
            gc_event::MARKED
        } else {
            gc_event::COLLECTED
        },
        _pad: 0,
        objects: 0,
    };
    // Changed only once userspace is told: a verdict the ring had no
    // room for is counted, and taken again at the next collection.
    let sent = send_gc_event(&event);
    match (marked, sent) {
        (true, sent) => Judged::Keep(u32::from(sent)),
        (false, true) => Judged::Gone,
        (false, false) => Judged::Keep(slot.size_sent),
    }
}

/// The collector's verdict on the object at `addr`: marked, and its
/// size as the collector counts it (0 when it is no longer an object);
/// `None` when its memory could not be read. memprof's
/// `MarkLayout::verdict` does the same from userspace.
#[inline(always)]
fn verdict(marks: &KernelMarks, judging: &mut Judging, addr: u64) -> Option<(bool, u64)> {
    let hblksize = 1u64 << (marks.log_hblksize & 31);
    let block = addr & !(hblksize - 1);
    if block != judging.block {
        let (header, size) = match block_header(marks, judging, addr)? {
            Some(found) => found,
            None => (0, 0),
        };
        (judging.block, judging.header, judging.size) = (block, header, size);
        judging.objects = u64::from(header != 0);
    }
    // No block, the later blocks of a large object, or a free block.
    if judging.objects == 0 {
        return Some((false, 0));
    }
    let (hdr, size) = (judging.header, judging.size);
    let in_block = addr & (hblksize - 1);
    // GC_base: objects are laid out from the block start, `size` apart.
    if size == 0 || addr & 7 != 0 || in_block % size != 0 {
        return Some((false, 0));
    }
    if size <= hblksize && in_block + size > hblksize {
        return Some((false, 0));
    }
    let granule = in_block >> (marks.granule_shift & 31);
    let mark: u8 = unsafe {
        bpf_probe_read_user(hdr.wrapping_add(marks.hb_marks).wrapping_add(granule) as *const u8)
    }
    .ok()?;
    Some((mark != 0, size))
}

/// The header and object size of the heap block holding `addr`;
/// `Some(None)` when there is none holding objects there (no block, the
/// later blocks of a large object, or a free block).
#[inline(always)]
fn block_header(
    marks: &KernelMarks,
    judging: &mut Judging,
    addr: u64,
) -> Option<Option<(u64, u64)>> {
    let hi = addr >> marks.key_shift;
    let bi = if hi == judging.region {
        judging.bottom_index
    } else {
        let bi = bottom_index(marks, judging, hi)?;
        judging.region = hi;
        judging.bottom_index = bi;
        bi
    };
    let slot = (addr >> (marks.log_hblksize & 31)) & marks.bottom_mask;
    let hdr = read_word(bi.wrapping_add(marks.bi_index).wrapping_add(slot << 3))?;
    if hdr <= marks.max_forward {
        return Some(None);
    }
    let flags: u8 =
        unsafe { bpf_probe_read_user(hdr.wrapping_add(marks.hb_flags) as *const u8) }.ok()?;
    if flags & marks.free_blk != 0 {
        return Some(None);
    }
    Some(Some((hdr, read_word(hdr.wrapping_add(marks.hb_sz))?)))
}

/// The collector's bottom index of region `hi`: through `GC_top_index`
/// and its hash chain, else `GC_all_nils` (whose entries are all 0).
#[inline(always)]
fn bottom_index(marks: &KernelMarks, judging: &Judging, hi: u64) -> Option<u64> {
    let mut bi = read_word(
        judging
            .arrays
            .wrapping_add(marks.top_index)
            .wrapping_add((hi & marks.top_mask) << 3),
    )?;
    for _ in 0..MAX_CHAIN {
        if bi == judging.nils || read_word(bi.wrapping_add(marks.bi_key))? == hi {
            return Some(bi);
        }
        bi = read_word(bi.wrapping_add(marks.bi_hash_link))?;
    }
    None
}

/// The first 32-bit word at `addr` (a Crystal object's type id) with
/// [`FIRST_WORD_READ`], or 0 when it cannot be read.
#[inline(always)]
pub(crate) fn first_word(addr: u64) -> u64 {
    match unsafe { bpf_probe_read_user(addr as *const u32) } {
        Ok(word) => FIRST_WORD_READ | u64::from(word),
        Err(_) => 0,
    }
}

#[inline(always)]
fn read_word(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}
