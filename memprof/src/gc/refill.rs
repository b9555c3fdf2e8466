//! `--gc-sampling refill`: Boehm GC allocations sampled where the collector
//! refills a thread's free list, not probed one by one.
//!
//! A uprobe hit costs about a microsecond whatever its program does, and a
//! Crystal program allocates small objects in tens of nanoseconds, from the
//! calling thread's free list (`GC_malloc_kind`'s fast path). Only when a
//! list runs out does the collector refill it, with
//! `GC_generic_malloc_many(lb, kind, &list)`, about one block's worth of
//! objects (binary-trees: one refill per 72 allocations). So the fast path
//! is left alone, and:
//!
//! - a refill is a sample: the allocation that ran the list out (its stack,
//!   the collector's own frame skipped) gets the new list's head, and
//!   stands for the `N` objects of the list: the rise of the collector's
//!   `GC_bytes_allocd` over the call, over `lb` (at most the objects
//!   from the head's block start to the head: the collector builds a
//!   block's list from its end down). The sample object is tracked and
//!   judged by the mark bits like any other, so live bytes per stack are
//!   estimated from exact verdicts of the samples;
//! - what the free lists do not serve goes to `GC_malloc_kind_global`: a
//!   thread's first few objects of each size and every large object. Those
//!   are probed and exact.
//!
//! The size a sample records is what its allocation asked for: the caller
//! (`GC_malloc_kind`) keeps it in a callee-saved register across the call,
//! found here by running `GC_malloc_kind` through the symbolic explorer;
//! without it, the list's object size `lb`.
//!
//! Systematic sampling: one sample per list, so a program whose
//! allocations of one size repeat with the list's period would put every
//! sample on the same stack (see docs/how-it-works.md, "Sampling at the
//! collector's refills").

use anyhow::{anyhow, Result};
use iced_x86::Register;
use memprof_common::Refill;

use super::{heap_stats, layout};
use crate::modules::Module;
use crate::x86::explore::{explore, Hooks};
use crate::x86::regs::gpr_index;
use crate::x86::value::{Bits, Role, V};

/// Values the size search gives no role to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum NoRole {}
impl Role for NoRole {}

/// What the kernel needs to weigh refills in one libgc, found in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefillLayout {
    /// `GC_arrays` at link time, or the GOT slot holding its address.
    pub arrays: u64,
    pub arrays_in_slot: bool,
    /// Offset of `GC_bytes_allocd` in `GC_arrays`.
    pub bytes_allocd: u64,
    pub log_hblksize: u32,
    /// The register `GC_malloc_kind` keeps the requested size in across
    /// its call of `GC_generic_malloc_many`, if one does on every path.
    pub size_reg: Option<Register>,
    /// `GC_malloc_kind`'s code (link time): a refill's stack starts there.
    pub caller: Option<std::ops::Range<u64>>,
}

/// The callee-saved registers, as `memprof_common::Refill::size_reg`
/// numbers them (their order in the kernel's `pt_regs`).
const SIZE_REGS: [Register; 6] = [
    Register::R15,
    Register::R14,
    Register::R13,
    Register::R12,
    Register::RBP,
    Register::RBX,
];

/// Whether `module` (a libgc, or an executable with libgc in it) has the
/// functions refill sampling probes; the reason when not.
pub fn supported(module: &Module) -> Result<()> {
    for symbol in ["GC_generic_malloc_many", "GC_malloc_kind_global"] {
        if module.symbol(symbol).is_none() {
            return Err(anyhow!("{symbol} is not in {}", module.path().display()));
        }
    }
    Ok(())
}

impl RefillLayout {
    /// Derives the layout from `module`'s code: `GC_arrays` and
    /// `GC_bytes_allocd` from the collector's getters, the block size from
    /// the mark-bit layout, the size register from `GC_malloc_kind`.
    pub fn derive(module: &Module) -> Result<RefillLayout> {
        supported(module)?;
        let stats = heap_stats::derive(module)?;
        let bytes_allocd = stats.bytes_allocd.ok_or_else(|| {
            anyhow!(
                "GC_get_bytes_since_gc in {} does not read GC_bytes_allocd as memprof knows it",
                module.path().display()
            )
        })?;
        let marks = layout::derive(module)?;
        let (arrays, arrays_in_slot) = match stats.arrays_slot {
            Some(slot) => (slot, true),
            None => (stats.arrays, false),
        };
        Ok(RefillLayout {
            arrays,
            arrays_in_slot,
            bytes_allocd,
            log_hblksize: marks.log_hblksize,
            size_reg: size_register(module),
            caller: module
                .symbol("GC_malloc_kind")
                .map(|s| s.address..s.address + s.size.max(1)),
        })
    }

