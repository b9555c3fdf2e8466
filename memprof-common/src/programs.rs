//! Symbol names the eBPF object exports for its programs, used by userspace
//! to find and attach them.

/// The entry of every allocating function: the attach cookie says how
/// to read its arguments ([`cookie`](super::cookie)). One program, so
/// the verifier walks the unwinder once, not once per layout (~0.2 s each).
pub const ALLOC_ENTER: &str = "alloc_enter";
pub const ALLOC_EXIT: &str = "alloc_exit";
/// Both in one program, a uprobe session (Linux 6.13): its entry says
/// whether the return runs at all. Preferred where the kernel has it.
pub const ALLOC_SESSION: &str = "alloc_session";
pub const FREE_ENTER: &str = "free_enter";
pub const MUNMAP_ENTER: &str = "munmap_enter";
/// Does nothing: `cargo xtask bench` uses it to measure the bare probe cost.
pub const EMPTY: &str = "empty_probe";
pub const EMPTY_RET: &str = "empty_retprobe";
/// On the dynamic linker's `_dl_debug_state`: libraries were (un)loaded.
pub const DL_DEBUG_STATE: &str = "dl_debug_state";
/// On every `GC_gc_no++` of the Boehm GC: a collection finished marking.
pub const GC_COLLECTION: &str = "gc_collection";
/// Raw tracepoint `sched_process_exit`: a thread's `PENDING` slot goes.
pub const THREAD_EXIT: &str = "thread_exit";
/// Raw tracepoint `sched_process_exec` (`attach --all`): the process's
/// index is done.
pub const PROCESS_EXEC: &str = "process_exec";
/// Raw tracepoint `mark_victim` (`attach --all`, `memprof agent`): the
/// OOM killer chose a process.
pub const OOM_VICTIM: &str = "oom_victim";

/// Raw tracepoint `page_fault_user` (`--rss`): a page written for the
/// first time, sampled by bytes.
pub const PAGE_FAULT: &str = "page_fault";
/// Raw tracepoint `sys_enter` (`--rss`): the syscalls that give memory
/// back, `munmap`, `madvise` (`MADV_DONTNEED`, `MADV_FREE`,
/// `MADV_REMOVE`), `mmap` with `MAP_FIXED` over a range, `brk` lowering
/// the heap's end, `mremap` shrinking a range.
pub const MM_SYSCALL: &str = "mm_syscall";
/// Raw tracepoint `rss_stat` (`--rss`): a process's resident count
/// changed; inside a syscall of those [`MM_SYSCALL`] names, its range is
/// given back. Where the kernel has it, in place of [`MM_SYSCALL`].
pub const RSS_CHANGED: &str = "rss_changed";

/// Every program of the eBPF object (checked against the object by a
/// userspace test, as [`maps::ALL`](super::maps::ALL) is).
pub const ALL: [&str; 15] = [
    ALLOC_ENTER,
    ALLOC_EXIT,
    ALLOC_SESSION,
    FREE_ENTER,
    MUNMAP_ENTER,
    EMPTY,
    EMPTY_RET,
    DL_DEBUG_STATE,
    GC_COLLECTION,
    THREAD_EXIT,
    PROCESS_EXEC,
    OOM_VICTIM,
    PAGE_FAULT,
    MM_SYSCALL,
    RSS_CHANGED,
];

/// The number the kernel programs call `bpf_session_is_return()` by: a
/// helper call with this number (no helper has it) that userspace rewrites
/// into the kfunc call, with the running kernel's BTF id for it.
pub const SESSION_IS_RETURN: u32 = 0x0bad_5e55;

/// The numbers the kernel programs call the task-VMA iterator's kfuncs
/// by (`bpf_iter_task_vma_new`, `_next`, `_destroy`), rewritten as
/// [`SESSION_IS_RETURN`] is.
pub const ITER_TASK_VMA_NEW: u32 = 0x0bad_17e0;
pub const ITER_TASK_VMA_NEXT: u32 = 0x0bad_17e1;
pub const ITER_TASK_VMA_DESTROY: u32 = 0x0bad_17e2;

/// Every kfunc the programs call: its placeholder number and its name.
pub const KFUNCS: [(u32, &str); 4] = [
    (SESSION_IS_RETURN, "bpf_session_is_return"),
    (ITER_TASK_VMA_NEW, "bpf_iter_task_vma_new"),
    (ITER_TASK_VMA_NEXT, "bpf_iter_task_vma_next"),
    (ITER_TASK_VMA_DESTROY, "bpf_iter_task_vma_destroy"),
];
