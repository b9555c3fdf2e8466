//! Tracing every thread of the target with `ptrace(PTRACE_SEIZE)`, for two
//! things only: stopping a thread when memprof's eBPF side asks (a signal
//! it sends to the thread, which memprof takes instead of the program), and
//! seeing the process exit while its mappings still exist.
//!
//! `PTRACE_SEIZE` does not stop anything; new threads are traced from birth
//! (`PTRACE_O_TRACECLONE`). Every other signal is handed back to the program
//! unchanged, group-stops (Ctrl-Z, SIGSTOP) stay stops. [`Tracer::detach`]
//! lets every thread go, handing back a signal that was about to be
//! delivered; if memprof dies, the kernel detaches by itself.
//!
//! `run` also follows the processes the command starts ([`super::family`]):
//! they are traced for their fork, `exec` and exit events only, never
//! stopped otherwise, and let go like the command's threads.
//!
//! Why a signal and not `SIGSTOP`: a group-stop would be seen by the
//! program's parent (a shell would take the terminal back).
use std::collections::{HashMap, HashSet};
use std::time::Instant;

use anyhow::{bail, Result};

use super::exit::ExitStatus;
use super::family::{self, Member};
use super::router::{has_queued, next_change, route, take_queued, take_queued_of, unroute};

/// What [`Tracer::poll`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The process is about to exit: its mappings can still be read.
    Exiting,
    /// It has exited.
    Exited(ExitStatus),
    /// Thread `tid` stopped before receiving `signal`, one memprof may have
    /// sent (SIGURG: from `dl_debug_state` or a GC hold). It stays
    /// stopped until [`Tracer::resume_signal`].
    Signal { tid: u32, signal: i32 },
    /// The process itself `exec`ed a program ([`Tracer::own_exec`]): it
    /// stays stopped before the program's first instruction, its other
    /// threads gone, for a session of its own.
    Exec,
}

/// The traced threads of one process.
#[derive(Debug)]
pub struct Tracer {
    pub pid: u32,
    threads: HashSet<u32>,
    /// Threads stopped by [`Event::Signal`], waiting for `resume_signal`.
    stopped: HashSet<u32>,
    /// The leader is stopped at `PTRACE_EVENT_EXIT`: resumed by the next poll.
    at_exit_stop: bool,
    status: Option<ExitStatus>,
    /// `run`: the processes the command started, by pid (exited ones too).
    members: HashMap<u32, Member>,
    /// Their threads still traced, each with its process.
    member_threads: HashMap<u32, u32>,
    /// Members stopped right after an `exec`, for a session of their own
    /// to take over ([`Tracer::take_execs`]).
    execs: Vec<u32>,
    /// Whether a member's `exec` is held for a session (`run`'s default);
    /// `false` (`--no-follow`): it is only recorded.
    pub hold_execs: bool,
    /// The traced process's own `exec`s are reported ([`Event::Exec`]),
    /// not gone through (`run`'s command, followed).
    pub own_exec: bool,
}

/// The options every traced thread gets.
pub(crate) const OPTIONS: i32 = libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACEEXIT;

/// What `run` adds: the processes the command starts are traced from
/// birth, and their `exec`s seen.
pub(crate) const FAMILY_OPTIONS: i32 =
    libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK | libc::PTRACE_O_TRACEEXEC;

impl Tracer {
    /// A tracer for a process whose leader is already seized (by `launch`).
    pub(super) fn for_launched(pid: u32) -> Tracer {
        route(pid, pid);
        Tracer {
            pid,
            threads: HashSet::from([pid]),
            stopped: HashSet::new(),
            at_exit_stop: false,
            status: None,
            members: HashMap::new(),
            member_threads: HashMap::new(),
            execs: Vec::new(),
            hold_execs: true,
            own_exec: false,
        }
    }

    /// A tracer for process `pid`, one another tracer followed until it
    /// stopped right after an `exec` ([`Tracer::take_execs`]); it stays
    /// stopped until [`Tracer::resume_signal`].
    pub fn for_exec_stopped(pid: u32) -> Tracer {
        let mut tracer = Tracer::for_launched(pid);
        // Stopped already (the stop was taken): let go without a wait.
        tracer.stopped.insert(pid);
        tracer
    }

