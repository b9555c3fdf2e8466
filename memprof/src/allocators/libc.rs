//! The libc allocator family (glibc, musl, or any library that exports the
//! same functions): the heap (`malloc` and friends) and `mmap`/`munmap` as a
//! separate kind.
//!
//! Every function but `malloc` and `free` is optional: not every libc has
//! `reallocarray`, `pvalloc` or `valloc`.
use memprof_common::{layout as l, programs as p, AllocKind};

use super::alloc_fn::{AllocFn, ArgReg::*};

use AllocKind::{Libc, Mmap};

pub static LIBC: &[AllocFn] = &[
    AllocFn::alloc("malloc", l::MALLOC_TCACHE, Libc, &[Rdi], false),
    AllocFn::alloc("calloc", l::CALLOC, Libc, &[Rdi, Rsi], true),
    AllocFn::alloc("realloc", l::REALLOC, Libc, &[Rdi, Rsi], true),
    AllocFn::alloc(
        "reallocarray",
        l::REALLOCARRAY,
        Libc,
        &[Rdi, Rsi, Rdx],
        true,
    ),
    AllocFn::alloc("posix_memalign", l::POSIX_MEMALIGN, Libc, &[Rdi, Rdx], true),
    AllocFn::alloc("aligned_alloc", l::MEMALIGN, Libc, &[Rsi], true),
    AllocFn::alloc("memalign", l::MEMALIGN, Libc, &[Rsi], true),
    AllocFn::alloc("valloc", l::SIZE, Libc, &[Rdi], true),
    AllocFn::alloc("pvalloc", l::SIZE, Libc, &[Rdi], true),
    AllocFn::release("free", p::FREE_ENTER, Libc, false),
    AllocFn::alloc("mmap", l::MMAP, Mmap, &[Rsi], true),
    AllocFn::release("munmap", p::MUNMAP_ENTER, Mmap, true),
];
