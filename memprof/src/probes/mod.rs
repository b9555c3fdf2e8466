//! memprof's eBPF programs in the kernel: loading them, and everything
//! userspace does with them afterwards, one part per concern.
//!
//! The object is built by `build.rs` and embedded in the binary. The kernel
//! side and this one agree through `memprof-common` (map and program names,
//! record layouts, counters, the module-table packing); the parts:
//!
//! | part | what it does |
//! |---|---|
//! | this module | loads the object with the map sizes and load-time settings of [`ProbeOptions`], flips the switches the kernel reads while running, stops recording |
//! | `kernel` | what the running kernel offers (multi-uprobes, uprobe sessions, the task-VMA iterator), found once; every fallback is chosen from it |
//! | `attach` | attaches programs to functions of the target, scoped to its pid |
//! | `multi`, `classic` | loads the uprobe programs; links them with multi-uprobe links, or one perf event per probe where the kernel lacks those |
//! | `verifier` | why the verifier refused a program, in one short block |
//! | `unwind_tables` | writes the CFI rows and the module ranges the kernel unwinder searches |
//! | `gc_hold` | the protocols with a traced target: holding a collector for the mark-bit pass, stopping the main thread after `dlopen` |
//! | `view` | a read-only view of the kernel's tables, in userspace types ([`Site`], [`LiveBlock`]) |
//!
//! Dropping [`Probes`] (or memprof exiting, however it exits) closes the
//! links: the kernel then removes the breakpoints.
use anyhow::{anyhow, Result};
use aya::maps::{Array, Map, MapData};
use aya::{Ebpf, EbpfLoader};
use memprof_common::{globals, maps};

use crate::unwind::Tables;

mod attach;
mod batch;
pub mod btf;
mod classic;
mod gc_hold;
mod host;
mod kernel;
mod multi;
pub(crate) mod placement;
mod rss;
mod spare;
#[cfg(test)]
mod stack_budget;
mod syscall;
mod unwind_tables;
mod verifier;
mod view;

pub use attach::ProcessProbes;
pub use gc_hold::{GcChange, GcEvents};
pub use host::{monotonic_ns, DeferredStacks, HostEvents, ModuleTables, Prefetched, RowTable};
pub use kernel::kernel;
pub use view::{HeapMaps, LiveBlock, RecordedStack, Site};

use unwind_tables::ModuleTable;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memprof-probes"));

/// Map sizes and probe modes.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Capacity of the live-block table.
    pub max_live: u32,
    /// Capacity of the stack table.
    pub max_stacks: u32,
    /// Capacity of the per-site totals table.
    pub max_sites: u32,
    /// Attach programs that do nothing (benchmark of the bare probe cost).
    pub empty: bool,
    /// Bytes of the GC event ring buffer (a power of two, at least a page;
    /// only used when GC objects are judged by mark bits).
    pub gc_events_bytes: u32,
    /// Keep every frame of recursive calls (DWARF unwinding folds them by default).
    pub keep_recursion: bool,
    /// Sampling: mean bytes between sample points (`--sample-bytes`); 0
    /// follows every allocation.
    pub sample_bytes: u64,
    /// GC allocations are sampled at refills (`--gc-sampling refill`):
    /// `sample_bytes` samples the other allocators only.
    pub gc_refill: bool,
    /// With `gc_refill`: one refill in this many is followed, standing
    /// for as many lists (`--gc-refill-every`; 0 and 1: every one).
    pub gc_refill_every: u32,
    /// `attach --all`: the probes sit on files for every process, with
    /// state per process ([`memprof_common::host`]).
    pub host: bool,
    /// With `host`: only the processes this one (`run`'s command) started,
    /// directly or not; 0: every process.
    pub family_root: u32,
    /// With `host`: only the processes `attach --comm/--exe` selects
    /// ([`Probes::select`]).
    pub selecting: bool,
    /// GC objects are kept in memprof's copy only (their mark bits are
    /// read): the kernel streams them to the GC event ring, not to its
    /// live table ([`globals::GC_COPY`]).
    pub gc_copy: bool,
    /// With `gc_copy`, the kernel judges the copy's objects by the mark
    /// bits itself ([`globals::GC_VERDICTS`]).
    pub gc_verdicts: bool,
    /// With `host`: pages at their first write, sampled, and the
    /// syscalls that give them back (`--rss`).
    pub rss: bool,
}

