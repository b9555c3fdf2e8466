//! The Boehm GC (bdwgc), as Crystal uses it: `GC_malloc` (scanned objects,
//! kind `gc`), `GC_malloc_atomic` (pointer-free buffers, `gc_atomic`),
//! `GC_realloc`, `GC_free`, and the rarer variants. Found in `libgc.so.1`
//! (Debian's Crystal) or in the executable itself (Crystal release builds link
//! libgc statically, with `-rdynamic`, so the symbols survive `strip`).
//!
//! `GC_realloc` (probed unless sampling at refills: [`BOEHM_REFILL`])
//! calls `GC_malloc_kind`/`GC_free` and may tail-jump to
//! `GC_malloc`: the kernel counts a call made inside another allocator call
//! once (the outer one), and `GC_malloc_kind` itself is never probed.
//! A realloc'd block keeps the kind of the block it replaces.
//!
//! The collector never calls `GC_free` for what it collects: until mark bits
//! are read, a GC block counts as live until `GC_free` or until its address is
//! handed out again (the kernel's live table replaces the entry).
use memprof_common::{layout as l, programs as p, AllocKind};

use super::alloc_fn::{AllocFn, ArgReg::*};

use AllocKind::{Gc, GcAtomic};

/// A table of Boehm functions: `entries`, then what every mode probes
/// (the rarer variants, `GC_free`).
macro_rules! boehm_table {
    ($($entry:expr),* $(,)?) => {
        &[
            $($entry,)*
            AllocFn::alloc("GC_malloc_uncollectable", l::SIZE, Gc, &[Rdi], true),
            AllocFn::alloc("GC_malloc_ignore_off_page", l::SIZE, Gc, &[Rdi], true),
            AllocFn::alloc(
                "GC_malloc_atomic_ignore_off_page",
                l::SIZE,
                GcAtomic,
                &[Rdi],
                true,
            ),
            AllocFn {
                symbol: "GC_free",
                entry_program: p::FREE_ENTER,
                exit_program: None,
                layout: 0,
                kind: Gc,
                args: &[Rdi],
                optional: false,
            },
        ]
    };
}

/// Every allocation: the thread-local fast path's entry points, and
/// `GC_realloc`.
pub static BOEHM: &[AllocFn] = boehm_table![
    AllocFn::alloc("GC_malloc", l::GC_THREAD_LOCAL, Gc, &[Rdi], false),
    AllocFn::alloc(
        "GC_malloc_atomic",
        l::GC_THREAD_LOCAL,
        GcAtomic,
        &[Rdi],
        true,
    ),
    AllocFn::alloc("GC_realloc", l::REALLOC, Gc, &[Rdi, Rsi], true),
];

/// `--gc-sampling refill` ([`crate::gc::refill`]): the thread-local fast path
/// (`GC_malloc`, `GC_malloc_atomic`) is not probed; what it does not serve
/// is. `GC_malloc_kind` refills a thread's free list with
/// `GC_generic_malloc_many` (a sample standing for the list) and hands
/// every other request (a thread's first few of a size, large objects) to
/// `GC_malloc_kind_global` (exact). `GC_realloc` is not probed: the block
/// it moves to comes from `GC_malloc_kind` like any other (sampled the
/// same way), and the old one goes through `GC_free`. Probed, every call
/// paid its stack and return: a Crystal program building strings
/// (`String::Builder#to_s` trims with it) ran 45× slower.
pub static BOEHM_REFILL: &[AllocFn] = boehm_table![
    AllocFn::alloc(
        "GC_malloc_kind_global",
        l::GC_KIND_GLOBAL,
        Gc,
        &[Rdi, Rsi],
        false,
    ),
    AllocFn::alloc(
        "GC_generic_malloc_many",
        l::GC_REFILL,
        Gc,
        &[Rdi, Rsi, Rdx],
        false,
    ),
];
