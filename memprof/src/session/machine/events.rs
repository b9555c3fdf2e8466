//! The ring of process events, read on a thread of its own: a process's
//! mappings are read (and its files opened) the moment the kernel says
//! it started, `exec`ed or loaded libraries, before the slow work (unwind
//! rows, probe plans) that the main loop does with them. A process that
//! lives a few milliseconds is gone by the time that work is done.
//!
//! Library loads are read at a bounded rate per process ([`LoadBudget`]):
//! a process that loads and unloads libraries all the time is read a few
//! times a second, its latest state, and the events of the others are
//! not kept waiting behind its readings.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memprof_common::{host, DeferredStack, HostEvent};

use super::files::{self, RowIndex};
use crate::modules::maps::{self, Mapping};
use crate::modules::ModuleCache;
use crate::probes::{DeferredStacks, HostEvents, ModuleTables};
use crate::tracee::Tracee;

/// The longest wait for an event. The kernel's wakeup of a ring's reader
/// goes through `irq_work`, which this kernel runs at its next tick (up to
/// 4 ms at HZ=250: measured 2.5–4.2 ms late): a process that lives a few
/// milliseconds would be gone. Looking every millisecond costs ~1,000
/// wakeups a second (~0.5 % of a core).
const POLL: Duration = Duration::from_millis(1);

/// `memprof agent` (resident): after this long without an event...
const QUIET_AFTER: Duration = Duration::from_secs(1);
/// ...the ring is looked at this often, the kernel's wakeup (up to 4 ms
/// late) waking the thread meanwhile: on a quiet machine, 20 wakeups a
/// second rather than 1,000; the first process after the quiet is read
/// up to 4 ms late, those after it within the millisecond again.
const QUIET_POLL: Duration = Duration::from_millis(50);

/// Library loads of one process read at once, in a row (a program's
/// start and a `dlopen` take two `_dl_debug_state` calls each)...
const LOAD_BURST: u32 = 4;
/// ...then one reading per process per this interval at most: the loads
/// meanwhile are read together, once, as the process maps them then.
const LOAD_INTERVAL: Duration = Duration::from_millis(100);

/// An event, and what was read of its process at once.
pub struct Seen {
    pub event: HostEvent,
    pub read: Option<ReadNow>,
    /// Reading its process was refused for want of a resource
    /// (descriptors, memory): it may be unnamed.
    pub refused: bool,
}

/// A process as /proc showed it right after its event.
pub struct ReadNow {
    /// Its executable mappings, and which reading of the session's this
    /// is (they count up).
    pub maps: Vec<Mapping>,
    pub reading: u64,
    /// Its files, opened through it (readable after it is gone).
    pub modules: ModuleCache,
    /// Its command line and executable (at its first allocation).
    pub target: Option<Tracee>,
    pub ns_pid: Option<u32>,
}

/// The reading thread.
pub struct Reader {
    pub seen: Receiver<Seen>,
    /// Stacks the kernel could not finish, as they come.
    pub deferred: Receiver<Box<DeferredStack>>,
    /// Library loads read together with a later one of their process
    /// (its mappings read once for them).
    pub loads_merged: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// Reads `ring`; a process seen (or relinked) gets its module table
    /// in `tables` at once, with the files of `rows`. `resident`: `memprof
    /// agent`, which looks less often on a quiet machine ([`QUIET_POLL`]).
    pub fn start(
        mut ring: HostEvents,
        mut stacks: DeferredStacks,
        rows: RowIndex,
        tables: Arc<Mutex<ModuleTables>>,
        resident: bool,
    ) -> Reader {
        let (send, seen) = mpsc::channel();
        let (send_stacks, deferred) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let loads_merged = Arc::new(AtomicU64::new(0));
        let merged = Arc::clone(&loads_merged);
        crate::memory::allow_second_arena();
        let thread = std::thread::spawn(move || {
            // A process that lives milliseconds is read only if this
            // thread runs the moment it is woken, whatever else memprof
            // (building unwind rows) or the machine is doing.
            set_realtime(true);
            let mut drain_stacks = || {
                while let Some(stack) = stacks.take_next() {
                    let _ = send_stacks.send(stack);
                }
            };
            read_ring(
                &mut ring,
                &send,
                &stopping,
                &rows,
                &tables,
                &mut drain_stacks,
                &merged,
                resident,
            );
        });
        Reader {
            seen,
            deferred,
            loads_merged,
            stop,
            thread: Some(thread),
        }
    }