impl ProbeOptions {
    /// Tables of one entry: for probes that record nothing (`run`'s wait
    /// for the command's libraries).
    pub fn smallest() -> ProbeOptions {
        ProbeOptions {
            max_live: 1,
            max_stacks: 1,
            max_sites: 1,
            empty: false,
            gc_events_bytes: 0,
            keep_recursion: false,
            sample_bytes: 0,
            gc_refill: false,
            gc_refill_every: 1,
            host: false,
            family_root: 0,
            selecting: false,
            gc_copy: false,
            gc_verdicts: false,
            rss: false,
        }
    }
}

/// The loaded programs, with their links while attached.
pub struct Probes {
    ebpf: Ebpf,
    empty: bool,
    /// The programs, loaded on first use.
    programs: multi::Programs,
    /// Every link. A multi-uprobe link holds many probes.
    links: Vec<Link>,
    /// How many probes (entry + return) are attached.
    pub attached: usize,
    /// GC objects allocated and freed (see [`memprof_common::GcEvent`]),
    /// until its reader takes it.
    gc_events: Option<GcEvents>,
    /// The module ranges the kernel unwinder has.
    modules: ModuleTable,
    /// Sampling's mean distance (`--sample-bytes`), 0 without.
    sample_bytes: u64,
    /// GC allocations sampled at refills ([`ProbeOptions::gc_refill`]).
    gc_refill: bool,
    /// Stacks are unwound with the CFI tables (`DWARF_STACKS`), not frame pointers.
    dwarf: bool,
    /// Some allocator's results are read at its entry ([`crate::predict`]):
    /// every allocating function gets a uprobe session. Cleared by
    /// `attach` where there are none.
    pub predict: bool,
    /// `attach --all`: the capacity of the CFI row table.
    host_rows: u32,
    /// Loaded with GC objects in memprof's copy only, and judged by the
    /// kernel ([`ProbeOptions::gc_copy`], [`ProbeOptions::gc_verdicts`]).
    gc_copy: bool,
    gc_verdicts: bool,
    /// The settings and unwind-row room it was loaded with (a spare's).
    loaded_as: (ProbeOptions, Option<usize>),
}

impl Probes {
    /// Loads (verifies) the programs `names` now, not at their first
    /// attach; one the kernel refuses is left for that attach to report.
    fn prepare(&mut self, names: &[&str]) {
        for name in names {
            let _ = self.programs.get(name);
        }
    }

    /// A followed session's probes, just loaded: a spare like them is
    /// loaded in the background for the next session with their settings
    /// ([`spare`]).
    pub fn prepare_spare(&self) {
        let (options, rows) = self.loaded_as.clone();
        let key = spare::LoadKey::of_sized(&options, rows);
        spare::prepare_like(key, options);
    }

    /// Sampling's mean distance (`--sample-bytes`, or its stand-in for
    /// refill sampling), 0 without.
    pub fn sample_bytes(&self) -> u64 {
        self.sample_bytes
    }

    /// Loads the eBPF object into the kernel (no probe attached yet).
    /// With `unwind_tables`, stacks are unwound in the kernel with those CFI
    /// rows; without, by frame pointers.
    pub fn load(options: &ProbeOptions, unwind_tables: Option<&Tables>) -> Result<Probes> {
        let key = spare::LoadKey::of(options, unwind_tables);
        let mut probes = match spare::take(&key) {
            Some(probes) => probes,
            None => Probes::load_sized(options, unwind_tables.map(|t| t.rows.len()))?,
        };
        if let Some(tables) = unwind_tables {
            probes.write_unwind_rows(tables)?;
        }
        Ok(probes)
    }

