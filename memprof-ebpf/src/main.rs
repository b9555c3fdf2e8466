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
//! Boehm GC objects are never freed: `gc_collection` (on `GC_gc_no++`, the
//! end of a collection's marking, world stopped) counts the collection in
//! `GC_EPOCH` and stops the collecting thread with a signal memprof takes
//! (it traces the target): memprof reads the mark bits while the world is
//! still stopped. While it does (`config::GC_COPY`), GC objects are not put
//! in `LIVE`: allocations and `GC_free`s are streamed to `GC_EVENTS` and
//! memprof's copy is the only record (their number is not bounded by
//! `LIVE`'s size). Every allocation is tagged with the epoch it was made in
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

#[cfg(target_arch = "bpf")]
mod probes {
    use aya_ebpf::{
        bindings::{
            BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
        },
        helpers::{
            bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
            bpf_send_signal_thread,
        },
        macros::{map, uprobe, uretprobe},
        maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
        programs::{tracing::StackIdContext, ProbeContext, RetProbeContext},
        EbpfContext,
    };
    use memprof_common::{
        cfa, config, errno, gc_event, lifetime_bucket, module_table, op, AllocKind, AllocSite,
        DwarfStack, GcEvent, KernelCounters, KindLive, LiveAlloc, ModuleRange, PendingCall,
        SiteTotals, UnwindRow, HOLD_SIGNAL, LIBRARY_LOAD_SIGNAL, MAX_FRAMES, NO_STACK,
    };

