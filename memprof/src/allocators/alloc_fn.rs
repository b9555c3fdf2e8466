//! One allocator function memprof knows how to probe ([`AllocFn`]): the
//! row of the backend tables ([`super::libc`], [`super::boehm`]).
use memprof_common::AllocKind;

/// An x86-64 System V argument register, as the entry probe reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgReg {
    Rdi,
    Rsi,
    Rdx,
}

/// One allocator function memprof knows how to probe.
#[derive(Debug)]
pub struct AllocFn {
    pub symbol: &'static str,
    /// eBPF program run at entry (see `memprof_common::programs`).
    pub entry_program: &'static str,
    /// eBPF program run at return, for functions that return a block.
    pub exit_program: Option<&'static str>,
    pub kind: AllocKind,
    /// How the entry program reads the arguments
    /// ([`memprof_common::layout`]; allocating functions only).
    pub layout: u8,
    /// Registers the entry program reads.
    pub args: &'static [ArgReg],
    /// A run may lack this function without being wrong (missing ones are noted, not fatal).
    pub optional: bool,
}

impl AllocFn {
    /// A function that returns a new block (probed at entry and return).
    pub const fn alloc(
        symbol: &'static str,
        layout: u8,
        kind: AllocKind,
        args: &'static [ArgReg],
        optional: bool,
    ) -> AllocFn {
        AllocFn {
            symbol,
            entry_program: memprof_common::programs::ALLOC_ENTER,
            exit_program: Some(memprof_common::programs::ALLOC_EXIT),
            layout,
            kind,
            args,
            optional,
        }
    }

    /// A function that releases the block its first argument points to.
    pub const fn release(
        symbol: &'static str,
        entry_program: &'static str,
        kind: AllocKind,
        optional: bool,
    ) -> AllocFn {
        AllocFn {
            symbol,
            entry_program,
            exit_program: None,
            layout: 0,
            kind,
            args: &[ArgReg::Rdi],
            optional,
        }
    }
}
