//! `memprof run` and `memprof attach`: start a [`Session`], step it until
//! the end, finish it. They differ only in when they stop: `run` when the
//! command exits (after Ctrl-C it gives the command a moment to exit by
//! itself, then lets it go), `attach` at Ctrl-C / SIGTERM, `--duration` or
//! the process's exit.
use std::time::{Duration, Instant};

use anyhow::Result;

use std::path::Path;

use anyhow::bail;

use super::output::Output;
use super::select::{self, Selection};
use super::signals::Signals;
use super::{Session, SessionOptions, Step};
use crate::profile::{ExitInfo, Profile};
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
    let mut followed = Followed::default();
    let deadline = options.duration.map(|d| Instant::now() + d);
    let mut grace: Option<Instant> = None;
    let status = loop {
        if let Some(libc::SIGINT | libc::SIGTERM) =
            signals.wait(followed.timeout(session.timeout()))
        {
            grace.get_or_insert(Instant::now() + EXIT_GRACE);
        }
        let step = session.step()?;
        followed.adopt(session.take_execs(), options);
        followed.attach_forked(session.take_forked(FORK_AGE), options);
        match step {
            Step::Exited(status) => break status,
            Step::Exec => {
                session = session.exec_again(options)?;
                session.begin();
            }
            Step::Running => {}
        }
        followed.step(options);
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
    let followed = followed.finish();
    session.finish(status.map(ExitInfo::from), followed)?;
    Ok(status.map_or(0, ExitStatus::shell_code))
}

/// A process the command forked is attached to once it has run this long
/// without an `exec` (most forks `exec` at once: a shell's children).
const FORK_AGE: Duration = Duration::from_millis(200);

/// The processes `run` follows with sessions of their own: each one the
/// command started (or one of those did) that `exec`ed a program, from
/// that program's first instruction, and each forked worker, from
/// [`FORK_AGE`] after its fork; to its exit or the command's.
#[derive(Default)]
struct Followed {
    running: Vec<Session>,
    /// The profiles of those that ended.
    done: Vec<Profile>,
}

impl Followed {
    /// Sessions for the processes held after their `exec` (`pids`); one
    /// that cannot start lets its process go, and says so.
    fn adopt(&mut self, pids: Vec<u32>, options: &SessionOptions) {
        for pid in pids {
            match Session::adopt(pid, options) {
                Ok(mut session) => {
                    session.begin();
                    self.running.push(session);
                }
                Err(e) => eprintln!("memprof: pid {pid} runs on, not profiled: {e:#}"),
            }
        }
    }

    /// Steps every followed session; those whose process exited are
    /// finished, and what they started in turn is adopted.
    fn step(&mut self, options: &SessionOptions) {
        let mut i = 0;
        while i < self.running.len() {
            let step = self.running[i].step();
            let execs = self.running[i].take_execs();
            let forked = self.running[i].take_forked(FORK_AGE);
            match step {
                // A followed process's own `exec`s are gone through (its
                // tracer does not report them).
                Ok(Step::Running | Step::Exec) => i += 1,
                Ok(Step::Exited(status)) => {
                    // Without a tracer (an attached worker), how is not known.
                    let exit = status.map_or(ExitInfo::UNKNOWN, ExitInfo::from);
                    let session = self.running.swap_remove(i);
                    self.finish_one(session, Some(exit));
                }
                Err(e) => {
                    let mut session = self.running.swap_remove(i);
                    eprintln!("memprof: pid {} no longer followed: {e:#}", session.pid());
                    let _ = session.release(false);
                    self.finish_one(session, None);
                }
            }
            self.adopt(execs, options);
            self.attach_forked(forked, options);
        }
    }

    /// Sessions attached to the processes forked a while ago that never
    /// `exec`ed (workers); one that cannot start says so.
    fn attach_forked(&mut self, pids: Vec<u32>, options: &SessionOptions) {
        for pid in pids {
            self.started(pid, Session::attach_followed(pid, options));
        }
    }

    /// Keeps a session just started for `pid`; one that could not start
    /// says so, and its process runs on.
    fn started(&mut self, pid: u32, session: Result<Session>) {
        match session {
            Ok(session) => self.running.push(session),
            Err(_) if !crate::target::is_alive(pid) => {
                eprintln!(
                    "memprof: pid {pid} ended before memprof could attach to it: not profiled"
                )
            }
            Err(e) => eprintln!("memprof: pid {pid} runs on, not profiled: {e:#}"),
        }
    }

    fn finish_one(&mut self, session: Session, exit: Option<ExitInfo>) {
        let pid = session.pid();
        match session.into_profile(exit) {
            Ok(profile) => self.done.push(profile),
            Err(e) => eprintln!("memprof: the profile of pid {pid} could not be read: {e:#}"),
        }
    }

    /// How long the driver may wait before the next step of any session.
    fn timeout(&self, command: Duration) -> Duration {
        self.running
            .iter()
            .map(Session::timeout)
            .fold(command, Duration::min)
    }

