//! Reading an allocator's result at its entry, from the thread's cache.

/// How the entry of an allocator knows its result, so that its return need
/// not be probed (a uprobe session skips it): the allocator serves a small
/// request from the calling thread's cache, whose head for the request's
/// class is the result. Two predictors ([`predictor`]), each found per
/// thread through its thread-local storage (the `fs` base, from the task):
///
/// - Boehm (`GC_malloc`, `GC_malloc_atomic`; layout
///   [`layout::GC_THREAD_LOCAL`](crate::layout::GC_THREAD_LOCAL)): bdwgc's `GC_FAST_MALLOC_GRANS` hands out
///   the head of the thread's free list for the size's granules. The free
///   lists are `GC_thread_key` (a TLS variable): the TLS vector at `fs:8`,
///   libgc's block `dtv[module]` (the module id read from libgc's GOT, or
///   1 for the executable), the variable at `tls_offset` in it.
/// - glibc (`malloc`; layout [`layout::MALLOC_TCACHE`](crate::layout::MALLOC_TCACHE)): `__libc_malloc`
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
