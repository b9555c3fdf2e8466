//! `attach --all`: one load of the programs for every process. Each
//! process gets an index at its first allocation followed (`PROCESSES`),
//! which keys its blocks and sites and names its unwinder table
//! (`PROCESS_MODULES`); userspace hears of new, exited and `exec`ed
//! processes, and of library loads, through `HOST_EVENTS`. Without it,
//! every call is of the one target process, index 0. `run` follows its
//! command's processes the same way, only those (`FAMILY_ROOT`), and
//! `attach --comm/--exe` the processes it names (`SELECTING`).
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user_buf,
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray, Queue, RingBuf},
};
use memprof_common::host::{FileKey, KnownFile, MappedFile};
use memprof_common::{errno, host, module_table, HostEvent, ModuleRange};

use crate::counters::{bump, enabled};
use crate::layout;
use crate::module_maps::{MODULE_RANGES, MODULE_TABLE};
use crate::settings::{
    FAMILY_ROOT, HOST, HOST_STARTED_NS, SELECTING, TASK_EXIT_CODE, TASK_REAL_PARENT,
    TASK_START_TIME, TASK_TGID, UNWIND_DWARF,
};
use crate::task_files::{path_of, read_at, vma_iter_destroy, vma_iter_new, vma_iter_next};

/// `attach --all`: the processes followed, tgid → index (see
/// `this_process`). Only the kernel writes it.
#[map]
static PROCESSES: HashMap<u32, u32> = HashMap::with_max_entries(1, 0);
/// `attach --all`: index → the process's module table (packed; 0:
/// none yet). Only userspace writes it: one aligned word.
#[map]
static PROCESS_MODULES: Array<u32> = Array::with_max_entries(1, 0);

/// `attach --comm`: the names selected, NUL-padded (an empty entry is
/// unused). Written by userspace.
#[map]
static SELECTED_COMMS: Array<[u8; 16]> = Array::with_max_entries(host::SELECT_MAX, 0);
/// `attach --exe`: the executables selected. Written by userspace.
#[map]
static SELECTED_EXES: HashMap<FileKey, u32> = HashMap::with_max_entries(host::SELECT_MAX, 0);

/// A process making a call: its index and its module table.
#[derive(Clone, Copy)]
pub(crate) struct ProcessState {
    pub(crate) index: u32,
    pub(crate) modules: u32,
}
/// `attach --all`: `[0]`, the next process index.
#[map]
static PROCESS_COUNT: Array<u64> = Array::with_max_entries(1, 0);
/// `attach --all`: processes seen, exited, `exec`ed, relinked, their
/// mappings and tables.
#[map]
static HOST_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 12, 0);
/// `attach --all`: the files whose rows are in `UNWIND_ROWS`. Written by
/// userspace.
#[map]
static KNOWN_FILES: HashMap<FileKey, KnownFile> = HashMap::with_max_entries(1, 0);
/// `attach --all`: segments of `MODULE_RANGES` free for a table built
/// here (userspace puts back those no process uses).
#[map]
static FREE_SEGMENTS: Queue<u32> = Queue::with_max_entries(1, 0);
/// `attach --all`: process indexes userspace is done with, given again
/// before new ones (a session of days sees more processes than indexes).
#[map]
static FREE_INDEXES: Queue<u32> = Queue::with_max_entries(1, 0);
/// `attach --all`: the table being built, per CPU.
#[map]
static TABLE_BUILD: PerCpuArray<TableBuild> = PerCpuArray::with_max_entries(1, 0);

/// The process making this call: under `attach --all` its entry of
/// `PROCESSES` (added with a new index at its first call followed, when
/// userspace hears of it); else index 0 and the session's one module
/// table. `None`: not followed (memprof itself, or no room).
#[inline(always)]
pub(crate) fn this_process() -> Option<ProcessState> {
    process_state(true)
}

/// [`this_process`] for a program that must not walk the task's memory
/// map (a page fault's): a process with no table yet gets none (0).
#[inline(always)]
pub(crate) fn this_process_or_none() -> Option<ProcessState> {
    process_state(false)
}