    // Sizes are defaults; userspace sets them from --max-live / --max-stacks.
    #[map]
    static PENDING: HashMap<u64, PendingCall> = HashMap::with_max_entries(8192, 0);
    #[map]
    static LIVE: HashMap<u64, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);
    #[map]
    static SITE_TOTALS: PerCpuHashMap<AllocSite, SiteTotals> =
        PerCpuHashMap::with_max_entries(1 << 16, 0);
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
    #[map]
    static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, 0);
    /// Two halves (`module_table`): userspace fills the one not in use, then
    /// switches (`config::MODULE_COUNT`), so no probe sees a half-written one.
    #[map]
    static MODULE_RANGES: Array<ModuleRange> = Array::with_max_entries(module_table::ENTRIES, 0);
    /// The stack being unwound (too big for the 512-byte BPF stack).
    #[map]
    static SCRATCH: PerCpuArray<DwarfStack> = PerCpuArray::with_max_entries(1, 0);

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
    const GC_EVENTS_WAKE_BYTES: u64 = 2 << 20;

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

    /// Records a call on entry. `size` is the requested size, `arg_ptr` the
    /// realloc'd block or the posix_memalign out-parameter.
    #[inline(always)]
    fn enter(ctx: &ProbeContext, size: u64, arg_ptr: u64, op: u8) {
        if !enabled() {
            return;
        }
        let thread = bpf_get_current_pid_tgid();
        // Entry probes sit where %rsp and %rbp still have their entry values
        // (userspace guarantees it), so the return address is at the top of
        // the stack and the caller's frame is intact.
        let sp = unsafe { (*ctx.regs).rsp };
        if let Some(outer) = PENDING.get_ptr_mut(&thread) {
            if !is_stale(unsafe { &*outer }, sp) {
                // Inside another allocator call of this thread: the outer call counts.
                unsafe { (*outer).nested += 1 };
                return;
            }
            // Its return was missed: replaced below.
            bump(|c| &mut c.stale_calls);
        }
        let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u8;
        let caller = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
        let stack = if setting(config::UNWIND_DWARF) == 1 {
            dwarf_unwind(ctx)
        } else {
            ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64)
                .map(|id| id as u64)
                .ok()
        };
        let stack_id = match stack {
            Some(id) => id,
            None => {
                bump(|c| &mut c.stack_errors);
                NO_STACK
            }
        };
        let call = PendingCall {
            site: AllocSite {
                caller,
                stack_id,
                kind,
                _pad: [0; 7],
            },
            size,
            arg_ptr,
            nested: 0,
            op,
            _pad: [0; 3],
            sp,
        };
        if PENDING.insert(&thread, &call, 0).is_err() {
            bump(|c| &mut c.pending_full);
        }
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

    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

    /// Unwinds the user stack from the probe (at function entry) with the
    /// CFI tables and stores it in `DWARF_STACKS`. Returns its key.
    #[inline(always)]
    fn dwarf_unwind(ctx: &ProbeContext) -> Option<u64> {
        let stack = unsafe { &mut *SCRATCH.get_ptr_mut(0)? };
        let regs = unsafe { &*ctx.regs };
        // At entry the CFA is %rsp + 8 and the return address is at %rsp.
        let mut sp = regs.rsp;
        let mut bp = regs.rbp;
        let mut pc = unsafe { bpf_probe_read_user(sp as *const u64) }.ok()?;
        sp += 8;
        // `count` is a mask, not min(): the searches stay prunable.
        let packed = setting(config::MODULE_COUNT);
        let modules = module_table::count(packed);
        let table = module_table::first_slot(packed);
        let mut hash = FNV_OFFSET;
        let mut len: u32 = 0;
        let mut truncated: u32 = 1;
        for i in 0..MAX_FRAMES {
            if pc == 0 {
                truncated = 0;
                break;
            }
            stack.frames[i] = pc;
            len = i as u32 + 1;
            hash = (hash ^ pc).wrapping_mul(FNV_PRIME);
            // A return address points after the call: look up the call itself.
            let Some(row) = find_row(pc - 1, table, modules) else {
                break;
            };
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
                match unsafe { bpf_probe_read_user(at as *const u64) } {
                    Ok(saved) => bp = saved,
                    Err(_) => break,
                }
            }
            match unsafe { bpf_probe_read_user((frame - 8) as *const u64) } {
                Ok(ret) => pc = ret,
                Err(_) => break,
            }
            sp = frame;
        }
        if len as usize == MAX_FRAMES && pc != 0 {
            truncated = 1;
        }
        stack.len = len;
        stack.truncated = truncated;
        if truncated == 1 {
            bump(|c| &mut c.truncated_stacks);
            hash ^= 1; // same frames, but a truncated stack is another stack
        }
        match DWARF_STACKS.insert(&hash, stack, BPF_NOEXIST as u64) {
            Ok(()) => Some(hash),
            Err(e) if e == -errno::EEXIST => Some(hash), // seen before
            Err(_) => None,
        }
    }

    /// The CFI row covering `pc`: binary search for the module, then for the
    /// last row starting at or before `pc`.
    ///
    /// Both searches are branch-free (a fixed number of halvings, the
    /// comparison turned into 0/1 arithmetically): a data-dependent branch per
    /// step multiplies the paths the verifier must walk.
    #[inline(always)]
    fn find_row(pc: u64, table: u32, modules: u32) -> Option<UnwindRow> {
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
        let rel = pc.wrapping_sub(module.bias) & 0xffff_ffff;
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
        Some(*row)
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
    pub fn gc_collection(_ctx: ProbeContext) -> u32 {
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
        let tid = bpf_get_current_pid_tgid() as u32;
        if setting(config::GC_HOLD) == 1
            && TRACED.get_ptr(&tid).is_some()
            && HELD.insert(&tid, &epoch, 0).is_ok()
        {
            unsafe { bpf_send_signal_thread(HOLD_SIGNAL) };
        } else {
            bump(|c| &mut c.gc_not_held);
        }
        0
    }

    fn arg(ctx: &ProbeContext, n: usize) -> u64 {
        ctx.arg::<u64>(n).unwrap_or(0)
    }

    /// `malloc(size)`, `valloc(size)`, `pvalloc(size)`, `mmap(addr, len, …)` use arg 0 or 1.
    #[uprobe]
    pub fn alloc_enter(ctx: ProbeContext) -> u32 {
        enter(&ctx, arg(&ctx, 0), 0, op::ALLOC);
        0
    }

    #[uprobe]
    pub fn mmap_enter(ctx: ProbeContext) -> u32 {
        enter(&ctx, arg(&ctx, 1), 0, op::ALLOC);
        0
    }

    #[uprobe]
    pub fn calloc_enter(ctx: ProbeContext) -> u32 {
        let size = arg(&ctx, 0).wrapping_mul(arg(&ctx, 1));
        enter(&ctx, size, 0, op::ALLOC);
        0
    }

    #[uprobe]
    pub fn realloc_enter(ctx: ProbeContext) -> u32 {
        enter(&ctx, arg(&ctx, 1), arg(&ctx, 0), op::REALLOC);
        0
    }

    #[uprobe]
    pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
        let size = arg(&ctx, 1).wrapping_mul(arg(&ctx, 2));
        enter(&ctx, size, arg(&ctx, 0), op::REALLOC);
        0
    }

    /// `memalign(align, size)`, `aligned_alloc(align, size)`.
    #[uprobe]
    pub fn memalign_enter(ctx: ProbeContext) -> u32 {
        enter(&ctx, arg(&ctx, 1), 0, op::ALLOC);
        0
    }

    /// `posix_memalign(void **memptr, align, size)`.
    #[uprobe]
    pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
        enter(&ctx, arg(&ctx, 2), arg(&ctx, 0), op::OUT_PTR);
        0
    }

    /// Return probe for every allocating function.
    #[uretprobe]
    pub fn alloc_exit(ctx: RetProbeContext) -> u32 {
        if !enabled() {
            return 0;
        }
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = PENDING.get_ptr_mut(&thread) else {
            return 0;
        };
        let call = unsafe { *pending };
        // After `ret`: %rsp is the entry's + 8.
        let entry_sp = unsafe { (*ctx.regs).rsp }.wrapping_sub(8);
        if entry_sp > call.sp {
            // A call above the pending one returns: that one's return was missed.
            bump(|c| &mut c.stale_calls);
            let _ = PENDING.remove(&thread);
            return 0;
        }
        if call.nested > 0 {
            unsafe { (*pending).nested -= 1 };
            return 0;
        }
        if entry_sp < call.sp {
            return 0; // a call inside the pending one, whose entry was not seen
        }
        let _ = PENDING.remove(&thread);

        let ret: u64 = ctx.ret();
        let addr = if call.op == op::OUT_PTR {
            if ret as u32 == 0 {
                unsafe { bpf_probe_read_user(call.arg_ptr as *const u64) }.unwrap_or(0)
            } else {
                0
            }
        } else {
            ret
        };
        // mmap fails with MAP_FAILED (-1), the others with NULL.
        let failed = addr == 0 || addr > (-4096i64) as u64;
        let mut call = call;
        if call.op == op::REALLOC && call.arg_ptr != 0 && (!failed || call.size == 0) {
            // The new block has the kind of the old one (GC_realloc keeps
            // atomic objects atomic).
            // realloc succeeded (or was realloc(p, 0), which frees p): the old block is gone.
            if let Some(kind) = release(call.arg_ptr, call.site.kind) {
                call.site.kind = kind;
            }
        }
        if failed {
            if !(call.op == op::REALLOC && call.size == 0) {
                bump(|c| &mut c.failed_allocs);
            }
            return 0;
        }
        let replaces = if call.op == op::REALLOC {
            call.arg_ptr
        } else {
            0
        };
        record(addr, &call, replaces);
        0
    }

    #[inline(always)]
    fn record(addr: u64, call: &PendingCall, replaces: u64) {
        bump(|c| &mut c.allocs);
        let now = unsafe { bpf_ktime_get_ns() };
        let live = LiveAlloc {
            site: call.site,
            size: call.size,
            timestamp_ns: now,
            epoch: GC_EPOCH.get(0).copied().unwrap_or(0),
        };
        let in_live = if in_copy(live.site.kind) {
            // Userspace's copy is the only one (address reuse is seen there);
            // an event the ring had no room for is counted as such.
            gc_event(addr, gc_event::ALLOC, &live, replaces);
            true
        } else {
            // An address still live was freed without us seeing it: for a GC
            // object, collected (its address was reused); else a missed free.
            if let Some(old) = LIVE.get_ptr(&addr) {
                let old = unsafe { *old };
                retire(&old, now, true);
                count_live(old.site.kind, old.size, -1);
            }
            let inserted = LIVE.insert(&addr, &live, 0).is_ok();
            if inserted {
                count_live(live.site.kind, live.size, 1);
            }
            inserted
        };
        let in_totals = match SITE_TOTALS.get_ptr_mut(&call.site) {
            Some(totals) => unsafe {
                (*totals).count += 1;
                (*totals).bytes += call.size;
                true
            },
            None => {
                let first = SiteTotals {
                    count: 1,
                    bytes: call.size,
                    ..SiteTotals::default()
                };
                SITE_TOTALS
                    .insert(&call.site, &first, BPF_NOEXIST as u64)
                    .is_ok()
            }
        };
        // Each allocation not fully recorded is counted once, in one category.
        match (in_live, in_totals) {
            (true, true) => {}
            (false, true) => bump(|c| &mut c.live_map_full),
            (true, false) => bump(|c| &mut c.sites_map_full),
            (false, false) => bump(|c| &mut c.both_maps_full),
        }
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
    fn gc_event(addr: u64, op: u8, object: &LiveAlloc, replaces: u64) {
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
            _pad: [0; 2],
        };
        // Waking the reader for every event would cost a wakeup per
        // allocation: it reads every few ms by itself, and is woken only
        // when the queued events cross `GC_EVENTS_WAKE_BYTES`.
        let queued = GC_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
        let flags = if (GC_EVENTS_WAKE_BYTES..GC_EVENTS_WAKE_BYTES + 4096).contains(&queued) {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        };
        if GC_EVENTS.output::<GcEvent>(&event, flags as u64).is_err() {
            bump(|c| &mut c.gc_events_lost);
        }
    }

    /// Adds a dead block's lifetime to its site's totals (this CPU's slot).
    #[inline(always)]
    fn retire(old: &LiveAlloc, now: u64, reused: bool) {
        let Some(totals) = SITE_TOTALS.get_ptr_mut(&old.site) else {
            return; // the site table was full when it was allocated (counted then)
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
    /// Forgets a freed block; returns its kind if it was known. `kind`: the
    /// freeing function's (its attach cookie, or the realloc's).
    fn release(addr: u64, kind: u8) -> Option<u8> {
        bump(|c| &mut c.frees);
        let now = unsafe { bpf_ktime_get_ns() };
        if in_copy(kind) {
            // The copy knows the object (or counts the free as unknown).
            let gone = LiveAlloc {
                site: AllocSite {
                    caller: 0,
                    stack_id: 0,
                    kind,
                    _pad: [0; 7],
                },
                size: 0,
                timestamp_ns: now,
                epoch: 0,
            };
            gc_event(addr, gc_event::GONE, &gone, 0);
            return None;
        }
        match LIVE.get_ptr(&addr) {
            Some(old) => {
                let old = unsafe { *old };
                retire(&old, now, false);
                if LIVE.remove(&addr).is_ok() {
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
        if let Some(pending) = PENDING.get_ptr(&thread) {
            let sp = unsafe { (*ctx.regs).rsp };
            if !is_stale(unsafe { &*pending }, sp) {
                return 0;
            }
            bump(|c| &mut c.stale_calls);
            let _ = PENDING.remove(&thread);
        }
        let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u8;
        let _ = release(addr, kind);
        0
    }

    /// `munmap(addr, len)`: forgets a mapping made by `mmap` at exactly that
    /// address. Partial unmaps and unmaps of untracked ranges are not counted.
    #[uprobe]
    pub fn munmap_enter(ctx: ProbeContext) -> u32 {
        if !enabled() {
            return 0;
        }
        let addr = arg(&ctx, 0);
        if let Some(live) = LIVE.get_ptr(&addr) {
            if unsafe { (*live).site.kind } == AllocKind::Mmap as u8 {
                let _ = release(addr, AllocKind::Mmap as u8);
            }
        }
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