    /// Lets go of a process stopped after its `exec` that no session took
    /// over: it runs on, untraced.
    pub fn let_go(pid: u32) {
        unroute(pid);
        unsafe { libc::ptrace(libc::PTRACE_DETACH, pid as i32, 0, 0) };
    }

    /// The members that have run at least `age` since memprof last
    /// stopped them and never `exec`ed (workers): let go here, for a
    /// session to attach to each. Not since their fork: one whose first
    /// stop waited while memprof was busy has hardly run.
    pub fn take_forked(&mut self, age: std::time::Duration) -> Vec<u32> {
        // One with a change not handled yet (an `exec` that came while
        // memprof was busy, say starting another member's session: a
        // pipeline forks its programs at once) is not judged by its age.
        let threads_of = |pid: u32| {
            let mut tids: Vec<u32> = self
                .member_threads
                .iter()
                .filter(|(_, &p)| p == pid)
                .map(|(&tid, _)| tid)
                .collect();
            tids.push(pid);
            tids
        };
        let ripe: Vec<u32> = self
            .members
            .values()
            .filter(|m| !m.handed_over && m.ended.is_none() && m.resumed.elapsed() >= age)
            .map(|m| m.pid)
            .filter(|&pid| {
                let tids = threads_of(pid);
                !has_queued(self.pid, &tids) && !tids.iter().any(|&tid| change_pending(tid))
            })
            .collect();
        if ripe.is_empty() {
            return ripe;
        }
        let tids: Vec<u32> = self
            .member_threads
            .iter()
            .filter(|(_, pid)| ripe.contains(pid))
            .map(|(&tid, _)| tid)
            .collect();
        for tid in &tids {
            self.member_threads.remove(tid);
        }
        let mut taken = take_queued_of(self.pid, &tids);
        let_go_threads(tids, &mut taken);
        for pid in &ripe {
            if let Some(member) = self.members.get_mut(pid) {
                member.handed_over = true;
            }
        }
        ripe
    }

