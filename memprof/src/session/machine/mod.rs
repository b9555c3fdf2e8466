//! `memprof attach --all`: every process of the machine that allocates,
//! those running and those that start meanwhile, with one load of the
//! probes.
//!
//! A uprobe sits on a file: each distinct allocator file (each libc, each
//! libgc, each executable with its own allocator) is probed once, for
//! every process, from the moment memprof first sees a process map it. The
//! kernel keeps the state per process ([`memprof_common::host`]): a
//! process gets an index at its first allocation followed, and its live
//! blocks and sites carry it. Userspace hears of processes through a ring
//! of events (first allocation, library loads, `exec`, exit), reads their
//! mappings, gives each its module table for the unwinder (the CFI rows
//! of each file are written once, shared), and finalizes each process
//! that ends: its blocks and sites are taken out of the kernel's tables,
//! symbolized with the mappings kept, and become its part of the profile.
//!
//! | part | what it does |
//! |---|---|
//! | this module | the [`Driven`] host: events, finalizing, the end |
//! | `process` | one process: who it is, what it maps, its table |
//! | `files` | each file once: its allocator probes, its CFI rows |
//! | `deferred` | stacks the kernel stopped at a file it had no rows for, finished here |
//! | `notes` | what stderr says of the processes: a summary line per kind |
//! | `family` | the same for `run`: the processes its command starts |
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Result};
use memprof_common::{host, HostEvent};

use crate::driver::profiles::{self, Header};
use crate::driver::{Driven, Driver, Flow, Output, Profiling};
use crate::groups;
use crate::modules::maps::Mapping;
use crate::options::{Heap, SessionOptions};
use crate::probes::{monotonic_ns, Detaching, ModuleTables, Probes};
use crate::profile::{Counters, ExitInfo, GcSummary, Profile, TargetInfo};
use crate::symbolize::SymbolCache;
use select::Selection;

mod deferred;
mod events;
mod family;
mod files;
mod notes;
mod process;
mod row_space;
pub(crate) mod select;
mod served;

use deferred::Deferred;
use events::{Reader, Seen};
use files::Files;
use notes::{Kind, Notes};
use process::{HostProcess, Told};

pub use family::{Family, Loading};

/// The longest wait for an event (signals are looked at between waits).
const POLL: Duration = Duration::from_millis(10);
/// How often processes that ended are finalized.
const FINALIZE_EVERY: Duration = Duration::from_millis(250);
/// Processes that ended symbolized with one [`SymbolCache`]: what it
/// keeps of the files read is given back after that many.
const SYMBOLS_RENEWED_EVERY: u64 = 500;
/// Files parsed were let go (no process maps them): the symbolizer's
/// cache, which may still hold them (a build's rustc libraries, 100s of
/// MB), is renewed, at most this often.
const SYMBOLS_RENEWED_AFTER_LET_GO: Duration = Duration::from_secs(60);
/// How often /proc is read for allocator files no event named (a static
/// program started before its `exec` event was read): each time, the
/// maps of the processes new since the last reading and of one pid in
/// [`RESCAN_SLICES`] (a pid used again between two readings), so every
/// process's within 30 s. Every process's each time cost 3 % of a core
/// with 500 running, and held the driver (a scrape) for 70 ms.
const RESCAN: Duration = Duration::from_secs(2);
const RESCAN_SLICES: u32 = 15;
/// What is kept of ended processes is bounded (a session of days sees
/// millions): `attach --all` and `--comm/--exe` merge their profiles
/// into one every [`MERGE_EVERY`] (their stacks are then shared), and
/// keep the [`KEEP_ENDED`] that ended last, within [`KEEP_ENDED_BYTES`]
/// (their groups and stacks, as [`Profile::estimated_bytes`] counts
/// them); older ones are let go, the oldest first, and counted
/// (`processes_evicted`, `evicted_allocs`).
const MERGE_EVERY: usize = 256;
const KEEP_ENDED: usize = 1_000;
const KEEP_ENDED_BYTES: usize = 48 << 20;
/// Processes the OOM killer chose, remembered for their sessions' ends.
const OOM_KEPT: usize = 64;
/// Exits of processes left out, remembered for their sessions' ends
/// (under a selection, every process not selected exits through here).
const EXITS_KEPT: usize = 1024;

