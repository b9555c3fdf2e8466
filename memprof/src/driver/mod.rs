//! The one loop every long-running mode goes through, and what every mode
//! uses below it.
//!
//! A mode is a [`Driven`]: what is due before each wait, how long it may
//! wait, what to do at Ctrl-C / SIGTERM, what to do at each step. The
//! [`Driver`] owns the signal mask (blocked once, for the whole command)
//! and the deadline (`--duration`, `--census-wait`, `heap --wait`), and
//! runs the loop until the mode, a signal or the deadline ends it:
//!
//! | mode | its [`Driven`] |
//! |---|---|
//! | `run` (and the processes it follows) | `session::drive::Command` |
//! | `attach --pid` | `session::drive::Attached` |
//! | `attach --comm/--exe`, `top` | `session::drive::Watch` |
//! | the end census's wait (`run`, `attach`) | `session::drive::CensusWait` |
//! | `attach --all` | [`crate::session::machine`]'s `Host` |
//! | `memprof heap`'s wait for a collection | [`crate::whole_heap`]'s `Hold` |
//!
//! Those that profile processes are also [`Profiling`]: which processes
//! they follow, and a profile of any one of them now, the others running
//! on.
//!
//! | part | what it does |
//! |---|---|
//! | this module | the loop, the deadline, the traits |
//! | [`signals`] | SIGINT, SIGTERM and SIGCHLD, received synchronously |
//! | [`profiles`] | a profile's header; many processes' profiles as one |
//! | [`output`] | the profile file, written whole, and the summary printed |
pub mod output;
pub mod profiles;
pub mod signals;

use std::time::{Duration, Instant};

use anyhow::Result;

pub use output::Output;
use signals::Signals;

use crate::profile::Profile;

/// What a mode says of the loop after one of its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// The loop goes on.
    Go,
    /// The loop ends here.
    Stop,
}

/// Why [`Driver::drive`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The mode said [`Flow::Stop`] (its target exited, `top`'s `q`…).
    Stopped,
    /// Ctrl-C or SIGTERM, and the mode stopped for it.
    Interrupted,
    /// The deadline passed.
    Deadline,
}

/// One long-running mode, as the driver steps it. The loop, each turn:
/// [`Driven::due`], a wait for a signal of at most [`Driven::timeout`]
/// (and never past the deadline), [`Driven::interrupted`] if Ctrl-C or
/// SIGTERM came, [`Driven::step`], then the deadline.
pub trait Driven {
    /// What is due before the next wait (a rescan, a table shown).
    fn due(&mut self) -> Result<Flow> {
        Ok(Flow::Go)
    }

    /// How long the driver may wait for a signal before the next step.
    fn timeout(&self) -> Duration;

    /// Ctrl-C or SIGTERM came: the loop ends unless the mode says otherwise.
    fn interrupted(&mut self) -> Result<Flow> {
        Ok(Flow::Stop)
    }

    /// Handles what happened since the last step.
    fn step(&mut self) -> Result<Flow>;
}

/// A [`Driven`] mode that profiles processes: any one's profile can be
/// taken at any moment without stopping the others (what `memprof agent`
/// serves). Implemented by every session-based mode and by `attach
/// --all`'s host.
pub trait Profiling: Driven {
    /// The processes profiled now.
    fn pids(&self) -> Vec<u32>;

    /// A profile of process `pid` as it is now (without what only the end
    /// knows: exit, GC summary); the others run on, profiled.
    fn snapshot(&mut self, pid: u32) -> Result<Profile>;

    /// Profiles of processes `pids` now, in their order; one that cannot
    /// be taken (it ended meanwhile) is left out. What a scrape of all of
    /// a program's processes merges: a mode that reads the kernel's tables
    /// reads them once for all.
    fn snapshots(&mut self, pids: &[u32]) -> Vec<Profile> {
        pids.iter()
            .filter_map(|&pid| self.snapshot(pid).ok())
            .collect()
    }
}

/// What a process's metrics say of it, read without symbolizing (cheap
/// enough for every process at every scrape).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub pid: u32,
    /// The program's file name (its command line's first word, or the
    /// kernel's name for it).
    pub program: String,
    pub exe: String,
    /// Per [`memprof_common::AllocKind`] (by its number): live blocks and
    /// bytes (estimated when sampled).
    pub live: [[u64; 2]; memprof_common::AllocKind::COUNT],
    /// Allocations followed so far (estimated when sampled).
    pub allocations: u64,
    /// Boehm GC programs with a session: collections seen, and the
    /// collector's heap size where readable.
    pub collections: Option<u64>,
    pub gc_heap_bytes: Option<u64>,
}

/// The driver of one command: its signals are blocked from here until it
/// is dropped, after the profile is written (a second Ctrl-C must not lose
/// it). Nothing else is process-global.
pub struct Driver {
    signals: Signals,
    waker: signals::Waker,
}

impl Driver {
    /// Blocks SIGINT, SIGTERM and SIGCHLD for the command.
    pub fn new() -> Result<Driver> {
        Ok(Driver {
            signals: Signals::block()?,
            waker: signals::Waker::current(),
        })
    }

    /// What wakes this driver's wait from another thread.
    pub fn waker(&self) -> signals::Waker {
        self.waker
    }

    /// The signal mask before blocking: what a launched command starts with.
    pub fn child_mask(&self) -> &libc::sigset_t {
        &self.signals.original
    }

    /// Runs `driven` until it stops, a signal stops it, or `limit` (from
    /// now) passes.
    pub fn drive(&self, driven: &mut impl Driven, limit: Option<Duration>) -> Result<End> {
        let deadline = limit.map(|d| Instant::now() + d);
        loop {
            if driven.due()? == Flow::Stop {
                return Ok(End::Stopped);
            }
            let mut wait = driven.timeout();
            if let Some(deadline) = deadline {
                wait = wait.min(deadline.saturating_duration_since(Instant::now()));
            }
            if let Some(libc::SIGINT | libc::SIGTERM) = self.signals.wait(wait) {
                if driven.interrupted()? == Flow::Stop {
                    return Ok(End::Interrupted);
                }
            }
            if driven.step()? == Flow::Stop {
                return Ok(End::Stopped);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(End::Deadline);
            }
        }
    }
}
