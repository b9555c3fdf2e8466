//! `memprof heap` between collections: the census of a program that does
//! not collect now (a server between requests, a worker waiting for a
//! job), taken at once from the mark bits its collector left.
//!
//! Between collections the mark bits still say what the last collection
//! (`GC_gc_no`) found live: every object that survived it is marked until
//! the next collection clears them. Objects allocated since are not
//! marked yet, so the marks cannot classify them; the collector counts
//! their bytes (`GC_bytes_allocd`, what `GC_get_bytes_since_gc()`
//! returns). So:
//!
//! 1. every thread of the program is stopped ([`Frozen`]: `PTRACE_SEIZE`
//!    and `PTRACE_INTERRUPT`, no probe, no signal the program sees) and
//!    its collector must be at rest ([`Frozen::busy`]): every thread
//!    waiting in the kernel (futex, epoll, poll, sleep, accept, read, …)
//!    or running outside libgc's code, no signal arriving. A collection
//!    clears and sets marks only while its threads run libgc's code (or
//!    wait for one another inside it, or sit suspended by it in
//!    `rt_sigsuspend`), so at rest the marks are the last collection's,
//!    whole. Where libgc is linked into the program its code is not told
//!    apart: every thread must be waiting in the kernel. Not at rest: let go, tried
//!    again 10 ms later, for up to [`REST_TRIES`] tries;
//! 2. the counters are read ([`HeapReader::counters`]). When little was
//!    allocated since ([`little`]: at most [`LITTLE_BYTES`] or 1% of the
//!    heap), or `--wait 0`, the heap is copied then and there, as at a
//!    held collection, and the program let go; the report says which
//!    collection it describes and how many bytes were allocated since,
//!    not classified. Otherwise (or no collection yet) the program is let
//!    go and `memprof heap` waits for its next collection, as it always
//!    did, saying why on stderr.
//!
//! Every thread is let go on every way out ([`Frozen`]'s `Drop`), a
//! signal that arrived meanwhile handed back.
//!
//! One inexactness stays, documented: libgc marks the objects left on a
//! thread's own free lists at a collection (so the sweep leaves them
//! there); the census tells those apart by their shape, but one handed
//! out since and already written reads as a live object. At most the
//! bytes allocated since can be so miscounted, and an idle program
//! allocates none.
use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Result};

use super::Held;
use crate::gc::census::{Counters, HeapReader};
use crate::report::thousands;
use crate::tracee::trace::task_ids;

/// Bytes allocated since the last collection under which its marks are
/// taken as the census at once (or 1% of the heap, if more). A program
/// that allocates faster than this between requests is not idle; waiting
/// for its next collection costs it little.
pub const LITTLE_BYTES: u64 = 256 << 10;

/// How many times the program is stopped, 10 ms apart, before memprof
/// gives up finding its collector at rest.
pub const REST_TRIES: u32 = 30;

/// Whether so little was allocated since the last collection that its
/// marks are taken at once.
pub fn little(c: &Counters) -> bool {
    match c.bytes_allocd {
        Some(b) => b <= LITTLE_BYTES.max(c.heap_size.unwrap_or(0) / 100),
        None => false,
    }
}

/// What a look at the stopped program decided.
pub(super) enum Look {
    /// Copied at once from the last collection's marks, with the counters.
    Now(Box<Held>, Counters),
    /// A collection is needed: why (one line), and the counters if read.
    Wait {
        why: String,
        counters: Option<Counters>,
    },
}

/// Stops the program, and when its collector is at rest and little was
/// allocated since its last collection (or `now`), copies the heap from
/// that collection's marks; lets it go in every case. Never at rest:
/// [`Look::Wait`], `now` or not (no collection yet and `now`: an error). `gc_code`: the
/// run-time ranges of libgc's code (`None`: libgc is linked into the
/// program, its code not told apart, so any running thread is busy).
pub(super) fn look(
    pid: u32,
    reader: &HeapReader,
    gc_code: Option<&[(u64, u64)]>,
    now: bool,
    (whole, with_roots): (bool, bool),
) -> Result<Look> {
    let mut last_busy = String::new();
    for attempt in 0..REST_TRIES {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = std::time::Instant::now();
        let frozen = Frozen::freeze(pid)?;
        if let Some(why) = frozen.busy(gc_code)? {
            last_busy = why;
            drop(frozen);
            continue;
        }
        let counters = reader.counters(pid)?;
        if counters.gc_no == 0 {
            drop(frozen);
            if now {
                bail!(
                    "pid {pid} has not collected yet, so its mark bits judge nothing: run `memprof heap` without --wait 0 to wait for its first collection"
                );
            }
            return Ok(Look::Wait {
                why: format!("pid {pid} has not collected yet"),
                counters: Some(counters),
            });
        }
        if !now && !little(&counters) {
            drop(frozen);
            let why = match counters.bytes_allocd {
                Some(b) => format!(
                    "pid {pid} allocated {} bytes since its collection {} (more than memprof takes unclassified: {})",
                    thousands(b),
                    counters.gc_no,
                    thousands(LITTLE_BYTES.max(counters.heap_size.unwrap_or(0) / 100)),
                ),
                None => format!(
                    "memprof cannot read how much pid {pid} allocated since its collection {} (GC_bytes_allocd)",
                    counters.gc_no
                ),
            };
            return Ok(Look::Wait {
                why,
                counters: Some(counters),
            });
        }
        let copied = super::copy_held(pid, pid, reader, whole, with_roots);
        drop(frozen);
        let (copy, snapshot, rollup, memory) = copied?;
        return Ok(Look::Now(
            Box::new((copy, snapshot, rollup, started.elapsed(), memory)),
            counters,
        ));
    }
    Ok(Look::Wait {
        why: format!(
            "pid {pid}'s collector was not at rest any of the {REST_TRIES} times memprof stopped it ({last_busy})"
        ),
        counters: None,
    })
}