    /// [`Self::load`] with room for `rows` unwind rows (`None`: frame
    /// pointers), the rows not written yet.
    fn load_sized(options: &ProbeOptions, unwind_rows: Option<usize>) -> Result<Probes> {
        let rows = unwind_rows.map_or(1, |n| n.max(1)) as u32;
        // Only the stack table of the chosen unwinder gets its full size
        // (the frame-pointer one is preallocated: ~1 KiB an entry).
        let (fp_stacks, dwarf_stacks) = match unwind_rows {
            Some(_) => (1, options.max_stacks),
            None => (options.max_stacks, 1),
        };
        let fold_recursion = u32::from(!options.keep_recursion);
        let sampling = u32::from(options.sample_bytes > 0);
        // The kernel's one setting: 0 off, else one refill in K followed.
        let gc_refill = match options.gc_refill {
            true => options.gc_refill_every.max(1),
            false => 0,
        };
        let dwarf = u32::from(unwind_rows.is_some() || options.host);
        let host = host::Sizes::new(options.host)?;
        let gc_verdicts = options.gc_copy && options.gc_verdicts;
        let rows = if options.host { host.rows } else { rows };
        let (fp_stacks, dwarf_stacks) = if options.host {
            (1, options.max_stacks)
        } else {
            (fp_stacks, dwarf_stacks)
        };
        let mut ebpf = EbpfLoader::new()
            .override_global(globals::FOLD_RECURSION, &fold_recursion, true)
            .override_global(globals::SAMPLING, &sampling, true)
            .override_global(globals::GC_REFILL, &gc_refill, true)
            .override_global(globals::UNWIND_DWARF, &dwarf, true)
            .override_global(globals::HOST, &u32::from(options.host), true)
            .override_global(globals::GC_COPY, &u32::from(options.gc_copy), true)
            .override_global(globals::GC_VERDICTS, &u32::from(gc_verdicts), true)
            .override_global(globals::TASK_REAL_PARENT, &host.real_parent, true)
            .override_global(globals::TASK_TGID, &host.tgid, true)
            .override_global(globals::TASK_EXIT_CODE, &host.exit_code, true)
            .override_global(globals::TASK_START_TIME, &host.start_time, true)
            .override_global(globals::HOST_STARTED_NS, &host.started_ns, true)
            .override_global(globals::FAMILY_ROOT, &options.family_root, true)
            .override_global(globals::SELECTING, &u32::from(options.selecting), true)
            .override_global(globals::KERNEL_LAYOUT, &host.layout, true)
            .map_max_entries(maps::KNOWN_FILES, host.known_files)
            .map_max_entries(maps::FREE_SEGMENTS, host.free_segments)
            .map_max_entries(maps::FREE_INDEXES, host.indexes)
            .map_max_entries(maps::PROCESSES, host.processes)
            .map_max_entries(maps::PROCESS_MODULES, host.indexes)
            .map_max_entries(maps::RSS_SAMPLED, host.indexes)
            .map_max_entries(maps::HOST_EVENTS, host.events_bytes)
            .map_max_entries(maps::DEFERRED_STACKS, host.deferred_bytes)
            .map_max_entries(maps::DEFERRED_SENT, host.deferred_keys)
            .map_max_entries(maps::MODULE_RANGES, host.module_slots)
            .map_max_entries(maps::LIVE, options.max_live)
            .map_max_entries(maps::STACKS, fp_stacks)
            .map_max_entries(maps::DWARF_STACKS, dwarf_stacks)
            .map_max_entries(maps::SHORT_STACKS, dwarf_stacks)
            .map_max_entries(maps::SITE_TOTALS, options.max_sites)
            .map_max_entries(maps::UNWIND_ROWS, rows)
            .map_max_entries(maps::GC_EVENTS, options.gc_events_bytes.max(4096))
            .load(OBJECT)
            .map_err(|e| permission_hint(e.into(), "loading the eBPF programs"))?;
        let programs = multi::Programs::new(OBJECT, &ebpf)?;
        let mut probes = Probes {
            programs,
            gc_events: Some(GcEvents::new(take_map(&mut ebpf, maps::GC_EVENTS)?)?),
            ebpf,
            empty: options.empty,
            links: Vec::new(),
            attached: 0,
            predict: false,
            modules: ModuleTable::default(),
            sample_bytes: options.sample_bytes,
            gc_refill: options.gc_refill,
            dwarf: unwind_rows.is_some() || options.host,
            host_rows: 0,
            loaded_as: (options.clone(), unwind_rows),
            gc_copy: options.gc_copy,
            gc_verdicts,
        };
        if options.sample_bytes > 0 {
            probes.write_sample_distances(options.sample_bytes)?;
        }
        if !options.empty {
            probes.watch_thread_exits()?;
        }
        probes.set_enabled(true)?;
        if options.host {
            probes.start_host(host)?;
            if options.rss {
                probes.start_rss()?;
            }
        }
        Ok(probes)
    }

