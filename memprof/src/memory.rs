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

/// mimalloc's options (the order of `mi_option_t` in the mimalloc 3 that
/// `libmimalloc-sys` 0.1.49 builds; checked by a test against their
/// documented defaults).
mod mi_option {
    /// The delay before freed memory is given back, in ms (1000).
    pub const PURGE_DELAY: i32 = 15;
    /// Whether arenas are committed at once (2: on overcommit systems).
    pub const ARENA_EAGER_COMMIT: i32 = 4;
    /// Whether transparent huge pages are asked for (1).
    pub const ALLOW_THP: i32 = 43;
}

/// Sets the allocators' policy: once, at start. mimalloc gives freed
/// memory back at once, commits its arenas as they are used, and asks
/// for no huge pages: with its defaults, memprof's peak under `run` of
/// binary-trees 15 was 90-99 MB; so, 67-71 MB (40 MB with glibc's
/// malloc; 46 MB when the same options are set before the first
/// allocation, through `MIMALLOC_PURGE_DELAY=0
/// MIMALLOC_ARENA_EAGER_COMMIT=0` in memprof's environment).
pub fn configure() {
    // SAFETY: both only set allocator parameters.
    unsafe {
        libmimalloc_sys::mi_option_set(mi_option::PURGE_DELAY, 0);
        libmimalloc_sys::mi_option_set(mi_option::ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(mi_option::ALLOW_THP, 0);
        // mimalloc asked for huge pages on its first arena before this
        // ran (its option is read at its own start): the process's own
        // switch stops them. With them, a 2 MiB page was zeroed and kept
        // resident for the first few bytes of each new span (`memprof
        // agent` idle: 12 % of its time in `clear_page_erms` under the
        // huge-page fault, RSS 79.5 MB after 30 s).
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
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

#[cfg(test)]
mod tests {
    use super::mi_option;

    /// The option numbers name the options they mean: their defaults.
    #[test]
    fn mimalloc_options_are_the_ones_meant() {
        // SAFETY: reads only.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        assert_eq!(get(mi_option::ARENA_EAGER_COMMIT), 2);
        // (`configure` runs in the binary's `main` only.)
        assert_eq!(get(mi_option::PURGE_DELAY), 1000);
        assert_eq!(get(mi_option::ALLOW_THP), 1);
    }
}

/// memprof's resident memory now, in bytes (0 if it cannot be read):
/// the second field of `/proc/self/statm`, in pages.
pub fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    pages * page
}
