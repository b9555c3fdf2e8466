//! The signals that end or wake the driver, received synchronously.
use std::time::Duration;

use anyhow::{bail, Result};

/// SIGINT, SIGTERM and SIGCHLD, blocked and received synchronously with
/// `sigtimedwait`, so the wait loop wakes at once when the target stops or
/// the user interrupts, without handlers; and [`WAKE`], with which another
/// of memprof's threads (the agent's server) has the loop step at once.
/// The mask is restored on drop.
pub struct Signals {
    set: libc::sigset_t,
    /// The mask before blocking: what a launched command must start with.
    pub(super) original: libc::sigset_t,
}

impl Signals {
    pub(super) fn block() -> Result<Signals> {
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut original: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD, WAKE] {
                libc::sigaddset(&mut set, sig);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut original) != 0 {
                bail!("cannot block signals");
            }
            Ok(Signals { set, original })
        }
    }

    /// Waits up to `timeout` for one of the signals.
    pub(super) fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

/// The signal that wakes the driver's wait (one from elsewhere only
/// makes it step once more).
pub const WAKE: i32 = libc::SIGUSR1;

/// Wakes the driver's thread from another thread: a request waits for
/// the driver's next step, so the agent's driver can sleep long when the
/// machine is quiet and still answer a scrape at once.
#[derive(Clone, Copy)]
pub struct Waker(libc::pthread_t);

impl Waker {
    /// The calling thread's waker (the driver's: `Driver::new`'s thread).
    pub(crate) fn current() -> Waker {
        // SAFETY: returns the calling thread's id.
        Waker(unsafe { libc::pthread_self() })
    }

    /// Has the driver step now.
    pub fn wake(&self) {
        // SAFETY: the driver's thread lives as long as memprof's
        // command (it is the main thread); the signal is blocked there
        // and taken by its `sigtimedwait`.
        unsafe { libc::pthread_kill(self.0, WAKE) };
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.original, std::ptr::null_mut()) };
    }
}
