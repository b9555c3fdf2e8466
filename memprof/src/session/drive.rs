//! The session-based modes, as the [`Driver`] steps them: `run`
//! ([`Command`]), `attach --pid` ([`Attached`]), `attach --comm/--exe` and
//! `top` (`Watch`, in [`super::watch`]), and the end census's wait
//! ([`CensusWait`]). They differ only in when they stop: `run` when the
//! command exits (after Ctrl-C it gives the command a moment to exit by
//! itself, then lets it go), `attach` at Ctrl-C / SIGTERM, `--duration` or
//! the process's exit.
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Session, Step};
use crate::allocators::{program_starts_processes, program_uses_gc};
use crate::driver::{Driven, Driver, End, Flow, Profiling};
use crate::options::SessionOptions;
use crate::profile::{ExitInfo, Profile};
use crate::session::machine::{Family, Loading};
use crate::tracee::launch::ExitStatus;

pub use super::watch::{attach_matching, top};

/// `run`: after Ctrl-C, how long to wait for the command to exit by itself
/// (it usually got the same Ctrl-C) before detaching from it.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// How a target ended, when it did: its status if memprof traced it.
type Exited = Option<Option<ExitStatus>>;

/// `memprof run`: launches `command` under the probes. Returns the exit code
/// memprof should exit with (the command's own).
pub fn run(driver: &Driver, command: &[OsString], options: &SessionOptions) -> Result<i32> {
    let mut followed = Followed::default();
    let mut session = Session::launch(command, options, driver.child_mask(), &mut |pid| {
        if !options.follow {
            return;
        }
        followed = Followed::of_command(pid);
        // A program that can start processes: their probes load beside
        // the command's, and are on before its first instruction: a
        // child it forks at once is followed from its first allocation.
        if program_starts_processes(pid) {
            followed.family.start(options);
        }
    })?;
    followed.family.wait_live();
    session.begin();
    let mut run = Command {
        session: Some(session),
        followed,
        grace: None,
        exited: None,
        options,
    };
    driver.drive(&mut run, options.duration)?;
    let Command {
        session,
        followed,
        exited,
        ..
    } = run;
    let mut session = session.expect("a session after every step");
    let status = match exited {
        Some(status) => status,
        // Ctrl-C and its grace, or `--duration`.
        None => match end_census(driver, &mut session, options.census_wait)? {
            Some(status) => status,
            None => {
                session.release(false)?;
                eprintln!(
                    "memprof: stopped profiling; pid {} keeps running",
                    session.pid()
                );
                None
            }
        },
    };
    if let Some(status) = status {
        let words: Vec<String> = command
            .iter()
            .map(|word| crate::text::lossy(word.as_bytes()))
            .collect();
        eprintln!("memprof: {} {status}", words.join(" "));
    }
    // The driver's signals stay blocked until the profile is written: a
    // second Ctrl-C must not lose it.
    let followed = followed.finish();
    session.finish(status.map(ExitInfo::from), followed)?;
    Ok(status.map_or(0, ExitStatus::shell_code))
}

/// `run`'s command and the processes it started.
struct Command<'a> {
    /// Always there between steps (taken only while it `exec`s).
    session: Option<Session>,
    followed: Followed,
    /// Ctrl-C came: when to stop waiting for the command to exit.
    grace: Option<Instant>,
    exited: Exited,
    options: &'a SessionOptions,
}

impl Command<'_> {
    fn session(&self) -> &Session {
        self.session.as_ref().expect("a session after every step")
    }
}

impl Driven for Command<'_> {
    fn timeout(&self) -> Duration {
        self.followed.timeout(self.session().timeout())
    }

    fn interrupted(&mut self) -> Result<Flow> {
        self.grace.get_or_insert(Instant::now() + EXIT_GRACE);
        Ok(Flow::Go)
    }

    fn step(&mut self) -> Result<Flow> {
        let Some(session) = &mut self.session else {
            anyhow::bail!("no session to step");
        };
        let step = session.step()?;
        if session.has_family() {
            self.followed.family.start(self.options);
        }
        let (execs, forked) = started_by(session, &mut self.followed.family);
        self.followed.adopt(execs, self.options);
        self.followed.attach_forked(forked, self.options);
        match step {
            Step::Exited(status) => {
                self.exited = Some(status);
                return Ok(Flow::Stop);
            }
            Step::Exec => {
                let session = self.session.take().expect("stepped just now");
                let mut session = session.exec_again(self.options)?;
                session.begin();
                self.session = Some(session);
            }
            Step::Running => {}
        }
        self.followed.step(self.options);
        Ok(match self.grace {
            Some(grace) if Instant::now() >= grace => Flow::Stop,
            _ => Flow::Go,
        })
    }
}