#[inline(always)]
fn process_state(build: bool) -> Option<ProcessState> {
    if HOST.load() == 0 {
        // Only the CFI unwinder reads the table: with frame pointers,
        // no lookup per call (a load-time constant: the verifier drops it).
        let modules = match UNWIND_DWARF.load() {
            1 => MODULE_TABLE.get(0).copied().unwrap_or(0),
            _ => 0,
        };
        return Some(ProcessState { index: 0, modules });
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let index = match PROCESSES.get_ptr(&tgid) {
        Some(index) => unsafe { *index },
        None => new_process(tgid, true)?,
    };
    if index >= host::SESSION {
        return None;
    }
    let mut modules = PROCESS_MODULES.get(index).copied().unwrap_or(0);
    if modules == 0 && build {
        // No table yet (a program's first calls, before its dynamic
        // linker's first `_dl_debug_state`): the kernel's own, once.
        modules = build_table(index, tgid);
    }
    Some(ProcessState { index, modules })
}

/// [`this_process`] for a process not in `PROCESSES` yet. `forked`: it
/// allocates before any `exec` memprof saw (a forked child, or a process
/// running before memprof): it maps what its parent maps, so it starts
/// with its parent's module table until userspace gives it its own (a
/// forked worker is unwound from its first allocation).
#[inline(always)]
fn new_process(tgid: u32, forked: bool) -> Option<u32> {
    if (FAMILY_ROOT.load() != 0 && !in_family(tgid)) || (SELECTING.load() != 0 && !selected()) {
        // Left out until it `exec`s or exits.
        let _ = PROCESSES.insert(&tgid, &host::UNSELECTED, BPF_NOEXIST as u64);
        return None;
    }
    let index = match FREE_INDEXES.pop() {
        Ok(Some(index)) => index,
        _ => fresh_index()?,
    };
    // Its table is none (or, forked since memprof started, its
    // parent's) until userspace gives one.
    let inherited = if forked && started_since_load() {
        parent_table()
    } else {
        0
    };
    if let Some(modules) = PROCESS_MODULES.get_ptr_mut(index) {
        unsafe { *modules = inherited };
    }
    match PROCESSES.insert(&tgid, &index, BPF_NOEXIST as u64) {
        Ok(()) => {
            new_event(tgid, index, if forked { host::FORKED } else { 0 });
            Some(index)
        }
        // Another thread of the process added it meanwhile: the index
        // taken goes back.
        Err(e) if e == -errno::EEXIST => {
            let _ = FREE_INDEXES.push(&index, 0);
            Some(unsafe { *PROCESSES.get_ptr(&tgid)? })
        }
        Err(_) => {
            let _ = FREE_INDEXES.push(&index, 0);
            bump(|c| &mut c.processes_not_followed);
            None
        }
    }
}

/// An index never given before (`None`: all were: counted).
#[inline(always)]
fn fresh_index() -> Option<u32> {
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
    Some(i as u32)
}

/// How many ancestors are looked at for `run`'s command.
const FAMILY_DEPTH: u32 = 32;

/// `run`: whether process `tgid` (the calling one) is one its command
/// started, directly or not: the command is among its ancestors. The
/// command itself is not (its session follows it).
#[inline(always)]
fn in_family(tgid: u32) -> bool {
    let root = FAMILY_ROOT.load();
    if tgid == root {
        return false;
    }
    let mut task = unsafe { bpf_get_current_task() };
    for _ in 0..FAMILY_DEPTH {
        let Some((parent, parent_tgid)) = parent_of(task) else {
            return false;
        };
        if parent_tgid == root {
            return true;
        }
        if parent_tgid <= 1 || parent == task {
            return false;
        }
        task = parent;
    }
    false
}

/// `attach --comm/--exe`: whether the calling process is one the
/// selection names: its `comm` (as `exec` set it, or a fork inherited
/// it), or its executable file.
#[inline(always)]
fn selected() -> bool {
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    for i in 0..host::SELECT_MAX {
        match SELECTED_COMMS.get(i) {
            Some(name) if name[0] != 0 && *name == comm => return true,
            _ => {}
        }
    }
    let mm = read_at(unsafe { bpf_get_current_task() }, layout!(task_mm));
    let file = read_at(mm, layout!(mm_exe_file));
    if file == 0 {
        return false;
    }
    let inode = read_at(file, layout!(file_inode));
    let key = FileKey {
        dev: read_at(read_at(inode, layout!(inode_sb)), layout!(sb_dev)) as u32,
        _pad: 0,
        ino: read_at(inode, layout!(inode_ino)),
    };
    unsafe { SELECTED_EXES.get(&key) }.is_some()
}

/// Task `task`'s parent (`real_parent`: not a tracer) and its tgid.
#[inline(always)]
fn parent_of(task: u64) -> Option<(u64, u32)> {
    let at = (task as *const u8).wrapping_add(TASK_REAL_PARENT.load() as usize);
    let parent = unsafe { bpf_probe_read_kernel(at as *const u64) }.ok()?;
    let at = (parent as *const u8).wrapping_add(TASK_TGID.load() as usize);
    let tgid = unsafe { bpf_probe_read_kernel(at as *const u32) }.ok()?;
    Some((parent, tgid))
}

/// Whether the calling process started after the programs were loaded.
#[inline(always)]
fn started_since_load() -> bool {
    start_time() > HOST_STARTED_NS.load()
}

/// When the calling task started (`task_struct.start_time`, 0 if
/// unreadable).
#[inline(always)]
pub(crate) fn start_time() -> u64 {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let at = task.wrapping_add(TASK_START_TIME.load() as usize);
    unsafe { bpf_probe_read_kernel(at as *const u64) }.unwrap_or(0)
}

/// The module table of the calling process's parent, if it is followed
/// (0: none).
#[inline(always)]
fn parent_table() -> u32 {
    let Some((_, ppid)) = parent_of(unsafe { bpf_get_current_task() }) else {
        return 0;
    };
    let Some(index) = PROCESSES.get_ptr(&ppid) else {
        return 0;
    };
    PROCESS_MODULES.get(unsafe { *index }).copied().unwrap_or(0)
}

/// Tells userspace of process `tgid`'s new index ([`host::NEW`]), with
/// the path of the program it runs now: a forked child gone (or
/// `exec`ed) before userspace reads /proc is named by what it ran.
#[inline(always)]
fn new_event(tgid: u32, index: u32, exit_code: u32) {
    if let Some(mut entry) = HOST_EVENTS.reserve::<HostEvent>(0) {
        let event = unsafe { &mut *entry.as_mut_ptr() };
        fill(event, host::NEW, tgid, index, exit_code);
        let mm = read_at(unsafe { bpf_get_current_task() }, layout!(task_mm));
        command_line(event, mm);
        let exe = read_at(mm, layout!(mm_exe_file));
        if exe != 0 {
            path_of(exe, &mut event.path);
        }
        entry.submit(0);
    }
}

/// Tells userspace of a change to process `tgid` (`index`).
#[inline(always)]
pub(crate) fn host_event(op: u8, tgid: u32, index: u32, exit_code: u32) {
    if let Some(mut entry) = HOST_EVENTS.reserve::<HostEvent>(0) {
        let event = unsafe { &mut *entry.as_mut_ptr() };
        fill(event, op, tgid, index, exit_code);
        entry.submit(0);
    }
}

/// An event's common part, written in place in the ring (an event with
/// its path is too big for the program's stack).
#[inline(always)]
fn fill(event: &mut HostEvent, op: u8, tgid: u32, index: u32, exit_code: u32) {
    event.time_ns = unsafe { bpf_ktime_get_ns() };
    event.tgid = tgid;
    event.index = index;
    event.ppid = 0;
    event.exit_code = exit_code;
    event.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    event.op = op;
    event._pad = [0; 7];
    event.mapping = MappedFile::default();
    event.path[0] = 0;
    event.args_len = 0;
    event._pad2 = 0;
    if op == host::NEW || op == host::PROGRAM {
        event.ppid = parent_of(unsafe { bpf_get_current_task() }).map_or(0, |(_, ppid)| ppid);
    }
}

/// What memprof knows of the process making a call, without giving it
/// an index (a process not seen allocating has no block to free).
pub(crate) enum Caller {
    /// Followed, with this index.
    Followed(u32),
    /// Left out: memprof itself, `run`'s command under its family's
    /// probes, a process outside the family.
    LeftOut,
    /// Not seen allocating since the probes were loaded.
    Unseen,
}

#[inline(always)]
pub(crate) fn caller() -> Caller {
    if HOST.load() == 0 {
        return Caller::Followed(0);
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    match PROCESSES.get_ptr(&tgid) {
        Some(index) if unsafe { *index } >= host::SESSION => Caller::LeftOut,
        Some(index) => Caller::Followed(unsafe { *index }),
        // Under `run`'s family or a selection, a process outside it has
        // no entry until it allocates: not one to count.
        None if FAMILY_ROOT.load() != 0 || SELECTING.load() != 0 => Caller::LeftOut,
        None => Caller::Unseen,
    }
}

/// The index of the process making this call, if it is followed.
#[inline(always)]
pub(crate) fn known_process() -> Option<u32> {
    match caller() {
        Caller::Followed(index) => Some(index),
        _ => None,
    }
}

/// A thread exits: if it is the main thread of a process followed, the
/// process is done.
#[inline(always)]
pub(crate) fn thread_exit(thread: u64) {
    if HOST.load() == 1 && thread >> 32 == thread & 0xffff_ffff {
        let tgid = (thread >> 32) as u32;
        if let Some(index) = PROCESSES.get_ptr(&tgid) {
            let index = unsafe { *index };
            if index != host::IGNORED {
                // One left out (outside the family or the selection, or
                // given a session of its own) is told too: a session's
                // process exits untraced, its status known only here.
                let task = unsafe { bpf_get_current_task() } as *const u8;
                let at = task.wrapping_add(TASK_EXIT_CODE.load() as usize);
                let code = unsafe { bpf_probe_read_kernel(at as *const u32) }.unwrap_or(0);
                host_event(host::EXIT, tgid, index, code);
                let _ = PROCESSES.remove(&tgid);
            }
        }
    }
}

/// The OOM killer chose `task`: userspace is told, if its process is
/// followed or left out to a session (its exit comes after).
#[inline(always)]
pub(crate) fn oom_victim(task: u64) -> i32 {
    if HOST.load() == 0 {
        return 0;
    }
    let at = (task as *const u8).wrapping_add(TASK_TGID.load() as usize);
    let Ok(tgid) = (unsafe { bpf_probe_read_kernel(at as *const u32) }) else {
        return 0;
    };
    if let Some(index) = PROCESSES.get_ptr(&tgid) {
        let index = unsafe { *index };
        if index != host::IGNORED {
            host_event(host::OOM, tgid, index, 0);
        }
    }
    0
}

/// `attach --all`: a process `exec`ed: the index of its old program is
/// done, and the new program gets one now, before any of its code
/// runs, with the path it was started by (`bprm`: the tracepoint's
/// `struct linux_binprm *`): a process gone before userspace reads /proc
/// is still named. Userspace reads its mappings and gives the unwinder
/// its table while the dynamic linker is still at work, and probes the
/// allocators of a program it has not seen (a static one).
#[inline(always)]
pub(crate) fn process_exec(bprm: u64) -> i32 {
    if HOST.load() == 0 || !enabled() {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(index) = PROCESSES.get_ptr(&tgid) {
        let index = unsafe { *index };
        // A session's process stays its session's.
        if index == host::IGNORED || index == host::SESSION {
            return 0;
        }
        // A process left out is looked at again as the program it is now.
        if index != host::UNSELECTED {
            host_event(host::EXEC, tgid, index, 0);
        }
        let _ = PROCESSES.remove(&tgid);
    }
    let Some(index) = new_process(tgid, false) else {
        return 0;
    };
    if let Some(mut entry) = HOST_EVENTS.reserve::<HostEvent>(0) {
        let event = unsafe { &mut *entry.as_mut_ptr() };
        fill(event, host::PROGRAM, tgid, index, 0);
        let at = (bprm as *const u8).wrapping_add(layout!(bprm_filename) as usize);
        if let Ok(name) = unsafe { bpf_probe_read_kernel(at as *const u64) } {
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut event.path) };
        }
        entry.submit(0);
    }
    0
}

/// The calling process's command line (as `exec` laid it out on its
/// stack, in `mm`; a fork's is its parent's) into a [`host::NEW`] event
/// (an `exec`'s comes before its [`host::PROGRAM`]): a process gone in a
/// millisecond is named by its arguments, not its path alone.
#[inline(always)]
fn command_line(event: &mut HostEvent, mm: u64) {
    let start = read_at(mm, layout!(mm_arg_start));
    let bytes = read_at(mm, layout!(mm_arg_end)).saturating_sub(start);
    event.args_len = bytes.min(u32::MAX as u64) as u32;
    let n = (bytes as usize).min(host::ARGS_BYTES);
    let read = match event.args.get_mut(..n) {
        Some(dest) if n > 0 => unsafe { bpf_probe_read_user_buf(start as *const u8, dest) }.is_ok(),
        _ => false,
    };
    if !read {
        event.args_len = 0;
    }
}

/// The kernel's own module table for process `index` (the calling one),
/// from its executable file mappings as the kernel has them now and the
/// files whose rows userspace wrote (`KNOWN_FILES`): a program memprof
/// has seen before is unwound from its first allocation, without
/// waiting for userspace to read /proc. Each executable mapping is told
/// to userspace (`MAPPING`), known or not: what names and symbolizes a
/// process that ends before /proc is read. The table goes into a
/// segment of `FREE_SEGMENTS` and replaces the process's with one write.
#[inline(never)]
pub(crate) fn build_table(index: u32, tgid: u32) -> u32 {
    let Some(modules) = PROCESS_MODULES.get_ptr_mut(index) else {
        return 0;
    };
    let old = unsafe { *modules };
    let Some(build) = TABLE_BUILD.get_ptr_mut(0) else {
        return old;
    };
    let Ok(Some(segment)) = FREE_SEGMENTS.pop() else {
        bump(|c| &mut c.tables_not_built);
        return old;
    };
    unsafe {
        (*build).segment = segment;
        (*build).count = 0;
    }
    let task = unsafe { bpf_get_current_task_btf() } as u64;
    let mut iter = [0u64; 1];
    let iter_at = iter.as_mut_ptr() as u64;
    if vma_iter_new(iter_at, task) == 0 {
        // Bounded: a process has at most vm.max_map_count mappings, and
        // the kernel's iterator ends; each step costs little.
        loop {
            let vma = vma_iter_next(iter_at);
            if vma == 0 {
                break;
            }
            visit(vma, index, tgid, build);
        }
    } else {
        bump(|c| &mut c.tables_not_built);
    }
    vma_iter_destroy(iter_at);
    let count = unsafe { (*build).count } & module_table::MAX_MODULES;
    // The next generation (the row cache is valid for one table).
    let generation = module_table::generation(old).wrapping_add(1) | 1;
    if count == 0 {
        let _ = FREE_SEGMENTS.push(segment, 0);
        if old == 0 {
            // Tried: an empty table, not tried again at every call.
            let empty = module_table::pack(0, 0, generation);
            unsafe { *modules = empty };
            return empty;
        }
        return old;
    }
    let packed = module_table::pack(count, segment, generation);
    unsafe { *modules = packed };
    if let Some(mut entry) = HOST_EVENTS.reserve::<HostEvent>(0) {
        let event = unsafe { &mut *entry.as_mut_ptr() };
        fill(event, host::TABLE, tgid, index, 0);
        // An empty table (count 0) is no segment's.
        event.mapping.start = u64::from(old) * u64::from(module_table::count(old) != 0);
        event.mapping.end = u64::from(packed);
        entry.submit(0);
    }
    packed
}

/// The table being built on this CPU.
#[derive(Clone, Copy)]
pub(crate) struct TableBuild {
    segment: u32,
    count: u32,
}

/// One mapping of [`build_table`]'s walk.
#[inline(never)]
fn visit(vma: u64, index: u32, tgid: u32, build: *mut TableBuild) {
    let read = |base: u64, offset: u32| -> u64 {
        let at = (base as *const u8).wrapping_add(offset as usize);
        unsafe { bpf_probe_read_kernel(at as *const u64) }.unwrap_or(0)
    };
    if read(vma, layout!(vma_flags)) & host::VM_EXEC == 0 {
        return;
    }
    let file = read(vma, layout!(vma_file));
    if file == 0 {
        return;
    }
    let inode = read(file, layout!(file_inode));
    let sb = read(inode, layout!(inode_sb));
    let key = FileKey {
        dev: read(sb, layout!(sb_dev)) as u32,
        _pad: 0,
        ino: read(inode, layout!(inode_ino)),
    };
    let mapped = MappedFile {
        start: read(vma, layout!(vma_start)),
        end: read(vma, layout!(vma_end)),
        pgoff: read(vma, layout!(vma_pgoff)),
        file: key,
    };
    let known = unsafe { KNOWN_FILES.get(&key) }.copied();
    if let Some(mut entry) = HOST_EVENTS.reserve::<HostEvent>(0) {
        let event = unsafe { &mut *entry.as_mut_ptr() };
        fill(event, host::MAPPING, tgid, index, 0);
        event.mapping = mapped;
        if known.is_none() {
            // Named for userspace, which may not read the process in time.
            path_of(file, &mut event.path);
        }
        entry.submit(0);
    }
    let Some(known) = known else {
        return;
    };
    let count = unsafe { (*build).count };
    if count >= module_table::MAX_MODULES {
        return;
    }
    let slot = module_table::slot(
        unsafe { (*build).segment },
        count & module_table::MAX_MODULES,
    );
    if let Some(range) = MODULE_RANGES.get_ptr_mut(slot) {
        unsafe {
            *range = ModuleRange {
                start: mapped.start,
                end: mapped.end,
                bias: mapped
                    .start
                    .wrapping_sub(mapped.pgoff << 12)
                    .wrapping_sub(known.vaddr_less_offset),
                row_start: known.row_start,
                row_count: known.row_count,
            };
            (*build).count = count + 1;
        }
    }
}
