//! The contract between the eBPF programs (`memprof-ebpf`) and the
//! userspace daemon (`memprof`): everything both sides must agree on is
//! written here once.
//!
//! | what | where |
//! |---|---|
//! | map records: keys, values, events | [`AllocSite`], [`LiveAlloc`], [`SiteTotals`], [`GcEvent`], [`UnwindRow`], [`ModuleRange`], [`DwarfStack`] |
//! | what went wrong or was dropped | [`KernelCounters`] (one field per counter) |
//! | names of programs and maps, settings | [`programs`], [`maps`], [`config`] |
//! | the module table's layout and packing | [`module_table`] |
//! | byte codes | [`AllocKind`] (`TryFrom<u8>`), [`op`], [`gc_event`], [`cfa`] |
//! | numbers from Linux the kernel side needs | [`errno`], [`signal`] |
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of pointers, so the same
//! bytes mean the same thing on both sides of a BPF map. With the `user`
//! feature the types also implement `aya::Pod`, which lets userspace read
//! them straight out of maps. Userspace converts the records into its own
//! types at one boundary (`memprof::probes`).
#![cfg_attr(not(any(feature = "user", test)), no_std)]

/// Which allocator family an allocation came from. Stored as a `u8`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocKind {
    /// libc heap: malloc, calloc, realloc, memalign, …
    Libc = 0,
    /// anonymous or file mappings made with `mmap`.
    Mmap = 1,
    /// Boehm GC, scanned objects (`GC_malloc`).
    Gc = 2,
    /// Boehm GC, pointer-free objects (`GC_malloc_atomic`).
    GcAtomic = 3,
}

impl AllocKind {
    pub const ALL: [AllocKind; 4] = [
        AllocKind::Libc,
        AllocKind::Mmap,
        AllocKind::Gc,
        AllocKind::GcAtomic,
    ];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::Libc => "libc",
            AllocKind::Mmap => "mmap",
            AllocKind::Gc => "gc",
            AllocKind::GcAtomic => "gc_atomic",
        }
    }
}

/// The kind byte of an [`AllocSite`] as an [`AllocKind`]: a byte no kind
/// has is an error ([`UnknownKind`]), never a guess.
impl TryFrom<u8> for AllocKind {
    type Error = UnknownKind;

    fn try_from(v: u8) -> Result<AllocKind, UnknownKind> {
        match v {
            0 => Ok(AllocKind::Libc),
            1 => Ok(AllocKind::Mmap),
            2 => Ok(AllocKind::Gc),
            3 => Ok(AllocKind::GcAtomic),
            _ => Err(UnknownKind(v)),
        }
    }
}

/// A kind byte that is no [`AllocKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownKind(pub u8);

impl core::fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown allocation kind {}", self.0)
    }
}

#[cfg(any(feature = "user", test))]
impl std::error::Error for UnknownKind {}

/// How an allocating function passes its size (and old block or
/// out-parameter): the entry program reads the arguments accordingly.
pub mod layout {
    /// `malloc(size)`, `valloc(size)`, `pvalloc(size)`, `GC_malloc(size)`, …
    pub const SIZE: u8 = 0;
    /// `mmap(addr, len, …)`.
    pub const MMAP: u8 = 1;
    /// `calloc(n, size)`.
    pub const CALLOC: u8 = 2;
    /// `realloc(ptr, size)`, `GC_realloc(ptr, size)`.
    pub const REALLOC: u8 = 3;
    /// `reallocarray(ptr, n, size)`.
    pub const REALLOCARRAY: u8 = 4;
    /// `memalign(align, size)`, `aligned_alloc(align, size)`.
    pub const MEMALIGN: u8 = 5;
    /// `posix_memalign(void **out, align, size)`.
    pub const POSIX_MEMALIGN: u8 = 6;
    /// `GC_malloc(size)`, `GC_malloc_atomic(size)`: served from the
    /// calling thread's free list when it has an object of the size's
    /// class, whose head is then the result ([`Predict`](super::Predict)).
    pub const GC_THREAD_LOCAL: u8 = 7;
    /// glibc's `malloc(size)`: served from the thread's tcache when it has
    /// a chunk of the size's bin ([`Predict`](super::Predict)).
    pub const MALLOC_TCACHE: u8 = 8;
    /// `GC_malloc_kind_global(size, kind)`: one object, of the collector
    /// kind in the second argument (0: pointer-free). Probed with
    /// `--gc-sampling refill`, where it is every allocation the free lists
    /// do not serve (a thread's first few of a size, and large objects).
    pub const GC_KIND_GLOBAL: u8 = 9;
    /// `GC_generic_malloc_many(lb, kind, &list)`: a thread's free list of
    /// `lb`-byte objects refilled (`--gc-sampling refill`, [`Refill`]). The
    /// allocation that ran it out gets the new list's head, and stands for
    /// the objects of the list.
    pub const GC_REFILL: u8 = 10;
}

/// The attach cookie of an allocator probe: the [`AllocKind`] in the low
/// byte, the argument [`layout`] in the next.
pub mod cookie {
    use super::AllocKind;

    pub const fn new(kind: AllocKind, layout: u8) -> u64 {
        kind as u64 | (layout as u64) << 8
    }

    /// The kind byte (an [`AllocKind`] as `u8`).
    #[inline(always)]
    pub const fn kind(cookie: u64) -> u8 {
        cookie as u8
    }

    /// The argument layout ([`layout`](super::layout)).
    #[inline(always)]
    pub const fn layout(cookie: u64) -> u8 {
        (cookie >> 8) as u8
    }
}

