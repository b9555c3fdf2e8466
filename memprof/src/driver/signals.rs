//! The signals that end or wake the driver, received synchronously.
use std::time::Duration;

use anyhow::{bail, Result};

/// SIGINT, SIGTERM and SIGCHLD, blocked and received synchronously with
/// `sigtimedwait`, so the wait loop wakes at once when the target stops or
/// the user interrupts, without handlers. The mask is restored on drop.
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
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
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

impl Drop for Signals {
    fn drop(&mut self) {
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.original, std::ptr::null_mut()) };
    }
}