    /// The processes the command started that have just `exec`ed a
    /// program, each stopped before its first instruction: the caller
    /// takes each over with [`Tracer::for_exec_stopped`] (or lets it go).
    pub fn take_execs(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.execs)
    }

    /// Lets member `pid`, held after its `exec` ([`Tracer::take_execs`]),
    /// run on traced as before: no session takes it over (`run` follows
    /// it with its family's probes).
    pub fn resume_exec(&mut self, pid: u32) {
        if let Some(member) = self.members.get_mut(&pid) {
            member.handed_over = false;
            member.resumed = Instant::now();
        }
        self.member_threads.insert(pid, pid);
        cont(pid, 0);
    }

    /// Whether the command has started any process.
    pub fn has_members(&self) -> bool {
        !self.members.is_empty()
    }

    /// The processes the command started, in the order they started.
    pub fn family(&self) -> Vec<Member> {
        let mut members: Vec<Member> = self.members.values().cloned().collect();
        members.sort_by_key(|m| (m.started, m.pid));
        members
    }

    /// Seizes every thread of running process `pid`; it keeps running.
    /// Fails if another tracer (a debugger) has it.
    pub fn seize(pid: u32, on_new_thread: &mut dyn FnMut(u32)) -> Result<Tracer> {
        let mut tracer = Tracer {
            pid,
            threads: HashSet::new(),
            stopped: HashSet::new(),
            at_exit_stop: false,
            status: None,
            members: HashMap::new(),
            member_threads: HashMap::new(),
            execs: Vec::new(),
            hold_execs: false,
            own_exec: false,
        };
        // Threads may start while we list them: list until nothing is new
        // (once a thread is traced, its children are traced at birth).
        loop {
            let mut new = 0;
            for tid in task_ids(pid) {
                if tracer.threads.contains(&tid) {
                    continue;
                }
                let r = unsafe {
                    libc::ptrace(libc::PTRACE_SEIZE, tid as i32, 0, OPTIONS as libc::c_long)
                };
                if r == -1 {
                    let err = std::io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::ESRCH) {
                        continue; // the thread ended meanwhile
                    }
                    tracer.detach();
                    bail!("cannot trace pid {pid} (thread {tid}): {err} (is a debugger attached?)");
                }
                tracer.threads.insert(tid);
                route(tid, pid);
                on_new_thread(tid);
                new += 1;
            }
            if new == 0 {
                return Ok(tracer);
            }
        }
    }

    /// Handles the threads' state changes without blocking; returns at the
    /// first event the caller must see. New threads are passed to
    /// `on_new_thread` before they run one instruction.
    pub fn poll(&mut self, on_new_thread: &mut dyn FnMut(u32)) -> Result<Option<Event>> {
        if let Some(status) = self.status {
            return Ok(Some(Event::Exited(status)));
        }
        if std::mem::take(&mut self.at_exit_stop) {
            cont(self.pid, 0);
        }
        loop {
            let Some((tid, status)) = next_change(self.pid)? else {
                return Ok(None);
            };
            if let Some(&pid) = self.member_threads.get(&tid) {
                self.member_event(tid, pid, status);
                continue;
            }
            if let Some(exit) = ExitStatus::from_wait(status) {
                self.threads.remove(&tid);
                if tid == self.pid {
                    self.status = Some(exit);
                    self.threads.clear();
                    return Ok(Some(Event::Exited(exit)));
                }
                continue;
            }
            if !self.threads.contains(&tid) {
                self.first_stop(tid, on_new_thread);
                continue;
            }
            if let Some(event) = self.stop_of_thread(tid, status, on_new_thread) {
                return Ok(Some(event));
            }
        }
    }

    /// The first stop of a task not known yet: a process the command
    /// started or a new thread, each resumed.
    fn first_stop(&mut self, tid: u32, on_new_thread: &mut dyn FnMut(u32)) {
        // A new process the command started, its first stop
        // before its parent's fork event.
        if let Some((process, parent)) = family::process_of(tid) {
            if process != self.pid {
                self.adopt(tid, process, parent);
                cont(tid, 0);
                return;
            }
        }
        // A new thread's first stop, possibly before its parent's
        // clone event.
        self.threads.insert(tid);
        route(tid, self.pid);
        on_new_thread(tid);
        cont(tid, 0);
    }

    /// A stop of one of the command's threads: a signal, or a ptrace event
    /// (clone, fork, exit, exec). The event the caller sees, if any; the
    /// others are handled and the thread resumed.
    fn stop_of_thread(
        &mut self,
        tid: u32,
        status: i32,
        on_new_thread: &mut dyn FnMut(u32),
    ) -> Option<Event> {
        match status >> 16 {
            0 => {
                let signal = libc::WSTOPSIG(status);
                if is_ours(signal) {
                    self.stopped.insert(tid);
                    return Some(Event::Signal { tid, signal });
                }
                cont(tid, signal);
            }
            libc::PTRACE_EVENT_CLONE => {
                let mut new: libc::c_ulong = 0;
                unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid as i32, 0, &mut new) };
                let new = new as u32;
                match family::process_of(new) {
                    // A clone that is a process of its own.
                    Some((process, _)) if process != self.pid => self.adopt(new, process, self.pid),
                    _ => {
                        if new != 0 && self.threads.insert(new) {
                            route(new, self.pid);
                            on_new_thread(new);
                        }
                    }
                }
                cont(tid, 0);
            }
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                if let Some(new) = event_message(tid) {
                    self.adopt(new, new, self.pid);
                }
                cont(tid, 0);
            }
            libc::PTRACE_EVENT_EXIT if tid == self.pid => {
                // Resumed by the next poll: the caller reads the mappings first.
                self.at_exit_stop = true;
                return Some(Event::Exiting);
            }
            libc::PTRACE_EVENT_STOP => event_stop(tid, status),
            libc::PTRACE_EVENT_EXEC if tid == self.pid && self.own_exec => {
                // The exec left one thread, with the process's id.
                self.threads.retain(|&t| t == tid);
                self.stopped.insert(tid);
                return Some(Event::Exec);
            }
            _ => cont(tid, 0), // exec, exit of another thread
        }
        None
    }

    /// Follows thread `tid` of process `pid`, one the command started
    /// (directly or not) with parent `parent`.
    fn adopt(&mut self, tid: u32, pid: u32, parent: u32) {
        if tid == 0 {
            return;
        }
        self.members
            .entry(pid)
            .or_insert_with(|| Member::born(pid, parent));
        self.member_threads.insert(tid, pid);
        route(tid, self.pid);
    }

    /// A state change of thread `tid` of member `pid`: its own signals
    /// are delivered, what it starts is followed, its `exec` and exit
    /// recorded.
    fn member_event(&mut self, tid: u32, pid: u32, status: i32) {
        // It runs again from here (unless held below).
        if let Some(member) = self.members.get_mut(&pid) {
            member.resumed = Instant::now();
        }
        if let Some(exit) = ExitStatus::from_wait(status) {
            self.member_threads.remove(&tid);
            if tid == pid {
                if let Some(member) = self.members.get_mut(&pid) {
                    member.ended = Some((Instant::now(), exit));
                }
            }
            return;
        }
        match status >> 16 {
            0 => cont(tid, libc::WSTOPSIG(status)),
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                if let Some(new) = event_message(tid) {
                    self.adopt(new, new, pid);
                }
                cont(tid, 0);
            }
            libc::PTRACE_EVENT_CLONE => {
                if let Some(new) = event_message(tid) {
                    match family::process_of(new) {
                        Some((process, _)) if process != pid => self.adopt(new, process, pid),
                        _ => self.adopt(new, pid, pid),
                    }
                }
                cont(tid, 0);
            }
            libc::PTRACE_EVENT_EXEC => {
                let hold = self.hold_execs;
                if let Some(member) = self.members.get_mut(&pid) {
                    member.reread();
                    member.handed_over = hold;
                }
                if !hold {
                    cont(tid, 0);
                    return;
                }
                // A new program: held here for a session of its own. The
                // `exec` left one thread, now with the process's id.
                self.member_threads.retain(|_, p| *p != pid);
                self.execs.push(pid);
            }
            libc::PTRACE_EVENT_STOP => event_stop(tid, status),
            _ => cont(tid, 0), // its exit stop
        }
    }

    /// Lets every member thread go (each stopped first, so that a signal
    /// about to be delivered is handed back, and a process it was just
    /// starting is let go too).
    fn detach_members(&mut self, taken: &mut HashMap<u32, i32>) {
        // Members held after an `exec` that no session took over.
        for pid in std::mem::take(&mut self.execs) {
            Tracer::let_go(pid);
        }
        let left: Vec<u32> = self.member_threads.drain().map(|(tid, _)| tid).collect();
        let_go_threads(left, taken);
    }

    /// Resumes a thread stopped by [`Event::Signal`], delivering the signal
    /// to the program or not.
    pub fn resume_signal(&mut self, tid: u32, signal: i32, deliver: bool) {
        self.stopped.remove(&tid);
        cont(tid, if deliver { signal } else { 0 });
    }

    /// Stops tracing every thread, leaving the process running. Threads
    /// still stopped by [`Event::Signal`] go without the signal.
    pub fn detach(&mut self) {
        // Threads whose stop was taken already (queued): not waited for again.
        let mut taken: HashMap<u32, i32> = take_queued(self.pid).into_iter().collect();
        self.detach_members(&mut taken);
        if self.status.is_some() {
            return;
        }
        let at_exit = std::mem::take(&mut self.at_exit_stop);
        let mut stopped = std::mem::take(&mut self.stopped);
        if at_exit {
            stopped.insert(self.pid);
        }
        for &tid in &self.threads {
            if !stopped.contains(&tid) && !taken.contains_key(&tid) {
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as i32, 0, 0) };
            }
        }
        for tid in std::mem::take(&mut self.threads) {
            if stopped.contains(&tid) {
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid as i32, 0, 0) };
                continue;
            }
            // Wait for it to stop; a signal it was about to receive is handed back on detach.
            let (r, status) = match taken.remove(&tid) {
                Some(status) => (tid as i32, status),
                None => {
                    let mut status = 0;
                    let r = unsafe { libc::waitpid(tid as i32, &mut status, libc::__WALL) };
                    (r, status)
                }
            };
            if r != tid as i32 || ExitStatus::from_wait(status).is_some() {
                if tid == self.pid && r == tid as i32 {
                    self.status = ExitStatus::from_wait(status);
                }
                continue;
            }
            let signal = if status >> 16 == 0 {
                let s = libc::WSTOPSIG(status);
                // A signal memprof may have sent is dropped: the signalling
                // is off by now, and one of the program's own SIGURG (ignored
                // by default) is the lesser loss.
                if is_ours(s) {
                    0
                } else {
                    s
                }
            } else {
                0
            };
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid as i32, 0, signal as libc::c_long) };
        }
    }
}