/// What the return probe must do with a pending call (set by the entry probe).
pub mod op {
    /// Returned pointer is a new block of `size` bytes.
    pub const ALLOC: u8 = 0;
    /// `realloc`: `old_ptr` is released if the call succeeds (or if size is 0).
    pub const REALLOC: u8 = 1;
    /// `posix_memalign`: the new pointer is written to `*out_ptr`; return value 0 on success.
    pub const OUT_PTR: u8 = 2;
    /// A free-list refill ([`layout::GC_REFILL`](super::layout::GC_REFILL)):
    /// the new list's head is written to `*out_ptr`.
    pub const REFILL: u8 = 3;
}

/// Stack id stored when no stack could be captured; counted in [`KernelCounters::stack_errors`].
pub const NO_STACK: u64 = u64::MAX;

/// Most frames a DWARF stack stores (a power of two: indexes are masked).
pub const MAX_FRAMES: usize = 64;

/// Frames kept of a stack the stack table has no room for: it goes to the
/// short-stack table (`SHORT_STACKS`) cut to its innermost frames, which
/// far fewer distinct stacks share (the Crystal compiler: 770,000 distinct
/// stacks).
pub const SHORT_FRAMES: usize = 8;

/// Most frames the DWARF unwinder steps through. More than it stores: frames
/// folded away (recursion) take a step but no room, so a deep recursion
/// still reaches `main`.
pub const MAX_STEPS: usize = 128;
const _: () = assert!(MAX_FRAMES.is_power_of_two() && MAX_STEPS.is_power_of_two());
const _: () = assert!(MAX_STEPS > MAX_FRAMES);

/// How many of the last frames kept the unwinder compares a frame's
/// function with: a frame of one of them is folded (recursion, direct or
/// through up to this many functions, keeps its innermost occurrence).
pub const FOLD_WINDOW: usize = 4;

/// Stack id of an allocation whose stack had no room in the stack table:
/// only its caller (the innermost frame, [`AllocSite::caller`]) is kept,
/// shown as a one-frame truncated stack; counted in
/// [`KernelCounters::stacks_degraded`] (not a loss).
pub const CALLER_ONLY: u64 = u64::MAX - 1;

/// Stack id of the overflow site of each kind: allocations whose site had
/// no room in the site table (`--max-sites`) are recorded there, with
/// caller 0 (totals and live figures stay exact, their stack is unknown);
/// counted in [`KernelCounters::sites_overflowed`].
pub const SITES_OVERFLOW: u64 = u64::MAX - 2;

/// Entries of the `SAMPLE_DISTANCES` table: equal-probability slices of
/// the exponential distribution the sampler draws distances from.
pub const SAMPLE_QUANTILES: u32 = 1024;

/// Where an allocation was made: the user stack (frame-pointer walk, kept in
/// the `STACKS` map) plus the return address read from the stack at the probe,
/// which the frame-pointer walk misses when the allocator does not start with
/// `push %rbp`. Key of the per-site totals map, and part of every live entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocSite {
    /// Return address into the caller of the allocator function.
    pub caller: u64,
    /// Frame-pointer unwinding: id in the `STACKS` map. DWARF unwinding: key
    /// (hash of the frames) in `DWARF_STACKS`. [`NO_STACK`] if none.
    pub stack_id: u64,
    /// [`AllocKind`] as `u8`.
    pub kind: u8,
    pub _pad: [u8; 3],
    /// `attach --all`: the process's index ([`host`]); else 0.
    pub process: u32,
}

/// A call in flight: written by the entry probe, consumed by the return probe.
/// Keyed by thread (`pid_tgid`); the entry stays while the thread lives.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PendingCall {
    pub site: AllocSite,
    /// Requested size in bytes.
    pub size: u64,
    /// `realloc`: the block being resized; `posix_memalign`: the `void **` out-parameter.
    pub arg_ptr: u64,
    /// Number of allocator calls nested inside this one (e.g. `realloc(NULL, n)`
    /// calls `malloc`): their return probes are skipped, the outer call counts.
    pub nested: u32,
    /// One of [`op`].
    pub op: u8,
    /// 1: not sampled (`--sample-bytes`), followed only because it is a
    /// realloc of a tracked block: its return releases that block and
    /// records nothing.
    pub unsampled: u8,
    /// 1: a call in flight; 0: the thread's slot, kept between its calls
    /// (written in place: no insert or delete per call).
    pub active: u8,
    pub _pad: u8,
    /// `%rsp` at the entry (it points at the return address). Stacks grow
    /// down: a call made inside this one enters at or below it, and the
    /// return probe of this call sees `sp + 8`. An entry above it means this
    /// call's frame is gone and its return was missed (a stale call).
    pub sp: u64,
    /// The thread's last clock read for a GC object, reused (see
    /// `gc_time` in the kernel programs): kept across the thread's calls.
    pub clock: ThreadClock,
    /// Where the thread's caches are ([`Predict`]), read each call (a
    /// thread that leaves the collector, or frees its tcache, clears
    /// them): the address of its `GC_thread_key`, and of its `tcache`.
    /// 0: not known yet, 1: not found (tried again at the next
    /// collection, `found_epoch`).
    pub gc_key: u64,
    pub tcache: u64,
    pub found_epoch: u64,
    /// The result predicted for this call, to check at its return (0: none).
    pub predicted: u64,
    /// A refill ([`op::REFILL`]): the size of the list's objects, and
    /// the collector's `GC_bytes_allocd` at the entry (`u64::MAX`: not read).
    pub refill_lb: u64,
    pub allocd_before: u64,
}

