//! The ring of process events, read on a thread of its own: a process's
//! mappings are read (and its files opened) the moment the kernel says
//! it started, `exec`ed or loaded libraries, before the slow work (unwind
//! rows, probe plans) that the main loop does with them. A process that
//! lives a few milliseconds is gone by the time that work is done.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memprof_common::{host, DeferredStack, HostEvent};

use super::files::{self, RowIndex};
use crate::modules::ModuleCache;
use crate::probes::{DeferredStacks, HostEvents, ModuleTables};
use crate::target::maps::{self, Mapping};
use crate::target::Target;

/// The longest wait for an event. The kernel's wakeup of a ring's reader
/// goes through `irq_work`, which this kernel runs at its next tick (up to
/// 4 ms at HZ=250: measured 2.5–4.2 ms late): a process that lives a few
/// milliseconds would be gone. Looking every millisecond costs ~1,000
/// wakeups a second (~0.5 % of a core).
const POLL: Duration = Duration::from_millis(1);

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
    pub target: Option<Target>,
    pub ns_pid: Option<u32>,
}

/// The reading thread.
pub struct Reader {
    pub seen: Receiver<Seen>,
    /// Stacks the kernel could not finish, as they come.
    pub deferred: Receiver<Box<DeferredStack>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// Reads `ring`; a process seen (or relinked) gets its module table
    /// in `tables` at once, with the files of `rows`.
    pub fn start(
        mut ring: HostEvents,
        mut stacks: DeferredStacks,
        rows: RowIndex,
        tables: Arc<Mutex<ModuleTables>>,
    ) -> Reader {
        let (send, seen) = mpsc::channel();
        let (send_stacks, deferred) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
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
            );
        });
        Reader {
            seen,
            deferred,
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
fn read_ring(
    ring: &mut HostEvents,
    send: &mpsc::Sender<Seen>,
    stopping: &AtomicBool,
    rows: &RowIndex,
    tables: &Mutex<ModuleTables>,
    drain_stacks: &mut dyn FnMut(),
) {
    let mut queue = Queue::default();
    loop {
        // Set before the last read: events queued by then are read.
        let last = stopping.load(Ordering::Acquire);
        queue.drain(ring);
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
        ring.wait(POLL);
    }
}

/// The events read, each with what its process showed then.
#[derive(Default)]
struct Queue {
    items: std::collections::VecDeque<(HostEvent, Option<ReadNow>, bool)>,
    readings: u64,
}

impl Queue {
    /// Reads every event queued in the ring, and each one's process.
    fn drain(&mut self, ring: &mut HostEvents) {
        while let Some(event) = ring.take_next() {
            self.readings += 1;
            let (read, refused) = read_now(&event, self.readings);
            self.items.push_back((event, read, refused));
        }
    }
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
    if event.index == host::IGNORED || !matches!(event.op, host::NEW | host::LIBRARIES) {
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
            Target::attach(pid).ok(),
            crate::target::family::namespace_pid(pid),
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