    /// The profiles of every followed process; those still running are
    /// let go first (they run on, untraced).
    fn finish(mut self) -> Vec<Profile> {
        for mut session in std::mem::take(&mut self.running) {
            // An exit already reported (the command's often comes right
            // after its children's) is taken now, with its status.
            if let Ok(Step::Exited(status)) = session.step() {
                let exit = status.map_or(ExitInfo::UNKNOWN, ExitInfo::from);
                self.finish_one(session, Some(exit));
                continue;
            }
            // Gone already (not seen yet): exited, how not known.
            let exited = !crate::target::is_alive(session.pid());
            let _ = session.release(exited);
            self.finish_one(session, exited.then_some(ExitInfo::UNKNOWN));
        }
        self.done
    }
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
    session.finish(
        exited.map(|status| status.map_or(ExitInfo::UNKNOWN, ExitInfo::from)),
        Vec::new(),
    )?;
    Ok(0)
}

/// `memprof attach --comm NAME` / `--exe PATH`: profiles every process
/// the selection names, those running and those that start while memprof
/// runs (found within [`select::RESCAN`]), each from its attach on, until
/// Ctrl-C, SIGTERM or `--duration`; one profile, one process each.
pub fn attach_matching(selection: &Selection, options: &SessionOptions) -> Result<i32> {
    watch_matching(selection, options, None)
}

/// `memprof top`: [`attach_matching`] with the processes' heaps shown
/// every `refresh` (`count` times, or until `q`, Ctrl-C, SIGTERM,
/// `--duration`); a profile is written only if `-o` asks for one.
pub fn top(
    selection: &Selection,
    options: &SessionOptions,
    refresh: Duration,
    count: Option<u32>,
) -> Result<i32> {
    watch_matching(selection, options, Some((refresh, count)))
}

/// The processes `selection` names, each with a session of its own, until
/// the end; with `top` (`refresh`, `count`), shown as a table.
fn watch_matching(
    selection: &Selection,
    options: &SessionOptions,
    top: Option<(Duration, Option<u32>)>,
) -> Result<i32> {
    let signals = Signals::block()?;
    let mut output = match (top, &options.output) {
        (Some(_), None) => None,
        _ => Some(Output::create(
            options.output.as_ref(),
            Path::new(&selection_name(selection)),
            None,
        )?),
    };
    let mut view = top.map(|_| crate::top::View::new());
    let mut next_refresh = Instant::now();
    let mut refreshes = 0u32;
    let mut followed = Followed::default();
    let mut seen = std::collections::HashSet::new();
    let deadline = options.duration.map(|d| Instant::now() + d);
    let started = Instant::now();
    let mut last_scan: Option<Instant> = None;
    let mut sampled = match options.probes.sample_bytes {
        0 => String::new(),
        n => format!(", sampled (--sample-bytes {n}; 0: every allocation)"),
    };
    if options.gc_sampling == super::GcSampling::Refill {
        sampled.push_str(
            ", GC allocations at the collector's refills (--gc-sampling exact: every one)",
        );
    }
    eprintln!(
        "memprof: {} every process of {} (now and as they start){sampled}; Ctrl-C to stop{}",
        if top.is_some() {
            "watching"
        } else {
            "profiling"
        },
        selection.describe(),
        options
            .duration
            .map(|d| format!(", or wait {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
    loop {
        if last_scan.is_none_or(|t| t.elapsed() >= select::RESCAN) {
            last_scan = Some(Instant::now());
            for pid in selection.matching() {
                if seen.insert(pid) {
                    followed.started(pid, Session::attach_followed(pid, options));
                }
            }
        }
        if let (Some(view), Some((refresh, count))) = (&mut view, top) {
            if Instant::now() >= next_refresh {
                let vitals: Vec<_> = followed
                    .running
                    .iter_mut()
                    .filter_map(|s| s.vitals().ok())
                    .collect();
                view.refresh(&vitals, &selection.describe())?;
                refreshes += 1;
                next_refresh += refresh;
                if count.is_some_and(|n| refreshes >= n) {
                    break;
                }
            }
            if view.quit_pressed() {
                break;
            }
        }
        let mut wait = followed.timeout(select::RESCAN);
        if top.is_some() {
            wait = wait.min(next_refresh.saturating_duration_since(Instant::now()));
        }
        if let Some(libc::SIGINT | libc::SIGTERM) = signals.wait(wait) {
            break;
        }
        followed.step(options);
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    // The terminal is given back before anything else is printed.
    drop(view);
    let mut profiles = followed.finish();
    let Some(output) = &mut output else {
        eprintln!(
            "memprof: watched {} process{}; each runs on, untraced",
            profiles.len(),
            if profiles.len() == 1 { "" } else { "es" }
        );
        return Ok(0);
    };
    if profiles.is_empty() {
        bail!(
            "no process of {} ran while memprof watched ({:.1} s): nothing to write",
            selection.describe(),
            started.elapsed().as_secs_f64()
        );
    }
    // The first process attached to stands for the session; the others join it.
    profiles.sort_by(|a, b| a.start_unix_s.total_cmp(&b.start_unix_s));
    let mut profile = profiles.remove(0);
    crate::profile::family::merge(&mut profile, profiles);
    output.write_and_print(&profile, options.top)?;
    Ok(0)
}

/// The profile's default name: the first program the selection names.
fn selection_name(selection: &Selection) -> String {
    match (selection.comms.first(), selection.exes.first()) {
        (Some(comm), _) => comm.clone(),
        (None, Some(exe)) => exe.display().to_string(),
        (None, None) => "attach".to_string(),
    }
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
    if wait.is_zero() || !session.want_end_census()? {
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