/// How the kernel weighs a free-list refill (`--gc-sampling refill`, the
/// `REFILL` map's one entry, written after attaching). A refill hands out
/// `N` objects of `lb` bytes; the sample (the allocation that ran the list
/// out) stands for them. `N` is the rise of `GC_bytes_allocd` over the call
/// over `lb` (exact when no other thread allocates meanwhile), at most the
/// objects from the head's block start to the head (the collector builds a
/// block's list from its end down).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Refill {
    /// 1: the fields below are set; 0: `N` from the head's place alone.
    pub on: u64,
    /// Where `GC_arrays` is: its address, or (`arrays_in_slot`) the GOT
    /// slot holding it, read at each refill (filled by the dynamic linker).
    pub arrays: u64,
    pub arrays_in_slot: u64,
    /// Offset of `GC_bytes_allocd` in `GC_arrays`.
    pub bytes_allocd: u64,
    /// LOG_HBLKSIZE: the collector's blocks are `1 << log_hblksize` bytes.
    pub log_hblksize: u64,
    /// Index in `pt_regs` (as `u64`s) of the register holding the caller's
    /// requested size at the refill's entry (`GC_malloc_kind` keeps it in
    /// a callee-saved register across the call); `u64::MAX`: not known,
    /// the sample's size is `lb`.
    pub size_reg: u64,
}

/// How the entry of an allocator knows its result, so that its return need
/// not be probed (a uprobe session skips it): the allocator serves a small
/// request from the calling thread's cache, whose head for the request's
/// class is the result. Two predictors ([`predictor`]), each found per
/// thread through its thread-local storage (the `fs` base, from the task):
///
/// - Boehm (`GC_malloc`, `GC_malloc_atomic`; layout
///   [`layout::GC_THREAD_LOCAL`]): bdwgc's `GC_FAST_MALLOC_GRANS` hands out
///   the head of the thread's free list for the size's granules. The free
///   lists are `GC_thread_key` (a TLS variable): the TLS vector at `fs:8`,
///   libgc's block `dtv[module]` (the module id read from libgc's GOT, or
///   1 for the executable), the variable at `tls_offset` in it.
/// - glibc (`malloc`; layout [`layout::MALLOC_TCACHE`]): `__libc_malloc`
///   returns `tcache->entries[idx]` when the thread's tcache has a chunk
///   of the size's bin. `tcache` is a TLS variable at `fs + tp_offset`,
///   the offset read from the GOT slot `malloc`'s code loads it from.
///
/// Checked before trusted: predictions are compared with the returns until
/// [`PREDICT_TRUST_AFTER`] matched, then one in [`PREDICT_CHECK_EVERY`];
/// one wrong turns that predictor off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Predict {
    /// One of [`predict`].
    pub state: u64,
    /// Predictions that matched their return, while checking.
    pub matched: u64,
    /// Address of the GOT slot in the target the kernel reads once per
    /// thread: Boehm, libgc's TLS module id (0: `module_id` instead);
    /// glibc, `tcache`'s offset from the thread pointer.
    pub slot: u64,
    pub module_id: u64,
    /// Boehm: offset of `GC_thread_key` in libgc's TLS block.
    pub tls_offset: u64,
    /// Offset of `thread.fsbase` in the kernel's `task_struct`.
    pub fsbase_offset: u64,
    /// Boehm: bytes the collector adds to a request before rounding it up
    /// to granules (`EXTRA_BYTES`: 1 with interior pointers recognized).
    pub extra_bytes: u64,
}

/// The predictors: indexes of the `PREDICT` map.
pub mod predictor {
    pub const GC: u32 = 0;
    pub const MALLOC: u32 = 1;
    pub const COUNT: u32 = 2;
}

/// States of a [`Predict`].
pub mod predict {
    /// No prediction: every return is probed.
    pub const OFF: u64 = 0;
    /// Predicting, every prediction checked against its return.
    pub const CHECKING: u64 = 1;
    /// Predictions recorded at the entry, one in `PREDICT_CHECK_EVERY` checked.
    pub const TRUSTED: u64 = 2;
}

/// Predictions that must match their returns before they are trusted.
pub const PREDICT_TRUST_AFTER: u64 = 4096;
/// Once trusted, one prediction in this many is still checked (per CPU).
pub const PREDICT_CHECK_EVERY: u64 = 256;
/// Objects per free list kind (`GC_TINY_FREELISTS`, 64-bit bdwgc): a
/// request of this many granules or more is not served from it.
pub const GC_TINY_FREELISTS: u64 = 25;
/// A free-list head at or below this is a count, not an object
/// (`DIRECT_GRANULES + GC_TINY_FREELISTS + 1`).
pub const GC_FREELIST_COUNTS: u64 = 256 + GC_TINY_FREELISTS + 1;
/// glibc's tcache bins (`TCACHE_MAX_BINS`): `tcache_perthread_struct` is
/// `u16 counts[64]` then `entries[64]`.
pub const TCACHE_BINS: u64 = 64;

/// A clock read and what it is valid for: the jiffy (4 ms at HZ=250) and
/// the collection count it was read at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadClock {
    pub ns: u64,
    pub jiffies: u64,
    pub epoch: u64,
}

/// One live block: value of the `LIVE` map, keyed by address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LiveAlloc {
    pub site: AllocSite,
    pub size: u64,
    /// `bpf_ktime_get_ns()` at allocation (CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// GC collections seen (`GC_EPOCH`) when it was allocated: a collection
    /// judges only objects allocated before it.
    pub epoch: u64,
}

/// A change to the set of GC objects, streamed to userspace through the
/// `GC_EVENTS` ring buffer. While userspace keeps the copy of the GC
/// objects (`config::GC_COPY`) that copy is the only one: GC objects are
/// not in `LIVE`. Kept small (56 bytes): a busy GC program streams
/// millions a second.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GcEvent {
    pub addr: u64,
    /// The allocation site ([`gc_event::ALLOC`] only): [`AllocSite::caller`].
    pub caller: u64,
    /// [`AllocSite::stack_id`].
    pub stack_id: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// `bpf_ktime_get_ns()` at the allocation or the free.
    pub timestamp_ns: u64,
    /// `GC_realloc`: the block this one replaces (its kind is this one's:
    /// the kernel does not know it); else 0.
    pub replaces: u64,
    /// `GC_EPOCH` at the allocation (truncated: a run sees fewer than 2^32
    /// collections).
    pub epoch: u32,
    /// [`AllocKind`] as `u8`.
    pub kind: u8,
    /// One of [`gc_event`].
    pub op: u8,
    pub _pad: u8,
    /// Objects this allocation stands for: 1 (0 read as 1), or a refill
    /// sample's `N` (`--gc-sampling refill`).
    pub objects: u16,
}

