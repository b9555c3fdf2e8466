//! How long naming may take: the asking thread's wait, and memprof's stop.
//!
//! A mode that serves while it runs (`attach --all`, the agent, a
//! snapshot) waits at most [`Budget::BACKGROUND`] for one process's
//! names; the profile a user waits for at the end of `run` or `attach`
//! gets what it takes ([`Budget::WHOLE`]) until a Ctrl-C or SIGTERM
//! comes while it is named (the first one ended the profiling). A loop's
//! wait is cut to [`STOP_GRACE`] when a signal waits for the driver, so
//! the driver takes it soon; and after [`stopping`] (the agent's end)
//! naming ends within [`STOP_GRACE`]: the profile is written with what
//! was named.
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the asking thread waits for one process's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `None`: until every address is named (or a stop).
    pub wait: Option<Duration>,
    /// A Ctrl-C or SIGTERM waiting for a loop's driver cuts the wait to
    /// [`STOP_GRACE`] (a loop that serves, which must answer its stop).
    pub cut_by_signal: bool,
}

impl Budget {
    /// The profile a user waits for.
    pub const WHOLE: Budget = Budget {
        wait: None,
        cut_by_signal: false,
    };
    /// A mode's loop, which has kernel events to drain and requests to
    /// answer. What it cuts stays unnamed for good: 5 s cut the first
    /// process named in a machine under QEMU (libc read cold), so 15.
    pub const BACKGROUND: Budget = Budget {
        wait: Some(Duration::from_secs(15)),
        cut_by_signal: true,
    };
    /// A loop that serves nobody while it names (`attach --all`,
    /// `--comm`, `--exe`): a Ctrl-C waits for the process being named
    /// (cut, its frames would stay addresses for good: under QEMU the
    /// first process named took longer than the half second).
    pub const ALONE: Budget = Budget {
        wait: Some(Duration::from_secs(15)),
        cut_by_signal: false,
    };

    /// The profile a user waits for (`progress`: a bar shown) or a loop's.
    pub fn of(progress: bool) -> Budget {
        match progress {
            true => Budget::WHOLE,
            false => Budget::BACKGROUND,
        }
    }
}

/// After [`stopping`], the time naming may still take.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

static STOPPING: OnceLock<Instant> = OnceLock::new();

/// memprof is stopping (the agent's SIGTERM): naming ends within
/// [`STOP_GRACE`] from now on.
pub fn stopping() {
    STOPPING.get_or_init(Instant::now);
}

/// Whether naming should end now: the grace after [`stopping`] is
/// spent, or, for the profile a user waits for, a Ctrl-C or SIGTERM
/// came while it was named.
pub fn stop_now(budget: Budget) -> bool {
    STOPPING.get().is_some_and(|at| at.elapsed() >= STOP_GRACE)
        || (budget == Budget::WHOLE && signal_waits())
}

/// Whether a SIGINT or SIGTERM waits to be taken (blocked on memprof's
/// threads, it stays pending for the driver to take).
pub fn signal_waits() -> bool {
    // SAFETY: sigpending fills the set it is given.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut pending) != 0 {
            return false;
        }
        libc::sigismember(&pending, libc::SIGINT) == 1
            || libc::sigismember(&pending, libc::SIGTERM) == 1
    }
}

/// Takes a Ctrl-C or SIGTERM that came before the naming of a profile a
/// user waits for ([`Budget::WHOLE`]): it ended the profiling (`run`'s
/// command may end of the same Ctrl-C before the driver took it), so
/// only one that comes while naming stops the naming.
pub fn take_earlier_stop() {
    // SAFETY: a set of two blocked signals, taken without waiting.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while libc::sigtimedwait(&set, std::ptr::null_mut(), &now) > 0 {}
    }
}
