//! An allocator call: how its arguments are read (the attach cookie and
//! its layout), and the call in flight between its entry and its return.
use crate::AllocSite;
#[cfg(doc)]
use crate::{AllocKind, Predict, Refill};

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
    /// class, whose head is then the result ([`Predict`](crate::Predict)).
    pub const GC_THREAD_LOCAL: u8 = 7;
    /// glibc's `malloc(size)`: served from the thread's tcache when it has
    /// a chunk of the size's bin ([`Predict`](crate::Predict)).
    pub const MALLOC_TCACHE: u8 = 8;
    /// `GC_malloc_kind_global(size, kind)`: one object, of the collector
    /// kind in the second argument (0: pointer-free). Probed with
    /// `--gc-sampling refill`, where it is every allocation the free lists
    /// do not serve (a thread's first few of a size, and large objects).
    pub const GC_KIND_GLOBAL: u8 = 9;
    /// `GC_generic_malloc_many(lb, kind, &list)`: a thread's free list of
    /// `lb`-byte objects refilled (`--gc-sampling refill`, [`Refill`](crate::Refill)). The
    /// allocation that ran it out gets the new list's head, and stands for
    /// the objects of the list.
    pub const GC_REFILL: u8 = 10;
}

/// The attach cookie of an allocator probe: the [`AllocKind`] in the low
/// byte, the argument [`layout`] in the next.
pub mod cookie {
    use crate::AllocKind;

    pub const fn new(kind: AllocKind, layout: u8) -> u64 {
        kind as u64 | (layout as u64) << 8
    }

    /// The kind byte (an [`AllocKind`] as `u8`).
    #[inline(always)]
    pub const fn kind(cookie: u64) -> u8 {
        cookie as u8
    }

    /// The argument layout ([`layout`](crate::layout)).
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
    /// A free-list refill ([`layout::GC_REFILL`](crate::layout::GC_REFILL)):
    /// the new list's head is written to `*out_ptr`.
    pub const REFILL: u8 = 3;
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
    /// The thread's last GC object sent to userspace's copy, and the epoch
    /// it was allocated in: its first word goes with the thread's next
    /// one ([`crate::GcEvent::typed`]). Kept across the thread's calls.
    pub last_gc: u64,
    pub last_gc_epoch: u64,
    /// The thread's last `malloc`-family call that sampling skipped and
    /// that may map memory itself (a large block; any block in a thread,
    /// whose arena grows by `mmap`): its entry `sp` and return address.
    /// An `mmap` entering below that `sp` while the return address is
    /// still there is made inside it: its bytes are that call's, which
    /// was drawn already (0: none).
    pub skipped_sp: u64,
    pub skipped_ret: u64,
}

/// A clock read and what it is valid for: the jiffy (4 ms at HZ=250) and
/// the collection count it was read at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadClock {
    pub ns: u64,
    pub jiffies: u64,
    pub epoch: u64,
}

/// What an entry returns in a uprobe session: whether the kernel runs
/// the program again at the call's return (for the pair of programs,
/// ignored: the return probe runs anyway). Skipping it skips the
/// return probe's whole cost, trap and trampoline: with sampling, most
/// calls.
pub const RUN_RETURN: u32 = 0;
pub const SKIP_RETURN: u32 = 1;
