//! `memprof run` and `memprof attach`: start a [`Session`], step it until
//! the end, finish it. They differ only in when they stop: `run` when the
//! command exits (after Ctrl-C it gives the command a moment to exit by
//! itself, then lets it go), `attach` at Ctrl-C / SIGTERM, `--duration` or
//! the process's exit.
use std::time::{Duration, Instant};

use anyhow::Result;

use super::signals::Signals;
use super::{Session, SessionOptions, Step};
use crate::profile::ExitInfo;
use crate::target::launch::ExitStatus;

/// `run`: after Ctrl-C, how long to wait for the command to exit by itself
/// (it usually got the same Ctrl-C) before detaching from it.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// `memprof run`: launches `command` under the probes. Returns the exit code
/// memprof should exit with (the command's own).
pub fn run(command: &[String], options: &SessionOptions) -> Result<i32> {
    let signals = Signals::block()?;
    let mut session = Session::launch(command, options, &signals.original)?;
    session.begin();
    let deadline = options.duration.map(|d| Instant::now() + d);
    let mut grace: Option<Instant> = None;
    let status = loop {
        if let Some(libc::SIGINT | libc::SIGTERM) = signals.wait(session.timeout()) {
            grace.get_or_insert(Instant::now() + EXIT_GRACE);
        }
        if let Step::Exited(status) = session.step()? {
            break status;
        }
        let now = Instant::now();
        if grace.is_some_and(|g| now >= g) || deadline.is_some_and(|d| now >= d) {
            if let Some(status) = end_census(&mut session, &signals, options.census_wait)? {
                break status;
            }
            session.release(false)?;
            eprintln!(
                "memprof: stopped profiling; pid {} keeps running",
                session.pid()
            );
            break None;
        }
    };
    if let Some(status) = status {
        eprintln!("memprof: {} {status}", command.join(" "));
    }
    // `signals` stays blocked until the profile is written (dropped on
    // return): a second Ctrl-C must not lose it.
    session.finish(status.map(ExitInfo::from))?;
    Ok(status.map_or(0, ExitStatus::shell_code))
}

/// `memprof attach`: profiles a running process until Ctrl-C, SIGTERM,
/// `--duration` or its exit, and leaves it running.
pub fn attach(pid: u32, options: &SessionOptions) -> Result<i32> {
    let signals = Signals::block()?;
    let mut session = Session::attach(pid, options)?;
    let deadline = options.duration.map(|d| Instant::now() + d);
    let exited = loop {
        if let Some(libc::SIGINT | libc::SIGTERM) = signals.wait(session.timeout()) {
            break None;
        }
        if let Step::Exited(status) = session.step()? {
            break Some(status);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break None;
        }
    };
    let exited = match exited {
        None => end_census(&mut session, &signals, options.census_wait)?,
        exited => exited,
    };
    if exited.is_some() {
        eprintln!("memprof: pid {pid} exited");
    }
    // No new holds, then let every thread go.
    session.release(exited.is_some())?;
    // `signals` stays blocked until the profile is written (dropped on
    // return): a second Ctrl-C must not lose it.
    session.finish(exited.map(|status| status.map_or(ExitInfo::UNKNOWN, ExitInfo::from)))?;
    Ok(0)
}

/// Before memprof lets go of a target still running: the end census, at
/// the next collection the target makes (none is forced: memprof runs
/// nothing in the target). Waits up to `wait`; Ctrl-C or SIGTERM skips
/// it. Returns the target's exit status if it exits meanwhile.
fn end_census(
    session: &mut Session,
    signals: &Signals,
    wait: Duration,
) -> Result<Option<Option<ExitStatus>>> {
    if wait.is_zero() || !session.want_end_census() {
        return Ok(None);
    }
    eprintln!(
        "memprof: waiting up to {} s for a collection, for the end census (Ctrl-C to skip)",
        wait.as_secs_f64()
    );
    let deadline = Instant::now() + wait;
    loop {
        if session.end_census_copied() {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "memprof: no collection came within {} s: no end census of its own (the profile's census note says what stands for it)",
                wait.as_secs_f64()
            );
            return Ok(None);
        }
        if let Some(libc::SIGINT | libc::SIGTERM) = signals.wait(session.timeout().min(left)) {
            eprintln!("memprof: end census skipped");
            return Ok(None);
        }
        if let Step::Exited(status) = session.step()? {
            return Ok(Some(status));
        }
    }
}

