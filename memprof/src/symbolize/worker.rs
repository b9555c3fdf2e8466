//! Naming runs on a thread of its own, within budgets: the thread that
//! asks (the one that drains the kernel's events, or the agent's
//! driver) only waits for the answers, and stops waiting when its budget
//! is spent or memprof is told to stop.
//!
//! Every file a target maps is a stranger's: its symbols, its DWARF,
//! its sources. The worker gives each file [`FILE_TIME`] and each job
//! (one process's addresses) [`JOB_TIME`] and [`JOB_MEMORY`] of growth
//! of memprof's resident memory, checked between batches; the caller
//! waits at most its [`Budget`]. An address not named in time keeps its
//! module and offset (`libfoo.so+0x1234`) and is counted
//! ([`NameLosses::unnamed`]). A worker still busy when the next job
//! comes (stuck in one file) is left to finish alone and a new one
//! started, at most [`MAX_STUCK`] at a time.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{self, Budget};
use super::Symbolizers;
use crate::modules::Module;
use crate::profile::Frame;

/// Addresses named in one blazesym call: bounds the memory its results
/// hold at once, and how long a cancelled job runs on.
pub(super) const BATCH: usize = 4096;
/// The time one file may take in one job; the rest of its addresses stay unnamed.
pub const FILE_TIME: Duration = Duration::from_secs(20);
/// The time one process's addresses may take.
pub const JOB_TIME: Duration = Duration::from_secs(60);
/// The growth of memprof's resident memory one job may cause.
pub const JOB_MEMORY: u64 = 1 << 30;
/// Workers left running a job nobody waits for any more; beyond, no new
/// worker is started and addresses stay unnamed.
pub const MAX_STUCK: usize = 4;
/// How often the waiting caller looks at its budget and the signals.
const TICK: Duration = Duration::from_millis(20);

/// One address to name: the return address, and the file offsets of the
/// call (`address - 1`, looked up) and of the address itself (kept).
#[derive(Debug, Clone, Copy)]
pub struct Address {
    pub address: u64,
    pub lookup: u64,
    pub offset: Option<u64>,
}

/// One module's addresses: its path, the file as the session opened it
/// (`None`: unreadable, no names), the addresses.
pub struct ModuleWork {
    pub path: PathBuf,
    pub file: Option<Arc<Module>>,
    pub addresses: Vec<Address>,
}

/// What naming could not do, counted in the profile's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NameLosses {
    /// Names left mangled: their demangled form over its budget
    /// (`demangle::MAX_DEMANGLED`), or unreadable and too long to try.
    pub left_mangled: u64,
    /// Addresses left as `module+0xOFFSET`: a budget spent, memprof
    /// stopped, or the reading of their file failed (a panic caught).
    pub unnamed: u64,
}

/// One job: the modules, where to answer, and the flag that cancels it.
struct Job {
    modules: Vec<ModuleWork>,
    answers: Sender<Answer>,
    cancel: Arc<AtomicBool>,
}

enum Answer {
    /// Frames of some addresses, and the names among them left mangled.
    Named(Vec<(u64, Vec<Frame>)>, u64),
    /// A module's name being read now.
    Module(String),
    Done,
}

/// Workers running a job nobody waits for.
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// The naming thread and its cache of what it read of the files.
pub struct Worker {
    jobs: Sender<Job>,
    state: Arc<State>,
}

/// What the caller and the worker both see.
#[derive(Default)]
struct State {
    /// Between two jobs (false while one runs).
    idle: AtomicBool,
    /// Left to finish a job alone (counted in [`STUCK`] until it ends).
    stuck: AtomicBool,
}

impl Worker {
    fn spawn() -> Option<Worker> {
        let (jobs, incoming) = mpsc::channel::<Job>();
        let state = Arc::new(State {
            idle: AtomicBool::new(true),
            ..State::default()
        });
        let shared = Arc::clone(&state);
        std::thread::Builder::new()
            .name("memprof-names".into())
            .spawn(move || serve(incoming, &shared))
            .ok()?;
        Some(Worker { jobs, state })
    }
}