    /// The kernel's settings in a process where the module's run-time
    /// address is its link-time one plus `bias`.
    pub fn settings(&self, bias: u64) -> Refill {
        Refill {
            on: 1,
            arrays: self.arrays.wrapping_add(bias),
            arrays_in_slot: u64::from(self.arrays_in_slot),
            bytes_allocd: self.bytes_allocd,
            log_hblksize: u64::from(self.log_hblksize),
            size_reg: self
                .size_reg
                .and_then(|r| SIZE_REGS.iter().position(|&s| s == r))
                .map_or(u64::MAX, |i| i as u64),
        }
    }
}

/// The callee-saved register holding `GC_malloc_kind`'s first argument
/// (the requested bytes) at every call of `GC_generic_malloc_many` in it.
fn size_register(module: &Module) -> Option<Register> {
    let caller = module.symbol("GC_malloc_kind")?;
    let refill = module.symbol("GC_generic_malloc_many")?.address;
    struct AtRefill<'a> {
        refill: u64,
        /// `GC_malloc_kind`'s code: jumps out of it end the path.
        body: std::ops::Range<u64>,
        /// Where a PLT stub at an address jumps (its GOT slot's link-time value).
        through_plt: &'a dyn Fn(u64) -> Option<u64>,
        /// Callee-saved registers holding the argument on every call seen.
        holding: Option<Vec<Register>>,
    }
    impl Hooks for AtRefill<'_> {
        type Role = NoRole;
        fn call(&mut self, target: u64, regs: &[V<NoRole>; 16]) -> bool {
            if target == self.refill || (self.through_plt)(target) == Some(self.refill) {
                let argument = V::Bits(Bits {
                    shift: 0,
                    mask: u64::MAX,
                });
                let here: Vec<Register> = SIZE_REGS
                    .iter()
                    .copied()
                    .filter(|&r| gpr_index(r).is_some_and(|i| regs[i] == argument))
                    .collect();
                self.holding = Some(match self.holding.take() {
                    None => here,
                    Some(before) => before.into_iter().filter(|r| here.contains(r)).collect(),
                });
            }
            false // opaque: only what this function keeps matters
        }
        fn jump(&mut self, target: u64) -> bool {
            self.body.contains(&target)
        }
    }
    // A PLT stub: `jmp *slot(%rip)`.
    let through_plt = |at: u64| {
        let insn = crate::x86::decode::at(module, at)?;
        (insn.mnemonic() == iced_x86::Mnemonic::Jmp && insn.is_ip_rel_memory_operand())
            .then(|| module.slot_value(insn.ip_rel_memory_address()))
            .flatten()
    };
    let mut seen = AtRefill {
        refill,
        through_plt: &through_plt,
        body: caller.address..caller.address + caller.size.max(1),
        holding: None,
    };
    explore(module, caller.address, &mut seen);
    seen.holding?.first().copied()
}

#[cfg(test)]
/// [`RefillLayout::derive`] of the file at `path`.
pub fn derive_refill_layout(path: &std::path::Path) -> Result<RefillLayout> {
    RefillLayout::derive(&Module::open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIBGC_SO: &str = "/usr/lib/x86_64-linux-gnu/libgc.so.1";

    /// Debian's libgc 8.2.2: `GC_arrays` through its GOT slot,
    /// `GC_bytes_allocd` at +0x40, 4 KiB blocks, the size kept in `%r12`.
    #[test]
    fn debian_shared() {
        let layout = derive_refill_layout(std::path::Path::new(LIBGC_SO)).unwrap();
        assert_eq!(
            layout,
            RefillLayout {
                arrays: 0x2cf08,
                arrays_in_slot: true,
                bytes_allocd: 0x40,
                log_hblksize: 12,
                size_reg: Some(Register::R12),
                caller: Some(0x1f020..0x1f162),
            }
        );
        let settings = layout.settings(0x7f00_0000_0000);
        assert_eq!(
            (settings.arrays, settings.size_reg),
            (0x7f00_0000_0000 + 0x2cf08, 3)
        );
    }
}