/// Syscalls a program waits in when it has nothing to do. A thread in
/// any other syscall, or with a signal arriving, may be its collector at
/// work (it reads `/proc/self/maps`, grows the heap, writes its log): not
/// at rest.
const WAITING_SYSCALLS: [i64; 20] = [
    libc::SYS_futex,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_pause,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_read,
    libc::SYS_io_uring_enter,
];

/// Every thread of a process stopped under memprof's ptrace, for a
/// moment; let go (detached) when dropped.
pub(super) struct Frozen {
    pid: u32,
    threads: Vec<u32>,
    /// Signals a thread stopped for instead of the interrupt: handed back.
    signals: HashMap<u32, i32>,
}

impl Frozen {
    /// Seizes and stops every thread of `pid`, those started meanwhile too.
    pub fn freeze(pid: u32) -> Result<Frozen> {
        let mut frozen = Frozen {
            pid,
            threads: Vec::new(),
            signals: HashMap::new(),
        };
        // A thread may start a thread before it is stopped: list again
        // until nothing is new (a stopped thread starts none).
        loop {
            let mut new = 0;
            for tid in task_ids(pid) {
                if frozen.threads.contains(&tid) {
                    continue;
                }
                // SAFETY: plain ptrace requests on a thread id.
                if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid as i32, 0, 0) } == -1 {
                    let err = std::io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::ESRCH) {
                        continue; // ended meanwhile
                    }
                    bail!("cannot trace pid {pid} (thread {tid}): {err} (is a debugger attached?)");
                }
                frozen.threads.push(tid);
                new += 1;
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as i32, 0, 0) };
                let mut status = 0;
                // SAFETY: waits for the stop of a thread memprof traces.
                let r = unsafe { libc::waitpid(tid as i32, &mut status, libc::__WALL) };
                if r != tid as i32 || libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    frozen.threads.retain(|&t| t != tid);
                    if tid == pid {
                        bail!("pid {pid} exited");
                    }
                    continue;
                }
                // A signal-delivery stop (a signal came first): the thread
                // is stopped all the same; the signal is handed back.
                if status >> 16 == 0 {
                    frozen.signals.insert(tid, libc::WSTOPSIG(status));
                }
            }
            if new == 0 {
                return Ok(frozen);
            }
        }
    }

    /// Why the collector may be in the middle of a collection (see the
    /// module docs), or `None`: at rest.
    pub fn busy(&self, gc_code: Option<&[(u64, u64)]>) -> Result<Option<String>> {
        for &tid in &self.threads {
            // SAFETY: a plain-data struct the kernel fills.
            let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
            // SAFETY: `tid` is stopped under memprof's ptrace.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_GETREGS,
                    tid as i32,
                    0,
                    &mut regs as *mut libc::user_regs_struct,
                )
            };
            if r == -1 {
                bail!(
                    "cannot read the registers of thread {tid}: {}",
                    std::io::Error::last_os_error()
                );
            }
            let syscall = regs.orig_rax as i64;
            if let Some(signal) = self.signals.get(&tid) {
                return Ok(Some(format!(
                    "signal {signal} was arriving at thread {tid}"
                )));
            }
            if syscall >= 0 {
                // libgc reads /proc/self/maps as a collection starts.
                let maps = syscall == libc::SYS_read
                    && std::fs::read_link(format!("/proc/{}/fd/{}", self.pid, regs.rdi))
                        .is_ok_and(|p| p.ends_with("maps"));
                if !WAITING_SYSCALLS.contains(&syscall) || maps {
                    return Ok(Some(format!("thread {tid} was in syscall {syscall}")));
                }
                continue; // waiting in the kernel: not collecting
            }
            match gc_code {
                Some(ranges) if !ranges.iter().any(|&(a, b)| (a..b).contains(&regs.rip)) => {}
                Some(_) => {
                    return Ok(Some(format!(
                        "thread {tid} was running in the collector's code"
                    )))
                }
                None => {
                    return Ok(Some(format!(
                        "thread {tid} was running, and the collector is linked into the program, its code not told apart"
                    )))
                }
            }
        }
        Ok(None)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &tid in &self.threads {
            let signal = self.signals.get(&tid).copied().unwrap_or(0);
            // SAFETY: `tid` is stopped under memprof's ptrace.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid as i32, 0, signal as libc::c_long) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(bytes_allocd: Option<u64>, heap_size: Option<u64>) -> Counters {
        Counters {
            gc_no: 3,
            bytes_allocd,
            heap_size,
        }
    }

    #[test]
    fn little_is_256_kib_or_one_percent_of_the_heap() {
        assert!(little(&counters(Some(0), None)));
        assert!(little(&counters(Some(LITTLE_BYTES), Some(1 << 20))));
        assert!(!little(&counters(Some(LITTLE_BYTES + 1), Some(1 << 20))));
        // A 100 MB heap: up to 1 MB.
        assert!(little(&counters(Some(1_000_000), Some(100_000_000))));
        assert!(!little(&counters(Some(1_000_001), Some(100_000_000))));
        // Not knowing how much was allocated is not little.
        assert!(!little(&counters(None, Some(1 << 30))));
    }
}
