//! memprof's own memory: what it gives back to the system, and when.
//!
//! Rust's allocations go to mimalloc (the `#[global_allocator]` in
//! `main.rs`), not to libc's malloc: `attach --all` and `run`'s family
//! probe libc's malloc for every process of the machine, memprof's own
//! included, where each allocation trapped into the kernel (under
//! `crystal build`, memprof's time 3.4 s user + 8.7 s system with libc's
//! malloc, 2.0 + 4.6 s with mimalloc). What still calls libc's malloc (C
//! code memprof links) keeps the policy below.
//!
//! Its big arrays (the copy of the GC objects, the stack tables read at
//! the end) grow and shrink by tens of megabytes. glibc's default raises
//! its mmap threshold each time such a block is freed, after which blocks
//! of up to 32 MiB come from the heap and stay resident when freed; a fixed
//! threshold keeps big blocks as mappings that go back on free.

/// Blocks from this size up are mappings of their own (given back on free).
const MMAP_THRESHOLD: i32 = 1 << 20;

/// One heap for all of memprof's threads: a thread's own arena keeps what
/// it freed (the GC judge's and the feeder's vectors) out of the others'
/// reach. Their allocations are few and large, so the shared lock costs
/// nothing measurable; the peak drops (the Crystal compiler under `run`:
/// 149.4 → 144.5 MB).
const ARENAS: i32 = 1;

/// Sets the allocator's policy: once, at start.
pub fn configure() {
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// A second heap, for a thread that must never wait for another's lock
/// (`attach --all`'s event reader: the main loop allocates a lot while
/// finalizing a process, and a reader stalled milliseconds misses a
/// short-lived process). The next thread that allocates for the first
/// time gets it.
pub fn allow_second_arena() {
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS + 1);
    }
}

/// Gives the heap's free memory back after a big phase ends.
pub fn trim() {
    // SAFETY: both only release free memory.
    unsafe {
        libmimalloc_sys::mi_collect(true);
        libc::malloc_trim(0);
    }
}