/// Blocks and bytes in `LIVE` per [`AllocKind`], changed by this CPU's
/// inserts and removes (value of the per-CPU `LIVE_BY_KIND` map; one CPU's
/// figures can be negative, their sum is what `LIVE` holds). Read in O(1)
/// for timeline samples instead of walking `LIVE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindLive {
    pub blocks: [i64; 4],
    pub bytes: [i64; 4],
}

impl KindLive {
    /// Adds another CPU's figures.
    pub fn add(&mut self, other: &KindLive) {
        for i in 0..4 {
            self.blocks[i] += other.blocks[i];
            self.bytes[i] += other.bytes[i];
        }
    }
}

/// [`GcEvent::op`] values.
pub mod gc_event {
    /// A GC object was allocated at `addr`.
    pub const ALLOC: u8 = 0;
    /// The GC object at `addr` was freed (`GC_free`, or the old block of
    /// `GC_realloc`).
    pub const GONE: u8 = 1;
    /// [`config::GC_VERDICTS`](super::config::GC_VERDICTS): at the end of
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
/// ([`config::GC_VERDICTS`]): the numbers of memprof's `MarkLayout`, plus
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

/// Upper bounds of the lifetime histogram buckets, in nanoseconds: 100 µs,
/// 1 ms, 10 ms, 100 ms, 1 s, 10 s, 100 s; the last bucket holds the rest.
pub const LIFETIME_BOUNDS_NS: [u64; 7] = [
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    100_000_000_000,
];

/// Histogram bucket of a lifetime of `ns` nanoseconds.
#[inline(always)]
pub fn lifetime_bucket(ns: u64) -> usize {
    let mut bucket = 0;
    for bound in LIFETIME_BOUNDS_NS {
        bucket += (ns >= bound) as usize;
    }
    bucket
}

/// Everything allocated at one site over the whole run: value of the per-CPU
/// `SITE_TOTALS` map (userspace sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SiteTotals {
    pub count: u64,
    pub bytes: u64,
    /// Blocks of this site that died: freed, or (GC kinds) found dead
    /// because their address was allocated again.
    pub died: u64,
    /// Sum of their lifetimes, nanoseconds.
    pub lifetime_ns: u64,
    /// Their lifetimes by [`lifetime_bucket`].
    pub buckets: [u64; 8],
    /// GC kinds: of `died`, those proven collected by address reuse.
    pub reused: u64,
    pub reused_bytes: u64,
}

impl SiteTotals {
    /// Adds another CPU's totals, field by field.
    pub fn add(&mut self, other: &SiteTotals) {
        // Destructured, not `..`: a field added to the struct does not
        // compile until it is summed here.
        let SiteTotals {
            count,
            bytes,
            died,
            lifetime_ns,
            buckets,
            reused,
            reused_bytes,
        } = *other;
        self.count += count;
        self.bytes += bytes;
        self.died += died;
        self.lifetime_ns += lifetime_ns;
        for (mine, theirs) in self.buckets.iter_mut().zip(buckets) {
            *mine += theirs;
        }
        self.reused += reused;
        self.reused_bytes += reused_bytes;
    }
}

/// Declares [`KernelCounters`] and what is derived from its field list, so
/// adding a counter is one edit: its line in the struct.
macro_rules! counters {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $( $(#[$field_doc:meta])* pub $field:ident: u64, )*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$field_doc])* pub $field: u64, )*
        }

        impl $name {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($field)),*].len();
            /// Their names, in field order.
            pub const NAMES: [&'static str; Self::COUNT] = [$(stringify!($field)),*];

            /// Adds another CPU's counters, field by field.
            pub fn add(&mut self, other: &$name) {
                $( self.$field += other.$field; )*
            }

            /// Every counter, in field order.
            pub fn fields_mut(&mut self) -> [&mut u64; Self::COUNT] {
                [$(&mut self.$field),*]
            }
        }
    };
}