    /// Reads the events queued now, then stops.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's loop: every event read, its process read at once; then
/// the tables given, one event at a time, reading the ring again between
/// two files whose rows are built (a file takes ~10 ms a megabyte).
/// `merged`: the loads read together so far, for the end's summary.
#[allow(clippy::too_many_arguments)] // the thread's whole state, each used once
fn read_ring(
    ring: &mut HostEvents,
    send: &mpsc::Sender<Seen>,
    stopping: &AtomicBool,
    rows: &RowIndex,
    tables: &Mutex<ModuleTables>,
    drain_stacks: &mut dyn FnMut(),
    merged: &AtomicU64,
    resident: bool,
) {
    let mut queue = Queue::default();
    let mut last_event = Instant::now();
    loop {
        // Set before the last read: events queued by then are read.
        let last = stopping.load(Ordering::Acquire);
        queue.drain(ring);
        if last {
            // The loads held back, read now (the process may still run).
            queue.read_held(true);
        }
        merged.store(queue.loads.merged, Ordering::Relaxed);
        if !queue.items.is_empty() {
            last_event = Instant::now();
        }
        drain_stacks();
        while let Some((event, read, refused)) = queue.items.pop_front() {
            if event.op == host::TABLE {
                // In order with this thread's own tables.
                let (old, new) = (event.mapping.start as u32, event.mapping.end as u32);
                lock(tables).built_by_kernel(event.index, old, new);
            }
            if let Some(read) = &read {
                publish(&event, read, rows, tables, &mut || queue.drain(ring));
            }
            let seen = Seen {
                event,
                read,
                refused,
            };
            if send.send(seen).is_err() {
                return;
            }
        }
        if last {
            return;
        }
        let quiet = resident && last_event.elapsed() >= QUIET_AFTER;
        ring.wait(if quiet { QUIET_POLL } else { POLL });
    }
}

/// The events read, each with what its process showed then.
#[derive(Default)]
struct Queue {
    items: std::collections::VecDeque<(HostEvent, Option<ReadNow>, bool)>,
    readings: u64,
    loads: LoadBudget,
}

impl Queue {
    /// Reads every event queued in the ring, and each one's process (a
    /// library load past its process's budget is held, and read with
    /// its process's next one).
    fn drain(&mut self, ring: &mut HostEvents) {
        let now = Instant::now();
        while let Some(event) = ring.take_next() {
            match event.op {
                host::LIBRARIES if !self.loads.admit(&event, now) => continue,
                // Its loads held are of a program that is gone.
                host::EXIT | host::EXEC => self.loads.forget(event.tgid),
                _ => {}
            }
            self.read(event);
        }
        self.read_held(false);
    }

    /// The loads held whose process has budget again (`all`: every one).
    fn read_held(&mut self, all: bool) {
        for event in self.loads.due(Instant::now(), all) {
            self.read(event);
        }
    }

    fn read(&mut self, event: HostEvent) {
        self.readings += 1;
        let (read, refused) = read_now(&event, self.readings);
        self.items.push_back((event, read, refused));
    }
}

/// Each process's budget of library-load readings: [`LOAD_BURST`] at
/// once, then one per [`LOAD_INTERVAL`]; a load past it is held (the
/// latest of a process's replaces the one held) and read when the
/// process has budget again.
#[derive(Default)]
struct LoadBudget {
    /// By tgid: readings it may have now (in [`LOAD_INTERVAL`]s, counted
    /// up to [`LOAD_BURST`]) as of when, and its load held.
    processes: HashMap<u32, (f64, Instant, Option<HostEvent>)>,
    /// Loads held that a later reading of their process covered.
    merged: u64,
    /// When budgets full again were last forgotten.
    pruned: Option<Instant>,
}

impl LoadBudget {
    /// Whether library load `event` is read now; if not, it is held.
    fn admit(&mut self, event: &HostEvent, now: Instant) -> bool {
        let (credit, at, held) =
            self.processes
                .entry(event.tgid)
                .or_insert((f64::from(LOAD_BURST), now, None));
        *credit = refilled(*credit, *at, now);
        *at = now;
        if held.is_none() && *credit >= 1.0 {
            *credit -= 1.0;
            return true;
        }
        if held.replace(*event).is_some() {
            self.merged += 1;
        }
        false
    }

