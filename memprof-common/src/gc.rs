//! Boehm GC objects: the events of userspace's copy, where the mark
//! bits are, the signal that holds a collector.
use crate::signal;
#[cfg(doc)]
use crate::{AllocKind, AllocSite};

/// A change to the set of GC objects, streamed to userspace through the
/// `GC_EVENTS` ring buffer. While userspace keeps the copy of the GC
/// objects (`globals::GC_COPY`) that copy is the only one: GC objects are
/// not in `LIVE`. Kept small (72 bytes): a busy GC program streams
/// millions a second.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GcEvent {
    pub addr: u64,
    /// [`gc_event::ALLOC`]: the allocation site, [`AllocSite::caller`].
    /// [`gc_event::GONE`] (`GC_free`), [`gc_event::MARKED`],
    /// [`gc_event::COLLECTED`]: the object's first 32-bit word (a Crystal
    /// object's type id), read while it still held it, plus
    /// [`FIRST_WORD_READ`]; 0 when not read.
    pub caller: u64,
    /// [`AllocSite::stack_id`].
    pub stack_id: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// `bpf_ktime_get_ns()` at the allocation or the free.
    pub timestamp_ns: u64,
    /// `GC_realloc`: the block this one replaces (its kind is this one's:
    /// the kernel does not know it), freed by it: that free is not sent
    /// as a [`gc_event::GONE`] of its own (userspace could drain the ring
    /// between the two); else 0.
    pub replaces: u64,
    /// [`gc_event::ALLOC`]: the thread's previous GC object, allocated in
    /// the same epoch, whose first 32-bit word is [`GcEvent::typed_word`]
    /// (a Crystal object's type id, written by the program right after
    /// that allocation returned); 0: none read. Read here, not while
    /// memprof holds a collection, so typing every object costs no pause.
    pub typed: u64,
    /// `GC_EPOCH` at the allocation (truncated: a run sees fewer than 2^32
    /// collections).
    pub epoch: u32,
    /// The first word of the object at [`GcEvent::typed`].
    pub typed_word: u32,
    /// [`AllocKind`] as `u8`.
    pub kind: u8,
    /// One of [`gc_event`].
    pub op: u8,
    pub _pad: u8,
    /// Objects this allocation stands for: 1 (0 read as 1), or a refill
    /// sample's `N` (`--gc-sampling refill`).
    pub objects: u16,
}

/// Set in [`GcEvent::caller`] above a first word that was read (a word
/// may be 0).
pub const FIRST_WORD_READ: u64 = 1 << 32;

/// [`GcEvent::op`] values.
pub mod gc_event {
    /// A GC object was allocated at `addr`.
    pub const ALLOC: u8 = 0;
    /// The GC object at `addr` was freed (`GC_free`, or the old block of
    /// a `GC_realloc` that made no new one: `GC_realloc(p, 0)`, or one
    /// not sampled).
    pub const GONE: u8 = 1;
    /// [`globals::GC_VERDICTS`](crate::globals::GC_VERDICTS): at the end of
    /// the marking of collection `epoch`, the object at `addr` (allocated
    /// before it) was marked, for the first time; `size`: its size as the
    /// collector counts it. Not sent again while it stays marked.
    pub const MARKED: u8 = 2;
    /// Likewise, not marked (or no longer an object): collected.
    pub const COLLECTED: u8 = 3;
    /// Every verdict of collection `epoch` was sent: `addr` is the
    /// collector's `GC_gc_no` after it, `timestamp_ns` the end of marking,
    /// `size` the nanoseconds the kernel spent judging.
    pub const JUDGED: u8 = 4;
}

/// Where the collector keeps what a mark-bit verdict reads
/// ([`globals::GC_VERDICTS`](crate::globals::GC_VERDICTS)): the numbers of memprof's `MarkLayout`, plus
/// `GC_gc_no`. Addresses are link-time: each collection probe's attach
/// cookie is the link-time address of the instruction it is on, and the
/// probe's instruction pointer minus it is the module's bias.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelMarks {
    /// `GC_arrays`, or (`arrays_in_slot`) the GOT slot holding its address.
    pub arrays: u64,
    /// `GC_gc_no`, or (`gc_no_in_slot`) the GOT slot holding its address.
    pub gc_no: u64,
    /// Offsets in `GC_arrays` of `GC_top_index` and `GC_all_nils`.
    pub top_index: u64,
    pub all_nils: u64,
    /// `bottom_index` fields: `key`, `hash_link`, `index`.
    pub bi_key: u64,
    pub bi_hash_link: u64,
    pub bi_index: u64,
    pub top_mask: u64,
    pub bottom_mask: u64,
    /// `hblkhdr` fields: `hb_marks`, `hb_flags`, `hb_sz`.
    pub hb_marks: u64,
    pub hb_flags: u64,
    pub hb_sz: u64,
    /// Index entries at most this are forwarding counts, not headers.
    pub max_forward: u64,
    pub key_shift: u32,
    pub log_hblksize: u32,
    pub granule_shift: u32,
    pub arrays_in_slot: u8,
    pub gc_no_in_slot: u8,
    /// `FREE_BLK` in `hb_flags`.
    pub free_blk: u8,
    pub _pad: u8,
}

/// The signal that stops a collecting thread for the mark-bit pass: SIGURG,
/// ignored by default, so if it ever reached the program (memprof killed
/// in between) nothing would happen. memprof, tracing the thread, takes it.
pub const HOLD_SIGNAL: u32 = signal::SIGURG;
