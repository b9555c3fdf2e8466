//! The DWARF unwinder's contract: its limits, the CFI rows and module
//! ranges userspace writes, the stacks it stores.

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

/// The layout of the `MODULE_RANGES` table, which userspace fills and the
/// kernel unwinder binary-searches for the module of each return address.
///
/// The table is two halves of [`SLOTS`](module_table::SLOTS) entries. Userspace writes the half
/// not in use, then switches with one write of the value in the
/// [`MODULE_TABLE`](crate::maps::MODULE_TABLE) map ([`pack`](module_table::pack)),
/// so a probe never searches a half-written table.
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

    /// The generation of a packed value.
    #[inline(always)]
    pub const fn generation(packed: u32) -> u32 {
        packed >> GENERATION_SHIFT
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

#[cfg(test)]
mod tests {
    use super::*;

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

/// Bytes of the target's stack a [`DeferredStack`] carries: the rest of
/// the page of `sp`, then two more pages (what a stack holds above the
/// allocator's callers, to `main`, in most programs).
pub const DEFERRED_BYTES: usize = 3 * 4096;

/// `attach --all`: a stack the kernel stopped unwinding at a return
/// address in no module it had rows for (a file memprof had not read
/// yet, in a process that may end before it does): the state at that
/// frame and a copy of the stack above it, unwound in userspace once the
/// file's rows exist (`DEFERRED_STACKS`). Sent once per stack key.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeferredStack {
    pub index: u32,
    pub tgid: u32,
    /// The key the stack was stored under (its frames end with `pc`).
    pub key: u64,
    /// The frame the unwinder stopped at: its return address, and the
    /// CFA and `%rbp` of its callee's frame.
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of [`Self::bytes`] copied from `sp` up.
    pub len: u64,
    pub bytes: [u8; DEFERRED_BYTES],
}
