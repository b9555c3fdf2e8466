//! Weighing a Boehm free-list refill (`--gc-sampling refill`).

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