counters! {
    /// Things that went wrong or were dropped, and totals for context:
    /// the value of the per-CPU `COUNTERS` map (one entry). Nothing is lost
    /// silently: every report prints these. Userspace sums the CPUs with
    /// [`KernelCounters::add`].
    pub struct KernelCounters {
        /// An allocation counted in its site's totals but not recorded in
        /// `LIVE` (map full): its free is never matched, live figures are
        /// lower bounds. Disjoint from `sites_map_full` and `both_maps_full`.
        pub live_map_full: u64,
        /// An allocation recorded in `LIVE` whose site could not be added to
        /// `SITE_TOTALS` nor to its overflow slot: missing from the totals
        /// only. (A full site table sends sites to the overflow slot, so this
        /// stays 0 in practice.)
        pub sites_map_full: u64,
        /// `bpf_get_stackid` failed (stack map full or hash collision): site recorded without a stack.
        pub stack_errors: u64,
        /// A call could not be remembered between entry and return (`PENDING` full): allocation lost.
        pub pending_full: u64,
        /// A call remembered at entry whose return was never seen (its frame
        /// was gone when the thread made its next call): allocation lost.
        /// The stale entry is replaced, so it hides nothing after it.
        pub stale_calls: u64,
        /// An allocation neither table had room for (`LIVE` and
        /// `SITE_TOTALS` full): counted in `allocs` only.
        pub both_maps_full: u64,
        /// Frees of addresses memprof never saw allocated (made before attach, or lost).
        pub unknown_frees: u64,
        /// Allocations whose return the probes saw (recorded or not): each
        /// one is either fully recorded or in exactly one of
        /// `live_map_full`, `sites_map_full`, `both_maps_full`.
        pub allocs: u64,
        /// Frees seen (known or unknown).
        pub frees: u64,
        /// Failed allocations (NULL / MAP_FAILED returned).
        pub failed_allocs: u64,
        /// Allocation calls whose stack the DWARF unwinder could not follow
        /// to the end (one per call, not per distinct stack).
        pub truncated_stacks: u64,
        /// GC collections whose end of marking the probe saw.
        pub gc_collections: u64,
        /// Of those, collections whose collecting thread memprof could not hold
        /// for the mark-bit pass (not traced): not judged.
        pub gc_not_held: u64,
        /// GC events the ring buffer had no room for: an allocation missing
        /// from userspace's copy of the GC objects (counted in its site's
        /// totals only, never live nor judged), or a `GC_free` not seen.
        pub gc_events_lost: u64,
        /// Allocation calls whose DWARF stack had frames folded away
        /// (recursion: a function one of the last few kept frames had).
        pub folded_stacks: u64,
        /// Allocation calls whose stack had no room in the stack table
        /// (`--max-stacks`): recorded under their innermost
        /// [`SHORT_FRAMES`] frames in the short-stack table, marked
        /// truncated. Not a loss: attribution is coarser.
        pub stacks_shortened: u64,
        /// Allocation calls whose stack had no room in the stack table nor
        /// in the short-stack table: recorded under their caller alone
        /// ([`CALLER_ONLY`]). Not a loss: attribution is coarser.
        pub stacks_degraded: u64,
        /// Allocations whose site had no room in the site table
        /// (`--max-sites`): recorded in their kind's overflow site
        /// ([`SITES_OVERFLOW`]), totals exact, stack unknown.
        pub sites_overflowed: u64,
        /// Entries added to the stack table (DWARF) and the site table: how
        /// full they are.
        pub stacks_stored: u64,
        pub sites_stored: u64,
        /// Allocation calls not followed because sampling skipped them
        /// (`--sample-bytes`): not a loss, the reports scale the sampled
        /// ones. Includes calls made inside another allocator call (a
        /// `realloc(NULL, n)` calling `malloc`): sampling draws first.
        pub unsampled_allocs: u64,
        /// Allocation calls whose return the kernel probed: every call with
        /// the pair of programs; with a uprobe session (sampling), only
        /// those the entry followed.
        pub returns_probed: u64,
        /// Allocations recorded at their entry, their result read from the
        /// thread's cache ([`Predict`](crate::Predict)): no return probed.
        pub predicted: u64,
        /// Predictions checked against the return (the first ones, then
        /// one in [`PREDICT_CHECK_EVERY`](crate::PREDICT_CHECK_EVERY)).
        pub predictions_checked: u64,
        /// Of those, wrong: that predictor is then off for the session.
        pub predictions_wrong: u64,
        /// `--gc-sampling refill`: free-list refills recorded, each a sample
        /// standing for the objects of the list (counted in `allocs`).
        pub refills: u64,
        /// GC objects the kernel's table of objects to judge
        /// ([`config::GC_VERDICTS`]) had no room for: never judged, they
        /// count as live until freed or their address is reused.
        pub gc_unjudged: u64,
        /// Verdicts the kernel could not reach (the collector's memory
        /// unreadable, or a block index chain longer than it follows): the
        /// object stays live until the next collection.
        pub gc_verdicts_failed: u64,
        /// `attach --all`: allocations of processes that got no index
        /// (the process table full, or every index given): not followed.
        pub processes_not_followed: u64,
    }
}

/// Symbol names the eBPF object exports for its programs, used by userspace
/// to find and attach them.
pub mod programs {
    /// The entry of every allocating function: the attach cookie says how
    /// to read its arguments ([`cookie`](super::cookie)). One program, so
    /// the verifier walks the unwinder once, not once per layout (~0.2 s each).
    pub const ALLOC_ENTER: &str = "alloc_enter";
    pub const ALLOC_EXIT: &str = "alloc_exit";
    /// Both in one program, a uprobe session (Linux 6.13): its entry says
    /// whether the return runs at all. Preferred where the kernel has it.
    pub const ALLOC_SESSION: &str = "alloc_session";
    pub const FREE_ENTER: &str = "free_enter";
    pub const MUNMAP_ENTER: &str = "munmap_enter";
    /// Does nothing: `cargo xtask bench` uses it to measure the bare probe cost.
    pub const EMPTY: &str = "empty_probe";
    pub const EMPTY_RET: &str = "empty_retprobe";
    /// On the dynamic linker's `_dl_debug_state`: libraries were (un)loaded.
    pub const DL_DEBUG_STATE: &str = "dl_debug_state";
    /// On every `GC_gc_no++` of the Boehm GC: a collection finished marking.
    pub const GC_COLLECTION: &str = "gc_collection";
    /// Raw tracepoint `sched_process_exit`: a thread's `PENDING` slot goes.
    pub const THREAD_EXIT: &str = "thread_exit";
    /// Raw tracepoint `sched_process_exec` (`attach --all`): the process's
    /// index is done.
    pub const PROCESS_EXEC: &str = "process_exec";
}

/// The number the kernel programs call `bpf_session_is_return()` by: a
/// helper call with this number (no helper has it) that userspace rewrites
/// into the kfunc call, with the running kernel's BTF id for it.
pub const SESSION_IS_RETURN: u32 = 0x0bad_5e55;