    /// The loads held to read now: those whose process has budget again
    /// (`all`: every one).
    fn due(&mut self, now: Instant, all: bool) -> Vec<HostEvent> {
        let mut due = Vec::new();
        for (credit, at, held) in self.processes.values_mut() {
            if held.is_none() {
                continue;
            }
            let c = refilled(*credit, *at, now);
            if c >= 1.0 || all {
                *credit = (c - 1.0).max(0.0);
                *at = now;
                due.extend(held.take());
            }
        }
        // Processes that loaded nothing for a while: forgotten (those not
        // followed have no exit event).
        if self
            .pruned
            .is_none_or(|p| now - p >= LOAD_INTERVAL * LOAD_BURST)
        {
            self.pruned = Some(now);
            self.processes.retain(|_, (credit, at, held)| {
                held.is_some() || refilled(*credit, *at, now) < f64::from(LOAD_BURST)
            });
        }
        due
    }

    /// Process `tgid`'s program is done: its load held is not read.
    fn forget(&mut self, tgid: u32) {
        if let Some((_, _, Some(_))) = self.processes.remove(&tgid) {
            self.merged += 1;
        }
    }
}

/// A budget of `credit` readings at `at`, as of `now`.
fn refilled(credit: f64, at: Instant, now: Instant) -> f64 {
    let gained = now.saturating_duration_since(at).as_secs_f64() / LOAD_INTERVAL.as_secs_f64();
    (credit + gained).min(f64::from(LOAD_BURST))
}

/// Gives the process of `event` (its first allocation, or a library
/// load) its module table: the unwinder follows its stacks from now on,
/// through the files with rows (the main loop adds the others').
/// `between`: called before each file's rows are built.
fn publish(
    event: &HostEvent,
    read: &ReadNow,
    rows: &RowIndex,
    tables: &Mutex<ModuleTables>,
    between: &mut dyn FnMut(),
) {
    if event.index >= host::SESSION || !matches!(event.op, host::NEW | host::LIBRARIES) {
        return;
    }
    // With the rows known now first (the usual case: the program ran
    // before), then again if the rows of a small new file were added.
    let known = files::ranges(rows, &read.maps);
    let _ = lock(tables).publish(event.index, read.reading, &known);
    // Building rows takes milliseconds: not ahead of the machine's work.
    set_realtime(false);
    files::add_rows(
        rows,
        &read.maps,
        &read.modules,
        Some(files::SMALL_FILE),
        between,
    );
    set_realtime(true);
    let ranges = files::ranges(rows, &read.maps);
    if ranges != known {
        let _ = lock(tables).publish(event.index, read.reading, &ranges);
    }
}

/// The reader's scheduling: real-time (`SCHED_FIFO`, the lowest
/// priority) while it waits for and reads events, so that it runs the
/// moment its timer or wakeup fires (at nice -20 it was measured 2.4 ms
/// late behind a busy main loop and the targets, on 2 cores); the
/// normal policy at nice -20 while it builds rows.
fn set_realtime(on: bool) {
    // SAFETY: plain syscalls on this thread.
    unsafe {
        let param = libc::sched_param {
            sched_priority: i32::from(on),
        };
        let policy = if on {
            libc::SCHED_FIFO
        } else {
            libc::SCHED_OTHER
        };
        libc::sched_setscheduler(0, policy, &param);
        if !on {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -20);
        }
    }
}

fn lock(tables: &Mutex<ModuleTables>) -> std::sync::MutexGuard<'_, ModuleTables> {
    tables.lock().unwrap_or_else(|e| e.into_inner())
}

/// What an event's process shows now: for its first allocation (or
/// `exec`) and its library loads; and whether reading it was refused
/// for want of a resource.
fn read_now(event: &HostEvent, reading: u64) -> (Option<ReadNow>, bool) {
    if !matches!(event.op, host::NEW | host::LIBRARIES) {
        return (None, false);
    }
    let pid = event.tgid;
    let maps: Vec<Mapping> = match maps::read(pid) {
        Ok(maps) => maps.into_iter().filter(|m| m.executable).collect(),
        Err(e) => return (None, crate::modules::shared::is_refusal(&e)),
    };
    let modules = ModuleCache::of_process(pid);
    modules.keep(&maps);
    // Who it is (at its first allocation or `exec`).
    let (target, ns_pid) = match event.op {
        host::NEW => (
            Tracee::attach(pid).ok(),
            crate::tracee::family::namespace_pid(pid),
        ),
        _ => (None, None),
    };
    (
        Some(ReadNow {
            maps,
            reading,
            modules,
            target,
            ns_pid,
        }),
        false,
    )
}
