//! The libc allocator family (glibc, musl, or any library that exports the
//! same functions): the heap (`malloc` and friends) and `mmap`/`munmap` as a
//! separate kind.
//!
//! Every function but `malloc` and `free` is optional: not every libc has
//! `reallocarray`, `pvalloc` or `valloc`.
use memprof_common::{programs as p, AllocKind};

use super::{AllocFn, ArgReg::*};

const fn alloc(
    symbol: &'static str,
    entry_program: &'static str,
    kind: AllocKind,
    args: &'static [super::ArgReg],
    optional: bool,
) -> AllocFn {
    AllocFn {
        symbol,
        entry_program,
        exit_program: Some(p::ALLOC_EXIT),
        kind,
        args,
        optional,
    }
}

const fn release(
    symbol: &'static str,
    entry_program: &'static str,
    kind: AllocKind,
    optional: bool,
) -> AllocFn {
    AllocFn {
        symbol,
        entry_program,
        exit_program: None,
        kind,
        args: &[Rdi],
        optional,
    }
}

use AllocKind::{Libc, Mmap};

pub static LIBC: &[AllocFn] = &[
    alloc("malloc", p::ALLOC_ENTER, Libc, &[Rdi], false),
    alloc("calloc", p::CALLOC_ENTER, Libc, &[Rdi, Rsi], true),
    alloc("realloc", p::REALLOC_ENTER, Libc, &[Rdi, Rsi], true),
    alloc(
        "reallocarray",
        p::REALLOCARRAY_ENTER,
        Libc,
        &[Rdi, Rsi, Rdx],
        true,
    ),
    alloc(
        "posix_memalign",
        p::POSIX_MEMALIGN_ENTER,
        Libc,
        &[Rdi, Rdx],
        true,
    ),
    alloc("aligned_alloc", p::MEMALIGN_ENTER, Libc, &[Rsi], true),
    alloc("memalign", p::MEMALIGN_ENTER, Libc, &[Rsi], true),
    alloc("valloc", p::ALLOC_ENTER, Libc, &[Rdi], true),
    alloc("pvalloc", p::ALLOC_ENTER, Libc, &[Rdi], true),
    release("free", p::FREE_ENTER, Libc, false),
    alloc("mmap", p::MMAP_ENTER, Mmap, &[Rsi], true),
    release("munmap", p::MUNMAP_ENTER, Mmap, true),
];