/// Map names in the eBPF object.
pub mod maps {
    pub const PENDING: &str = "PENDING";
    pub const LIVE: &str = "LIVE";
    pub const SITE_TOTALS: &str = "SITE_TOTALS";
    /// Per kind, the totals of the sites `SITE_TOTALS` had no room for.
    pub const OVERFLOW_TOTALS: &str = "OVERFLOW_TOTALS";
    /// `SAMPLE_QUANTILES` distances between sample points, bytes.
    pub const SAMPLE_DISTANCES: &str = "SAMPLE_DISTANCES";
    pub const STACKS: &str = "STACKS";
    pub const COUNTERS: &str = "COUNTERS";
    /// One `u32`: 1 while recording. Set to 0 to stop recording at once
    /// (detaching uprobes takes a grace period each).
    pub const ENABLED: &str = "ENABLED";
    pub const DWARF_STACKS: &str = "DWARF_STACKS";
    /// Stacks cut to their innermost `SHORT_FRAMES` frames, for when
    /// `DWARF_STACKS` is full.
    pub const SHORT_STACKS: &str = "SHORT_STACKS";
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const MODULE_RANGES: &str = "MODULE_RANGES";
    /// `u32` settings indexed by [`config`](super::config).
    pub const CONFIG: &str = "CONFIG";
    /// One `u64`: collections seen so far (the probe on `GC_gc_no++` counts).
    pub const GC_EPOCH: &str = "GC_EPOCH";
    /// Threads (tid → 1) memprof traces: only those can be held at a collection.
    pub const TRACED: &str = "TRACED";
    /// tid → epoch: the thread is being stopped at the end of that
    /// collection's marking for the mark-bit pass (removed by userspace).
    pub const HELD: &str = "HELD";
    /// Ring buffer of [`GcEvent`](super::GcEvent)s.
    pub const GC_EVENTS: &str = "GC_EVENTS";
    /// How allocators' results are read at their entry ([`Predict`](crate::Predict)).
    pub const PREDICT: &str = "PREDICT";
    /// [`Refill`](super::Refill) settings, one entry.
    pub const REFILL: &str = "REFILL";
    /// [`KernelMarks`](super::KernelMarks), one entry.
    pub const GC_MARKS: &str = "GC_MARKS";

    /// Per-CPU [`KindLive`](super::KindLive): what `LIVE` holds, per kind.
    pub const LIVE_BY_KIND: &str = "LIVE_BY_KIND";
    /// `attach --all`: tgid → its index ([`host`](super::host)); written
    /// by the kernel only.
    pub const PROCESSES: &str = "PROCESSES";
    /// `attach --all`: index → its module table, packed by
    /// [`module_table::pack`](super::module_table::pack) (0: none yet);
    /// written by userspace.
    pub const PROCESS_MODULES: &str = "PROCESS_MODULES";
    /// `attach --all`: one `u64`, the next process index.
    pub const PROCESS_COUNT: &str = "PROCESS_COUNT";
    /// `attach --all`: ring of [`HostEvent`](super::HostEvent)s.
    pub const HOST_EVENTS: &str = "HOST_EVENTS";
}

/// Names of the load-time constants of the eBPF object (`Global`s set with
/// `EbpfLoader::override_global`): the verifier sees their values and drops
/// the paths they turn off.
pub mod globals {
    /// `u32`, 1: fold recursion in DWARF stacks (default), 0: keep every frame.
    pub const FOLD_RECURSION: &str = "FOLD_RECURSION";
    /// `u32`, 1: unwind with the CFI tables (`UNWIND_ROWS`), 0: frame pointers.
    pub const UNWIND_DWARF: &str = "UNWIND_DWARF";
    /// `u32`, 1: sample allocations (`--sample-bytes`, distances in
    /// `SAMPLE_DISTANCES`), 0: follow every one (default).
    pub const SAMPLING: &str = "SAMPLING";
    /// `u32`, 1: Boehm GC allocations are sampled at the collector's refills
    /// (`--gc-sampling refill`): the GC functions probed are followed
    /// whatever `SAMPLING` draws (it samples the others by bytes).
    pub const GC_REFILL: &str = "GC_REFILL";
    /// `u32`, 1: `attach --all`: the probes sit on files, for every
    /// process; state is kept per process ([`host`](super::host)).
    pub const HOST: &str = "HOST";
    /// `u32`s, offsets in the running kernel's `task_struct` (from its
    /// BTF), for `attach --all`'s process events: `real_parent`, `tgid`,
    /// `exit_code`.
    pub const TASK_REAL_PARENT: &str = "TASK_REAL_PARENT";
    pub const TASK_TGID: &str = "TASK_TGID";
    pub const TASK_EXIT_CODE: &str = "TASK_EXIT_CODE";
}

/// `attach --all`: one load of the programs for every process. Each
/// process that allocates gets an index, in the kernel, at its first
/// allocation followed; its live blocks are keyed by the index and the
/// address ([`live_key`](host::live_key)), its sites carry it
/// ([`AllocSite::process`]), its unwinder table is its own segment of
/// `MODULE_RANGES` (`PROCESS_MODULES`).
pub mod host {
    /// User addresses are below 2^47 (4-level paging): the index goes above.
    pub const INDEX_SHIFT: u32 = 47;
    /// Indexes a session can give (the ones above are counted, not followed).
    pub const MAX_INDEX: u32 = 1 << (64 - INDEX_SHIFT);
    /// The index of a process memprof does not follow (memprof itself).
    pub const IGNORED: u32 = u32::MAX;

    /// The `LIVE` key of the block at `addr` of process `index`.
    #[inline(always)]
    pub const fn live_key(addr: u64, index: u32) -> u64 {
        addr | (index as u64) << INDEX_SHIFT
    }

    /// `(index, addr)` back from a [`live_key`].
    pub const fn split(key: u64) -> (u32, u64) {
        ((key >> INDEX_SHIFT) as u32, key & ((1 << INDEX_SHIFT) - 1))
    }

