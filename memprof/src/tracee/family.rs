//! The processes a `run` command starts (fork, vfork, and what they in
//! turn start), followed by the same tracer as the command through their
//! `exec`s to their exit: who started whom, what each ran, how it ended.
//!
//! Their allocations are not profiled (the probes are the command's
//! alone): the profile lists them as processes not followed, so a
//! script's children are never missing silently.
use std::time::Instant;

use super::exit::ExitStatus;

/// One process the command started, directly or not.
#[derive(Debug, Clone)]
pub struct Member {
    pub pid: u32,
    /// The process that started it (the command or another member).
    pub ppid: u32,
    /// Its command line and executable: the parent's until it `exec`s.
    pub command: Vec<String>,
    pub exe: String,
    pub started: Instant,
    /// When memprof last let it run after a stop of one of its threads.
    pub resumed: Instant,
    /// When it exited, and how, if it did while followed.
    pub ended: Option<(Instant, ExitStatus)>,
    /// It `exec`ed a program and was handed to a session of its own.
    pub handed_over: bool,
    /// Its pid in its own pid namespace, where that differs (a container's).
    pub ns_pid: Option<u32>,
}

impl Member {
    /// A process just started by `ppid`, read from /proc (`pid`'s own
    /// command line is its parent's copy until it `exec`s).
    pub(super) fn born(pid: u32, ppid: u32) -> Member {
        let mut member = Member {
            pid,
            ppid,
            command: Vec::new(),
            exe: String::new(),
            started: Instant::now(),
            resumed: Instant::now(),
            ended: None,
            handed_over: false,
            ns_pid: namespace_pid(pid),
        };
        member.reread();
        member
    }

    /// Reads its command line and executable again (after an `exec`).
    pub(super) fn reread(&mut self) {
        if let Ok(target) = super::Tracee::attach(self.pid) {
            self.command = target.command;
            self.exe = crate::text::lossy_path(&target.exe);
        }
    }
}

/// /proc/PID/status, whose `Name:` is the program's (any bytes: read
/// lossily, only the numbers are used).
fn read_status(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/status")).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `pid` as its own pid namespace numbers it (the last of `NSpid`), where
/// that differs from the host's.
pub(crate) fn namespace_pid(pid: u32) -> Option<u32> {
    let status = read_status(pid)?;
    let inner: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()?;
    (inner != pid).then_some(inner)
}

/// The process (thread group) thread `tid` belongs to, and that process's
/// parent, from /proc; `None` once the thread is gone.
pub(crate) fn process_of(tid: u32) -> Option<(u32, u32)> {
    let status = read_status(tid)?;
    let field = |name: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .parse()
            .ok()
    };
    Some((field("Tgid:")?, field("PPid:")?))
}
