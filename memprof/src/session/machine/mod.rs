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
use crate::symbolize::{NameLosses, SymbolCache};
use select::Selection;

mod deferred;
mod ended;
mod events;
mod family;
mod file_ids;
mod files;
mod host_events;
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
    /// Names left mangled and frames left unnamed in the profiles of the
    /// processes that ended (those let go since included).
    name_losses: NameLosses,
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
    /// How long a process's names may take: the loop's budget while it
    /// serves, the whole profile's once recording stopped (a Ctrl-C or
    /// the agent's stop still cuts it).
    naming: crate::symbolize::Budget,
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
            name_losses: NameLosses::default(),
            oom_killed: Default::default(),
            exits: Default::default(),
            // The agent serves while it names; `attach` does not.
            naming: match options.resident {
                true => crate::symbolize::Budget::BACKGROUND,
                false => crate::symbolize::Budget::ALONE,
            },
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
        // The profile a user waits for: named whole (under QEMU, the
        // loop's budget cut the first process named).
        self.naming = crate::symbolize::Budget::WHOLE;
        self.finalize(&all)?;
        let mut counters = self.probes.peek()?.counters()?;
        counters.stacks_not_finished += self.deferred.dropped;
        counters.short_of_resources += self.short_of_resources;
        counters.add_name_losses(self.name_losses.left_mangled, self.name_losses.unnamed);
        counters.tables_from_proc += self.tables_from_proc();
        (counters.processes_evicted, counters.evicted_allocs) = self.evicted;
        self.take_file_notes();
        self.notes.say();
        Ok(counters)
    }

    /// The blocks process `pid`'s own allocator probes recorded, still
    /// live now that those came off, let go (their frees would not be
    /// seen) and counted in its profile.
    pub fn let_go_calls(&mut self, pid: u32) -> Result<()> {
        let Some(p) = self.processes.values_mut().find(|p| p.pid == pid) else {
            return Ok(());
        };
        // Sampled, each stands for the blocks its size weighs, as the
        // live figures count them (by size, rounded once, as a group's).
        let mean = self.probes.sample_bytes();
        let mut by_size: std::collections::BTreeMap<u64, u64> = Default::default();
        for size in self.probes.take_calls_live(p.index)? {
            *by_size.entry(size).or_default() += 1;
        }
        for (size, n) in by_size {
            let (blocks, bytes) = crate::sampling::scale(n, n * size, mean);
            p.calls_let_go.0 += blocks;
            p.calls_let_go.1 += bytes;
        }
        Ok(())
    }

    /// The rows of files no process followed maps any more let go
    /// (`files::Unwinding::let_go_unused`), and the files parsed.
    fn let_go_unused_rows(&mut self) {
        let in_use: HashSet<&file_ids::FileId> = self
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
        // The parsed files go at once (their rows stay, for the next
        // process that maps them, until their room is wanted): a machine
        // runs ever new files, a build's every binary.
        let parsed = self.files.parsed();
        self.files.let_go_modules(|id| in_use.contains(id));
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