    /// [`HostEvent::op`]: the process's first allocation followed (its
    /// index is new); `comm` is its name then.
    pub const NEW: u8 = 0;
    /// The process exited (its main thread did): `exit_code` is the
    /// kernel's (`wait` status).
    pub const EXIT: u8 = 1;
    /// The dynamic linker changed the process's libraries.
    pub const LIBRARIES: u8 = 2;
    /// The process `exec`ed: the index it had is done.
    pub const EXEC: u8 = 3;
}

/// A change to the processes of `attach --all` (the `HOST_EVENTS` ring).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HostEvent {
    /// `bpf_ktime_get_ns()`.
    pub time_ns: u64,
    pub tgid: u32,
    pub index: u32,
    /// Its parent's tgid ([`host::NEW`]).
    pub ppid: u32,
    /// [`host::EXIT`]: the wait status.
    pub exit_code: u32,
    pub comm: [u8; 16],
    /// One of [`host`]'s event codes.
    pub op: u8,
    pub _pad: [u8; 7],
}

/// Indexes into the `CONFIG` array.
pub mod config {
    /// Unused (was the unwinder, now [`globals::UNWIND_DWARF`](super::globals::UNWIND_DWARF)).
    pub const UNUSED_0: u32 = 0;
    /// Which modules the `MODULE_RANGES` table holds, packed by
    /// [`module_table::pack`](super::module_table::pack).
    pub const MODULE_COUNT: u32 = 1;
    /// 1: the main thread is traced by memprof (`run`): signal it when the
    /// dynamic linker has loaded libraries, so their ranges are known before
    /// their code runs.
    pub const SIGNAL_ON_DLOPEN: u32 = 2;
    /// Set to 1 by the kernel when it sent that signal; cleared by userspace.
    pub const DLOPEN_SIGNALLED: u32 = 3;
    /// 1: at the end of each collection's marking, stop the collecting
    /// thread (if traced) with [`HOLD_SIGNAL`](super::HOLD_SIGNAL) for the mark-bit pass.
    pub const GC_HOLD: u32 = 4;
    /// 1: userspace keeps the copy of the GC objects: GC allocations and
    /// frees go to the `GC_EVENTS` ring buffer only, not to `LIVE`. Set
    /// before any probe is attached, never cleared during a session.
    pub const GC_COPY: u32 = 5;
    /// 1: the kernel judges the GC objects of the copy by the collector's
    /// mark bits itself, at each collection's end of marking
    /// (`--gc-sampling refill`: few objects, see [`KernelMarks`]), and
    /// streams its verdicts; no hold is needed for them. Set before any
    /// probe is attached, never cleared during a session.
    pub const GC_VERDICTS: u32 = 6;
    pub const COUNT: u32 = 7;
}

/// The signal that stops a collecting thread for the mark-bit pass: SIGURG,
/// ignored by default, so if it ever reached the program (memprof killed
/// in between) nothing would happen. memprof, tracing the thread, takes it.
pub const HOLD_SIGNAL: u32 = signal::SIGURG;

/// The signal that stops the traced main thread when the dynamic linker
/// has loaded libraries (`run`): memprof, tracing it, takes it. The hold
/// signal too (SIGURG, ignored by default), never SIGTRAP: one left pending
/// when memprof stops or dies must not kill the program. The tracer tells
/// the two apart with the kernel's flags (`DLOPEN_SIGNALLED`, `HELD`).
pub const LIBRARY_LOAD_SIGNAL: u32 = HOLD_SIGNAL;

/// Linux signal numbers (x86-64) the kernel programs send; the eBPF side
/// has no libc.
pub mod signal {
    pub const SIGTRAP: u32 = 5;
    pub const SIGURG: u32 = 23;
}

/// Linux errno values the kernel programs test for (BPF helpers return
/// them negated).
pub mod errno {
    /// The key is already in the map (`BPF_NOEXIST` insert).
    pub const EEXIST: i32 = 17;
}

/// The layout of the `MODULE_RANGES` table, which userspace fills and the
/// kernel unwinder binary-searches for the module of each return address.
///
/// The table is two halves of [`SLOTS`](module_table::SLOTS) entries. Userspace writes the half
/// not in use, then switches with one write of `config::MODULE_COUNT`
/// ([`pack`](module_table::pack)), so a probe never searches a half-written table.
pub mod module_table {
    /// Entries in each half: a power of two, so the count is bounded by a
    /// mask ([`count`]).
    pub const SLOTS: u32 = 128;
    /// Most modules a half holds (the mask of a count).
    pub const MAX_MODULES: u32 = SLOTS - 1;
    /// Entries of the whole map.
    pub const ENTRIES: u32 = 2 * SLOTS;
    /// Halvings that narrow [`SLOTS`] entries to one (log2).
    pub const MODULE_SEARCH_STEPS: u32 = SLOTS.trailing_zeros();
    /// Halvings of the search of a module's CFI rows: enough for modules
    /// of fewer than 2^26 rows.
    pub const ROW_SEARCH_STEPS: u32 = 26;
    /// The bits of a packed value that say which segment of [`SLOTS`]
    /// entries is in use: one of two halves for one process, one per
    /// process under `attach --all` ([`SEGMENTS`]).
    const HALF_SHIFT: u32 = 8;
    const SEGMENT_BITS: u32 = 11;
    /// Segments the map can have (`attach --all`: processes with a table at once).
    pub const SEGMENTS: u32 = 1 << SEGMENT_BITS;

    // A count is a mask of SLOTS - 1, below the half bit, and the module
    // search narrows it to one entry.
    const _: () = assert!(SLOTS.is_power_of_two() && MAX_MODULES < 1 << HALF_SHIFT);
    const _: () = assert!(MAX_MODULES >> MODULE_SEARCH_STEPS == 0);

    /// The bits above the segment: which table this is, counted from the
    /// first (the kernel's row cache is valid for one table only).
    const GENERATION_SHIFT: u32 = HALF_SHIFT + SEGMENT_BITS;

