//! The one `waitpid(-1)` memprof's tracers share ([`super::trace`]): each
//! state change goes to the tracer of its thread, queued when another
//! tracer took it.
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use anyhow::{bail, Result};

use super::exit::ExitStatus;
use super::family;

/// memprof's tracers (the command's, and one per process `run` follows
/// with a session of its own) share one `waitpid(-1)`: each state change
/// goes to the tracer of its thread.
#[derive(Default)]
struct Router {
    /// The tracer (by its process) of each traced thread.
    route: HashMap<u32, u32>,
    /// Changes taken for another tracer than the one waiting.
    queued: HashMap<u32, VecDeque<(u32, i32)>>,
}

thread_local! {
    // ptrace binds a tracee to the thread that traced it: one router per thread.
    static ROUTER: RefCell<Router> = RefCell::default();
}

/// Thread `tid` is followed by the tracer of process `tracer`.
pub(super) fn route(tid: u32, tracer: u32) {
    ROUTER.with(|r| r.borrow_mut().route.insert(tid, tracer));
}

/// Thread `tid` is followed by no tracer any more.
pub(super) fn unroute(tid: u32) {
    ROUTER.with(|r| r.borrow_mut().route.remove(&tid));
}

/// The next state change of a thread of tracer `tracer`, without blocking.
pub(super) fn next_change(tracer: u32) -> Result<Option<(u32, i32)>> {
    ROUTER.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(change) = r.queued.get_mut(&tracer).and_then(VecDeque::pop_front) {
            return Ok(Some(change));
        }
        loop {
            let Some((tid, status)) = wait_any(libc::WNOHANG)? else {
                return Ok(None);
            };
            // A thread not seen yet: its process's tracer, or for a new
            // process (its first stop before its parent's fork event), its
            // parent's.
            let owner = r.route.get(&tid).copied().or_else(|| {
                let (process, parent) = family::process_of(tid)?;
                r.route
                    .get(&process)
                    .or_else(|| r.route.get(&parent))
                    .copied()
            });
            let owner = owner.unwrap_or(tracer);
            if ExitStatus::from_wait(status).is_some() {
                r.route.remove(&tid);
            }
            if owner == tracer {
                return Ok(Some((tid, status)));
            }
            r.queued.entry(owner).or_default().push_back((tid, status));
        }
    })
}

/// The changes already taken for tracer `tracer` (its threads stopped or
/// gone in them), dropping its queue.
pub(super) fn take_queued(tracer: u32) -> Vec<(u32, i32)> {
    ROUTER.with(|r| {
        r.borrow_mut()
            .queued
            .remove(&tracer)
            .map(Vec::from)
            .unwrap_or_default()
    })
}

/// Whether a change of one of threads `tids` was taken for tracer
/// `tracer` and not handled yet.
pub(super) fn has_queued(tracer: u32, tids: &[u32]) -> bool {
    ROUTER.with(|r| {
        r.borrow()
            .queued
            .get(&tracer)
            .is_some_and(|queue| queue.iter().any(|(tid, _)| tids.contains(tid)))
    })
}

/// The changes already taken for tracer `tracer` of threads `tids`; the
/// others stay queued.
pub(super) fn take_queued_of(tracer: u32, tids: &[u32]) -> HashMap<u32, i32> {
    ROUTER.with(|r| {
        let mut r = r.borrow_mut();
        let Some(queue) = r.queued.get_mut(&tracer) else {
            return HashMap::new();
        };
        let (mine, rest): (Vec<_>, Vec<_>) =
            queue.drain(..).partition(|(tid, _)| tids.contains(tid));
        queue.extend(rest);
        mine.into_iter().collect()
    })
}

/// `waitpid(-1)` over every traced thread; `None` when `WNOHANG` found nothing.
fn wait_any(flags: i32) -> Result<Option<(u32, i32)>> {
    let mut status = 0;
    loop {
        let r = unsafe { libc::waitpid(-1, &mut status, flags | libc::__WALL) };
        if r > 0 {
            return Ok(Some((r as u32, status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(None),
            _ => bail!("waiting for the target: {err}"),
        }
    }
}