/// Names the addresses of `modules` on `worker` (started, or started
/// again when the last one is stuck), waiting within `budget`; `bar`
/// counts the addresses named. Every address of `modules` is in the
/// answer: named, or `module+0xOFFSET` and counted.
pub fn name(
    worker: &mut Option<Worker>,
    modules: Vec<ModuleWork>,
    budget: Budget,
    bar: &indicatif::ProgressBar,
) -> (HashMap<u64, Vec<Frame>>, NameLosses) {
    let total: usize = modules.iter().map(|m| m.addresses.len()).sum();
    let mut named: HashMap<u64, Vec<Frame>> = HashMap::with_capacity(total);
    let mut losses = NameLosses::default();
    // What to show for each address if no name comes.
    let fallbacks: Vec<(String, Vec<Address>)> = modules
        .iter()
        .map(|m| (crate::text::lossy_path(&m.path), m.addresses.clone()))
        .collect();
    // Stopping and out of time: nothing more is read.
    let stopped = budget::stop_now(budget);
    if let Some(answers) = (!stopped).then(|| submit(worker, modules)).flatten() {
        let (answers, cancel) = answers;
        let mut deadline = budget.wait.map(|w| Instant::now() + w);
        loop {
            match answers.recv_timeout(TICK) {
                Ok(Answer::Named(frames, mangled)) => {
                    bar.inc(frames.len() as u64);
                    losses.left_mangled += mangled;
                    named.extend(frames);
                }
                Ok(Answer::Module(module)) => bar.set_message(format!("symbolizing {module}")),
                Ok(Answer::Done) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    // A loop's driver has a signal to take: half a second more.
                    if let Some(d) = deadline
                        .as_mut()
                        .filter(|_| budget.cut_by_signal && budget::signal_waits())
                    {
                        *d = (*d).min(Instant::now() + budget::STOP_GRACE);
                    }
                    let late = deadline.is_some_and(|d| Instant::now() >= d);
                    if late || budget::stop_now(budget) {
                        cancel.store(true, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    }
    for (module, addresses) in fallbacks {
        for a in addresses {
            named.entry(a.address).or_insert_with(|| {
                losses.unnamed += 1;
                vec![unnamed_frame(&module, a)]
            });
        }
    }
    (named, losses)
}

/// Hands `modules` to the worker, a new one if it is still busy with a
/// job nobody waits for; `None` when no worker can take it.
fn submit(
    worker: &mut Option<Worker>,
    modules: Vec<ModuleWork>,
) -> Option<(Receiver<Answer>, Arc<AtomicBool>)> {
    if let Some(w) = worker
        .as_ref()
        .filter(|w| !w.state.idle.load(Ordering::Acquire))
    {
        // Stuck in a file: left to end alone (it ends when that call
        // returns, and sees its job cancelled).
        STUCK.fetch_add(1, Ordering::Relaxed);
        w.state.stuck.store(true, Ordering::Release);
        *worker = None;
    }
    if worker.is_none() {
        if STUCK.load(Ordering::Relaxed) >= MAX_STUCK {
            return None;
        }
        *worker = Worker::spawn();
    }
    let w = worker.as_ref()?;
    let (answers, incoming) = mpsc::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    w.state.idle.store(false, Ordering::Release);
    let job = Job {
        modules,
        answers,
        cancel: Arc::clone(&cancel),
    };
    if w.jobs.send(job).is_err() {
        *worker = None;
        return None;
    }
    Some((incoming, cancel))
}

/// The worker's loop: one job after the other, each within its budgets,
/// until its handle is dropped.
fn serve(jobs: Receiver<Job>, state: &State) {
    block_signals();
    let mut symbolizers = Symbolizers::new();
    while let Ok(job) = jobs.recv() {
        run_job(&mut symbolizers, job, state);
    }
    if state.stuck.load(Ordering::Acquire) {
        STUCK.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One process's modules, a batch at a time, until done, cancelled or a
/// budget is spent (the rest stays unnamed: the caller fills it in).
fn run_job(symbolizers: &mut Symbolizers, job: Job, state: &State) {
    let started = Instant::now();
    let resident = crate::memory::resident_bytes();
    'job: for work in job.modules {
        let file_started = Instant::now();
        let module = crate::text::lossy_path(&work.path);
        if job
            .answers
            .send(Answer::Module(crate::allocators::short(&work.path)))
            .is_err()
        {
            break;
        }
        for batch in work.addresses.chunks(BATCH) {
            let spent = started.elapsed() > JOB_TIME
                || crate::memory::resident_bytes().saturating_sub(resident) > JOB_MEMORY;
            if job.cancel.load(Ordering::Relaxed) || spent {
                break 'job;
            }
            if file_started.elapsed() > FILE_TIME {
                break;
            }
            // A file that makes blazesym panic names nothing more; the
            // worker lives on.
            let named = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                symbolizers.batch(&module, work.file.as_deref(), batch)
            }));
            let Ok((frames, mangled)) = named else {
                break;
            };
            let frames = batch.iter().map(|a| a.address).zip(frames).collect();
            if job.answers.send(Answer::Named(frames, mangled)).is_err() {
                break 'job;
            }
        }
    }
    // Idle before the caller hears it is done: a next job submitted at
    // once must find this worker free, not stuck (a new worker would
    // parse every file again: libc's DWARF alone 40 ms, each process).
    state.idle.store(true, Ordering::Release);
    let _ = job.answers.send(Answer::Done);
}

/// `libfoo.so+0x1234`: an address whose name was not read.
pub fn unnamed_frame(module: &str, a: Address) -> Frame {
    let file = module.rsplit('/').next().unwrap_or(module);
    let offset = a.offset.unwrap_or(a.lookup + 1);
    Frame {
        function: format!("{file}+0x{offset:x}"),
        raw_name: String::new(),
        file: None,
        line: None,
        module: module.to_string(),
        address: a.address,
        offset: a.offset,
    }
}

/// Every signal blocked on the worker but the ones a fault raises:
/// SIGINT and SIGTERM are the driver's to take, and a SIGBUS (a file
/// truncated while blazesym reads its mapping) must reach the handler
/// of `modules::shrunk`; blocked, the kernel would end memprof with it.
fn block_signals() {
    // SAFETY: a set built here, applied to this thread's mask alone.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for fault in [libc::SIGBUS, libc::SIGSEGV, libc::SIGILL, libc::SIGFPE] {
            libc::sigdelset(&mut all, fault);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::ModuleCache;

    /// `display_name` in this test binary, as the worker is given it.
    fn this_function() -> (ModuleWork, u64) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let mut maps = crate::modules::maps::MapsCache::default();
        maps.merge(crate::modules::maps::read(std::process::id()).unwrap());
        // A return address inside the function (its second byte).
        let addr = crate::symbolize::display_name as fn(&str) -> String as usize as u64 + 2;
        let work = ModuleWork {
            file: ModuleCache::default().get(&exe).ok(),
            addresses: vec![crate::symbolize::address(addr, &maps)],
            path: exe,
        };
        (work, addr)
    }

    #[test]
    fn an_address_is_named_on_the_worker() {
        let (work, addr) = this_function();
        let mut worker = None;
        let bar = indicatif::ProgressBar::hidden();
        let (named, losses) = name(&mut worker, vec![work], Budget::BACKGROUND, &bar);
        assert_eq!(losses, NameLosses::default());
        let frames = &named[&addr];
        assert!(
            frames
                .last()
                .unwrap()
                .function
                .ends_with("symbolize::display_name"),
            "{frames:?}"
        );
        assert!(worker.is_some());
    }

    #[test]
    fn a_sigterm_while_naming_a_users_profile_leaves_its_addresses_unnamed_and_counted() {
        let (work, addr) = this_function();
        let offset = work.addresses[0].offset.unwrap();
        let module = crate::allocators::short(&work.path);
        // SIGTERM blocked on this thread and sent to it: pending, as the
        // driver's thread sees one before it takes it.
        // SAFETY: this thread's mask; a signal to this thread alone.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            libc::pthread_kill(libc::pthread_self(), libc::SIGTERM);
        }
        let mut worker = None;
        let bar = indicatif::ProgressBar::hidden();
        // A loop's wait gives it a second: named.
        let (work_again, _) = this_function();
        let (named, losses) = name(&mut worker, vec![work_again], Budget::BACKGROUND, &bar);
        assert_eq!(losses, NameLosses::default());
        assert!(named[&addr][0].function.ends_with("display_name"));
        // The profile a user waits for: a signal while it is named stops it.
        let mut worker = None;
        let (named, losses) = name(&mut worker, vec![work], Budget::WHOLE, &bar);
        // Taken again, so the test binary lives on.
        budget::take_earlier_stop();
        assert_eq!(
            losses,
            NameLosses {
                left_mangled: 0,
                unnamed: 1
            }
        );
        assert_eq!(named[&addr].len(), 1);
        assert_eq!(named[&addr][0].function, format!("{module}+0x{offset:x}"));
        assert!(worker.is_none(), "no job was given to a worker");
    }
}