    /// Fills `SAMPLE_DISTANCES` for a mean distance of `sample_bytes`.
    fn write_sample_distances(&mut self, sample_bytes: u64) -> Result<()> {
        let mut table: Array<&mut MapData, u64> =
            Array::try_from(self.map_mut(maps::SAMPLE_DISTANCES)?)?;
        for (i, distance) in crate::sampling::distances(sample_bytes)
            .into_iter()
            .enumerate()
        {
            table.set(i as u32, distance, 0)?;
        }
        Ok(())
    }

    fn map_mut(&mut self, name: &str) -> Result<&mut Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
    }

    fn map(&self, name: &str) -> Result<&Map> {
        self.ebpf
            .map(name)
            .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
    }

    /// Another handle on map `name`, for a reader of its own (a thread,
    /// a snapshot): a duplicate of memprof's own descriptor (opening the
    /// map by id would need CAP_SYS_ADMIN).
    fn dup_map(&self, name: &str) -> Result<MapData> {
        let data = map_data(self.map(name)?)
            .ok_or_else(|| anyhow!("map {name} has an unexpected type"))?;
        let fd = std::os::fd::AsFd::as_fd(data.fd()).try_clone_to_owned()?;
        Ok(MapData::from_fd(fd)?)
    }

    fn set_enabled(&mut self, on: bool) -> Result<()> {
        self.set_switch(maps::ENABLED, u32::from(on))
    }

    /// Every program turns into a no-op when the `ENABLED` switch is
    /// cleared, so the kernel's tables no longer change; nothing signals
    /// the target any more.
    pub fn disable(&mut self) -> Result<()> {
        self.set_enabled(false)?;
        self.set_switch(maps::SIGNAL_ON_DLOPEN, 0)
    }

    /// Sets the one-entry `u32` map `name`: a switch the kernel reads
    /// while running (each its own map, so no write of one overwrites
    /// another, nor a flag the kernel sets).
    fn set_switch(&mut self, name: &str, value: u32) -> Result<()> {
        let mut switch: Array<&mut MapData, u32> = Array::try_from(self.map_mut(name)?)?;
        switch.set(0, value, 0)?;
        Ok(())
    }

    /// The value of the one-entry `u32` map `name`.
    fn switch(&self, name: &str) -> Result<u32> {
        let switch: Array<&MapData, u32> = Array::try_from(self.map(name)?)?;
        Ok(switch.get(&0, 0)?)
    }

    /// Closes every link. Closing a multi-uprobe link waits for the
    /// kernel's grace periods; closed on a thread each, the waits overlap
    /// (`run -- /bin/true`: 0.53 s instead of 0.70 s closing its links in
    /// turn), while the caller goes on; [`Detaching::wait`] joins them. No
    /// probe is left in the target after that. (A classic uprobe's
    /// detach, ~0.1 s, waits for the one before it in the kernel: on a
    /// thread each they at least leave the caller alone.)
    pub fn detach(mut self) -> Detaching {
        let links = std::mem::take(&mut self.links);
        Detaching(std::thread::spawn(move || {
            close(links);
            drop(self);
        }))
    }

    /// Closes every link now (as [`Self::detach`] does), keeping the maps
    /// to read: no target traps into memprof's programs any more while what
    /// they recorded is read (`attach --all` reads every process's tables
    /// after SIGTERM, which may take seconds).
    pub fn close_links(&mut self) -> Detaching {
        let links = std::mem::take(&mut self.links);
        Detaching(std::thread::spawn(move || close(links)))
    }
}

/// One link's descriptors, closed together (closing them detaches its
/// probes): a multi-uprobe link, or a classic uprobe's BPF link and perf
/// event, in the order they are closed.
pub(super) struct Link(#[allow(dead_code)] Vec<std::os::fd::OwnedFd>);

/// The data of a map of any type memprof's object has (aya's `Map` is one
/// variant per type, each holding the same `MapData`).
fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::RingBuf(d)
        | Map::Queue(d)
        | Map::StackTraceMap(d) => Some(d),
        _ => None,
    }
}

/// Removes map `name` from the object, for a part that owns it.
fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<Map> {
    ebpf.take_map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
}

/// Probes being detached on a background thread.
pub struct Detaching(std::thread::JoinHandle<()>);

impl Detaching {
    /// Whether every link is closed (then [`Detaching::wait`] returns at once).
    pub fn is_done(&self) -> bool {
        self.0.is_finished()
    }
}

