//! memprof's own memory: what it gives back to the system, and when.
//!
//! Its big arrays (the copy of the GC objects, the stack tables read at
//! the end) grow and shrink by tens of megabytes. glibc's default raises
//! its mmap threshold each time such a block is freed, after which blocks
//! of up to 32 MiB come from the heap and stay resident when freed; a fixed
//! threshold keeps big blocks as mappings that go back on free.

/// Blocks from this size up are mappings of their own (given back on free).
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Sets the allocator's policy: once, at start.
pub fn configure() {
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Gives the heap's free memory back after a big phase ends.
pub fn trim() {
    // SAFETY: malloc_trim only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