impl Profiling for Command<'_> {
    fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.session().pid()];
        pids.extend(self.followed.pids());
        pids
    }

    fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        match &self.session {
            Some(session) if session.pid() == pid => session.snapshot(),
            _ => self.followed.snapshot(pid),
        }
    }
}

/// Without [`Family`]: a process the command forked is attached to once
/// it has run this long without an `exec` (most forks `exec` at once: a
/// shell's children).
const FORK_AGE: Duration = Duration::from_millis(200);

/// At most this long between two readings of the family's events.
const FAMILY_STEP: Duration = Duration::from_millis(50);

/// What `session`'s process (or those it started) started since the last
/// step: the programs `exec`ed that need sessions of their own, and the
/// forked workers to attach to. With the `family` machinery, only a
/// program that allocates with the Boehm GC gets a session (its
/// collections held, its mark bits read, as the command's); every other
/// program runs on at once, followed by the family's probes from its
/// first allocation, and so does every forked worker.
fn started_by(session: &mut Session, family: &mut FamilyProbes) -> (Vec<u32>, Vec<u32>) {
    let execs = session.take_execs();
    if !family.active() {
        return (execs, session.take_forked(FORK_AGE));
    }
    let mut own = Vec::new();
    for pid in execs {
        if !program_uses_gc(pid) {
            // Held only until the probes are on the system's allocators.
            family.wait_live();
            match family.active() {
                true => session.resume_exec(pid),
                false => own.push(pid),
            }
            continue;
        }
        match family.ready_now().map(|f| f.leave_out(pid)) {
            Some(Err(e)) => {
                eprintln!("memprof: pid {pid} followed without its collections: {e:#}");
                session.resume_exec(pid);
            }
            Some(Ok(())) | None => own.push(pid),
        }
    }
    (own, Vec::new())
}

/// The probes `run` follows what its command starts with ([`Family`]),
/// loaded in the background: at launch when the command's program can
/// start processes, else at its first child.
#[derive(Default)]
pub(super) struct FamilyProbes {
    /// `run`, following: its command's pid, until the loading starts.
    root: Option<u32>,
    loading: Option<Loading>,
    ready: Option<Family>,
}

impl FamilyProbes {
    /// Starts loading the probes, once.
    fn start(&mut self, options: &SessionOptions) {
        if let Some(root) = self.root.take() {
            self.loading = Some(Family::load(&options.for_family(), root));
        }
    }

    /// Whether they are loaded or being loaded.
    fn active(&self) -> bool {
        self.loading.is_some() || self.ready.is_some()
    }

    /// Waits until a program that allocates through the system's
    /// allocators is seen (or the loading failed).
    fn wait_live(&mut self) {
        if let Some(loading) = &self.loading {
            loading.wait_live();
            if !loading.live() {
                self.ready_now();
            }
        }
    }

    /// The probes, loaded; `None` if they could not be (said once).
    fn ready_now(&mut self) -> Option<&mut Family> {
        if let Some(loading) = self.loading.take() {
            match loading.join() {
                Ok(family) => self.ready = Some(family),
                Err(e) => eprintln!(
                    "memprof: the processes the command starts are followed one by one, each held while its probes load: {e:#}"
                ),
            }
        }
        self.ready.as_mut()
    }

    /// The probes, if loaded by now.
    fn ready(&mut self) -> Option<&mut Family> {
        if self.loading.as_ref().is_some_and(Loading::is_finished) {
            return self.ready_now();
        }
        self.ready.as_mut()
    }
}