/// Threads closing links at most: classic uprobes are a link each (a
/// few hundred under `attach --all` on Linux 6.1), and the kernel
/// detaches them one at a time anyway.
const CLOSING_THREADS: usize = 16;

/// Closes `links`, a thread each up to [`CLOSING_THREADS`] (see
/// [`Probes::detach`]).
fn close<L: Send + 'static>(links: impl IntoIterator<Item = L>) {
    let mut shares: Vec<Vec<L>> = Vec::new();
    for (i, link) in links.into_iter().enumerate() {
        match shares.get_mut(i % CLOSING_THREADS) {
            Some(share) => share.push(link),
            None => shares.push(vec![link]),
        }
    }
    let closing: Vec<_> = shares
        .into_iter()
        .map(|share| std::thread::spawn(move || drop(share)))
        .collect();
    for thread in closing {
        let _ = thread.join();
    }
}

impl Detaching {
    /// Waits until every probe is detached.
    pub fn wait(self) {
        let _ = self.0.join();
    }
}

/// Loading or attaching fails with EPERM without the capabilities: say
/// which. The error's own chain says so (an `io::Error` from the syscall),
/// not its text.
fn permission_hint(err: anyhow::Error, what: &str) -> anyhow::Error {
    if is_permission_denied(&err) {
        anyhow!("{what} was not permitted: memprof needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)")
    } else {
        err.context(what.to_string())
    }
}

/// Some syscall in `err`'s chain failed with EPERM.
fn is_permission_denied(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya::programs::ProgramError;
    use aya::sys::SyscallError;

    #[test]
    fn eperm_from_a_syscall_is_a_permission_error() {
        let err = ProgramError::SyscallError(SyscallError {
            call: "perf_event_open",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        let hinted = permission_hint(anyhow::Error::from(err), "attaching a uprobe");
        assert!(format!("{hinted:#}").contains("was not permitted: memprof needs root"));
    }

    #[test]
    fn other_errors_keep_their_cause() {
        let err = ProgramError::SyscallError(SyscallError {
            call: "perf_event_open",
            io_error: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        let hinted = permission_hint(anyhow::Error::from(err), "attaching a uprobe");
        let text = format!("{hinted:#}");
        assert!(text.starts_with("attaching a uprobe: "), "{text}");
        assert!(!text.contains("not permitted"), "{text}");
    }

    /// The names userspace attaches and opens by (`memprof_common`'s
    /// `programs`, `maps`, `globals`) are exactly those of the built
    /// object: the kernel side names its maps and settings after its
    /// statics, so each name is written on both sides, and this is where
    /// they are checked against each other.
    fn sorted(mut names: Vec<&str>) -> Vec<&str> {
        names.sort_unstable();
        names
    }

    #[test]
    fn the_object_has_exactly_the_contract_names() {
        use object::{Object, ObjectSection, ObjectSymbol};
        let parsed = aya_obj::Object::parse(OBJECT).unwrap();
        // Sections aya turns into maps (`.rodata`, …) are not maps of ours.
        let object_maps = parsed.maps.keys().map(String::as_str);
        assert_eq!(
            sorted(object_maps.filter(|name| !name.starts_with('.')).collect()),
            sorted(maps::ALL.to_vec())
        );
        let object_programs = parsed.programs.keys().map(String::as_str).collect();
        assert_eq!(
            sorted(object_programs),
            sorted(memprof_common::programs::ALL.to_vec())
        );
        let elf = object::File::parse(OBJECT).unwrap();
        let in_rodata = |symbol: &object::Symbol| {
            let section = symbol
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok());
            section.is_some_and(|s| s.name().is_ok_and(|n| n.starts_with(".rodata")))
        };
        let object_globals = elf
            .symbols()
            .filter(|symbol| symbol.is_global() && in_rodata(symbol))
            .map(|symbol| symbol.name().unwrap())
            .collect();
        assert_eq!(sorted(object_globals), sorted(globals::ALL.to_vec()));
    }

    #[test]
    fn errno_and_signal_numbers_match_libc() {
        use memprof_common::{errno, signal};
        assert_eq!(errno::EEXIST, libc::EEXIST);
        assert_eq!(signal::SIGTRAP, libc::SIGTRAP as u32);
        assert_eq!(signal::SIGURG, libc::SIGURG as u32);
    }
}
