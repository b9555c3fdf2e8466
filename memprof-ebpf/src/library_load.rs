//! The dynamic linker's `_dl_debug_state`, which runs when it has changed
//! the list of loaded libraries: memprof must know a new library's
//! address ranges (and, under `attach --all`, its allocators) before its
//! code runs.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_send_signal_thread},
    macros::map,
    maps::Array,
};
use memprof_common::{host, LIBRARY_LOAD_SIGNAL};

use crate::host::{build_table, host_event, known_process};
use crate::settings::HOST;

/// 1: signal the traced main thread at each library load (`run`, until
/// its tracer lets it go). Written by userspace.
#[map]
static SIGNAL_ON_DLOPEN: Array<u32> = Array::with_max_entries(1, 0);
/// Set to 1 here when the signal was sent; cleared by userspace. A map
/// of its own: userspace writing its switch never overwrites this flag.
#[map]
static DLOPEN_SIGNALLED: Array<u32> = Array::with_max_entries(1, 0);

/// `_dl_debug_state` ran. During `run` the main thread is traced:
/// `LIBRARY_LOAD_SIGNAL` (SIGURG, ignored by default) stops it so
/// memprof can add the new libraries' address ranges before their code
/// runs (memprof swallows the signal; `DLOPEN_SIGNALLED` tells it from
/// the program's own).
#[inline(always)]
pub(crate) fn libraries_changed() -> u32 {
    let thread = bpf_get_current_pid_tgid();
    if HOST.load() == 1 {
        // Userspace reads the process's mappings again (and probes the
        // allocators of files it has not seen: a process not followed
        // yet may be about to call them).
        let index = known_process().unwrap_or(host::IGNORED);
        if index != host::IGNORED {
            let _ = build_table(index, (thread >> 32) as u32);
        }
        host_event(host::LIBRARIES, (thread >> 32) as u32, index, 0);
        return 0;
    }
    if SIGNAL_ON_DLOPEN.get(0).copied().unwrap_or(0) == 1
        && (thread >> 32) == (thread & 0xffff_ffff)
    {
        if let Some(flag) = DLOPEN_SIGNALLED.get_ptr_mut(0) {
            unsafe { *flag = 1 };
        }
        unsafe { bpf_send_signal_thread(LIBRARY_LOAD_SIGNAL) };
    }
    0
}