/// Profiles every process until Ctrl-C, SIGTERM or `--duration`; one
/// profile, one process each.
pub fn attach_all(driver: &Driver, options: &SessionOptions) -> Result<i32> {
    let mut output = Output::create(options.output.as_ref(), Path::new("host"), None)?;
    let mut host = Host::start(options, Scope::All, None)?;
    let mut sampled = match options.probes.sample_bytes {
        0 => String::new(),
        n => format!(", sampled (--sample-bytes {n}; 0: every allocation)"),
    };
    if options.heap == Heap::Libc {
        sampled.push_str(", libc and mmap (--heap all: Boehm GC objects too)");
    }
    eprintln!(
        "memprof: profiling every process (now and as they start){sampled}: {} allocator files probed; Ctrl-C to stop{}",
        host.files.probed(),
        options
            .duration
            .map(|d| format!(", or wait {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
    driver.drive(&mut host, options.duration)?;
    host.finish(&mut output, options.top)
}

/// `attach --all`'s state.
struct Host {
    probes: Probes,
    /// The links being closed since profiling stopped.
    closing: Option<Detaching>,
    events: Reader,
    /// Each process's module table (the reader gives a process its first).
    tables: Arc<Mutex<ModuleTables>>,
    /// By index: the processes with an index that have not been finalized.
    processes: HashMap<u32, HostProcess>,
    /// Processes whose files to examine once the events queued are read.
    to_examine: Vec<u32>,
    files: Files,
    /// Stacks the kernel could not finish, finished here.
    deferred: Deferred,
    /// What was read of the files to symbolize, shared by the processes.
    symbols: Symbols,
    /// Processes that ended symbolized so far.
    symbolized: u64,
    /// When the symbolizer's cache was last renewed because files were
    /// let go ([`SYMBOLS_RENEWED_AFTER_LET_GO`]).
    symbols_renewed: Instant,
    /// Indexes of processes that ended, to finalize.
    ended: Vec<u32>,
    /// The finalized processes' profiles.
    done: Vec<Profile>,
    /// Those merged so far (not under `run`: see [`KEEP_ENDED`]).
    merged: Option<Profile>,
    /// Ended processes let go, and their allocations.
    evicted: (u64, u64),
    /// When profiling started: monotonic, wall clock, and the kernel's
    /// clock (`bpf_ktime_get_ns`).
    started: (Instant, SystemTime, u64),
    /// Processes seen in all.
    seen: u64,
    /// The processes running when profiling started that have not
    /// `exec`ed since: profiled from then on, not from their start.
    initial: HashSet<u32>,
    last_finalize: Instant,
    last_scan: Instant,
    /// Readings of /proc so far ([`RESCAN`]), and the pids the last one saw.
    scans: u32,
    scanned: HashSet<u32>,
    /// Which processes are followed.
    scope: Scope,
    /// Allocations of processes memprof was short of a resource for
    /// ([`HostProcess::short_of_resources`]).
    short_of_resources: u64,
    /// Processes given to sessions of their own ([`Host::leave_out`]):
    /// an index the kernel gave one before it was left out, heard of
    /// after, is dropped.
    left_out: HashSet<u32>,
    /// What stderr says of the processes.
    notes: Notes,
    /// Library loads heard of (each `_dl_debug_state` of a process
    /// followed or not).
    loads: u64,
    /// The last processes the OOM killer chose ([`OOM_KEPT`]).
    oom_killed: std::collections::VecDeque<u32>,
    /// How the last processes left out exited ([`EXITS_KEPT`]): their
    /// sessions, untraced, do not know.
    exits: std::collections::VecDeque<(u32, ExitInfo)>,
}

/// Which processes a [`Host`] follows (the kernel decides, at each
/// process's first allocation or `exec`).
#[derive(Clone, Debug)]
pub enum Scope {
    /// `attach --all`: every process.
    All,
    /// `run`: those its command (this pid) starts, directly or not.
    Family(u32),
    /// `attach --comm/--exe`: those the selection names.
    Selected(Selection),
}

/// The symbolizer's cache, made at the first process symbolized.
struct Symbols(Option<SymbolCache>);

// SAFETY: blazesym's cache is not `Send`. A `Host` is moved to another
// thread only while `run`'s family is loaded there (`Family::load`),
// before any process is symbolized: the cache is still `None`, and it is
// made and used on the thread that drives the host.
unsafe impl Send for Symbols {}

impl Driven for Host {
    /// Signals are looked at between waits for events.
    fn timeout(&self) -> Duration {
        Duration::ZERO
    }

    fn step(&mut self) -> Result<Flow> {
        self.tick(POLL)?;
        Ok(Flow::Go)
    }
}

impl Profiling for Host {
    fn pids(&self) -> Vec<u32> {
        self.processes.values().map(|p| p.pid).collect()
    }

    /// Its blocks and sites read from the kernel's tables, left there.
    fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        let Some(index) = self
            .processes
            .values()
            .find(|p| p.pid == pid)
            .map(|p| p.index)
        else {
            bail!("pid {pid} is not profiled");
        };
        let tables = self.probes.read_processes(&HashSet::from([index]))?;
        let tables = tables.into_values().next().unwrap_or_default();
        // Out of the table while its profile is made, then back.
        let Some(mut p) = self.processes.remove(&index) else {
            bail!("pid {pid} is not profiled");
        };
        let profile = self.profile_of(&mut p, tables);
        self.processes.insert(index, p);
        profile
    }

    /// One reading of the kernel's tables for all of them (a reading
    /// walks every process's entries: once per process, 500 of them took
    /// 0.6 s).
    fn snapshots(&mut self, pids: &[u32]) -> Vec<Profile> {
        let indexes: Vec<u32> = pids
            .iter()
            .filter_map(|&pid| self.processes.values().find(|p| p.pid == pid))
            .map(|p| p.index)
            .collect();
        let Ok(mut tables) = self
            .probes
            .read_processes(&indexes.iter().copied().collect())
        else {
            return Vec::new();
        };
        let mut profiles = Vec::new();
        for index in indexes {
            let Some(mut p) = self.processes.remove(&index) else {
                continue;
            };
            let profile = self.profile_of(&mut p, tables.remove(&index).unwrap_or_default());
            self.processes.insert(index, p);
            profiles.extend(profile.ok());
        }
        profiles
    }
}

impl Host {
    /// The probes loaded for every process, the system's libraries and
    /// every process running probed; only those of `scope` are followed.
    /// `live` is set once the system's allocators are probed.
    fn start(
        options: &SessionOptions,
        scope: Scope,
        live: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Host> {
        let mut probe_options = options.probes.clone();
        probe_options.host = true;
        probe_options.gc_refill = false;
        if let Scope::Family(root) = scope {
            probe_options.family_root = root;
        }
        probe_options.selecting = matches!(scope, Scope::Selected(_));
        let mut probes = Probes::load(&probe_options, None)?;
        if let Scope::Selected(selection) = &scope {
            probes.select(&selection.kernel_comms()?, &selection.kernel_exes()?)?;
        }
        let files = Files::new(options, probes.row_table()?);
        let tables = Arc::new(Mutex::new(probes.module_tables()?));
        let events = Reader::start(
            probes.host_events()?,
            probes.deferred_stacks()?,
            Arc::clone(&files.rows),
            Arc::clone(&tables),
            options.resident,
        );
        let mut host = Host {
            probes,
            closing: None,
            events,
            tables,
            processes: HashMap::new(),
            to_examine: Vec::new(),
            files,
            deferred: Deferred::default(),
            symbols: Symbols(None),
            symbolized: 0,
            symbols_renewed: Instant::now(),
            ended: Vec::new(),
            done: Vec::new(),
            merged: None,
            evicted: (0, 0),
            started: (Instant::now(), SystemTime::now(), monotonic_ns()),
            seen: 0,
            initial: HashSet::new(),
            last_finalize: Instant::now(),
            last_scan: Instant::now(),
            scans: 0,
            scanned: HashSet::new(),
            scope,
            left_out: HashSet::new(),
            notes: Notes::new(options.verbose),
            loads: 0,
            short_of_resources: 0,
            oom_killed: Default::default(),
            exits: Default::default(),
        };
        host.files.probe_system_libraries(&mut host.probes);
        if let Some(live) = live {
            // A program held for the family can go now: its allocations
            // through the system's allocators are seen.
            live.store(true, std::sync::atomic::Ordering::Release);
        }
        host.initial = host.rescan();
        host.files.started = true;
        Ok(host)
    }

    /// One step: the events (waiting up to `wait` for the first), the
    /// processes that ended finalized now and then, /proc read again now
    /// and then.
    fn tick(&mut self, wait: Duration) -> Result<()> {
        self.read_events(wait);
        if self.last_finalize.elapsed() >= FINALIZE_EVERY {
            self.last_finalize = Instant::now();
            self.finalize_ended()?;
        }
        if self.last_scan.elapsed() >= RESCAN {
            self.last_scan = Instant::now();
            let _ = self.rescan();
            self.let_go_unused_rows();
        }
        self.take_file_notes();
        self.notes.tick();
        Ok(())
    }

    /// Recording stops; every process still followed is finalized (it
    /// runs on, untraced). Returns the kernel's counters (the losses of
    /// every process, and what no process could be given), with the
    /// stacks not finished here.
    fn stop(&mut self) -> Result<Counters> {
        self.probes.disable()?;
        // Detached before the tables are read: every process runs free at once.
        self.closing = Some(self.probes.close_links());
        self.events.stop();
        self.read_events(Duration::ZERO);
        let all: HashSet<u32> = self.processes.keys().copied().collect();
        self.finalize(&all)?;
        let mut counters = self.probes.peek()?.counters()?;
        counters.stacks_not_finished += self.deferred.dropped;
        counters.short_of_resources += self.short_of_resources;
        counters.tables_from_proc += self.tables_from_proc();
        (counters.processes_evicted, counters.evicted_allocs) = self.evicted;
        self.take_file_notes();
        self.notes.say();
        Ok(counters)
    }

    /// The rows of files no process followed maps any more let go
    /// (`files::Unwinding::let_go_unused`), and the files parsed.
    fn let_go_unused_rows(&mut self) {
        let in_use: HashSet<&files::FileId> = self
            .processes
            .values()
            .flat_map(|p| {
                let latest = p.latest.iter().flat_map(|(_, maps)| maps);
                p.maps.all().iter().chain(latest).chain(&p.unknown)
            })
            .map(|m| &m.file_id)
            .collect();
        let rows = Arc::clone(&self.files.rows);
        let mut rows = rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.let_go_unused(&in_use, Instant::now());
        // The parsed files go with their rows (or at once, without rows):
        // a machine runs ever new files, a build's every binary.
        let parsed = self.files.parsed();
        self.files
            .let_go_modules(|id| in_use.contains(id) || rows.has_rows(id));
        // Else a machine quiet after a build keeps what blazesym read of
        // the build's files until 500 more processes end.
        if self.files.parsed() < parsed
            && self.symbols_renewed.elapsed() >= SYMBOLS_RENEWED_AFTER_LET_GO
        {
            self.symbols_renewed = Instant::now();
            self.symbols = Symbols(None);
        }
    }

    /// The files' events (an allocator probed late), to the notes.
    fn take_file_notes(&mut self) {
        for line in std::mem::take(&mut self.files.probed_late) {
            self.notes.note(Kind::ProbedLate, line);
        }
    }

    /// Seconds since profiling started, of a kernel time.
    fn since(&self, time_ns: u64) -> f64 {
        time_ns.saturating_sub(self.started.2) as f64 / 1e9
    }

    /// The events read (waiting up to `wait` for the first), then the
    /// files they named.
    fn read_events(&mut self, wait: Duration) {
        if let Ok(seen) = self.events.seen.recv_timeout(wait) {
            self.on_event(seen);
        }
        while let Ok(seen) = self.events.seen.try_recv() {
            self.on_event(seen);
        }
        while let Ok(stack) = self.events.deferred.try_recv() {
            self.deferred.add(stack);
        }
        let mut pids = std::mem::take(&mut self.to_examine);
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            self.files.examine_pid(&mut self.probes, pid);
        }
    }

    fn on_event(
        &mut self,
        Seen {
            event: e,
            read,
            refused,
        }: Seen,
    ) {
        let index_known = e.index < host::SESSION;
        match e.op {
            host::NEW if self.left_out.contains(&e.tgid) => {
                if let Err(err) = self.drop_indexes(HashSet::from([e.index])) {
                    let line = format!("pid {}: its tables stay: {err:#}", e.tgid);
                    self.notes.note(Kind::TablesStay, line);
                }
            }
            host::NEW => {
                let start_s = self.since(e.time_ns);
                // Running before memprof: from then on (as `attach`).
                let start_s = if self.initial.contains(&e.tgid) {
                    0.0
                } else {
                    start_s
                };
                let told = Told {
                    comm: comm_of(&e.comm),
                    command: command_of(&e),
                    cut: e.args_len as usize > host::ARGS_BYTES,
                    exe: crate::text::lossy_path(&path_of_components(&e.path)),
                };
                let mut process = HostProcess::seen(e.tgid, e.index, e.ppid, start_s, read, told);
                process.forked = e.exit_code == host::FORKED;
                process.refused = refused;
                process.seq = self.seen;
                self.processes.insert(e.index, process);
                self.seen += 1;
                self.publish(e.index);
            }
            host::LIBRARIES => {
                self.loads += 1;
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.refused |= refused;
                    if let Some(read) = read {
                        p.take(read);
                    }
                    self.publish(e.index);
                } else {
                    self.to_examine.push(e.tgid);
                }
            }
            host::MAPPING => {
                let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) else {
                    return;
                };
                let m = e.mapping;
                // Told again at each of its library loads: taken once.
                let told = |k: &Mapping| {
                    (k.start, k.end, k.file_offset) == (m.start, m.end, m.pgoff << 12)
                        && k.file_id == files::file_id_of(&m.file)
                };
                if p.maps.all().iter().any(told) {
                    return;
                }
                let mut mapping = Mapping {
                    start: m.start,
                    end: m.end,
                    file_offset: m.pgoff << 12,
                    executable: true,
                    path: path_of_components(&e.path),
                    file_id: files::file_id_of(&m.file),
                };
                // A file not seen yet is opened by the path the kernel
                // gave (the process may be gone already).
                let refused = self.files.refused;
                let opened = self.files.open_named(&mapping);
                p.refused |= self.files.refused > refused;
                match opened {
                    Some(module) => {
                        mapping.path = module.path().to_path_buf();
                        p.mapped(mapping, module);
                    }
                    // Told again at each of its library loads: kept once.
                    None if p.unknown.contains(&mapping) => {}
                    None => p.unknown.push(mapping),
                }
            }
            host::PROGRAM => {
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.program(&text_of(&e.path));
                }
            }
            host::OOM => {
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.oom_killed = true;
                }
                // A process left out to a session: the session's end
                // asks ([`Host::oom_killed`]).
                self.oom_killed.push_back(e.tgid);
                if self.oom_killed.len() > OOM_KEPT {
                    self.oom_killed.pop_front();
                }
                let line = format!(
                    "pid {} ({}) was ended by the OOM killer",
                    e.tgid,
                    comm_of(&e.comm)
                );
                self.notes.note(Kind::OomKilled, line);
            }
            host::EXIT if matches!(e.index, host::UNSELECTED | host::SESSION) => {
                // Left out: a session's process, or one not selected.
                let exit = ExitInfo {
                    oom_killed: self.oom_killed.contains(&e.tgid),
                    ..wait_status(e.exit_code)
                };
                self.exits.push_back((e.tgid, exit));
                if self.exits.len() > EXITS_KEPT {
                    self.exits.pop_front();
                }
            }
            host::EXEC | host::EXIT => {
                let end_s = self.since(e.time_ns);
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.end_s = Some(end_s);
                    if e.op == host::EXIT {
                        p.exit = Some(ExitInfo {
                            oom_killed: p.oom_killed,
                            ..wait_status(e.exit_code)
                        });
                    } else {
                        p.execed = true;
                    }
                    self.ended.push(e.index);
                }
                if e.op == host::EXEC {
                    self.initial.remove(&e.tgid);
                }
            }
            _ => {}
        }
    }

    /// Processes whose first module table came from /proc, the kernel
    /// building none ([`ModuleTables::tables_from_proc`]).
    fn tables_from_proc(&self) -> u64 {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables.tables_from_proc()
    }

    /// Gives process `index` the module table of its mappings last read,
    /// once the rows of each of its files are written.
    fn publish(&mut self, index: u32) {
        let Some(p) = self.processes.get_mut(&index) else {
            return;
        };
        let Some((reading, now)) = p.take_latest() else {
            return; // nothing new read (gone already)
        };
        // Its files examined already (the usual case): /proc not read again.
        if !self.files.examined_all(&now) {
            self.to_examine.push(p.pid);
        }
        files::add_rows(&self.files.rows, &now, &p.modules, None, &mut || {});
        let ranges = files::ranges(&self.files.rows, &now);
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = tables.publish(p.index, reading, &ranges) {
            let line = format!("pid {}: no unwind table: {e:#}", p.pid);
            drop(tables);
            self.notes.note(Kind::NoTable, line);
        }
    }

    /// Reads /proc for processes whose files memprof has not examined
    /// (all at first, then those new since the last reading and a slice
    /// of the others, [`RESCAN`]); returns the processes.
    fn rescan(&mut self) -> HashSet<u32> {
        self.scanned = self.scan();
        self.scans += 1;
        match self.scope {
            Scope::Family(_) => HashSet::new(),
            _ => self.scanned.clone(),
        }
    }

    /// [`Self::rescan`]: reads the maps of the processes chosen (see
    /// [`Self::read_now`]); returns the processes chosen.
    fn scan(&mut self) -> HashSet<u32> {
        let chosen = match &self.scope {
            Scope::All => None,
            // The command's files.
            Scope::Family(root) => Some(vec![*root]),
            // Those of the processes selected that ran before memprof.
            Scope::Selected(selection) => Some(selection.matching()),
        };
        if let Some(mut pids) = chosen {
            // And those of the processes followed that have not ended
            // (the pid of one that has may be another process's already).
            pids.extend(
                self.processes
                    .values()
                    .filter(|p| p.end_s.is_none())
                    .map(|p| p.pid),
            );
            pids.sort_unstable();
            pids.dedup();
            let due: Vec<u32> = pids.iter().copied().filter(|&p| self.read_now(p)).collect();
            for pid in due {
                self.files.examine_pid(&mut self.probes, pid);
            }
            return pids.into_iter().collect();
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return HashSet::new();
        };
        let me = std::process::id();
        let pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .collect();
        let due: Vec<u32> = pids.iter().copied().filter(|&p| self.read_now(p)).collect();
        for pid in due {
            self.files.examine_pid(&mut self.probes, pid);
        }
        pids.into_iter().collect()
    }

    /// Whether this reading of /proc reads `pid`'s maps: at the first,
    /// when new since the last, and in its turn.
    fn read_now(&self, pid: u32) -> bool {
        self.scans == 0
            || !self.scanned.contains(&pid)
            || pid % RESCAN_SLICES == self.scans % RESCAN_SLICES
    }

    /// Finalizes the processes that ended: their tables out of the
    /// kernel's, their profiles made.
    fn finalize_ended(&mut self) -> Result<()> {
        if self.ended.is_empty() {
            return Ok(());
        }
        // Events of the last moment first (a `free` racing the exit is
        // already in the tables: the probes ran before the exit).
        self.read_events(Duration::ZERO);
        let indexes: HashSet<u32> = std::mem::take(&mut self.ended).into_iter().collect();
        self.finalize(&indexes)
    }

    /// Process `pid` is followed elsewhere from now on (a session of its
    /// own): not here any more, and what was recorded of it here is
    /// dropped (its session's profile says from when it is profiled).
    fn leave_out(&mut self, pid: u32) -> Result<()> {
        self.probes.leave_out(pid, host::SESSION)?;
        self.left_out.insert(pid);
        let indexes: HashSet<u32> = self
            .processes
            .values()
            .filter(|p| p.pid == pid)
            .map(|p| p.index)
            .collect();
        self.drop_indexes(indexes)
    }

    /// Processes `indexes` are not profiled here: their tables are taken
    /// out of the kernel's and dropped.
    fn drop_indexes(&mut self, indexes: HashSet<u32>) -> Result<()> {
        self.probes.take_ended(&indexes)?;
        self.probes.free_indexes(&indexes)?;
        for index in indexes {
            self.processes.remove(&index);
            self.tables
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(index);
            self.deferred.forget(index);
        }
        Ok(())
    }

    fn finalize(&mut self, indexes: &HashSet<u32>) -> Result<()> {
        let mut taken = self.probes.take_ended(indexes)?;
        // Children before their parents: a forked child gone before it
        // was read is symbolized with its parent's mappings.
        let parents: HashSet<u32> = indexes
            .iter()
            .filter_map(|i| self.processes.get(i))
            .map(|p| p.ppid)
            .collect();
        let mut order: Vec<u32> = indexes.iter().copied().collect();
        order.sort_by_key(|i| {
            self.processes
                .get(i)
                .is_some_and(|p| parents.contains(&p.pid))
        });
        for index in &order {
            let Some(mut p) = self.processes.remove(index) else {
                continue;
            };
            self.tables
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(p.index);
            let tables = taken.remove(index).unwrap_or_default();
            // Given an index at its `exec`, it never allocated (or no
            // allocation was sampled): not a process of the profile.
            if tables.sites.is_empty() {
                self.deferred.forget(p.index);
                continue;
            }
            let orphan = !self
                .processes
                .values()
                .any(|q| q.pid == p.ppid && !q.unread);
            if p.unread && orphan {
                let line = format!(
                    "pid {} ({}) ended before memprof could read its mappings: its frames are addresses",
                    p.pid,
                    p.name()
                );
                self.notes.note(Kind::Unread, line);
            }
            // What blazesym read of the files serves the next processes,
            // renewed now and then (it keeps every file it read). Counted
            // at the ends, not the snapshots: a scrape of 500 processes
            // would renew it, and read every file again, at each scrape.
            self.symbolized += 1;
            if self.symbolized.is_multiple_of(SYMBOLS_RENEWED_EVERY) {
                self.symbols = Symbols(None);
            }
            match self.profile_of(&mut p, tables) {
                Ok(profile) => {
                    self.short_of_resources += profile.counters.short_of_resources;
                    self.done.push(profile)
                }
                Err(e) => {
                    let line = format!(
                        "pid {} ({}): its profile could not be made: {e:#}",
                        p.pid,
                        p.name()
                    );
                    self.notes.note(Kind::NoProfile, line);
                }
            }
            self.deferred.forget(p.index);
        }
        if self.done.len() >= MERGE_EVERY {
            self.merge_done();
        }
        // Given again to processes that start: the kernel's tables hold
        // nothing of them any more.
        self.probes.free_indexes(indexes)
    }

    /// The profiles of the processes finalized merged into one; beyond
    /// [`KEEP_ENDED`] ended processes or [`KEEP_ENDED_BYTES`], the oldest
    /// let go. Not under `run` (its family's profiles go to the command's).
    fn merge_done(&mut self) {
        if matches!(self.scope, Scope::Family(_)) {
            return;
        }
        let done = std::mem::take(&mut self.done);
        let Some(mut merged) = profiles::merge(self.merged.take(), done) else {
            return;
        };
        let ends = |merged: &Profile| {
            let mut ends: Vec<f64> = merged.processes.iter().filter_map(|p| p.end_s).collect();
            ends.sort_by(f64::total_cmp);
            ends
        };
        let by_count = ends(&merged);
        if by_count.len() > KEEP_ENDED {
            self.evict_ended(&mut merged, by_count[by_count.len() - KEEP_ENDED - 1]);
        }
        // By bytes: the oldest whose groups are the excess's share of all
        // (stacks go with their groups), a few times over since stacks
        // are shared; the one that ended last is kept.
        for _ in 0..4 {
            let bytes = merged.estimated_bytes();
            let ends = ends(&merged);
            if bytes <= KEEP_ENDED_BYTES || ends.len() < 2 {
                break;
            }
            let excess = (bytes - KEEP_ENDED_BYTES) as f64 / bytes as f64;
            let wanted = (excess * merged.groups.len() as f64).ceil() as usize;
            let mut groups: HashMap<(u32, u32), usize> = HashMap::new();
            for g in &merged.groups {
                *groups.entry((g.pid, g.pid_reuse)).or_default() += 1;
            }
            let mut ended: Vec<(f64, usize)> = merged
                .processes
                .iter()
                .filter_map(|p| Some((p.end_s?, groups.get(&(p.pid, p.pid_reuse)).copied()?)))
                .collect();
            ended.sort_by(|a, b| a.0.total_cmp(&b.0));
            ended.pop();
            let mut taken = 0;
            let mut last = None;
            for (end, n) in ended {
                taken += n;
                last = Some(end);
                if taken >= wanted {
                    break;
                }
            }
            match last {
                Some(last) => self.evict_ended(&mut merged, last),
                None => break,
            }
        }
        self.merged = Some(merged);
    }

    /// Lets go of the processes of `merged` that ended at `last_evicted`
    /// or before, counted.
    fn evict_ended(&mut self, merged: &mut Profile, last_evicted: f64) {
        let evict = |p: &crate::profile::ProcessInfo| p.end_s.is_some_and(|e| e <= last_evicted);
        let gone: HashSet<(u32, u32)> = merged
            .processes
            .iter()
            .filter(|&p| evict(p))
            .map(|p| (p.pid, p.pid_reuse))
            .collect();
        self.evicted.0 += gone.len() as u64;
        self.evicted.1 += merged
            .processes
            .iter()
            .filter(|&p| evict(p))
            .filter_map(|p| p.counters.as_ref())
            .map(|c| c.allocs)
            .sum::<u64>();
        merged.processes.retain(|p| !evict(p));
        merged
            .groups
            .retain(|g| !gone.contains(&(g.pid, g.pid_reuse)));
        merged.compact_stacks();
    }

    /// The profile of process `p`, from its tables.
    fn profile_of(
        &mut self,
        p: &mut HostProcess,
        tables: crate::probes::Prefetched,
    ) -> Result<Profile> {
        let recorded: u64 = tables.sites.iter().map(|(_, t)| t.count).sum();
        // Its blocks freed (those found dead by address reuse were not).
        let freed: u64 = tables
            .sites
            .iter()
            .map(|(_, t)| t.died.saturating_sub(t.reused))
            .sum();
        // Files it mapped that another process's reading opened since.
        for m in std::mem::take(&mut p.unknown) {
            match self.files.module_by_id(&m.file_id) {
                Some(module) => {
                    let mapping = Mapping {
                        path: module.path().to_path_buf(),
                        ..m
                    };
                    p.mapped(mapping, module);
                }
                None => p.unknown.push(m),
            }
        }
        // A forked child gone (or `exec`ed) before it was read maps what
        // its parent maps (the kernel unwound it with its parent's table):
        // the parent's image it was forked from, the latest before it
        // (a parent that `exec`ed has an older image, at other addresses,
        // under an older index).
        let parent = self
            .processes
            .values()
            .filter(|q| p.forked && (p.unread || p.execed) && q.pid == p.ppid && !q.unread)
            .filter(|q| q.seq < p.seq)
            .max_by_key(|q| q.seq);
        let (maps, modules) = match parent {
            Some(q) => {
                // And runs its parent's program (its command line is
                // its own, if it was read).
                if p.exe.is_empty() {
                    p.exe = q.exe.clone();
                }
                (&q.maps, &q.modules)
            }
            None => (&p.maps, &p.modules),
        };
        self.deferred.finish_process(p.index, maps, modules);
        let view = self
            .probes
            .peek()?
            .of_process(tables)
            .with_finished(self.deferred.finished(p.index));
        let raw = groups::collect(&view, None)?;
        let (groups, stacks) = profiles::groups_of_with(
            p.pid,
            raw,
            (maps, modules),
            false,
            self.symbols.0.get_or_insert_with(SymbolCache::default),
        );
        let short = p.short_of_resources();
        let counters = Counters {
            allocs: recorded,
            frees: freed,
            short_of_resources: if short { recorded } else { 0 },
            ..Counters::default()
        };
        let mut info = p.info();
        info.counters = Some(counters.clone());
        Ok(Profile {
            duration_s: self.started.0.elapsed().as_secs_f64(),
            exit: p.exit,
            counters,
            groups,
            stacks,
            processes: vec![info],
            ..profiles::header(Header {
                // `run`'s family: each from its start (or its fork).
                mode: match self.scope {
                    Scope::Family(_) => "run",
                    _ => "attach",
                },
                target: TargetInfo {
                    pid: p.pid,
                    command: p.command.clone(),
                    exe: p.exe.clone(),
                },
                started: self.started.1,
                unwind: "dwarf".to_string(),
                sample_bytes: self.probes.sample_bytes(),
            })
        })
    }

    /// The end: recording stops, every process still running is
    /// finalized (it runs on, untraced), the profile written.
    fn finish(mut self, output: &mut Output, top: usize) -> Result<i32> {
        let running = self.processes.len();
        let mut host_counters = self.stop()?;
        let duration_s = self.started.0.elapsed().as_secs_f64();
        self.merge_done();
        // Those let go by this last merge counted too.
        (
            host_counters.processes_evicted,
            host_counters.evicted_allocs,
        ) = self.evicted;
        let closing = self.closing.take();
        let detaching = self.probes.detach();
        let done = std::mem::take(&mut self.done);
        let merged = self.merged.take();
        let profiled = merged
            .iter()
            .chain(&done)
            .map(|p| p.processes.len())
            .sum::<usize>()
            + self.evicted.0 as usize;
        eprintln!(
            "memprof: {profiled} processes profiled ({running} still running, let go untraced); {} programs started or seen, those with no allocation followed are not listed",
            self.seen
        );
        let loads_merged = self
            .events
            .loads_merged
            .load(std::sync::atomic::Ordering::Relaxed);
        if self.loads + loads_merged > 0 {
            eprintln!(
                "memprof: {} library loads and unloads, {loads_merged} of them read together with a later one of their process (one reading per process per 0.1 s at most)",
                self.loads + loads_merged
            );
        }
        {
            let rows = self.files.rows.lock().unwrap_or_else(|e| e.into_inner());
            for (why, files) in &rows.refusals {
                eprintln!("memprof: {files} files got no unwind rows: {why}");
            }
            if rows.let_go > 0 {
                eprintln!(
                    "memprof: the unwind rows of {} files were let go, no process mapping them any more",
                    rows.let_go
                );
            }
        }
        let Some(mut profile) = profiles::merge(merged, done) else {
            if let Some(closing) = closing {
                closing.wait();
            }
            detaching.wait();
            bail!(
                "no process allocated while memprof watched ({duration_s:.1} s): nothing to write"
            );
        };
        // Each from its start, or (running before memprof) from start_s 0.
        for p in &mut profile.processes {
            p.profiled_from_s = None;
        }
        // The machine's: every process's, and what no process could be
        // given (processes not followed, frees of blocks never seen).
        profile.counters = host_counters;
        // Boehm GC objects (`--heap all`) are live until their address is
        // allocated again: nothing is traced, no collection held.
        let gc = |g: &crate::profile::Group| g.kind == "gc" || g.kind == "gc_atomic";
        profile.gc = profile.groups.iter().any(gc).then(|| GcSummary {
            liveness: "address reuse only: attach --all traces no process and reads no mark bits (attach --pid or --comm does)".to_string(),
            ..GcSummary::default()
        });
        profile.duration_s = duration_s;
        profile.exit = None;
        profile.target = TargetInfo {
            pid: 0,
            command: vec!["--all".to_string()],
            exe: String::new(),
        };
        let result = output.write_and_print(&profile, top);
        if let Some(closing) = closing {
            closing.wait();
        }
        detaching.wait();
        result.map(|()| 0)
    }
}