/// On every path out (errors included), the target is let go.
impl Drop for Tracer {
    fn drop(&mut self) {
        self.detach();
    }
}

/// A signal memprof's kernel side sends (the hold and library-load
/// signals are one, SIGURG): the thread stops for memprof to decide.
fn is_ours(signal: i32) -> bool {
    signal == memprof_common::HOLD_SIGNAL as i32
        || signal == memprof_common::LIBRARY_LOAD_SIGNAL as i32
}

/// Lets threads `left` go, each stopped first (so a signal about to be
/// delivered is handed back, and a process one was just starting goes
/// too). `taken`: stops already taken from the kernel (not waited for again).
fn let_go_threads(mut left: Vec<u32>, taken: &mut HashMap<u32, i32>) {
    for &tid in &left {
        if !taken.contains_key(&tid) {
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as i32, 0, 0) };
        }
    }
    while let Some(tid) = left.pop() {
        let status = match taken.remove(&tid) {
            Some(status) => status,
            None => {
                let mut status = 0;
                let r = unsafe { libc::waitpid(tid as i32, &mut status, libc::__WALL) };
                if r != tid as i32 {
                    continue;
                }
                status
            }
        };
        if ExitStatus::from_wait(status).is_some() {
            continue;
        }
        let signal = match status >> 16 {
            0 => libc::WSTOPSIG(status),
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                // Born traced: stops at its start, then goes too.
                if let Some(new) = event_message(tid) {
                    left.push(new);
                }
                0
            }
            _ => 0,
        };
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid as i32, 0, signal as libc::c_long) };
    }
}

