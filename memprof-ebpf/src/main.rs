//! memprof's kernel side: uprobes on allocator functions that keep a table of
//! live blocks and per-site totals, for one target process (or, with
//! `attach --all`, every process).
//!
//! Data flow, one allocation (the files in that order):
//!
//! 1. `settings`: the load-time constants every program reads.
//! 2. `calls`: the entry probe remembers the requested size, the stack and
//!    the caller in the thread's `PENDING` slot; `sampling` decides first
//!    whether the call is followed at all, `unwind` walks its stack when
//!    the code has no frame pointers, `prediction` may read its result
//!    right there, `refill` weighs a Boehm free-list refill.
//! 3. `calls`: the return probe takes the pending call and `record` puts
//!    the block in `LIVE` and adds it to `SITE_TOTALS`; a free removes it.
//! 4. `gc_copy`, `gc`: Boehm GC objects, never freed, are streamed to
//!    userspace's copy and judged at each collection by the mark bits.
//! 5. `host`: `attach --all`'s processes; `library_load`: the dynamic
//!    linker's library loads.
//!
//! Userspace reads `LIVE`, `SITE_TOTALS` and `STACKS`/`DWARF_STACKS` at the
//! end. Everything that could not be recorded is counted in `COUNTERS`.
//! Names of programs, maps and settings are `memprof_common`'s.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

// The kernel side is built for BPF only: on the host (a workspace build)
// this binary is empty.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

/// Comparisons and choices without a branch (the verifier's paths).
#[cfg(target_arch = "bpf")]
mod branchless;
/// An allocator call's entry and return, and the frees.
#[cfg(target_arch = "bpf")]
mod calls;
/// `ENABLED` and `COUNTERS`, which every program uses.
#[cfg(target_arch = "bpf")]
mod counters;
/// `attach --all`: stacks cut at a file not known yet, finished in userspace.
#[cfg(target_arch = "bpf")]
mod deferred;
/// Boehm collections: the hold, the kernel's verdicts.
#[cfg(target_arch = "bpf")]
mod gc;
/// Userspace's copy of the Boehm GC objects: the events.
#[cfg(target_arch = "bpf")]
mod gc_copy;
/// `attach --all`: the processes followed.
#[cfg(target_arch = "bpf")]
mod host;
/// The dynamic linker's library loads.
#[cfg(target_arch = "bpf")]
mod library_load;
/// The module tables the unwinder looks frames up in.
#[cfg(target_arch = "bpf")]
mod module_maps;
/// Reading an allocator's result at its entry.
#[cfg(target_arch = "bpf")]
mod prediction;
/// The core tables (`LIVE`, `SITE_TOTALS`, `STACKS`, `COUNTERS`) and what
/// writes them.
#[cfg(target_arch = "bpf")]
mod record;
/// Weighing a Boehm free-list refill.
#[cfg(target_arch = "bpf")]
mod refill;
/// Resident memory by stack: pages at their first write, and given back.
#[cfg(target_arch = "bpf")]
mod rss;
/// Sampling by bytes: which calls are followed.
#[cfg(target_arch = "bpf")]
mod sampling;
/// Load-time constants (`Global`s).
#[cfg(target_arch = "bpf")]
mod settings;
/// A task's files as the kernel has them: paths, the VMA iterator.
#[cfg(target_arch = "bpf")]
mod task_files;
/// The CFI unwinder and its stack table.
#[cfg(target_arch = "bpf")]
mod unwind;

/// The programs userspace attaches by name (`memprof_common::programs`),
/// each a call into the module of its concern.
#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{
        macros::{raw_tracepoint, uprobe, uretprobe},
        programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    };

    use crate::{calls, gc, host, library_load, rss};

    /// Entry of every allocating function (the cookie says which).
    #[uprobe]
    pub fn alloc_enter(ctx: ProbeContext) -> u32 {
        calls::alloc_enter(&ctx)
    }

    /// Return of every allocating function.
    #[uretprobe]
    pub fn alloc_exit(ctx: RetProbeContext) -> u32 {
        calls::alloc_exit(&ctx)
    }

    /// Entry and return of every allocating function in one program: a
    /// uprobe session (Linux 6.13). Userspace uses it with sampling, where
    /// the kernel has it; else (and in exact mode, where every return is
    /// needed and the pair costs less) the pair `alloc_enter`/`alloc_exit`.
    ///
    /// Written out, not with `#[uprobe]`: that macro's wrapper returns 0
    /// whatever the function returns, and here the value is the decision.
    #[unsafe(no_mangle)]
    #[unsafe(link_section = "uprobe")]
    pub fn alloc_session(ctx: *mut core::ffi::c_void) -> u32 {
        calls::alloc_session(ctx)
    }

    #[uprobe]
    pub fn free_enter(ctx: ProbeContext) -> u32 {
        calls::free_enter(&ctx)
    }

    #[uprobe]
    pub fn munmap_enter(ctx: ProbeContext) -> u32 {
        calls::munmap_enter(&ctx)
    }

    /// On each `GC_gc_no++`: a collection finished marking.
    #[uprobe]
    pub fn gc_collection(ctx: ProbeContext) -> u32 {
        gc::collection(&ctx)
    }

    /// On the dynamic linker's `_dl_debug_state`.
    #[uprobe]
    pub fn dl_debug_state(_ctx: ProbeContext) -> u32 {
        library_load::libraries_changed()
    }

    /// A thread exits (any thread of the system).
    #[raw_tracepoint(tracepoint = "sched_process_exit")]
    pub fn thread_exit(_ctx: RawTracePointContext) -> i32 {
        calls::thread_exit()
    }

    /// `attach --all`: a process `exec`ed.
    #[raw_tracepoint(tracepoint = "sched_process_exec")]
    pub fn process_exec(ctx: RawTracePointContext) -> i32 {
        // args: the task, its old pid, its `struct linux_binprm *`.
        host::process_exec(ctx.arg::<u64>(2))
    }

    /// `attach --all`: the OOM killer chose a task.
    #[raw_tracepoint(tracepoint = "mark_victim")]
    pub fn oom_victim(ctx: RawTracePointContext) -> i32 {
        // args: the task, its user.
        host::oom_victim(ctx.arg::<u64>(0))
    }

    /// `--rss`: a user page fault. args: the address, the user
    /// registers, the error code.
    #[raw_tracepoint(tracepoint = "page_fault_user")]
    pub fn page_fault(ctx: RawTracePointContext) -> i32 {
        rss::page_fault(ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2))
    }

    /// `--rss`: a syscall's entry (raw tracepoint `sys_enter`; args:
    /// the user's registers, the syscall's number): those that give
    /// memory back.
    #[raw_tracepoint(tracepoint = "sys_enter")]
    pub fn mm_syscall(ctx: RawTracePointContext) -> i32 {
        rss::syscall_entry(ctx.arg::<u64>(0), ctx.arg::<u64>(1))
    }

    /// `--rss`: the kernel changed a process's resident count (raw
    /// tracepoint `rss_stat`; args: the `mm_struct`, the counter).
    #[raw_tracepoint(tracepoint = "rss_stat")]
    pub fn rss_changed(ctx: RawTracePointContext) -> i32 {
        rss::rss_changed(ctx.arg::<u64>(0))
    }

    /// Benchmark baseline: the bare cost of a probe hit.
    #[uprobe]
    pub fn empty_probe(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uretprobe]
    pub fn empty_retprobe(_ctx: RetProbeContext) -> u32 {
        0
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