/// The processes `run` follows: with the [`Family`] probes (each from
/// its first allocation), or with sessions of their own: a program that
/// allocates with the Boehm GC from its first instruction, and (when the
/// family's probes cannot be loaded) each program `exec`ed, and each
/// forked worker from [`FORK_AGE`] after its fork; to its exit or the
/// command's. Also the processes `attach --comm/--exe` and `top` select.
#[derive(Default)]
pub(super) struct Followed {
    running: Vec<Session>,
    /// The profiles of those that ended.
    done: Vec<Profile>,
    /// `run`'s family probes.
    family: FamilyProbes,
    /// Processes that ended before their session attached (the first
    /// said, all counted: a machine starts many that live milliseconds).
    pub(super) missed: u64,
}

impl Followed {
    /// `run`, following `root`'s children.
    fn of_command(root: u32) -> Followed {
        Followed {
            family: FamilyProbes {
                root: Some(root),
                ..FamilyProbes::default()
            },
            ..Followed::default()
        }
    }

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
    pub(super) fn step(&mut self, options: &SessionOptions) {
        let mut i = 0;
        if let Some(family) = self.family.ready() {
            if let Err(e) = family.step() {
                eprintln!("memprof: the processes the command started: {e:#}");
            }
        }
        while i < self.running.len() {
            let step = self.running[i].step();
            let (execs, forked) = started_by(&mut self.running[i], &mut self.family);
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
    pub(super) fn started(&mut self, pid: u32, session: Result<Session>) {
        match session {
            Ok(session) => self.running.push(session),
            Err(_) if !crate::tracee::is_alive(pid) => {
                self.missed += 1;
                if self.missed == 1 {
                    eprintln!(
                        "memprof: pid {pid} ended before memprof could attach to it: its Boehm GC objects are not seen (said once; each counted)"
                    );
                }
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
    pub(super) fn timeout(&self, command: Duration) -> Duration {
        let command = match self.family.active() {
            true => command.min(FAMILY_STEP),
            false => command,
        };
        self.running
            .iter()
            .map(Session::timeout)
            .fold(command, Duration::min)
    }

    /// The sessions running now.
    pub(super) fn running(&mut self) -> &mut [Session] {
        &mut self.running
    }

    pub(super) fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.running.iter().map(Session::pid).collect();
        if let Some(family) = &self.family.ready {
            pids.extend(family.pids());
        }
        pids
    }

    /// A profile of followed process `pid` now.
    pub(super) fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        match (
            self.running.iter().find(|s| s.pid() == pid),
            self.family.ready(),
        ) {
            (Some(session), _) => session.snapshot(),
            (None, Some(family)) => family.snapshot(pid),
            (None, None) => anyhow::bail!("pid {pid} is not profiled"),
        }
    }

    /// The figures of every session's process (one that cannot be read
    /// now is left out: its session says why when it ends).
    pub(super) fn figures(&mut self) -> Vec<crate::driver::Figures> {
        self.running
            .iter_mut()
            .filter_map(|s| s.figures().ok())
            .collect()
    }

    /// The profiles of the sessions whose process ended, as kept.
    pub(super) fn ended(&self) -> &[Profile] {
        &self.done
    }

    /// The sessions whose process exited untraced (how not known) get
    /// the exit `exit_of` knows (the kernel's, the OOM killer's mark).
    pub(super) fn learn_exits(&mut self, exit_of: impl Fn(u32) -> Option<ExitInfo>) {
        for profile in &mut self.done {
            if profile.exit != Some(ExitInfo::UNKNOWN) {
                continue;
            }
            let Some(exit) = exit_of(profile.target.pid) else {
                continue;
            };
            profile.exit = Some(exit);
            for p in &mut profile.processes {
                p.exit = Some(exit);
            }
        }
    }

    /// Keeps the profiles of the last `n` sessions that ended (a machine
    /// runs programs for days).
    pub(super) fn keep_last(&mut self, n: usize) -> u64 {
        let gone = self.done.len().saturating_sub(n);
        self.done.drain(..gone);
        gone as u64
    }

    /// The profiles of every followed process; those still running are
    /// let go first (they run on, untraced).
    pub(super) fn finish(mut self) -> Vec<Profile> {
        for mut session in std::mem::take(&mut self.running) {
            // An exit already reported (the command's often comes right
            // after its children's) is taken now, with its status.
            if let Ok(Step::Exited(status)) = session.step() {
                let exit = status.map_or(ExitInfo::UNKNOWN, ExitInfo::from);
                self.finish_one(session, Some(exit));
                continue;
            }
            // Gone already (not seen yet): exited, how not known.
            let exited = !crate::tracee::is_alive(session.pid());
            let _ = session.release(exited);
            self.finish_one(session, exited.then_some(ExitInfo::UNKNOWN));
        }
        self.family.ready_now();
        if let Some(family) = self.family.ready.take() {
            match family.finish() {
                Ok(profiles) => self.done.extend(profiles),
                Err(e) => eprintln!(
                    "memprof: the profiles of the processes the command started could not be read: {e:#}"
                ),
            }
        }
        self.done
    }
}

/// `memprof attach`: profiles a running process until Ctrl-C, SIGTERM,
/// `--duration` or its exit, and leaves it running.
pub fn attach(driver: &Driver, pid: u32, options: &SessionOptions) -> Result<i32> {
    let mut attached = Attached {
        session: Session::attach(pid, options)?,
        exited: None,
    };
    driver.drive(&mut attached, options.duration)?;
    let Attached {
        mut session,
        exited,
    } = attached;
    let exited = match exited {
        None => end_census(driver, &mut session, options.census_wait)?,
        exited => exited,
    };
    if exited.is_some() {
        eprintln!("memprof: pid {pid} exited");
    }
    // No new holds, then let every thread go.
    session.release(exited.is_some())?;
    // The driver's signals stay blocked until the profile is written: a
    // second Ctrl-C must not lose it.
    session.finish(
        exited.map(|status| status.map_or(ExitInfo::UNKNOWN, ExitInfo::from)),
        Vec::new(),
    )?;
    Ok(0)
}

/// `attach --pid`'s one session, until its process exits.
struct Attached {
    session: Session,
    exited: Exited,
}

impl Driven for Attached {
    fn timeout(&self) -> Duration {
        self.session.timeout()
    }

    fn step(&mut self) -> Result<Flow> {
        if let Step::Exited(status) = self.session.step()? {
            self.exited = Some(status);
            return Ok(Flow::Stop);
        }
        Ok(Flow::Go)
    }
}

impl Profiling for Attached {
    fn pids(&self) -> Vec<u32> {
        vec![self.session.pid()]
    }

    fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        match self.session.pid() == pid {
            true => self.session.snapshot(),
            false => anyhow::bail!("pid {pid} is not profiled"),
        }
    }
}

/// Before memprof lets go of a target still running: the end census, at
/// the next collection the target makes (none is forced: memprof runs
/// nothing in the target). Waits up to `wait`; Ctrl-C or SIGTERM skips
/// it. Returns the target's exit status if it exits meanwhile.
fn end_census(driver: &Driver, session: &mut Session, wait: Duration) -> Result<Exited> {
    if wait.is_zero() || !session.want_end_census()? {
        return Ok(None);
    }
    eprintln!(
        "memprof: waiting up to {} s for a collection, for the end census (Ctrl-C to skip)",
        wait.as_secs_f64()
    );
    let mut census = CensusWait {
        session,
        exited: None,
    };
    let end = driver.drive(&mut census, Some(wait))?;
    if end == End::Deadline && !census.session.end_census_copied() {
        eprintln!(
            "memprof: no collection came within {} s: no end census of its own (the profile's census note says what stands for it)",
            wait.as_secs_f64()
        );
    }
    Ok(census.exited)
}

/// The wait for the end census: until it is copied, or the target exits.
struct CensusWait<'a> {
    session: &'a mut Session,
    exited: Exited,
}

impl Driven for CensusWait<'_> {
    fn due(&mut self) -> Result<Flow> {
        Ok(match self.session.end_census_copied() {
            true => Flow::Stop,
            false => Flow::Go,
        })
    }

    fn timeout(&self) -> Duration {
        self.session.timeout()
    }

    fn interrupted(&mut self) -> Result<Flow> {
        eprintln!("memprof: end census skipped");
        Ok(Flow::Stop)
    }

    fn step(&mut self) -> Result<Flow> {
        if let Step::Exited(status) = self.session.step()? {
            self.exited = Some(status);
            return Ok(Flow::Stop);
        }
        Ok(Flow::Go)
    }
}