/// Whether the kernel has a state change of thread `tid` to report (left
/// to be reported: `WNOWAIT`).
fn change_pending(tid: u32) -> bool {
    // SAFETY: siginfo_t is plain data, filled by waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WSTOPPED | libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    let r = unsafe { libc::waitid(libc::P_PID, tid as libc::id_t, &mut info, flags) };
    r == 0 && unsafe { info.si_pid() } != 0
}

/// The pid a fork, vfork or clone event of `tid` names.
fn event_message(tid: u32) -> Option<u32> {
    let mut new: libc::c_ulong = 0;
    let r = unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid as i32, 0, &mut new) };
    (r == 0 && new != 0).then_some(new as u32)
}

/// A `PTRACE_EVENT_STOP`: a group-stop (Ctrl-Z, SIGSTOP) stays a stop
/// (events still come); anything else (a new thread's start, a stray
/// interrupt) goes on.
fn event_stop(tid: u32, status: i32) {
    let signal = libc::WSTOPSIG(status);
    if matches!(
        signal,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    ) {
        unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid as i32, 0, 0) };
    } else {
        cont(tid, 0);
    }
}

fn cont(tid: u32, signal: i32) {
    unsafe { libc::ptrace(libc::PTRACE_CONT, tid as i32, 0, signal as libc::c_long) };
}

/// The thread ids of `pid`.
pub(crate) fn task_ids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
