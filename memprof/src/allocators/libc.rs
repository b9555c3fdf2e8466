//! The libc allocator family (glibc, musl, or any library that exports the
//! same functions): the heap (`malloc` and friends) and `mmap`/`munmap` as a
//! separate kind.
//!
//! Every function but `malloc` and `free` is optional: not every libc has
//! `reallocarray`, `pvalloc` or `valloc`.
use memprof_common::{programs as p, AllocKind};

use super::{AllocFn, ArgReg::*};

use AllocKind::{Libc, Mmap};

pub static LIBC: &[AllocFn] = &[
    AllocFn::alloc("malloc", p::ALLOC_ENTER, Libc, &[Rdi], false),
    AllocFn::alloc("calloc", p::CALLOC_ENTER, Libc, &[Rdi, Rsi], true),
    AllocFn::alloc("realloc", p::REALLOC_ENTER, Libc, &[Rdi, Rsi], true),
    AllocFn::alloc(
        "reallocarray",
        p::REALLOCARRAY_ENTER,
        Libc,
        &[Rdi, Rsi, Rdx],
        true,
    ),
    AllocFn::alloc(
        "posix_memalign",
        p::POSIX_MEMALIGN_ENTER,
        Libc,
        &[Rdi, Rdx],
        true,
    ),
    AllocFn::alloc("aligned_alloc", p::MEMALIGN_ENTER, Libc, &[Rsi], true),
    AllocFn::alloc("memalign", p::MEMALIGN_ENTER, Libc, &[Rsi], true),
    AllocFn::alloc("valloc", p::ALLOC_ENTER, Libc, &[Rdi], true),
    AllocFn::alloc("pvalloc", p::ALLOC_ENTER, Libc, &[Rdi], true),
    AllocFn::release("free", p::FREE_ENTER, Libc, false),
    AllocFn::alloc("mmap", p::MMAP_ENTER, Mmap, &[Rsi], true),
    AllocFn::release("munmap", p::MUNMAP_ENTER, Mmap, true),
];