    /// The value naming a table of `count` modules in segment `half` (0 or
    /// 1 for one process's two halves; any below [`SEGMENTS`] under
    /// `attach --all`), the `generation`th table written (wraps around).
    pub const fn pack(count: u32, half: u32, generation: u32) -> u32 {
        count | half << HALF_SHIFT | generation << GENERATION_SHIFT
    }

    /// Modules in use, from a packed value. A mask, not `min()`: `min()`
    /// would give the verifier a constant bound, and with constant indices
    /// it cannot prune the binary searches.
    #[inline(always)]
    pub const fn count(packed: u32) -> u32 {
        packed & (SLOTS - 1)
    }

    /// The first entry of the segment in use, from a packed value.
    #[inline(always)]
    pub const fn first_slot(packed: u32) -> u32 {
        (packed >> HALF_SHIFT & (SEGMENTS - 1)) * SLOTS
    }

    /// Entry `i` of half `half`.
    pub const fn slot(half: u32, i: u32) -> u32 {
        half * SLOTS + i
    }
}

/// How to find the canonical frame address (CFA) at a pc.
pub mod cfa {
    pub const RSP: u8 = 0;
    pub const RBP: u8 = 1;
    /// The outermost frame (return address undefined): the stack ends here.
    pub const END: u8 = 2;
    /// No rule memprof can follow (expressions, gaps between functions).
    pub const UNKNOWN: u8 = 3;
}

/// Slots of the unwinder's cache of rows by return address (a
/// power of two).
pub const ROW_CACHE_SLOTS: u32 = 1024;

/// One row of a compact CFI table: from `pc` (module-relative) until the
/// next row, CFA = `cfa_reg` + `cfa_offset`; the return address is at
/// CFA - 8; %rbp is saved at CFA + `rbp_offset` when `rbp_saved` is 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    pub cfa_offset: i32,
    pub rbp_offset: i16,
    pub cfa_reg: u8,
    pub rbp_saved: u8,
    /// Start of the function the row belongs to (its FDE), module-relative:
    /// frames of one function are recognized by it (recursion folding).
    /// 0 for gaps between functions.
    pub func: u32,
}

/// Where a module's code is mapped in the target and where its rows are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleRange {
    pub start: u64,
    pub end: u64,
    /// Runtime address minus the module's own (ELF) address.
    pub bias: u64,
    pub row_start: u32,
    pub row_count: u32,
}

/// A stack captured by the DWARF unwinder: return addresses, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DwarfStack {
    pub len: u32,
    /// 1 if the unwinder stopped before the outermost frame.
    pub truncated: u32,
    /// 1 if frames were left out because their function was one of the
    /// last [`FOLD_WINDOW`] kept (recursion folded into its innermost
    /// occurrence). Part of the stack's identity.
    pub folded: u32,
    pub _pad: u32,
    pub frames: [u64; MAX_FRAMES],
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data, every bit pattern valid, padding explicit.
    unsafe impl aya::Pod for super::AllocSite {}
    unsafe impl aya::Pod for super::PendingCall {}
    unsafe impl aya::Pod for super::LiveAlloc {}
    unsafe impl aya::Pod for super::GcEvent {}
    unsafe impl aya::Pod for super::KindLive {}
    unsafe impl aya::Pod for super::SiteTotals {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::ModuleRange {}
    unsafe impl aya::Pod for super::DwarfStack {}
    unsafe impl aya::Pod for super::Predict {}
    unsafe impl aya::Pod for super::HostEvent {}
    unsafe impl aya::Pod for super::KernelMarks {}
    unsafe impl aya::Pod for super::Refill {}
    unsafe impl aya::Pod for super::KernelCounters {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_counter_is_summed() {
        for i in 0..KernelCounters::COUNT {
            let mut one = KernelCounters::default();
            *one.fields_mut()[i] = 1;
            let mut sum = one;
            sum.add(&one);
            let summed: Vec<u64> = sum.fields_mut().into_iter().map(|v| *v).collect();
            let mut expected = vec![0; KernelCounters::COUNT];
            expected[i] = 2;
            assert_eq!(summed, expected, "counter {}", KernelCounters::NAMES[i]);
        }
        // Plain u64 fields, nothing else: the map value is exactly the counters.
        assert_eq!(
            core::mem::size_of::<KernelCounters>(),
            8 * KernelCounters::COUNT
        );
    }

    #[test]
    fn every_site_total_is_summed() {
        let one = SiteTotals {
            count: 1,
            bytes: 2,
            died: 3,
            lifetime_ns: 4,
            buckets: [5, 6, 7, 8, 9, 10, 11, 12],
            reused: 13,
            reused_bytes: 14,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(sum.count, 2);
        assert_eq!(sum.bytes, 4);
        assert_eq!(sum.died, 6);
        assert_eq!(sum.lifetime_ns, 8);
        assert_eq!(sum.buckets, [10, 12, 14, 16, 18, 20, 22, 24]);
        assert_eq!((sum.reused, sum.reused_bytes), (26, 28));
    }

    #[test]
    fn kind_bytes_round_trip_and_unknown_is_an_error() {
        for kind in AllocKind::ALL {
            assert_eq!(AllocKind::try_from(kind as u8), Ok(kind));
        }
        assert_eq!(AllocKind::try_from(4), Err(UnknownKind(4)));
    }

    #[test]
    fn module_table_packing() {
        assert_eq!(module_table::MODULE_SEARCH_STEPS, 7);
        for half in [0, 1] {
            let packed = module_table::pack(module_table::MAX_MODULES, half, u32::MAX);
            assert_eq!(module_table::count(packed), module_table::MAX_MODULES);
            assert_eq!(
                module_table::first_slot(packed),
                module_table::slot(half, 0)
            );
            assert!(module_table::slot(half, module_table::MAX_MODULES) < module_table::ENTRIES);
        }
    }
}
