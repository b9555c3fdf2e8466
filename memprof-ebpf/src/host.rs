//! `attach --all`: one load of the programs for every process. Each
//! process gets an index at its first allocation followed (`PROCESSES`),
//! which keys its blocks and sites and names its unwinder table
//! (`PROCESS_MODULES`); userspace hears of new, exited and `exec`ed
//! processes, and of library loads, through `HOST_EVENTS`. Without it,
//! every call is of the one target process, index 0.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
    },
    macros::map,
    maps::{Array, HashMap, RingBuf},
};
use memprof_common::{errno, host, HostEvent};

use crate::counters::{bump, enabled};
use crate::settings::{HOST, TASK_EXIT_CODE, TASK_REAL_PARENT, TASK_TGID, UNWIND_DWARF};
use crate::unwind::MODULE_TABLE;

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
pub(crate) struct ProcessState {
    pub(crate) index: u32,
    pub(crate) modules: u32,
}
/// `attach --all`: `[0]`, the next process index.
#[map]
static PROCESS_COUNT: Array<u64> = Array::with_max_entries(1, 0);
/// `attach --all`: processes seen, exited, `exec`ed, relinked.
#[map]
static HOST_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 12, 0);

/// The process making this call: under `attach --all` its entry of
/// `PROCESSES` (added with a new index at its first call followed, when
/// userspace hears of it); else index 0 and the session's one module
/// table. `None`: not followed (memprof itself, or no room).
#[inline(always)]
pub(crate) fn this_process() -> Option<ProcessState> {
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
pub(crate) fn host_event(op: u8, tgid: u32, index: u32, exit_code: u32) {
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
    if let Ok(comm) = bpf_get_current_comm() {
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

/// The index of the process making this call if it has one (no new
/// one: a process not followed yet has no block to free).
#[inline(always)]
pub(crate) fn known_process() -> Option<u32> {
    if HOST.load() == 0 {
        return Some(0);
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let index = unsafe { *PROCESSES.get_ptr(&tgid)? };
    (index != host::IGNORED).then_some(index)
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
                let task = unsafe { bpf_get_current_task() } as *const u8;
                let at = task.wrapping_add(TASK_EXIT_CODE.load() as usize);
                let code = unsafe { bpf_probe_read_kernel(at as *const u32) }.unwrap_or(0);
                host_event(host::EXIT, tgid, index, code);
                let _ = PROCESSES.remove(&tgid);
            }
        }
    }
}

/// `attach --all`: a process `exec`ed: the index of its old program is
/// done, and the new program gets one now, before any of its code
/// runs: userspace reads its mappings and gives the unwinder its table
/// while the dynamic linker is still at work, and probes the
/// allocators of a program it has not seen (a static one).
#[inline(always)]
pub(crate) fn process_exec() -> i32 {
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
