//! memprof's kernel side: uprobes on allocator functions that keep a table of
//! live blocks and per-site totals, for one target process.
//!
//! Data flow, one allocation:
//!
//! 1. entry probe (`alloc_enter`, `calloc_enter`, …): remember the requested
//!    size, the user stack id and the caller's return address in `PENDING`,
//!    keyed by thread. The allocator kind (libc, mmap, gc, …) comes from the
//!    attach cookie, so one program serves every function with the same
//!    argument layout.
//! 2. return probe (`alloc_exit`): take the pending call, read the returned
//!    pointer, insert it into `LIVE` and add to `SITE_TOTALS`.
//! 3. `free_enter` / `munmap_enter`: remove the block from `LIVE`, adding
//!    its lifetime to its site's totals.
//!
//! With sampling, 1 and 2 are one program, `alloc_session` (a uprobe
//! session): the entry of a call that is not followed tells the kernel
//! not to probe its return at all, which is half the probes' cost.
//!
//! Boehm GC objects are never freed: `gc_collection` (on `GC_gc_no++`, the
//! end of a collection's marking, world stopped) counts the collection in
//! `GC_EPOCH` and stops the collecting thread with a signal memprof takes
//! (it traces the target): memprof reads the mark bits while the world is
//! still stopped. While it does (`config::GC_COPY`), GC objects are not put
//! in `LIVE`: allocations and `GC_free`s are streamed to `GC_EVENTS` and
//! memprof's copy is the only record (their number is not bounded by
//! `LIVE`'s size), and the copy sums their per-site totals (they are not in
//! `SITE_TOTALS`). Every allocation is tagged with the epoch it was made in
//! (only older ones are judged); an allocation at an address still live
//! proves the old object died (found here for `LIVE`, by memprof for the
//! copy). `LIVE_BY_KIND` keeps `LIVE`'s blocks and bytes per kind.
//!
//! Userspace reads `LIVE`, `SITE_TOTALS` and `STACKS`/`DWARF_STACKS` at the
//! end. Everything that could not be recorded is counted in `COUNTERS`.
//!
//! Stacks: with frame pointers, `bpf_get_stackid`. Code without frame
//! pointers (Crystal, most optimized C) is unwound here with compact CFI
//! tables that userspace builds from each module's `.eh_frame`
//! (`UNWIND_ROWS`, located through `MODULE_RANGES`); each distinct stack is
//! stored once in `DWARF_STACKS`, keyed by a hash of its frames.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod probes {
    use aya_ebpf::Global;
    use aya_ebpf::{
        bindings::{
            BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
        },
        helpers::{
            bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_current_task,
            bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
            bpf_send_signal_thread, generated as gen,
        },
        macros::{map, raw_tracepoint, uprobe, uretprobe},
        maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
        programs::{tracing::StackIdContext, ProbeContext, RawTracePointContext, RetProbeContext},
        EbpfContext,
    };
    use memprof_common::{
        cfa, config, cookie, errno, gc_event, host, layout, lifetime_bucket, module_table, op,
        predict, predictor, AllocKind, AllocSite, DwarfStack, GcEvent, HostEvent, KernelCounters,
        KernelMarks, KindLive, LiveAlloc, ModuleRange, PendingCall, Predict, Refill, SiteTotals,
        ThreadClock, UnwindRow, CALLER_ONLY, FOLD_WINDOW, GC_FREELIST_COUNTS, GC_TINY_FREELISTS,
        HOLD_SIGNAL, LIBRARY_LOAD_SIGNAL, MAX_FRAMES, MAX_STEPS, NO_STACK, PREDICT_CHECK_EVERY,
        PREDICT_TRUST_AFTER, ROW_CACHE_SLOTS, SAMPLE_QUANTILES, SESSION_IS_RETURN, SHORT_FRAMES,
        SITES_OVERFLOW, TCACHE_BINS,
    };

    /// 1: fold recursion in DWARF stacks (`--keep-recursion` sets 0). A
    /// load-time constant: the verifier drops the path not taken.
    #[unsafe(no_mangle)]
    static FOLD_RECURSION: Global<u32> = Global::new(1);
    /// 1: unwind with the CFI tables (`UNWIND_ROWS`), 0: frame pointers.
    #[unsafe(no_mangle)]
    static UNWIND_DWARF: Global<u32> = Global::new(0);
    /// 1: sample allocations (`--sample-bytes`), 0: follow every one.
    #[unsafe(no_mangle)]
    static SAMPLING: Global<u32> = Global::new(0);
    /// 1: GC allocations are sampled at refills (`--gc-sampling refill`):
    /// the GC calls probed are not drawn by `SAMPLING`.
    #[unsafe(no_mangle)]
    static GC_REFILL: Global<u32> = Global::new(0);
    /// 1: `attach --all`: every process, state per process (`PROCESSES`).
    #[unsafe(no_mangle)]
    static HOST: Global<u32> = Global::new(0);
    /// Offsets in `task_struct` (`attach --all`'s process events).
    #[unsafe(no_mangle)]
    static TASK_REAL_PARENT: Global<u32> = Global::new(0);
    #[unsafe(no_mangle)]
    static TASK_TGID: Global<u32> = Global::new(0);
    #[unsafe(no_mangle)]
    static TASK_EXIT_CODE: Global<u32> = Global::new(0);

    /// `attach --all`: the processes followed, tgid → index (see
    /// `this_process`). Only the kernel writes it.
    #[map]
    static PROCESSES: HashMap<u32, u32> = HashMap::with_max_entries(1, 0);
    /// `attach --all`: index → the process's module table (packed; 0:
    /// none yet). Only userspace writes it: one aligned word.
    #[map]
    static PROCESS_MODULES: Array<u32> = Array::with_max_entries(1, 0);

    /// A process making a call: its index and its module table.
    #[derive(Clone, Copy)]
    struct ProcessState {
        index: u32,
        modules: u32,
    }
    /// `attach --all`: `[0]`, the next process index.
    #[map]
    static PROCESS_COUNT: Array<u64> = Array::with_max_entries(1, 0);
    /// `attach --all`: processes seen, exited, `exec`ed, relinked.
    #[map]
    static HOST_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 12, 0);

    /// Bytes to the next sample point, per CPU (0: not drawn yet).
    #[map]
    static SAMPLE_COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
    /// Distances between sample points (see `sample_distance`).
    #[map]
    static SAMPLE_DISTANCES: Array<u64> = Array::with_max_entries(SAMPLE_QUANTILES, 0);

    /// How allocators' results are read at their entry, per predictor
    /// ([`Predict`]): written by userspace once attached.
    #[map]
    static PREDICT: Array<Predict> = Array::with_max_entries(predictor::COUNT, 0);

    /// How a free-list refill is weighed (`--gc-sampling refill`,
    /// [`Refill`]): written by userspace once attached.
    #[map]
    static REFILL: Array<Refill> = Array::with_max_entries(1, 0);

    // Sizes are defaults; userspace sets them from --max-live / --max-stacks.
    #[map]
    static PENDING: HashMap<u64, PendingCall> = HashMap::with_max_entries(8192, 0);
    #[map]
    static LIVE: HashMap<u64, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);
    /// Filled on demand (BPF_F_NO_PREALLOC).
    #[map]
    static SITE_TOTALS: PerCpuHashMap<AllocSite, SiteTotals> =
        PerCpuHashMap::with_max_entries(1 << 18, aya_ebpf::bindings::BPF_F_NO_PREALLOC);
    /// Per allocation kind: the totals of sites the site table had no room for.
    #[map]
    static OVERFLOW_TOTALS: PerCpuArray<SiteTotals> =
        PerCpuArray::with_max_entries(AllocKind::ALL.len() as u32, 0);
    #[map]
    static STACKS: StackTrace = StackTrace::with_max_entries(1 << 15, 0);
    /// One entry per CPU: see `bump`.
    #[map]
    static COUNTERS: PerCpuArray<KernelCounters> = PerCpuArray::with_max_entries(1, 0);
    /// 1 while recording; userspace clears it to stop every program at once.
    #[map]
    static ENABLED: Array<u32> = Array::with_max_entries(1, 0);

    #[map]
    static CONFIG: Array<u32> = Array::with_max_entries(config::COUNT, 0);
    /// Filled on demand (BPF_F_NO_PREALLOC): most runs use a fraction of it.
    #[map]
    static DWARF_STACKS: HashMap<u64, DwarfStack> =
        HashMap::with_max_entries(1 << 16, aya_ebpf::bindings::BPF_F_NO_PREALLOC);
    /// Where a stack goes, cut short, when `DWARF_STACKS` is full.
    #[map]
    static SHORT_STACKS: HashMap<u64, DwarfStack> =
        HashMap::with_max_entries(1 << 16, aya_ebpf::bindings::BPF_F_NO_PREALLOC);
    #[map]
    static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, 0);
    /// Two halves (`module_table`): userspace fills the one not in use, then
    /// switches (`config::MODULE_COUNT`), so no probe sees a half-written one.
    #[map]
    static MODULE_RANGES: Array<ModuleRange> = Array::with_max_entries(module_table::ENTRIES, 0);
    /// Per CPU, rows found by pc (see `cached_row`): one value holding
    /// every slot, looked up once per stack, not once per frame.
    #[map]
    static ROW_CACHE: PerCpuArray<RowCache> = PerCpuArray::with_max_entries(1, 0);

    /// 32 KiB: the most a per-CPU value can hold.
    #[repr(C)]
    struct RowCache {
        rows: [CachedRow; ROW_CACHE_SLOTS as usize],
    }

    /// A row of `ROW_CACHE`: 32 bytes, half a cache line.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CachedRow {
        pc: u64,
        /// The row's rule (see [`rule_of`]).
        rule: u64,
        /// The function the row belongs to (its address in the target).
        func: u64,
        /// `config::MODULE_COUNT` when it was found.
        packed: u64,
    }

    /// The part of a row the unwinder uses, in one word.
    #[inline(always)]
    fn rule_of(row: &UnwindRow) -> u64 {
        (row.cfa_offset as u32 as u64)
            | (row.rbp_offset as u16 as u64) << 32
            | (row.cfa_reg as u64) << 48
            | (row.rbp_saved as u64) << 56
    }

    /// The row back from [`rule_of`] (its `pc` and `func` left 0).
    #[inline(always)]
    fn row_of(rule: u64) -> UnwindRow {
        UnwindRow {
            pc: 0,
            cfa_offset: rule as u32 as i32,
            rbp_offset: (rule >> 32) as u16 as i16,
            cfa_reg: (rule >> 48) as u8,
            rbp_saved: (rule >> 56) as u8,
            func: 0,
        }
    }

    /// The stack being unwound (too big for the 512-byte BPF stack).
    #[map]
    static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

    /// A [`DwarfStack`] with room behind its frames for every step of the
    /// walk, so the unwinder writes at a masked index without a bounds branch.
    #[repr(C)]
    struct Scratch {
        stack: DwarfStack,
        spill: [u64; MAX_STEPS - MAX_FRAMES],
        /// The copy of the target's stack [`Window`] reads from.
        window: [u64; WINDOW_WORDS],
        /// Keys this CPU found in `DWARF_STACKS`, by their low bits:
        /// nothing is ever removed from it while recording, so a key seen
        /// there once needs no lookup again.
        known: [u64; KNOWN_STACKS],
    }

    /// Slots of `Scratch::known` (a power of two).
    const KNOWN_STACKS: usize = 256;

    impl Scratch {
        /// Frame slot `i` (of `MAX_STEPS`: past `MAX_FRAMES`, the spill).
        #[inline(always)]
        fn frame(&mut self, i: usize) -> &mut u64 {
            // `frames` is the last field of `stack`, `spill` follows it.
            let frames = core::mem::offset_of!(DwarfStack, frames);
            unsafe {
                let first = (self as *mut Scratch as *mut u8).add(frames) as *mut u64;
                &mut *first.add(i & (MAX_STEPS - 1))
            }
        }
    }

    /// The most bytes of the target's stack copied at once.
    const WINDOW_BYTES: u64 = 2048;
    const WINDOW_WORDS: usize = WINDOW_BYTES as usize / 8;
    const _: () = assert!(WINDOW_BYTES.is_power_of_two() && 4096 % WINDOW_BYTES == 0);

    /// The part of the target's stack copied into `Scratch::window`:
    /// `[start, end)` (empty: none yet). Each `bpf_probe_read_user` costs
    /// ~0.1 µs whatever its size (the fault-safe copy and its checks) and
    /// the unwinder reads one or two words a frame, all upward from
    /// `%rsp`: a copy runs from the first word missed to the end of its
    /// page (a copy past the top of a stack, the end of its mapping, would
    /// fail), at most `WINDOW_BYTES`, so most walks need one copy.
    struct Window {
        start: u64,
        end: u64,
    }

    impl Window {
        /// The word at `addr` in the target's stack: from the copy, or
        /// copying from `addr` first. A misaligned slot (no compiler
        /// makes one: `%rsp` and `%rbp` stay 8-aligned) is not followed.
        #[inline(always)]
        fn word(&mut self, copy: &mut [u64; WINDOW_WORDS], addr: u64) -> Option<u64> {
            if addr & 7 != 0 {
                return None;
            }
            if addr.wrapping_sub(self.start) >= self.end.wrapping_sub(self.start) {
                let mut len = 4096 - (addr & 4095);
                if len > WINDOW_BYTES {
                    len = WINDOW_BYTES;
                }
                let dst = copy.as_mut_ptr() as *mut core::ffi::c_void;
                let src = addr as *const core::ffi::c_void;
                if unsafe { gen::bpf_probe_read_user(dst, len as u32, src) } != 0 {
                    self.end = self.start;
                    return None;
                }
                self.start = addr;
                self.end = addr + len;
            }
            Some(copy[(addr.wrapping_sub(self.start) >> 3) as usize & (WINDOW_WORDS - 1)])
        }
    }

    /// Collections seen (see `gc_collection`).
    #[map]
    static GC_EPOCH: Array<u64> = Array::with_max_entries(1, 0);
    /// Threads memprof traces (tid → 1): only those can be held.
    #[map]
    static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);
    /// tid → epoch of the collection it is being held at.
    #[map]
    static HELD: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

    /// GC objects allocated and freed, for userspace's copy (size set by userspace).
    #[map]
    static GC_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 12, 0);
    /// Queued GC event bytes at which the reader is woken (see `gc_event`).
    const GC_EVENTS_WAKE_BYTES: u64 = 1 << 20;

    /// Where the collector keeps its mark bits (`config::GC_VERDICTS`):
    /// written by userspace before any probe is attached.
    #[map]
    static GC_MARKS: Array<KernelMarks> = Array::with_max_entries(1, 0);
    /// The GC objects judged at each collection (`config::GC_VERDICTS`),
    /// in `GC_SLOTS[..GC_SLOT_COUNT]`: a collection walks those it has, not
    /// a table's capacity (a hash table's walk visits every bucket: 2.4 ms
    /// a collection at 2^17 entries). Few: refill samples, large objects.
    /// No index by address: an object freed, or whose address is allocated
    /// again, keeps its slot until a collection finds it unmarked; the
    /// slots of one address get the same verdict (the address's mark), and
    /// userspace applies it to the object the address holds.
    #[map]
    static GC_SLOTS: Array<JudgedSlot> = Array::with_max_entries(JUDGED_SLOTS, 0);
    /// `[0]`: slots in use (the first `n` of `GC_SLOTS`; may run past the
    /// end, the objects that found none are counted). `[1]`: the slots
    /// kept so far by a collection's walk (counted here, not in the walk's
    /// own state: the verifier would follow every value).
    #[map]
    static GC_SLOT_COUNT: Array<u64> = Array::with_max_entries(2, 0);
    const JUDGED_SLOTS: u32 = 1 << 18;
    /// Longest block index hash chain a verdict follows (they are a few
    /// entries long; a longer one fails the verdict, counted).
    const MAX_CHAIN: usize = 8;

    /// One GC object judged at each collection.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct JudgedSlot {
        addr: u64,
        /// `GC_EPOCH` at its allocation.
        epoch: u32,
        /// 1: its size went to userspace (its first `gc_event::MARKED`;
        /// a live object's size does not change).
        size_sent: u32,
    }

    /// What `LIVE` holds per kind (one entry per CPU): timeline samples read
    /// it instead of the table.
    #[map]
    static LIVE_BY_KIND: PerCpuArray<KindLive> = PerCpuArray::with_max_entries(1, 0);

    #[inline(always)]
    fn enabled() -> bool {
        ENABLED.get(0).is_some_and(|&on| on == 1)
    }

    #[inline(always)]
    fn setting(index: u32) -> u32 {
        CONFIG.get(index).copied().unwrap_or(0)
    }

    /// Adds one to a counter: `bump(|c| &mut c.allocs)`.
    #[inline(always)]
    fn bump(counter: impl FnOnce(&mut KernelCounters) -> &mut u64) {
        if let Some(counters) = COUNTERS.get_ptr_mut(0) {
            // Per-CPU value: no other CPU writes it.
            unsafe { *counter(&mut *counters) += 1 };
        }
    }

    /// The process making this call: under `attach --all` its entry of
    /// `PROCESSES` (added with a new index at its first call followed, when
    /// userspace hears of it); else index 0 and the session's one module
    /// table. `None`: not followed (memprof itself, or no room).
    #[inline(always)]
    fn this_process() -> Option<ProcessState> {
        if HOST.load() == 0 {
            // Only the CFI unwinder reads the table: with frame pointers,
            // no lookup per call (a load-time constant: the verifier drops it).
            let modules = match UNWIND_DWARF.load() {
                1 => setting(config::MODULE_COUNT),
                _ => 0,
            };
            return Some(ProcessState { index: 0, modules });
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let index = match PROCESSES.get_ptr(&tgid) {
            Some(index) => unsafe { *index },
            None => new_process(tgid)?,
        };
        if index == host::IGNORED {
            return None;
        }
        Some(ProcessState {
            index,
            modules: PROCESS_MODULES.get(index).copied().unwrap_or(0),
        })
    }

    /// [`this_process`] for a process not in `PROCESSES` yet.
    #[inline(always)]
    fn new_process(tgid: u32) -> Option<u32> {
        let count = PROCESS_COUNT.get_ptr_mut(0)?;
        let mut i = 1u64;
        unsafe {
            core::arch::asm!(
                "{i} = atomic_fetch_add((u64 *)({p} + 0), {i})",
                p = in(reg) count,
                i = inout(reg) i,
            )
        };
        if i >= host::MAX_INDEX as u64 {
            bump(|c| &mut c.processes_not_followed);
            return None;
        }
        let index = i as u32;
        // Its table is none until userspace gives one.
        if let Some(modules) = PROCESS_MODULES.get_ptr_mut(index) {
            unsafe { *modules = 0 };
        }
        match PROCESSES.insert(&tgid, &index, BPF_NOEXIST as u64) {
            Ok(()) => {
                host_event(host::NEW, tgid, index, 0);
                Some(index)
            }
            // Another thread of the process added it meanwhile.
            Err(e) if e == -errno::EEXIST => Some(unsafe { *PROCESSES.get_ptr(&tgid)? }),
            Err(_) => {
                bump(|c| &mut c.processes_not_followed);
                None
            }
        }
    }

    /// Tells userspace of a change to process `tgid` (`index`).
    #[inline(always)]
    fn host_event(op: u8, tgid: u32, index: u32, exit_code: u32) {
        let mut event = HostEvent {
            time_ns: unsafe { bpf_ktime_get_ns() },
            tgid,
            index,
            ppid: 0,
            exit_code,
            comm: [0; 16],
            op,
            _pad: [0; 7],
        };
        if let Ok(comm) = aya_ebpf::helpers::bpf_get_current_comm() {
            event.comm = comm;
        }
        if op == host::NEW {
            let task = unsafe { bpf_get_current_task() } as *const u8;
            let parent: Option<u64> = unsafe {
                bpf_probe_read_kernel(task.add(TASK_REAL_PARENT.load() as usize) as *const u64).ok()
            };
            if let Some(parent) = parent {
                let at = (parent as *const u8).wrapping_add(TASK_TGID.load() as usize);
                event.ppid = unsafe { bpf_probe_read_kernel(at as *const u32) }.unwrap_or(0);
            }
        }
        let _ = HOST_EVENTS.output::<HostEvent>(&event, 0);
    }

    /// Records a call on entry. `size` is the requested size, `arg_ptr` the
    /// realloc'd block or the posix_memalign out-parameter.
    #[inline(always)]
    fn enter(
        ctx: &ProbeContext,
        kind: u8,
        size: u64,
        arg_ptr: u64,
        op: u8,
        session: bool,
        predictable: bool,
        refill_lb: u64,
    ) -> u32 {
        if !enabled() {
            return SKIP_RETURN;
        }
        // Sampling draws first: a call it skips needs no slot lookup (with
        // a session, its whole cost is this). A call nested in a followed
        // one draws too, which costs no accuracy: the draws are memoryless,
        // so an outer call is followed with the same probability, and a
        // nested one is never recorded (below).
        let mut unsampled = 0;
        let drawn = SAMPLING.load() == 1 && !(GC_REFILL.load() == 1 && is_gc(kind));
        if drawn && !sampled(size) {
            bump(|c| &mut c.unsampled_allocs);
            // Not followed: no stack, no return probe work. Except a
            // realloc of a tracked block: its return must still release it.
            let tracked = op == op::REALLOC
                && arg_ptr != 0
                && this_process()
                    .is_some_and(|p| LIVE.get_ptr(&host::live_key(arg_ptr, p.index)).is_some());
            if !tracked {
                return SKIP_RETURN;
            }
            unsampled = 1;
        }
        let Some(process) = this_process() else {
            return SKIP_RETURN;
        };
        let thread = bpf_get_current_pid_tgid();
        // Entry probes sit where %rsp and %rbp still have their entry values
        // (userspace guarantees it), so the return address is at the top of
        // the stack and the caller's frame is intact.
        let sp = unsafe { (*ctx.regs).rsp };
        // The thread's slot, kept between calls (`thread_exit` removes it):
        // a call is written into it in place, with no insert or delete.
        let slot = PENDING.get_ptr_mut(&thread);
        if let Some(outer) = slot.filter(|&p| unsafe { (*p).active } == 1) {
            if !is_stale(unsafe { &*outer }, sp) {
                // Inside another allocator call of this thread: the outer
                // call counts. In a session its return is not run at all.
                if !session {
                    unsafe { (*outer).nested += 1 };
                }
                return SKIP_RETURN;
            }
            // Its return was missed: replaced below.
            bump(|c| &mut c.stale_calls);
        }
        // A thread's first call adds its slot (idle). From here on `slot`
        // is a valid pointer on every path: the verifier walks the
        // unwinder with one state for it, not two (null or not).
        let slot = match slot {
            Some(slot) => slot,
            None => match new_slot(thread) {
                Some(slot) => slot,
                None => {
                    bump(|c| &mut c.pending_full);
                    return SKIP_RETURN;
                }
            },
        };
        let read_caller = || unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
        let (caller, stack) = if unsampled == 1 {
            (read_caller(), Some(NO_STACK)) // never recorded
        } else if UNWIND_DWARF.load() == 1 {
            // A refill's stack starts at the allocator that ran its list
            // out (`GC_malloc_kind`): userspace leaves that frame out (a
            // skip here would cost the verifier another walk of the loop).
            dwarf_unwind(ctx, process.modules)
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
        // Written in place, field by field (no copy of the call on the
        // stack, where the unwinder needs the room); the thread's clock
        // and free lists stay. Only this thread writes its slot.
        unsafe {
            let call = &mut *slot;
            call.site = AllocSite {
                caller,
                stack_id,
                kind,
                _pad: [0; 3],
                process: process.index,
            };
            call.size = size;
            call.arg_ptr = arg_ptr;
            call.nested = 0;
            call.op = op;
            call.unsampled = unsampled;
            call.active = 1;
            call.sp = sp;
            call.predicted = 0;
            call.refill_lb = refill_lb;
        }
        if refill_lb != 0 {
            unsafe { (*slot).allocd_before = bytes_allocd() };
        }
        if predictable && unsampled == 0 {
            predict_call(slot, kind, size)
        } else {
            RUN_RETURN
        }
    }

    /// A followed call of an allocator with a thread cache, in `slot`:
    /// its result predicted from that cache and, trusted, recorded now
    /// with no return to probe; else checked at the return. Its own
    /// function: its stack is not the unwinder's.
    #[inline(never)]
    fn predict_call(slot: *mut PendingCall, kind: u8, size: u64) -> u32 {
        let (addr, trusted) = predicted(slot, kind, size);
        if !trusted {
            unsafe { (*slot).predicted = addr };
            return RUN_RETURN;
        }
        unsafe { (*slot).active = 0 };
        bump(|c| &mut c.predicted);
        record(addr, unsafe { &*slot }, 0, slot, 1);
        SKIP_RETURN
    }

    /// The predictor of allocations of `kind` ([`predictor`]).
    #[inline(always)]
    fn predictor_of(kind: u8) -> u32 {
        if is_gc(kind) {
            predictor::GC
        } else {
            predictor::MALLOC
        }
    }

    /// The result of a call of `size` bytes entering now, read from the
    /// thread's cache (0 if it has none for the size), and whether it is
    /// trusted: recorded at the entry. See [`Predict`].
    #[inline(always)]
    fn predicted(slot: *mut PendingCall, kind: u8, size: u64) -> (u64, bool) {
        let which = predictor_of(kind);
        let Some(p) = PREDICT.get_ptr(which) else {
            return (0, false);
        };
        let p = unsafe { &*p };
        if p.state == predict::OFF {
            return (0, false);
        }
        let head = if which == predictor::GC {
            gc_list_head(slot, p, kind, size)
        } else {
            tcache_head(slot, p, size)
        };
        if head == 0 {
            return (0, false);
        }
        let result = unsafe { bpf_probe_read_user(head as *const u64) }.unwrap_or(0);
        // Boehm: a word at or below the counts is a count (the slow path);
        // glibc: an empty bin is NULL, a chunk is 16-aligned.
        let object = if which == predictor::GC {
            result > GC_FREELIST_COUNTS
        } else {
            result != 0 && result & 15 == 0
        };
        if !object {
            return (0, false);
        }
        // Every prediction counts in one of the two: each
        // `PREDICT_CHECK_EVERY`th on this CPU is checked.
        let trusted = p.state == predict::TRUSTED
            && COUNTERS.get_ptr(0).is_some_and(|c| unsafe {
                ((*c).predicted + (*c).predictions_checked) % PREDICT_CHECK_EVERY != 0
            });
        (result, trusted)
    }

    /// Boehm: where the head of the thread's free list for `size` bytes
    /// of `kind` is (`_freelists[kind][granules]`; 0: none).
    #[inline(always)]
    fn gc_list_head(slot: *mut PendingCall, p: &Predict, kind: u8, size: u64) -> u64 {
        let granules = (size + 15 + p.extra_bytes) >> 4;
        if granules >= GC_TINY_FREELISTS {
            return 0;
        }
        let key = cached_address(slot, p, predictor::GC);
        if key == 0 {
            return 0;
        }
        let tlfs = unsafe { bpf_probe_read_user(key as *const u64) }.unwrap_or(0);
        if tlfs <= GC_FREELIST_COUNTS {
            return 0; // the thread is not (or no longer) the collector's
        }
        // PTRFREE (0) for atomic objects, NORMAL (1).
        let list = if kind == AllocKind::GcAtomic as u8 {
            0
        } else {
            1
        };
        tlfs + (list * GC_TINY_FREELISTS + granules) * 8
    }

    /// glibc: where `tcache->entries[idx]` for `size` bytes is (0: none).
    #[inline(always)]
    fn tcache_head(slot: *mut PendingCall, p: &Predict, size: u64) -> u64 {
        // `request2size` and `csize2tidx`: chunks of 32, 48, … bytes.
        if size > 1 << 32 {
            return 0;
        }
        let chunk = if size + 23 < 32 {
            32
        } else {
            (size + 23) & !15
        };
        let idx = (chunk - 17) >> 4;
        if idx >= TCACHE_BINS {
            return 0;
        }
        let var = cached_address(slot, p, predictor::MALLOC);
        if var == 0 {
            return 0;
        }
        let tcache = unsafe { bpf_probe_read_user(var as *const u64) }.unwrap_or(0);
        if tcache == 0 {
            return 0; // not made yet, or freed as the thread ends
        }
        tcache + TCACHE_BINS * 2 + idx * 8
    }

    /// The address of the thread's cache variable for predictor `which`
    /// (0: not found), found once per thread and kept in its slot; not
    /// found, tried again after the next collection.
    #[inline(always)]
    fn cached_address(slot: *mut PendingCall, p: &Predict, which: u32) -> u64 {
        let known = unsafe {
            if which == predictor::GC {
                (*slot).gc_key
            } else {
                (*slot).tcache
            }
        };
        if known > 1 {
            return known;
        }
        let epoch = GC_EPOCH.get(0).copied().unwrap_or(0);
        if known == 1 && unsafe { (*slot).found_epoch } == epoch {
            return 0;
        }
        let found = find_cache_variable(p, which).unwrap_or(1);
        unsafe {
            if which == predictor::GC {
                (*slot).gc_key = found;
            } else {
                (*slot).tcache = found;
            }
            (*slot).found_epoch = epoch;
        }
        if found > 1 {
            found
        } else {
            0
        }
    }

    /// The current thread's `GC_thread_key` (fs base, TLS vector, libgc's
    /// block) or `tcache` (fs base + the offset in glibc's GOT).
    #[inline(always)]
    fn find_cache_variable(p: &Predict, which: u32) -> Option<u64> {
        let task = unsafe { bpf_get_current_task() };
        let fsbase: u64 =
            unsafe { bpf_probe_read_kernel((task + p.fsbase_offset) as *const u64) }.ok()?;
        if fsbase == 0 {
            return None;
        }
        if which == predictor::MALLOC {
            let offset: u64 = unsafe { bpf_probe_read_user(p.slot as *const u64) }.ok()?;
            return Some(fsbase.wrapping_add(offset));
        }
        let dtv: u64 = unsafe { bpf_probe_read_user((fsbase + 8) as *const u64) }.ok()?;
        let module: u64 = if p.slot == 0 {
            p.module_id
        } else {
            unsafe { bpf_probe_read_user(p.slot as *const u64) }.ok()?
        };
        if module == 0 || module > 1 << 16 {
            return None;
        }
        // glibc's dtv entries are 16 bytes, the block's address first;
        // -1 (unallocated) until the thread first touches it.
        let block: u64 = unsafe { bpf_probe_read_user((dtv + module * 16) as *const u64) }.ok()?;
        if block == 0 || block == u64::MAX {
            return None;
        }
        Some(block + p.tls_offset)
    }

    /// At the return of a call whose result was predicted: whether it was
    /// right. Trusted after `PREDICT_TRUST_AFTER` right; off at the first wrong.
    #[inline(always)]
    fn check_prediction(kind: u8, predicted: u64, addr: u64) {
        bump(|c| &mut c.predictions_checked);
        let Some(p) = PREDICT.get_ptr_mut(predictor_of(kind)) else {
            return;
        };
        if predicted != addr {
            bump(|c| &mut c.predictions_wrong);
            unsafe { (*p).state = predict::OFF };
            return;
        }
        // Every CPU adds to one count (its read after is close enough):
        // BPF's atomic add (core has no 64-bit atomics for BPF).
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({p} + 0) += {v}",
                p = in(reg) core::ptr::addr_of_mut!((*p).matched),
                v = in(reg) 1u64,
            )
        };
        let matched = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*p).matched)) };
        if matched >= PREDICT_TRUST_AFTER && unsafe { (*p).state } == predict::CHECKING {
            unsafe { (*p).state = predict::TRUSTED };
        }
    }

    /// What an entry returns in a uprobe session: whether the kernel runs
    /// the program again at the call's return (for the pair of programs,
    /// ignored: the return probe runs anyway). Skipping it skips the
    /// return probe's whole cost, trap and trampoline: with sampling, most
    /// calls.
    const RUN_RETURN: u32 = 0;
    const SKIP_RETURN: u32 = 1;

    /// Adds `thread`'s slot to `PENDING`, idle; `None` if the table is full.
    /// Its own function: the idle slot's copy is not on the unwinder's stack.
    #[inline(never)]
    fn new_slot(thread: u64) -> Option<*mut PendingCall> {
        let idle = PendingCall {
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
        };
        let _ = PENDING.insert(&thread, &idle, BPF_NOEXIST as u64);
        PENDING.get_ptr_mut(&thread)
    }

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

    /// Sampling (`--sample-bytes N`): whether an allocation of `size` bytes
    /// is followed. Sample points are a Poisson process over the bytes
    /// allocated (on this CPU), with mean distance N: an allocation is
    /// followed when the next point falls within it, then the distance to
    /// the next is drawn afresh (memoryless), so each allocation is
    /// followed with probability 1 - exp(-size/N), independently.
    #[inline(always)]
    fn sampled(size: u64) -> bool {
        let Some(left) = SAMPLE_COUNTDOWN.get_ptr_mut(0) else {
            return true;
        };
        let mut remaining = unsafe { *left };
        if remaining == 0 {
            remaining = sample_distance(); // this CPU's first allocation
        }
        let followed = size >= remaining;
        unsafe {
            *left = if followed {
                sample_distance()
            } else {
                remaining - size
            }
        };
        followed
    }

    /// A distance to the next sample point: userspace fills
    /// `SAMPLE_DISTANCES` with equal-probability slices of an exponential
    /// distribution of mean N (no floating point here).
    #[inline(always)]
    fn sample_distance() -> u64 {
        let i = unsafe { bpf_get_prandom_u32() } % SAMPLE_QUANTILES;
        SAMPLE_DISTANCES.get(i).copied().unwrap_or(1).max(1)
    }

    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

    /// Unwinds the user stack from the probe (at function entry) with the
    /// CFI tables and stores it in `DWARF_STACKS`. Returns its key, or
    /// [`CALLER_ONLY`] when the table has no room for a new stack (the site
    /// keeps its caller: attribution degrades, nothing is lost).
    ///
    /// Recursion is folded (unless `FOLD_RECURSION` is 0): a frame whose
    /// function is one of the last [`FOLD_WINDOW`] kept is left out, so
    /// every path through a recursive function is one stack, its innermost
    /// occurrence, and the walk goes on to the callers (up to `MAX_STEPS`
    /// frames walked, `MAX_FRAMES` kept).
    #[inline(always)]
    fn dwarf_unwind(ctx: &ProbeContext, packed: u32) -> (u64, Option<u64>) {
        let regs = unsafe { &*ctx.regs };
        let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
            let caller = unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0);
            return (caller, None);
        };
        let scratch = unsafe { &mut *scratch };
        let Some(cache) = ROW_CACHE.get_ptr_mut(0) else {
            let caller = unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0);
            return (caller, None);
        };
        let cache = unsafe { &mut *cache };
        // At entry the CFA is %rsp + 8 and the return address, the
        // caller, is at %rsp. The stack is read a window at a time.
        let mut window = Window { start: 0, end: 0 };
        let caller = window.word(&mut scratch.window, regs.rsp).unwrap_or(0);
        (
            caller,
            unwind_from(scratch, cache, &mut window, regs, caller, packed),
        )
    }

    /// [`dwarf_unwind`] from the caller's frame (`caller`: its pc).
    #[inline(always)]
    fn unwind_from(
        scratch: &mut Scratch,
        cache: &mut RowCache,
        window: &mut Window,
        regs: &aya_ebpf::bindings::pt_regs,
        caller: u64,
        packed: u32,
    ) -> Option<u64> {
        let mut sp = regs.rsp + 8;
        let mut bp = regs.rbp;
        let mut pc = caller;
        if pc == 0 {
            return None; // unreadable
        }
        let fold = u64::from(FOLD_RECURSION.load()) & 1;
        // Whether a frame is kept or folded is computed, not branched on
        // (`select`): a branch per frame whose sides differ in what they
        // keep would double the paths the verifier walks at every frame.
        let mut hash = FNV_OFFSET;
        let mut len: usize = 0;
        let mut truncated: u32 = 1;
        let mut folded: u64 = 0;
        // Functions of the last kept frames, newest first (none: MAX, no
        // function's address).
        let mut recent: [u64; FOLD_WINDOW] = [u64::MAX; FOLD_WINDOW];
        for _ in 0..MAX_STEPS {
            if pc == 0 {
                truncated = 0;
                break;
            }
            // A return address points after the call: look up the call itself.
            let Some((row, func)) = cached_row(cache, pc - 1, packed) else {
                // No rule for it: the last frame.
                if len < MAX_FRAMES {
                    *scratch.frame(len) = pc;
                    len += 1;
                    hash = (hash ^ pc).wrapping_mul(FNV_PRIME);
                }
                break;
            };
            let new = differ(func, recent[0])
                & differ(func, recent[1])
                & differ(func, recent[2])
                & differ(func, recent[3]);
            let keep = new | (fold ^ 1);
            let fold_it = keep ^ 1;
            if keep & (len as u64 >> MAX_FRAMES.trailing_zeros()) != 0 {
                break; // MAX_FRAMES kept, another to keep: truncated
            }
            // Written either way; a folded frame's slot is the next frame's.
            *scratch.frame(len) = pc;
            len += keep as usize;
            folded |= fold_it;
            hash = select(keep, (hash ^ pc).wrapping_mul(FNV_PRIME), hash);
            recent = [
                select(keep, func, recent[0]),
                select(keep, recent[0], recent[1]),
                select(keep, recent[1], recent[2]),
                select(keep, recent[2], recent[3]),
            ];
            let base = match row.cfa_reg {
                cfa::RSP => sp,
                cfa::RBP => bp,
                cfa::END => {
                    truncated = 0;
                    break;
                }
                _ => break,
            };
            let frame = base.wrapping_add(row.cfa_offset as i64 as u64);
            if row.rbp_saved == 1 {
                let at = frame.wrapping_add(row.rbp_offset as i64 as u64);
                match window.word(&mut scratch.window, at) {
                    Some(saved) => bp = saved,
                    None => break,
                }
            }
            match window.word(&mut scratch.window, frame - 8) {
                Some(ret) => pc = ret,
                None => break,
            }
            sp = frame;
        }
        let folded = folded as u32;
        scratch.stack.len = len as u32;
        scratch.stack.truncated = truncated;
        scratch.stack.folded = folded;
        if truncated == 1 {
            bump(|c| &mut c.truncated_stacks);
            hash ^= 1; // same frames, but a truncated stack is another stack
        }
        if folded == 1 {
            bump(|c| &mut c.folded_stacks);
            hash ^= 2; // and so is a folded one
        }
        // A known stack (the usual case) takes no lock, and one this CPU
        // saw no lookup (0 is an empty slot, never a key seen).
        let known = &mut scratch.known[hash as usize & (KNOWN_STACKS - 1)];
        if *known == hash && hash != 0 {
            return Some(hash);
        }
        if DWARF_STACKS.get_ptr(&hash).is_some() {
            *known = hash;
            return Some(hash);
        }
        match DWARF_STACKS.insert(&hash, &scratch.stack, BPF_NOEXIST as u64) {
            Ok(()) => {
                bump(|c| &mut c.stacks_stored);
                Some(hash)
            }
            Err(e) if e == -errno::EEXIST => Some(hash), // stored meanwhile
            Err(_) => match shortened(&mut scratch.stack) {
                // Full (or no memory): keep the innermost frames.
                Some(key) => {
                    bump(|c| &mut c.stacks_shortened);
                    Some(key)
                }
                // That table too: the innermost frame, the caller.
                None => {
                    bump(|c| &mut c.stacks_degraded);
                    Some(CALLER_ONLY)
                }
            },
        }
    }

    /// Stores `stack` cut to its innermost `SHORT_FRAMES` frames (marked
    /// truncated) in `SHORT_STACKS`; returns its key, `None` if that table
    /// has no room either.
    #[inline(always)]
    fn shortened(stack: &mut DwarfStack) -> Option<u64> {
        let mut hash = FNV_OFFSET;
        let mut kept: u32 = 0;
        for i in 0..SHORT_FRAMES {
            if i as u32 >= stack.len {
                break;
            }
            hash = (hash ^ stack.frames[i]).wrapping_mul(FNV_PRIME);
            kept += 1;
        }
        stack.len = kept;
        stack.truncated = 1;
        hash ^= 1;
        if stack.folded == 1 {
            hash ^= 2;
        }
        if SHORT_STACKS.get_ptr(&hash).is_some() {
            return Some(hash);
        }
        match SHORT_STACKS.insert(&hash, &*stack, BPF_NOEXIST as u64) {
            Ok(()) => Some(hash),
            Err(e) if e == -errno::EEXIST => Some(hash),
            Err(_) => None,
        }
    }

    /// [`find_row`] through this CPU's cache of rows by pc: most
    /// allocations come from a few call paths, whose return addresses hit
    /// (one load instead of a binary search of 33 steps). An entry is
    /// valid for the module table it was found in (`packed`, which counts
    /// the tables written). Both ways end reading the entry, so the
    /// verifier sees one state after it, not two. (One slot per map entry
    /// cost a second dependent load per frame, the per-CPU pointer, and
    /// both missed the CPU's caches: a quarter of the entry program's
    /// time on binary-trees.)
    #[inline(always)]
    fn cached_row(cache: &mut RowCache, pc: u64, packed: u32) -> Option<(UnwindRow, u64)> {
        let slot = ((pc ^ (pc >> 12)) as usize) & (ROW_CACHE_SLOTS as usize - 1);
        let entry = &mut cache.rows[slot];
        if entry.pc != pc || entry.packed != packed as u64 {
            // `count` is a mask, not min(): the searches stay prunable.
            let modules = module_table::count(packed);
            let table = module_table::first_slot(packed);
            let (row, func) = find_row(pc, table, modules)?;
            *entry = CachedRow {
                pc,
                rule: rule_of(&row),
                func,
                packed: packed as u64,
            };
        }
        Some((row_of(entry.rule), entry.func))
    }

    /// The CFI row covering `pc` and the function it belongs to (its start,
    /// as an address in the target): binary search for the module, then for
    /// the last row starting at or before `pc`.
    ///
    /// Both searches are branch-free (a fixed number of halvings, the
    /// comparison turned into 0/1 arithmetically): a data-dependent branch per
    /// step multiplies the paths the verifier must walk.
    #[inline(always)]
    fn find_row(pc: u64, table: u32, modules: u32) -> Option<(UnwindRow, u64)> {
        if modules == 0 {
            return None;
        }
        // Module: the last range with start <= pc (ranges are sorted).
        let mut base: u32 = 0;
        let mut len: u32 = modules;
        for _ in 0..module_table::MODULE_SEARCH_STEPS {
            let half = len >> 1;
            let m = MODULE_RANGES.get(table + base + half)?;
            base += half * at_or_before(m.start, pc);
            len -= half;
        }
        let module = MODULE_RANGES.get(table + base)?;
        if pc < module.start || pc >= module.end || module.row_count == 0 {
            return None;
        }
        // Below 2^32 (pc is in the module), but not masked: LLVM would turn
        // `at_or_before` on two known 32-bit values into a branch.
        let rel = pc.wrapping_sub(module.bias);
        let mut base = module.row_start;
        let mut len = module.row_count;
        for _ in 0..module_table::ROW_SEARCH_STEPS {
            let half = len >> 1;
            let row = UNWIND_ROWS.get(base + half)?;
            base += half * at_or_before(row.pc as u64, rel);
            len -= half;
        }
        let row = UNWIND_ROWS.get(base)?;
        if row.pc as u64 > rel {
            return None;
        }
        Some((*row, module.bias.wrapping_add(row.func as u64)))
    }

    /// 1 if `a != b`, else 0, without a branch.
    #[inline(always)]
    fn differ(a: u64, b: u64) -> u64 {
        let x = a ^ b;
        // `x | -x` has the top bit set unless x is 0.
        opaque((x | opaque(x.wrapping_neg())) >> 63)
    }

    /// `if pick == 1 { a } else { b }` for `pick` 0 or 1, without a branch.
    #[inline(always)]
    fn select(pick: u64, a: u64, b: u64) -> u64 {
        let mask = opaque(pick.wrapping_neg());
        (a & mask) | (b & !mask)
    }

    /// `x`, hidden from LLVM: it recognizes `equal` and `select` as a
    /// comparison and a choice and compiles them back into branches (BPF
    /// has no conditional move), which is what they are here to avoid.
    /// An empty `asm!` (LLVM cannot see through it) rather than
    /// `black_box`, which spills the value to the stack and reloads it.
    #[inline(always)]
    fn opaque(mut x: u64) -> u64 {
        unsafe { core::arch::asm!("{0} = {0}", inout(reg) x, options(pure, nomem, nostack)) };
        x
    }

    /// 1 if `a <= b`, else 0, without a branch (both below 2^63).
    #[inline(always)]
    fn at_or_before(a: u64, b: u64) -> u32 {
        ((b.wrapping_sub(a) >> 63) ^ 1) as u32
    }

    /// `_dl_debug_state` runs when the dynamic linker has changed the list of
    /// loaded libraries. During `run` the main thread is traced:
    /// `LIBRARY_LOAD_SIGNAL` (SIGURG, ignored by default) stops it so
    /// memprof can add the new libraries' address ranges before their code
    /// runs (memprof swallows the signal; `DLOPEN_SIGNALLED` tells it from
    /// the program's own).
    #[uprobe]
    pub fn dl_debug_state(_ctx: ProbeContext) -> u32 {
        let thread = bpf_get_current_pid_tgid();
        if HOST.load() == 1 {
            // Userspace reads the process's mappings again (and probes the
            // allocators of files it has not seen: a process not followed
            // yet may be about to call them).
            let index = known_process().unwrap_or(host::IGNORED);
            host_event(host::LIBRARIES, (thread >> 32) as u32, index, 0);
            return 0;
        }
        if setting(config::SIGNAL_ON_DLOPEN) == 1 && (thread >> 32) == (thread & 0xffff_ffff) {
            if let Some(flag) = CONFIG.get_ptr_mut(config::DLOPEN_SIGNALLED) {
                unsafe { *flag = 1 };
            }
            unsafe { bpf_send_signal_thread(LIBRARY_LOAD_SIGNAL) };
        }
        0
    }

    /// On `GC_gc_no++`: a collection finished marking; the world is stopped
    /// and the mark bits are the collector's verdict. Count it, and hold
    /// the collecting thread (a signal to it, which memprof's tracer takes)
    /// so memprof reads the marks before anything changes them.
    #[uprobe]
    pub fn gc_collection(ctx: ProbeContext) -> u32 {
        if !enabled() {
            return 0;
        }
        let Some(slot) = GC_EPOCH.get_ptr_mut(0) else {
            return 0;
        };
        // One collector at a time, world stopped: a plain add is safe.
        let epoch = unsafe {
            *slot += 1;
            *slot
        };
        bump(|c| &mut c.gc_collections);
        let judged_here = setting(config::GC_VERDICTS) == 1;
        if judged_here {
            // The cookie is the increment's link-time address.
            let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
            let ip = unsafe { (*ctx.regs).rip };
            judge_all(epoch, ip.wrapping_sub(cookie));
        }
        let tid = bpf_get_current_pid_tgid() as u32;
        if setting(config::GC_HOLD) == 1
            && TRACED.get_ptr(&tid).is_some()
            && HELD.insert(&tid, &epoch, 0).is_ok()
        {
            unsafe { bpf_send_signal_thread(HOLD_SIGNAL) };
        } else if !judged_here {
            bump(|c| &mut c.gc_not_held);
        }
        0
    }

    /// State of one collection's judging, for `judge_one`.
    #[repr(C)]
    struct Judging {
        epoch: u64,
        /// `GC_arrays` and `GC_all_nils` in the target.
        arrays: u64,
        nils: u64,
        /// The last region (`addr >> key_shift`) looked up, and its bottom
        /// index: objects share a few regions (4 MiB each).
        region: u64,
        bottom_index: u64,
        /// The last heap block looked up, and its header, object size and
        /// whether it holds objects: objects allocated one after another
        /// share blocks, and then only their mark byte is read.
        block: u64,
        header: u64,
        size: u64,
        objects: u64,
    }

    /// The end of collection `epoch`'s marking, world stopped (no thread
    /// allocates meanwhile): every object of `GC_SLOTS` allocated before it
    /// gets the collector's verdict (`GC_base(p) == p && GC_is_marked(p)`);
    /// the collected are streamed (`gc_event::COLLECTED`) and forgotten,
    /// then `gc_event::JUDGED`.
    #[inline(always)]
    fn judge_all(epoch: u64, bias: u64) {
        let (Some(marks), Some(count)) = (GC_MARKS.get(0), GC_SLOT_COUNT.get_ptr_mut(0)) else {
            return;
        };
        let start = unsafe { bpf_ktime_get_ns() };
        let arrays = if marks.arrays_in_slot != 0 {
            read_word(marks.arrays.wrapping_add(bias)).unwrap_or(0)
        } else {
            marks.arrays.wrapping_add(bias)
        };
        let nils = read_word(arrays.wrapping_add(marks.all_nils)).unwrap_or(0);
        let mut judging = Judging {
            epoch,
            arrays,
            nils,
            region: u64::MAX,
            bottom_index: 0,
            block: u64::MAX,
            header: 0,
            size: 0,
            objects: 0,
        };
        let used = unsafe { *count }.min(JUDGED_SLOTS as u64);
        let Some(kept) = GC_SLOT_COUNT.get_ptr_mut(1) else {
            return;
        };
        unsafe { *kept = 0 };
        unsafe {
            gen::bpf_loop(
                used as u32,
                judge_one as *mut _,
                &mut judging as *mut Judging as *mut _,
                0,
            )
        };
        unsafe { *count = *kept };
        let gc_no_at = if marks.gc_no_in_slot != 0 {
            read_word(marks.gc_no.wrapping_add(bias)).unwrap_or(0)
        } else {
            marks.gc_no.wrapping_add(bias)
        };
        // The probe is on the increment, before it: this collection is one more.
        let gc_no = read_word(gc_no_at).unwrap_or(0).wrapping_add(1);
        let now = unsafe { bpf_ktime_get_ns() };
        let done = GcEvent {
            addr: gc_no,
            caller: 0,
            stack_id: 0,
            size: now.wrapping_sub(start),
            timestamp_ns: start,
            replaces: 0,
            epoch: epoch as u32,
            kind: 0,
            op: gc_event::JUDGED,
            _pad: 0,
            objects: 0,
        };
        send_gc_event(&done);
    }

    /// Slot `index` of `GC_SLOTS` (a `bpf_loop` callback): judged if its
    /// object was allocated before the collection; moved down to the
    /// first slot not kept yet (`GC_SLOT_COUNT[1]`) unless collected.
    extern "C" fn judge_one(index: u64, judging: *mut Judging) -> i64 {
        let judging = unsafe { &mut *judging };
        let (Some(slot), Some(kept)) = (
            GC_SLOTS.get(index as u32).copied(),
            GC_SLOT_COUNT.get_ptr_mut(1),
        ) else {
            return 1;
        };
        let size_sent = match judge_slot(&slot, judging) {
            Judged::Keep(size_sent) => size_sent,
            Judged::Gone => return 0,
        };
        let to = unsafe { *kept };
        unsafe { *kept = to + 1 };
        if to != index || size_sent != slot.size_sent {
            if let Some(dst) = GC_SLOTS.get_ptr_mut(to as u32) {
                unsafe { *dst = JudgedSlot { size_sent, ..slot } };
            }
        }
        0
    }

    /// What a slot's judging decided.
    enum Judged {
        /// Still tracked; whether its size was sent.
        Keep(u32),
        /// Collected, and userspace told.
        Gone,
    }

    #[inline(always)]
    fn judge_slot(slot: &JudgedSlot, judging: &mut Judging) -> Judged {
        // Objects allocated since the collection started are not judged.
        if slot.epoch >= judging.epoch as u32 {
            return Judged::Keep(slot.size_sent);
        }
        let Some(marks) = GC_MARKS.get(0) else {
            return Judged::Keep(slot.size_sent);
        };
        let Some((marked, size)) = verdict(marks, judging, slot.addr) else {
            bump(|c| &mut c.gc_verdicts_failed);
            return Judged::Keep(slot.size_sent);
        };
        // Only the collected are sent, and a marked object's size once.
        if marked && slot.size_sent != 0 {
            return Judged::Keep(1);
        }
        let event = GcEvent {
            addr: slot.addr,
            caller: 0,
            stack_id: 0,
            size,
            timestamp_ns: 0,
            replaces: 0,
            epoch: judging.epoch as u32,
            kind: 0,
            op: if marked {
                gc_event::MARKED
            } else {
                gc_event::COLLECTED
            },
            _pad: 0,
            objects: 0,
        };
        // Changed only once userspace is told: a verdict the ring had no
        // room for is counted, and taken again at the next collection.
        let sent = send_gc_event(&event);
        match (marked, sent) {
            (true, sent) => Judged::Keep(u32::from(sent)),
            (false, true) => Judged::Gone,
            (false, false) => Judged::Keep(slot.size_sent),
        }
    }

    /// The collector's verdict on the object at `addr`: marked, and its
    /// size as the collector counts it (0 when it is no longer an object);
    /// `None` when its memory could not be read. memprof's
    /// `MarkLayout::verdict` does the same from userspace.
    #[inline(always)]
    fn verdict(marks: &KernelMarks, judging: &mut Judging, addr: u64) -> Option<(bool, u64)> {
        let hblksize = 1u64 << (marks.log_hblksize & 31);
        let block = addr & !(hblksize - 1);
        if block != judging.block {
            let (header, size) = match block_header(marks, judging, addr)? {
                Some(found) => found,
                None => (0, 0),
            };
            (judging.block, judging.header, judging.size) = (block, header, size);
            judging.objects = u64::from(header != 0);
        }
        // No block, the later blocks of a large object, or a free block.
        if judging.objects == 0 {
            return Some((false, 0));
        }
        let (hdr, size) = (judging.header, judging.size);
        let in_block = addr & (hblksize - 1);
        // GC_base: objects are laid out from the block start, `size` apart.
        if size == 0 || addr & 7 != 0 || in_block % size != 0 {
            return Some((false, 0));
        }
        if size <= hblksize && in_block + size > hblksize {
            return Some((false, 0));
        }
        let granule = in_block >> (marks.granule_shift & 31);
        let mark: u8 = unsafe {
            bpf_probe_read_user(hdr.wrapping_add(marks.hb_marks).wrapping_add(granule) as *const u8)
        }
        .ok()?;
        Some((mark != 0, size))
    }

    /// The header and object size of the heap block holding `addr`;
    /// `Some(None)` when there is none holding objects there (no block, the
    /// later blocks of a large object, or a free block).
    #[inline(always)]
    fn block_header(
        marks: &KernelMarks,
        judging: &mut Judging,
        addr: u64,
    ) -> Option<Option<(u64, u64)>> {
        let hi = addr >> marks.key_shift;
        let bi = if hi == judging.region {
            judging.bottom_index
        } else {
            let bi = bottom_index(marks, judging, hi)?;
            judging.region = hi;
            judging.bottom_index = bi;
            bi
        };
        let slot = (addr >> (marks.log_hblksize & 31)) & marks.bottom_mask;
        let hdr = read_word(bi.wrapping_add(marks.bi_index).wrapping_add(slot << 3))?;
        if hdr <= marks.max_forward {
            return Some(None);
        }
        let flags: u8 =
            unsafe { bpf_probe_read_user(hdr.wrapping_add(marks.hb_flags) as *const u8) }.ok()?;
        if flags & marks.free_blk != 0 {
            return Some(None);
        }
        Some(Some((hdr, read_word(hdr.wrapping_add(marks.hb_sz))?)))
    }

    /// The collector's bottom index of region `hi`: through `GC_top_index`
    /// and its hash chain, else `GC_all_nils` (whose entries are all 0).
    #[inline(always)]
    fn bottom_index(marks: &KernelMarks, judging: &Judging, hi: u64) -> Option<u64> {
        let mut bi = read_word(
            judging
                .arrays
                .wrapping_add(marks.top_index)
                .wrapping_add((hi & marks.top_mask) << 3),
        )?;
        for _ in 0..MAX_CHAIN {
            if bi == judging.nils || read_word(bi.wrapping_add(marks.bi_key))? == hi {
                return Some(bi);
            }
            bi = read_word(bi.wrapping_add(marks.bi_hash_link))?;
        }
        None
    }

    #[inline(always)]
    fn read_word(addr: u64) -> Option<u64> {
        unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
    }

    fn arg(ctx: &ProbeContext, n: usize) -> u64 {
        ctx.arg::<u64>(n).unwrap_or(0)
    }

    /// Entry of every allocating function. The attach cookie gives the
    /// allocator kind and how the arguments are laid out (`cookie`,
    /// `layout`): one program for all, so the verifier walks the unwinder
    /// once at load, not once per layout.
    #[uprobe]
    pub fn alloc_enter(ctx: ProbeContext) -> u32 {
        alloc_entry(&ctx, false);
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
        let cached =
            layout == layout::GC_THREAD_LOCAL as u64 || layout == layout::MALLOC_TCACHE as u64;
        enter(
            ctx,
            kind,
            size,
            arg_ptr,
            op,
            session,
            session && cached,
            refill_lb,
        )
    }

    /// A refill's sample size: what the allocation that ran the list out
    /// asked for, in the caller's register ([`Refill::size_reg`]), else
    /// the list's object size. `pt_regs` is read at constant offsets only.
    #[inline(always)]
    fn requested_size(ctx: &ProbeContext) -> u64 {
        let regs = unsafe { &*ctx.regs };
        let lb = regs.rdi;
        let Some(r) = REFILL.get(0) else { return lb };
        let size = match r.size_reg {
            0 => regs.r15,
            1 => regs.r14,
            2 => regs.r13,
            3 => regs.r12,
            4 => regs.rbp,
            5 => regs.rbx,
            _ => lb,
        };
        // Never more than the object holds.
        if size == 0 || size > lb {
            lb
        } else {
            size
        }
    }

    /// The collector's `GC_bytes_allocd` now (`u64::MAX`: not known).
    #[inline(never)]
    fn bytes_allocd() -> u64 {
        let Some(r) = REFILL.get(0) else {
            return u64::MAX;
        };
        if r.on != 1 {
            return u64::MAX;
        }
        let arrays = if r.arrays_in_slot == 1 {
            match unsafe { bpf_probe_read_user(r.arrays as *const u64) } {
                Ok(a) => a,
                Err(_) => return u64::MAX,
            }
        } else {
            r.arrays
        };
        unsafe { bpf_probe_read_user(arrays.wrapping_add(r.bytes_allocd) as *const u64) }
            .unwrap_or(u64::MAX)
    }

    /// The objects a refill handed out, its list's head at `head` (see
    /// [`Refill`]): the rise of `GC_bytes_allocd` over `lb` (after a
    /// collection inside the call, what was allocated since), at most the
    /// objects from the head's block start to the head; at least 1.
    #[inline(never)]
    fn refill_objects(lb: u64, before: u64, head: u64) -> u16 {
        let lb = lb.max(1);
        let log = match REFILL.get(0) {
            Some(r) if r.on == 1 => r.log_hblksize & 31,
            _ => 12,
        };
        let mut n = (head & ((1u64 << log) - 1)) / lb + 1;
        if before != u64::MAX {
            let after = bytes_allocd();
            if after != u64::MAX {
                let allocd = if after >= before {
                    after - before
                } else {
                    after
                };
                n = n.min(allocd / lb);
            }
        }
        n.clamp(1, u16::MAX as u64) as u16
    }

    /// Entry and return of every allocating function in one program: a
    /// uprobe session (Linux 6.13). The entry decides whether the return
    /// runs at all (`SKIP_RETURN`). Userspace uses it with sampling, where
    /// the kernel has it; else (and in exact mode, where every return is
    /// needed and the pair costs less) the pair `alloc_enter`/`alloc_exit`.
    ///
    /// Written out, not with `#[uprobe]`: that macro's wrapper returns 0
    /// whatever the function returns, and here the value is the decision.
    #[unsafe(no_mangle)]
    #[unsafe(link_section = "uprobe")]
    pub fn alloc_session(ctx: *mut core::ffi::c_void) -> u32 {
        let regs = ctx as *mut aya_ebpf::bindings::pt_regs;
        if session_is_return() {
            session_return(regs);
            0
        } else {
            session_entry(regs)
        }
    }

    // The two halves as functions of their own: each gets its own
    // 512-byte stack frame (together, inlined, they overflow one).
    #[inline(never)]
    fn session_entry(regs: *mut aya_ebpf::bindings::pt_regs) -> u32 {
        alloc_entry(&ProbeContext::new(regs as *mut core::ffi::c_void), true)
    }

    #[inline(never)]
    fn session_return(regs: *mut aya_ebpf::bindings::pt_regs) {
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

    /// Return probe for every allocating function.
    #[uretprobe]
    pub fn alloc_exit(ctx: RetProbeContext) -> u32 {
        alloc_return(unsafe { &*ctx.regs });
        0
    }

    /// The return of an allocating function: `regs` after its `ret`.
    #[inline(always)]
    fn alloc_return(regs: &aya_ebpf::bindings::pt_regs) {
        if !enabled() {
            return;
        }
        bump(|c| &mut c.returns_probed);
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = PENDING.get_ptr_mut(&thread) else {
            return;
        };
        if unsafe { (*pending).active } == 0 {
            return;
        }
        let call = unsafe { *pending };
        // After `ret`: %rsp is the entry's + 8.
        let entry_sp = regs.rsp.wrapping_sub(8);
        if entry_sp > call.sp {
            // A call above the pending one returns: that one's return was missed.
            bump(|c| &mut c.stale_calls);
            unsafe { (*pending).active = 0 };
            return;
        }
        if call.nested > 0 {
            unsafe { (*pending).nested -= 1 };
            return;
        }
        if entry_sp < call.sp {
            return; // a call inside the pending one, whose entry was not seen
        }
        unsafe { (*pending).active = 0 };

        let ret: u64 = regs.rax;
        if call.op == op::REFILL {
            // The new list's head: the object the allocation that ran the
            // list out gets (the collector takes it right after).
            let head = unsafe { bpf_probe_read_user(call.arg_ptr as *const u64) }.unwrap_or(0);
            if head == 0 {
                bump(|c| &mut c.failed_allocs);
                return;
            }
            let objects = refill_objects(call.refill_lb, call.allocd_before, head);
            bump(|c| &mut c.refills);
            record(head, &call, 0, pending, objects);
            return;
        }
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
        let mut call = call;
        if call.op == op::REALLOC && call.arg_ptr != 0 && (!failed || call.size == 0) {
            // The new block has the kind of the old one (GC_realloc keeps
            // atomic objects atomic).
            // realloc succeeded (or was realloc(p, 0), which frees p): the old block is gone.
            let old = host::live_key(call.arg_ptr, call.site.process);
            if let Some(kind) = release(old, call.site.kind) {
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

    /// Records an allocation at `addr`; `slot`: the thread's `PENDING` slot.
    #[inline(always)]
    fn record(addr: u64, call: &PendingCall, replaces: u64, slot: *mut PendingCall, objects: u16) {
        bump(|c| &mut c.allocs);
        let epoch = GC_EPOCH.get(0).copied().unwrap_or(0);
        let copied = in_copy(call.site.kind);
        let (site, in_totals, now) = if copied {
            // Userspace's copy sums the totals from the event: no per-site
            // lookup here.
            (call.site, true, gc_time(slot, epoch, replaces != 0))
        } else {
            // The site's totals first: when the site table is full, the
            // block is recorded under its kind's overflow site, live entry
            // included.
            let (site, totals) = site_totals(&call.site);
            let in_totals = match totals {
                Some(totals) => unsafe {
                    (*totals).count += 1;
                    (*totals).bytes += call.size;
                    true
                },
                None => false,
            };
            (site, in_totals, unsafe { bpf_ktime_get_ns() })
        };
        let live = LiveAlloc {
            site,
            size: call.size,
            timestamp_ns: now,
            epoch,
        };
        let in_live = if copied {
            // Userspace's copy is the only one (address reuse is seen there);
            // an event the ring had no room for is counted as such.
            gc_event(addr, gc_event::ALLOC, &live, replaces, objects);
            if setting(config::GC_VERDICTS) == 1 {
                judge_later(addr, epoch);
            }
            true
        } else {
            // Added if new (one hash operation, the usual case). An address
            // still live was freed without us seeing it: for a GC object,
            // collected (its address was reused); else a missed free.
            let key = host::live_key(addr, call.site.process);
            let inserted = match LIVE.insert(&key, &live, BPF_NOEXIST as u64) {
                Ok(()) => true,
                Err(e) if e == -errno::EEXIST => {
                    if let Some(old) = LIVE.get_ptr(&key) {
                        let old = unsafe { *old };
                        retire(&old, now, true);
                        count_live(old.site.kind, old.size, -1);
                    }
                    LIVE.insert(&key, &live, 0).is_ok()
                }
                Err(_) => false,
            };
            if inserted {
                count_live(live.site.kind, live.size, 1);
            }
            inserted
        };
        // Each allocation not fully recorded is counted once, in one category.
        match (in_live, in_totals) {
            (true, true) => {}
            (false, true) => bump(|c| &mut c.live_map_full),
            (true, false) => bump(|c| &mut c.sites_map_full),
            (false, false) => bump(|c| &mut c.both_maps_full),
        }
    }

    /// The time of a GC object's allocation: the thread's last clock read
    /// while the jiffy and the collection count are the same (a clock read
    /// is a quarter of the return probe's time here), so up to a jiffy old.
    /// That is finer than GC lifetimes (an object is found dead at a
    /// collection), and keeps what userspace's copy needs: times follow
    /// the thread's order, and every time of an epoch is later than every
    /// time of the epochs before (a new epoch reads the clock). A
    /// `GC_realloc` (`fresh`) reads it: its object is matched to the one it
    /// replaced, which another thread may have made, by time.
    #[inline(always)]
    fn gc_time(slot: *mut PendingCall, epoch: u64, fresh: bool) -> u64 {
        let jiffies = unsafe { gen::bpf_jiffies64() };
        let clock = unsafe { &mut (*slot).clock };
        if !fresh && clock.jiffies == jiffies && clock.epoch == epoch {
            return clock.ns;
        }
        let ns = unsafe { bpf_ktime_get_ns() };
        *clock = ThreadClock { ns, jiffies, epoch };
        ns
    }

    /// The site an allocation is recorded under and its totals (this CPU's
    /// slot): its own, added to the table if new; when the table has no
    /// room, its kind's overflow slot (counted in `sites_overflowed`), so
    /// totals stay exact.
    #[inline(always)]
    fn site_totals(site: &AllocSite) -> (AllocSite, Option<*mut SiteTotals>) {
        if let Some(totals) = SITE_TOTALS.get_ptr_mut(site) {
            return (*site, Some(totals));
        }
        // Another CPU may add it meanwhile (EEXIST): the lookup after finds it.
        if SITE_TOTALS
            .insert(site, &SiteTotals::default(), BPF_NOEXIST as u64)
            .is_ok()
        {
            bump(|c| &mut c.sites_stored);
        }
        if let Some(totals) = SITE_TOTALS.get_ptr_mut(site) {
            return (*site, Some(totals));
        }
        bump(|c| &mut c.sites_overflowed);
        let overflow = AllocSite {
            caller: 0,
            stack_id: SITES_OVERFLOW,
            kind: site.kind,
            _pad: [0; 3],
            process: site.process,
        };
        (overflow, overflow_totals(site.kind))
    }

    /// The overflow slot of allocation kind `kind`.
    #[inline(always)]
    fn overflow_totals(kind: u8) -> Option<*mut SiteTotals> {
        OVERFLOW_TOTALS.get_ptr_mut(kind as u32)
    }

    #[inline(always)]
    fn is_gc(kind: u8) -> bool {
        kind == AllocKind::Gc as u8 || kind == AllocKind::GcAtomic as u8
    }

    /// Whether blocks of `kind` live in userspace's copy, not in `LIVE`.
    #[inline(always)]
    fn in_copy(kind: u8) -> bool {
        is_gc(kind) && setting(config::GC_COPY) == 1
    }

    /// Adds `sign` blocks of `size` bytes to `LIVE_BY_KIND` (this CPU's slot).
    #[inline(always)]
    fn count_live(kind: u8, size: u64, sign: i64) {
        let k = (kind & 3) as usize;
        if let Some(slot) = LIVE_BY_KIND.get_ptr_mut(0) {
            unsafe {
                (*slot).blocks[k] += sign;
                (*slot).bytes[k] += sign * size as i64;
            }
        }
    }

    /// Tells userspace's copy of the GC objects.
    #[inline(always)]
    fn gc_event(addr: u64, op: u8, object: &LiveAlloc, replaces: u64, objects: u16) {
        let event = GcEvent {
            addr,
            caller: object.site.caller,
            stack_id: object.site.stack_id,
            size: object.size,
            timestamp_ns: object.timestamp_ns,
            replaces,
            epoch: object.epoch as u32,
            kind: object.site.kind,
            op,
            _pad: 0,
            objects,
        };
        send_gc_event(&event);
    }

    /// Queues `event` for userspace's copy; whether there was room (an
    /// event the ring had none for is counted).
    #[inline(always)]
    fn send_gc_event(event: &GcEvent) -> bool {
        // Waking the reader for every event would cost a wakeup per
        // allocation: it reads every few ms by itself, and is woken only
        // when the queued events cross `GC_EVENTS_WAKE_BYTES`.
        let queued = GC_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
        let flags = if (GC_EVENTS_WAKE_BYTES..GC_EVENTS_WAKE_BYTES + 4096).contains(&queued) {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        };
        if GC_EVENTS.output::<GcEvent>(event, flags as u64).is_err() {
            bump(|c| &mut c.gc_events_lost);
            return false;
        }
        true
    }

    /// Has the GC object at `addr`, allocated in `epoch`, judged at the
    /// collections from the next on (`config::GC_VERDICTS`).
    #[inline(always)]
    fn judge_later(addr: u64, epoch: u64) {
        let Some(count) = GC_SLOT_COUNT.get_ptr_mut(0) else {
            return;
        };
        // Threads allocate at once: each takes its own slot.
        let mut i = 1u64;
        unsafe {
            core::arch::asm!(
                "{i} = atomic_fetch_add((u64 *)({p} + 0), {i})",
                p = in(reg) count,
                i = inout(reg) i,
            )
        };
        match GC_SLOTS.get_ptr_mut(i as u32) {
            Some(slot) if i < JUDGED_SLOTS as u64 => unsafe {
                *slot = JudgedSlot {
                    addr,
                    epoch: epoch as u32,
                    size_sent: 0,
                }
            },
            _ => bump(|c| &mut c.gc_unjudged),
        }
    }

    /// Adds a dead block's lifetime to its site's totals (this CPU's slot).
    #[inline(always)]
    fn retire(old: &LiveAlloc, now: u64, reused: bool) {
        let totals = match SITE_TOTALS.get_ptr_mut(&old.site) {
            Some(totals) => totals,
            None if old.site.stack_id == SITES_OVERFLOW => match overflow_totals(old.site.kind) {
                Some(totals) => totals,
                None => return,
            },
            None => return, // not in the totals (counted when it was allocated)
        };
        let lifetime = now.saturating_sub(old.timestamp_ns);
        let gc = is_gc(old.site.kind);
        unsafe {
            (*totals).died += 1;
            (*totals).lifetime_ns += lifetime;
            (*totals).buckets[lifetime_bucket(lifetime) & 7] += 1;
            if reused && gc {
                (*totals).reused += 1;
                (*totals).reused_bytes += old.size;
            }
        }
    }

    #[inline(always)]
    /// Forgets a freed block (`key`: its `LIVE` key, [`host::live_key`]);
    /// returns its kind if it was known. `kind`: the freeing function's
    /// (its attach cookie, or the realloc's).
    fn release(key: u64, kind: u8) -> Option<u8> {
        bump(|c| &mut c.frees);
        // The clock is read only for a block that is known: with
        // sampling most frees are of blocks never followed, and a clock
        // read is a fifth of such a free's probe time.
        if in_copy(kind) {
            let now = unsafe { bpf_ktime_get_ns() };
            // The copy knows the object (or counts the free as unknown).
            let gone = LiveAlloc {
                site: AllocSite {
                    caller: 0,
                    stack_id: 0,
                    kind,
                    _pad: [0; 3],
                    process: 0,
                },
                size: 0,
                timestamp_ns: now,
                epoch: 0,
            };
            // Only without `attach --all`: the key is the address.
            gc_event(key, gc_event::GONE, &gone, 0, 1);
            return None;
        }
        match LIVE.get_ptr(&key) {
            Some(old) => {
                let old = unsafe { *old };
                let now = unsafe { bpf_ktime_get_ns() };
                retire(&old, now, false);
                if LIVE.remove(&key).is_ok() {
                    count_live(old.site.kind, old.size, -1);
                }
                Some(old.site.kind)
            }
            None => {
                bump(|c| &mut c.unknown_frees);
                None
            }
        }
    }

    #[uprobe]
    pub fn free_enter(ctx: ProbeContext) -> u32 {
        if !enabled() {
            return 0;
        }
        let addr = arg(&ctx, 0);
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
        }
        let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u8;
        match known_process() {
            Some(index) => {
                let _ = release(host::live_key(addr, index), kind);
            }
            None => {
                bump(|c| &mut c.frees);
                bump(|c| &mut c.unknown_frees);
            }
        }
        0
    }

    /// The index of the process making this call if it has one (no new
    /// one: a process not followed yet has no block to free).
    #[inline(always)]
    fn known_process() -> Option<u32> {
        if HOST.load() == 0 {
            return Some(0);
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let index = unsafe { *PROCESSES.get_ptr(&tgid)? };
        (index != host::IGNORED).then_some(index)
    }

    /// `munmap(addr, len)`: forgets a mapping made by `mmap` at exactly that
    /// address. Partial unmaps and unmaps of untracked ranges are not counted.
    #[uprobe]
    pub fn munmap_enter(ctx: ProbeContext) -> u32 {
        if !enabled() {
            return 0;
        }
        let Some(index) = known_process() else {
            return 0;
        };
        let key = host::live_key(arg(&ctx, 0), index);
        if let Some(live) = LIVE.get_ptr(&key) {
            if unsafe { (*live).site.kind } == AllocKind::Mmap as u8 {
                let _ = release(key, AllocKind::Mmap as u8);
            }
        }
        0
    }

    /// A thread exits (any thread of the system: `sched_process_exit`
    /// fires for each): its `PENDING` slot goes, so the table holds the
    /// threads alive, not every thread the target ever had.
    #[raw_tracepoint(tracepoint = "sched_process_exit")]
    pub fn thread_exit(_ctx: RawTracePointContext) -> i32 {
        let thread = bpf_get_current_pid_tgid();
        // Looked up first: a lookup takes no lock, a remove does.
        if PENDING.get_ptr(&thread).is_some() {
            let _ = PENDING.remove(&thread);
        }
        // `attach --all`: the main thread's exit ends the process.
        if HOST.load() == 1 && thread >> 32 == thread & 0xffff_ffff {
            let tgid = (thread >> 32) as u32;
            if let Some(index) = PROCESSES.get_ptr(&tgid) {
                let index = unsafe { *index };
                if index != host::IGNORED {
                    let task = unsafe { bpf_get_current_task() } as *const u8;
                    let at = task.wrapping_add(TASK_EXIT_CODE.load() as usize);
                    let code = unsafe { bpf_probe_read_kernel(at as *const u32) }.unwrap_or(0);
                    host_event(host::EXIT, tgid, index, code);
                    let _ = PROCESSES.remove(&tgid);
                }
            }
        }
        0
    }

    /// `attach --all`: a process `exec`ed: the index of its old program is
    /// done, and the new program gets one now, before any of its code
    /// runs: userspace reads its mappings and gives the unwinder its table
    /// while the dynamic linker is still at work, and probes the
    /// allocators of a program it has not seen (a static one).
    #[raw_tracepoint(tracepoint = "sched_process_exec")]
    pub fn process_exec(_ctx: RawTracePointContext) -> i32 {
        if HOST.load() == 0 || !enabled() {
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if let Some(index) = PROCESSES.get_ptr(&tgid) {
            let index = unsafe { *index };
            if index == host::IGNORED {
                return 0;
            }
            host_event(host::EXEC, tgid, index, 0);
            let _ = PROCESSES.remove(&tgid);
        }
        let _ = new_process(tgid);
        0
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

#[cfg(not(target_arch = "bpf"))]
fn main() {}
