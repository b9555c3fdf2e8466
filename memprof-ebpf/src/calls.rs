//! The allocation programs: an allocator call's entry (`alloc_enter`, or
//! the entry half of the `alloc_session`), its return (`alloc_exit`, or the
//! return half), and the frees (`free_enter`, `munmap_enter`).
//!
//! 1. The entry remembers the requested size, the stack and the caller in
//!    the thread's `PENDING` slot. The allocator kind and how its
//!    arguments are laid out come from the attach cookie, so one program
//!    serves every allocating function.
//! 2. The return takes the pending call, reads the returned pointer and
//!    records the block (`record`).
//! 3. A free removes the block from `LIVE`, adding its lifetime to its
//!    site's totals.
//!
//! With sampling, 1 and 2 are one program, a uprobe session: the entry of
//! a call that is not followed tells the kernel not to probe its return at
//! all, which is half the probes' cost.
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::{tracing::StackIdContext, ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{
    cookie, host, layout, op, AllocKind, AllocSite, PendingCall, ThreadClock, NO_STACK,
    SESSION_IS_RETURN,
};

use crate::branchless::{differ, select};
use crate::counters::{bump, enabled};
use crate::gc::first_word;
use crate::gc_copy::in_copy;
use crate::host::{caller, known_process, this_process, Caller};
use crate::prediction::{check_prediction, predict_call};
use crate::record::{record, release, LIVE, STACKS};
use crate::refill::{bytes_allocd, record_refill, requested_size};
use crate::sampling::draw;
use crate::settings::UNWIND_DWARF;
use crate::unwind::dwarf_unwind;
use memprof_common::{RUN_RETURN, SKIP_RETURN};

/// The calls in flight, one slot per thread (kept between its calls).
/// Sizes are defaults; userspace sets them from --max-live / --max-stacks.
#[map]
static PENDING: HashMap<u64, PendingCall> = HashMap::with_max_entries(8192, 0);

/// An allocator call as its entry reads it.
#[derive(Clone, Copy)]
struct Entry {
    /// [`AllocKind`] as `u8`.
    kind: u8,
    /// Requested size in bytes.
    size: u64,
    /// The realloc'd block or the posix_memalign out-parameter.
    arg_ptr: u64,
    /// One of [`op`].
    op: u8,
    /// A refill: the size of its list's objects; else 0.
    refill_lb: u64,
}

fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Entry of every allocating function (`alloc_enter`). The attach cookie
/// gives the allocator kind and how the arguments are laid out (`cookie`,
/// `layout`): one program for all, so the verifier walks the unwinder
/// once at load, not once per layout.
#[inline(always)]
pub(crate) fn alloc_enter(ctx: &ProbeContext) -> u32 {
    alloc_entry(ctx, false);
    0
}

#[inline(always)]
fn alloc_entry(ctx: &ProbeContext, session: bool) -> u32 {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let layout = cookie::layout(cookie);
    let (size, arg_ptr, op) = match layout {
        layout::MMAP => (arg(ctx, 1), 0, op::ALLOC),
        layout::CALLOC => (arg(ctx, 0).wrapping_mul(arg(ctx, 1)), 0, op::ALLOC),
        layout::REALLOC => (arg(ctx, 1), arg(ctx, 0), op::REALLOC),
        layout::REALLOCARRAY => (
            arg(ctx, 1).wrapping_mul(arg(ctx, 2)),
            arg(ctx, 0),
            op::REALLOC,
        ),
        layout::MEMALIGN => (arg(ctx, 1), 0, op::ALLOC),
        layout::POSIX_MEMALIGN => (arg(ctx, 2), arg(ctx, 0), op::OUT_PTR),
        layout::GC_REFILL => (requested_size(ctx), arg(ctx, 2), op::REFILL),
        _ => (arg(ctx, 0), 0, op::ALLOC),
    };
    // The collector's kind is an argument of these two (0: pointer-free).
    // Chosen without a branch: the verifier then walks the unwinder
    // with one state for the kind, not one per constant.
    let layout = layout as u64;
    let is_refill = differ(layout, layout::GC_REFILL as u64) ^ 1;
    let takes_kind = is_refill | (differ(layout, layout::GC_KIND_GLOBAL as u64) ^ 1);
    let gc_kind = AllocKind::GcAtomic as u64 - differ(arg(ctx, 1), 0);
    let kind = select(takes_kind, gc_kind, cookie::kind(cookie) as u64) as u8;
    let refill_lb = select(is_refill, arg(ctx, 0), 0);
    // An allocator whose result its entry can read ([`Predict`]).
    let cached = layout == layout::GC_THREAD_LOCAL as u64 || layout == layout::MALLOC_TCACHE as u64;
    let call = Entry {
        kind,
        size,
        arg_ptr,
        op,
        refill_lb,
    };
    enter(ctx, call, session, session && cached)
}

/// Records a call on entry.
#[inline(always)]
fn enter(ctx: &ProbeContext, call: Entry, session: bool, predictable: bool) -> u32 {
    if !enabled() {
        return SKIP_RETURN;
    }
    let thread = bpf_get_current_pid_tgid();
    // Entry probes sit where %rsp and %rbp still have their entry values
    // (userspace guarantees it), so the return address is at the top of
    // the stack and the caller's frame is intact.
    let sp = unsafe { (*ctx.regs).rsp };
    // Sampling draws first: a call it skips needs no slot lookup (with
    // a session, its whole cost is this, or one slot write when it may
    // map memory itself). A call nested in a followed one draws too,
    // which costs no accuracy: the draws are memoryless, so an outer
    // call is followed with the same probability, and a nested one is
    // never recorded (below).
    let Some(unsampled) = draw(call.kind, call.size, call.op, call.arg_ptr) else {
        if call.kind == AllocKind::Libc as u8 && may_map(&call, thread) {
            note_skipped(thread, sp);
        }
        return SKIP_RETURN;
    };
    // glibc's malloc maps large blocks and threads' arenas itself: an
    // `mmap` inside a call sampling skipped is that call's, not one more
    // draw (it would be counted twice, once at the malloc's odds).
    if call.kind == AllocKind::Mmap as u8 && inside_skipped(thread, sp) {
        bump(|c| &mut c.unsampled_allocs);
        return SKIP_RETURN;
    }
    let Some(process) = this_process() else {
        return SKIP_RETURN;
    };
    // From here on `slot` is a valid pointer on every path: the verifier
    // walks the unwinder with one state for it, not two (null or not).
    let Some(slot) = thread_slot(thread, sp, session) else {
        return SKIP_RETURN;
    };
    let (caller, stack_id) = call_site(ctx, sp, unsampled, process.modules);
    // Written in place, field by field (no copy of the call on the
    // stack, where the unwinder needs the room); the thread's clock
    // and free lists stay. Only this thread writes its slot.
    unsafe {
        let pending = &mut *slot;
        pending.site = AllocSite {
            caller,
            stack_id,
            kind: call.kind,
            _pad: [0; 3],
            process: process.index,
        };
        pending.size = call.size;
        pending.arg_ptr = call.arg_ptr;
        pending.nested = 0;
        pending.op = call.op;
        pending.unsampled = unsampled;
        pending.active = 1;
        pending.sp = sp;
        pending.predicted = 0;
        pending.refill_lb = call.refill_lb;
    }
    if call.refill_lb != 0 {
        unsafe { (*slot).allocd_before = bytes_allocd() };
    }
    if predictable && unsampled == 0 {
        predict_call(slot, call.kind, call.size)
    } else {
        RUN_RETURN
    }
}

/// Requests at least this big may get a block of their own from `mmap`
/// (glibc's threshold starts at 128 KiB and only grows, unless the
/// program lowers it with `mallopt`).
const DIRECT_MAP_MIN: u64 = 64 << 10;

/// Whether a `malloc`-family call may call `mmap` itself: a large
/// request, or any request of a thread other than the main one (its
/// arena grows by mapping a new heap; the main arena grows by `brk`).
#[inline(always)]
fn may_map(call: &Entry, thread: u64) -> bool {
    call.size >= DIRECT_MAP_MIN || (thread >> 32) != (thread & 0xffff_ffff)
}

/// Remembers a `malloc`-family call that sampling skipped, entering at
/// `sp`, in the thread's slot (see [`PendingCall::skipped_sp`]).
#[inline(never)]
fn note_skipped(thread: u64, sp: u64) {
    let Ok(ret) = (unsafe { bpf_probe_read_user(sp as *const u64) }) else {
        return;
    };
    let slot = match PENDING.get_ptr_mut(&thread) {
        Some(slot) => slot,
        None => match new_slot(thread) {
            Some(slot) => slot,
            None => return,
        },
    };
    unsafe {
        (*slot).skipped_sp = sp;
        (*slot).skipped_ret = ret;
    }
}

/// Whether a call entering at `sp` is made inside the thread's last
/// skipped call: below its entry, whose return slot still holds its
/// return address, or the kernel's return trampoline (a return probe of
/// another session on the same function put it there: it starts its
/// page). A stale slot holding a value that starts a page would hide an
/// `mmap` of the caller's own: rare, and never a call's return address.
#[inline(never)]
fn inside_skipped(thread: u64, sp: u64) -> bool {
    let Some(slot) = PENDING.get_ptr(&thread) else {
        return false;
    };
    let (skipped_sp, ret) = unsafe { ((*slot).skipped_sp, (*slot).skipped_ret) };
    if skipped_sp == 0 || sp >= skipped_sp {
        return false;
    }
    match unsafe { bpf_probe_read_user(skipped_sp as *const u64) } {
        Ok(there) => there == ret || (there != 0 && there & 0xfff == 0),
        Err(_) => false,
    }
}

/// The thread's slot for a call entering at `sp`, its first call adding
/// it (idle); `None` when the call is not followed: made inside another
/// allocator call of this thread (the outer call counts; in a session
/// its return is not run at all), or no room.
#[inline(always)]
fn thread_slot(thread: u64, sp: u64, session: bool) -> Option<*mut PendingCall> {
    // Kept between calls (`thread_exit` removes it): a call is written
    // into it in place, with no insert or delete.
    let slot = PENDING.get_ptr_mut(&thread);
    if let Some(outer) = slot.filter(|&p| unsafe { (*p).active } == 1) {
        if !is_stale(unsafe { &*outer }, sp) {
            if !session {
                unsafe { (*outer).nested += 1 };
            }
            return None;
        }
        // Its return was missed: replaced by the caller.
        bump(|c| &mut c.stale_calls);
    }
    match slot {
        Some(slot) => Some(slot),
        None => match new_slot(thread) {
            Some(slot) => Some(slot),
            None => {
                bump(|c| &mut c.pending_full);
                None
            }
        },
    }
}

/// The caller and the stack id of a call entering at `sp`: no stack for
/// a call followed `unsampled` (never recorded); `modules`: the module
/// table the CFI unwinder searches.
#[inline(always)]
fn call_site(ctx: &ProbeContext, sp: u64, unsampled: u8, modules: u32) -> (u64, u64) {
    let read_caller = || unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    let (caller, stack) = if unsampled == 1 {
        (read_caller(), Some(NO_STACK)) // never recorded
    } else if UNWIND_DWARF.load() == 1 {
        // A refill's stack starts at the allocator that ran its list
        // out (`GC_malloc_kind`): userspace leaves that frame out (a
        // skip here would cost the verifier another walk of the loop).
        dwarf_unwind(ctx, modules)
    } else {
        let id = ctx
            .get_stackid(&STACKS, BPF_F_USER_STACK as u64)
            .map(|id| id as u64)
            .ok();
        (read_caller(), id)
    };
    let stack_id = match stack {
        Some(id) => id,
        None => {
            bump(|c| &mut c.stack_errors);
            NO_STACK
        }
    };
    (caller, stack_id)
}

/// Adds `thread`'s slot to `PENDING`, idle; `None` if the table is full.
/// The idle slot is written in this CPU's `IDLE_SLOT`, not on the stack,
/// whose 512 bytes the whole call chain shares.
#[inline(never)]
fn new_slot(thread: u64) -> Option<*mut PendingCall> {
    let idle = IDLE_SLOT.get_ptr_mut(0)?;
    unsafe {
        *idle = PendingCall {
            site: AllocSite {
                caller: 0,
                stack_id: NO_STACK,
                kind: 0,
                _pad: [0; 3],
                process: 0,
            },
            size: 0,
            arg_ptr: 0,
            nested: 0,
            op: 0,
            unsampled: 0,
            active: 0,
            _pad: 0,
            sp: 0,
            clock: ThreadClock {
                ns: 0,
                jiffies: 0,
                epoch: 0,
            },
            gc_key: 0,
            tcache: 0,
            found_epoch: 0,
            predicted: 0,
            refill_lb: 0,
            allocd_before: u64::MAX,
            last_gc: 0,
            last_gc_epoch: 0,
            skipped_sp: 0,
            skipped_ret: 0,
        };
        let _ = PENDING.insert(&thread, &*idle, BPF_NOEXIST as u64);
    }
    PENDING.get_ptr_mut(&thread)
}

/// Where [`new_slot`] writes a thread's idle slot before adding it.
#[map]
static IDLE_SLOT: PerCpuArray<PendingCall> = PerCpuArray::with_max_entries(1, 0);

/// Whether the pending call `call` is over although its return probe
/// never ran, seen from a new call (or free) entering at `sp`. Stacks
/// grow down: a call inside it enters at or below its entry `sp` (a
/// tail jump, GC_realloc to GC_malloc, at the same one). Above it, its
/// frame is gone. At it or below, its return slot tells: the return
/// probe replaced the return address there with its trampoline when the
/// call entered, so finding the original return address means no return
/// probe will ever see this call end.
#[inline(always)]
fn is_stale(call: &PendingCall, sp: u64) -> bool {
    if sp > call.sp {
        return true;
    }
    let slot = unsafe { bpf_probe_read_user(call.sp as *const u64) };
    call.site.caller != 0 && slot == Ok(call.site.caller)
}

/// Entry and return in one program (`alloc_session`, a uprobe session,
/// Linux 6.13): the entry decides whether the return runs at all
/// (`SKIP_RETURN`).
#[inline(always)]
pub(crate) fn alloc_session(ctx: *mut core::ffi::c_void) -> u32 {
    let regs = ctx as *mut pt_regs;
    if session_is_return() {
        session_return(regs);
        0
    } else {
        session_entry(regs)
    }
}

// The two halves as functions of their own, side by side in the call
// graph: the chain's 512 bytes of stack hold one of them at a time
// (inlined, their frames would add up).
#[inline(never)]
fn session_entry(regs: *mut pt_regs) -> u32 {
    alloc_entry(&ProbeContext::new(regs as *mut core::ffi::c_void), true)
}

#[inline(never)]
fn session_return(regs: *mut pt_regs) {
    alloc_return(unsafe { &*regs });
}

/// The kfunc `bpf_session_is_return()`. A kfunc call names its
/// function by the kernel's BTF id, which only the running kernel
/// knows: this is a helper call with [`SESSION_IS_RETURN`] as its
/// number, which userspace rewrites into the kfunc call before loading.
#[inline(always)]
fn session_is_return() -> bool {
    let r: u64;
    unsafe {
        core::arch::asm!(
            "call {n}",
            n = const SESSION_IS_RETURN,
            lateout("r0") r,
            lateout("r1") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
    r & 0xff != 0
}

/// Return probe for every allocating function (`alloc_exit`).
#[inline(always)]
pub(crate) fn alloc_exit(ctx: &RetProbeContext) -> u32 {
    alloc_return(unsafe { &*ctx.regs });
    0
}

/// The return of an allocating function: `regs` after its `ret`.
#[inline(always)]
fn alloc_return(regs: &pt_regs) {
    if !enabled() {
        return;
    }
    bump(|c| &mut c.returns_probed);
    let Some((mut call, pending)) = returning_call(regs) else {
        return;
    };
    if call.op == op::REFILL {
        record_refill(&call, pending);
        return;
    }
    let ret: u64 = regs.rax;
    let addr = if call.op == op::OUT_PTR {
        if ret as u32 == 0 {
            unsafe { bpf_probe_read_user(call.arg_ptr as *const u64) }.unwrap_or(0)
        } else {
            0
        }
    } else {
        ret
    };
    if call.predicted != 0 {
        check_prediction(call.site.kind, call.predicted, addr);
    }
    // mmap fails with MAP_FAILED (-1), the others with NULL.
    let failed = addr == 0 || addr > (-4096i64) as u64;
    if call.op == op::REALLOC && call.arg_ptr != 0 && (!failed || call.size == 0) {
        // The new block has the kind of the old one (GC_realloc keeps
        // atomic objects atomic).
        // realloc succeeded (or was realloc(p, 0), which frees p): the old block is gone.
        let old = host::live_key(call.arg_ptr, call.site.process);
        if in_copy(call.site.kind) && call.unsampled == 0 && !failed {
            // Userspace's copy: the new block's event (`replaces`) says
            // the free too. Two events, a reader draining the ring between
            // them could settle the copy without the new block, and the
            // replaced block's kind would be gone by the time it came.
            bump(|c| &mut c.frees);
        } else if let Some(kind) = release(old, call.site.kind, 0) {
            // The old block is already freed here: its first word is gone.
            call.site.kind = kind;
        }
    }
    if call.unsampled == 1 {
        return; // a realloc followed only to release the old block
    }
    if failed {
        if !(call.op == op::REALLOC && call.size == 0) {
            bump(|c| &mut c.failed_allocs);
        }
        return;
    }
    let replaces = if call.op == op::REALLOC {
        call.arg_ptr
    } else {
        0
    };
    record(addr, &call, replaces, pending, 1);
}

/// The call of this thread whose return `regs` is, and its slot (now
/// idle); `None` when the return is of no call followed.
#[inline(always)]
fn returning_call(regs: &pt_regs) -> Option<(PendingCall, *mut PendingCall)> {
    let thread = bpf_get_current_pid_tgid();
    let pending = PENDING.get_ptr_mut(&thread)?;
    if unsafe { (*pending).active } == 0 {
        return None;
    }
    let call = unsafe { *pending };
    // After `ret`: %rsp is the entry's + 8.
    let entry_sp = regs.rsp.wrapping_sub(8);
    if entry_sp > call.sp {
        // A call above the pending one returns: that one's return was missed.
        bump(|c| &mut c.stale_calls);
        unsafe { (*pending).active = 0 };
        return None;
    }
    if call.nested > 0 {
        unsafe { (*pending).nested -= 1 };
        return None;
    }
    if entry_sp < call.sp {
        return None; // a call inside the pending one, whose entry was not seen
    }
    unsafe { (*pending).active = 0 };
    Some((call, pending))
}

/// `free(addr)` and the other freeing functions (`free_enter`).
#[inline(always)]
pub(crate) fn free_enter(ctx: &ProbeContext) -> u32 {
    if !enabled() {
        return 0;
    }
    let addr = arg(ctx, 0);
    if addr == 0 {
        return 0; // free(NULL) is a no-op
    }
    // A free inside an allocator call (GC_realloc freeing the old block)
    // is accounted by that call's return probe; a stale call is not one.
    let thread = bpf_get_current_pid_tgid();
    if let Some(pending) = PENDING.get_ptr_mut(&thread) {
        if unsafe { (*pending).active } == 1 {
            let sp = unsafe { (*ctx.regs).rsp };
            if !is_stale(unsafe { &*pending }, sp) {
                return 0;
            }
            bump(|c| &mut c.stale_calls);
            unsafe { (*pending).active = 0 };
        }
        // Its first word is the collector's from here: the free below says it.
        if unsafe { (*pending).last_gc } == addr {
            unsafe { (*pending).last_gc = 0 };
        }
    }
    let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u8;
    match caller() {
        Caller::Followed(index) => {
            // Still the object's: a GC object's class, for the copy.
            let word = if in_copy(kind) { first_word(addr) } else { 0 };
            let _ = release(host::live_key(addr, index), kind, word);
        }
        // Not its free to count.
        Caller::LeftOut => {}
        Caller::Unseen => {
            bump(|c| &mut c.frees);
            bump(|c| &mut c.unknown_frees);
        }
    }
    0
}

/// `munmap(addr, len)` (`munmap_enter`): forgets a mapping made by `mmap`
/// at exactly that address. Partial unmaps and unmaps of untracked ranges
/// are not counted.
#[inline(always)]
pub(crate) fn munmap_enter(ctx: &ProbeContext) -> u32 {
    if !enabled() {
        return 0;
    }
    let Some(index) = known_process() else {
        return 0;
    };
    let key = host::live_key(arg(ctx, 0), index);
    if let Some(live) = LIVE.get_ptr(&key) {
        if unsafe { (*live).site.kind } == AllocKind::Mmap as u8 {
            let _ = release(key, AllocKind::Mmap as u8, 0);
        }
    }
    0
}

/// A thread exits (`thread_exit`, on every thread of the system): its
/// `PENDING` slot goes, so the table holds the threads alive, not every
/// thread the target ever had.
#[inline(always)]
pub(crate) fn thread_exit() -> i32 {
    let thread = bpf_get_current_pid_tgid();
    // Looked up first: a lookup takes no lock, a remove does.
    if PENDING.get_ptr(&thread).is_some() {
        let _ = PENDING.remove(&thread);
    }
    // `attach --all`: the main thread's exit ends the process.
    crate::host::thread_exit(thread);
    0
}