/// The kernel's 16-byte name, as text.
fn comm_of(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    crate::text::lossy(&comm[..end])
}

/// The path of a `MAPPING` event: its components innermost first, each
/// NUL-terminated, an empty one last (empty: none given).
fn path_of_components(path: &[u8]) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let components: Vec<&[u8]> = path
        .split(|&b| b == 0)
        .take_while(|c| !c.is_empty())
        .collect();
    let mut out = std::path::PathBuf::from("/");
    for c in components.iter().rev() {
        out.push(std::ffi::OsStr::from_bytes(c));
    }
    if components.is_empty() {
        std::path::PathBuf::new()
    } else {
        out
    }
}

/// A [`host::NEW`] event's command line, its
/// arguments as the kernel read them then (the last one cut short ends
/// in `…`); empty when it could not be read.
fn command_of(e: &HostEvent) -> Vec<String> {
    let n = (e.args_len as usize).min(host::ARGS_BYTES);
    let mut args: Vec<String> = e.args[..n]
        .split(|&b| b == 0)
        .map(crate::text::lossy)
        .collect();
    // The area ends with its last argument's NUL.
    if args.last().is_some_and(String::is_empty) {
        args.pop();
    }
    if e.args_len as usize > host::ARGS_BYTES {
        if let Some(last) = args.last_mut() {
            last.push('…');
        }
    }
    args
}

/// A NUL-terminated path an event carries, as text.
fn text_of(path: &[u8]) -> String {
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    crate::text::lossy(&path[..end])
}

/// A wait status (`task_struct.exit_code`) as the profile says it.
fn wait_status(status: u32) -> ExitInfo {
    let signal = (status & 0x7f) as i32;
    if signal == 0 {
        ExitInfo {
            code: Some(((status >> 8) & 0xff) as i32),
            signal: None,
            oom_killed: false,
        }
    } else {
        ExitInfo {
            code: None,
            signal: Some(signal),
            oom_killed: false,
        }
    }
}
