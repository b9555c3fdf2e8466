//! `attach --all`: the kernel's per-process state
//! ([`memprof_common::host`]) as userspace keeps it. The programs are
//! loaded once and sit on files, for every process; here:
//!
//! - the sizes of the per-process maps, and `task_struct` offsets for the
//!   process events (from the running kernel's BTF);
//! - memprof's own process, left out;
//! - the CFI rows of each file, appended once to `UNWIND_ROWS` and shared
//!   by every process mapping it;
//! - each process's module table, a segment of `MODULE_RANGES` of its own
//!   (a new one each time its mappings change: a probe may be reading
//!   the old one, which is reused last);
//! - the ring of process events ([`HostEvents`]);
//! - the tables of processes that ended, taken out of the kernel's maps
//!   ([`Probes::take_ended`]) so their room serves the processes to come.
use std::collections::{HashMap, HashSet, VecDeque};

use anyhow::{Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap, Queue, RingBuf};
use memprof_common::host::{FileKey, KernelLayout, KnownFile, KERNEL_SEGMENTS};
use memprof_common::{
    host, maps, module_table, programs, AllocKind, AllocSite, DeferredStack, HostEvent, LiveAlloc,
    ModuleRange, SiteTotals, UnwindRow,
};

use super::view::{LiveBlock, Site};
use super::{take_map, Probes};

/// CFI rows the kernel's table holds under `attach --all` (16 bytes
/// each: 64 MiB): libc has ~31,000, a Crystal program ~100,000, rustc's
/// `librustc_driver` 1,151,938.
const HOST_ROWS: u32 = 1 << 22;
/// Processes with an index at once (`PROCESSES`).
const HOST_PROCESSES: u32 = 1 << 15;
/// The process event ring: 4 MiB, ~11,000 events (a process that
/// starts a program and ends sends ~20).
const HOST_EVENTS_BYTES: u32 = 1 << 22;
/// The ring of stacks the kernel could not finish (`DEFERRED_STACKS`):
/// 4 MiB, ~325 copies waiting (each is sent once per stack, and read
/// within the millisecond). Its pages end up resident twice in memprof
/// (the kernel maps the data twice): at 8 MiB, 16 MB of the agent's RSS.
const DEFERRED_BYTES: u32 = 1 << 22;
/// Stack keys remembered as sent (`DEFERRED_SENT`, least recently used
/// forgotten).
const DEFERRED_KEYS: u32 = 1 << 14;
/// Files the kernel knows the rows of (`KNOWN_FILES`).
const HOST_KNOWN_FILES: u32 = 1 << 14;

/// Map sizes and offsets the object is loaded with.
pub(super) struct Sizes {
    pub rows: u32,
    pub processes: u32,
    /// Process indexes a session can give (`PROCESS_MODULES`).
    pub indexes: u32,
    pub events_bytes: u32,
    /// The ring of stacks finished in userspace, and the keys sent.
    pub deferred_bytes: u32,
    pub deferred_keys: u32,
    pub module_slots: u32,
    pub real_parent: u32,
    pub tgid: u32,
    pub exit_code: u32,
    pub start_time: u32,
    /// When the programs are loaded (`CLOCK_MONOTONIC` ns).
    pub started_ns: u64,
    pub known_files: u32,
    pub free_segments: u32,
    pub layout: KernelLayout,
}

impl Sizes {
    /// The sizes for `attach --all` (`host`), else the smallest.
    pub fn new(host: bool) -> Result<Sizes> {
        if !host {
            return Ok(Sizes {
                rows: 1,
                processes: 1,
                indexes: 1,
                events_bytes: 4096,
                deferred_bytes: 4096,
                deferred_keys: 1,
                module_slots: module_table::ENTRIES,
                real_parent: 0,
                tgid: 0,
                exit_code: 0,
                start_time: 0,
                started_ns: 0,
                known_files: 1,
                free_segments: 1,
                layout: KernelLayout::default(),
            });
        }
        let offset = |member: &str| -> Result<u32> {
            let offset = crate::probes::btf::kernel_member_offset("task_struct", &[member])
                .with_context(|| format!("task_struct.{member} in the kernel's BTF"))?;
            Ok(offset as u32)
        };
        Ok(Sizes {
            rows: HOST_ROWS,
            processes: HOST_PROCESSES,
            indexes: host::MAX_INDEX,
            events_bytes: HOST_EVENTS_BYTES,
            deferred_bytes: DEFERRED_BYTES,
            deferred_keys: DEFERRED_KEYS,
            module_slots: module_table::SEGMENTS * module_table::SLOTS,
            real_parent: offset("real_parent")?,
            tgid: offset("tgid")?,
            exit_code: offset("exit_code")?,
            start_time: offset("start_time")?,
            started_ns: monotonic_ns(),
            known_files: HOST_KNOWN_FILES,
            free_segments: KERNEL_SEGMENTS.len() as u32,
            layout: kernel_layout().context("memory-map structures in the kernel's BTF")?,
        })
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of
/// `bpf_ktime_get_ns` and of a task's `start_time`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The offsets the kernel's table building reads, from its BTF.
fn kernel_layout() -> Result<KernelLayout> {
    let o = crate::probes::btf::kernel_member_offsets(&[
        ("vm_area_struct", &["vm_start"]),
        ("vm_area_struct", &["vm_end"]),
        ("vm_area_struct", &["vm_flags"]),
        ("vm_area_struct", &["vm_pgoff"]),
        ("vm_area_struct", &["vm_file"]),
        ("file", &["f_inode"]),
        ("inode", &["i_ino"]),
        ("inode", &["i_sb"]),
        ("super_block", &["s_dev"]),
        ("linux_binprm", &["filename"]),
        ("file", &["f_path", "mnt"]),
        ("file", &["f_path", "dentry"]),
        ("dentry", &["d_parent"]),
        ("dentry", &["d_name", "name"]),
        ("vfsmount", &["mnt_root"]),
        ("mount", &["mnt"]),
        ("mount", &["mnt_parent"]),
        ("mount", &["mnt_mountpoint"]),
        ("task_struct", &["mm"]),
        ("mm_struct", &["exe_file"]),
        ("mm_struct", &["arg_start"]),
        ("mm_struct", &["arg_end"]),
        ("mm_struct", &["brk"]),
    ])?;
    let o: Vec<u32> = o.into_iter().map(|o| o as u32).collect();
    Ok(KernelLayout {
        vma_start: o[0],
        vma_end: o[1],
        vma_flags: o[2],
        vma_pgoff: o[3],
        vma_file: o[4],
        file_inode: o[5],
        inode_ino: o[6],
        inode_sb: o[7],
        sb_dev: o[8],
        bprm_filename: o[9],
        path_mnt: o[10],
        path_dentry: o[11],
        dentry_parent: o[12],
        dentry_name: o[13],
        vfsmount_root: o[14],
        mount_mnt: o[15],
        mount_parent: o[16],
        mount_mountpoint: o[17],
        task_mm: o[18],
        mm_exe_file: o[19],
        mm_arg_start: o[20],
        mm_arg_end: o[21],
        mm_brk: o[22],
    })
}

/// The allocations of one process that ended, out of the kernel's tables.
#[derive(Debug, Default)]
pub struct Prefetched {
    pub live: Vec<(u64, LiveBlock)>,
    pub sites: Vec<(Site, SiteTotals)>,
}

/// The kernel's CFI rows (`UNWIND_ROWS`), each file's written once where
/// `machine::row_space` found it room, and named in `KNOWN_FILES` for the
/// tables the kernel builds.
pub struct RowTable {
    rows: MapData,
    known: BpfHashMap<MapData, FileKey, KnownFile>,
    capacity: u32,
}

impl RowTable {
    /// Rows the table holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Writes a file's rows from row `start` (copied into the mapped
    /// table; by `bpf(2)` if it cannot be mapped).
    pub fn write(&mut self, start: u32, rows: &[UnwindRow]) -> Result<()> {
        anyhow::ensure!(
            start as usize + rows.len() <= self.capacity as usize,
            "rows {start}+{} past the table's {}",
            rows.len(),
            self.capacity
        );
        super::batch::copy_into_mappable(&self.rows, start, rows)
            .or_else(|_| super::batch::fill_at(&self.rows, start, rows))
    }

    /// Tells the kernel that `file`'s rows are `known`: the tables it
    /// builds from now on have it.
    pub fn name(&mut self, file: FileKey, known: KnownFile) -> Result<()> {
        self.known.insert(file, known, 0)?;
        Ok(())
    }

    /// The kernel builds no more tables with `file`'s rows.
    pub fn unname(&mut self, file: &FileKey) -> Result<()> {
        match self.known.remove(file) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Each process's module table for the unwinder: a segment of
/// `MODULE_RANGES` of its own, a new one each time its mappings change
/// (a probe may be reading the old one, which is reused last). Userspace
/// builds tables in the lower half of the segments; the kernel builds
/// its own (a process's files all known) in the upper half, taken from
/// `FREE_SEGMENTS`, where a segment the kernel's table no longer uses
/// goes back.
pub struct ModuleTables {
    ranges: MapData,
    /// `PROCESS_MODULES`.
    modules: MapData,
    /// `PROCESS_MODULES` to read, while the kernel builds no table of its
    /// own (no task-VMA iterator, Linux < 6.7): the processes whose
    /// first table is userspace's are counted ([`Self::tables_from_proc`]).
    kernel_built: Option<aya::maps::Array<MapData, u32>>,
    /// Processes whose first module table came from /proc, with
    /// `kernel_built`.
    tables_from_proc: u64,
    /// The kernel's free segments (`FREE_SEGMENTS`).
    kernel_free: Queue<MapData, u32>,
    /// Userspace's segments no process uses, the oldest first.
    free: VecDeque<u32>,
    /// Of each process index with a table: its segment, which reading of
    /// its mappings the table was made from (the kernel's: 0), and the
    /// table (the kernel's: empty).
    by_index: HashMap<u32, (u32, u64, Vec<ModuleRange>)>,
    generation: u32,
}

impl ModuleTables {
    /// Gives process `index` the module table `ranges`, made from the
    /// `reading`th reading of its mappings (a table from an earlier
    /// reading than the one it has is not taken). `false` when not taken
    /// or every segment is in use (its frames are then unwound no further
    /// than the allocator's caller).
    pub fn publish(&mut self, index: u32, reading: u64, ranges: &[ModuleRange]) -> Result<bool> {
        let ranges = &ranges[..ranges.len().min(module_table::MAX_MODULES as usize)];
        if let Some((_, last, table)) = self.by_index.get(&index) {
            if *last > reading || (*last == reading && table.as_slice() == ranges) {
                return Ok(false);
            }
        }
        let Some(segment) = self.free.pop_front() else {
            return Ok(false);
        };
        if !self.by_index.contains_key(&index) {
            self.count_first_table(index);
        }
        self.generation = self.generation.wrapping_add(1);
        let packed = module_table::pack(ranges.len() as u32, segment, self.generation);
        super::batch::fill_at(&self.ranges, module_table::slot(segment, 0), ranges)?;
        // One aligned word: a probe reads the old table or the new one.
        super::batch::fill_at(&self.modules, index, &[packed])?;
        if let Some((old, _, _)) = self
            .by_index
            .insert(index, (segment, reading, ranges.to_vec()))
        {
            self.give_back(old);
        }
        Ok(true)
    }

    /// Process `index` gets its first table from userspace: counted when
    /// the kernel, without the task-VMA iterator, left it none (a forked
    /// process may have its parent's).
    fn count_first_table(&mut self, index: u32) {
        let Some(kernel_built) = &self.kernel_built else {
            return;
        };
        let packed = kernel_built.get(&index, 0).unwrap_or(0);
        if module_table::count(packed) == 0 {
            self.tables_from_proc += 1;
        }
    }

    /// Processes whose first module table came from memprof's reading of
    /// /proc, the kernel having no task-VMA iterator to build it (0 on a
    /// kernel with one).
    pub fn tables_from_proc(&self) -> u64 {
        self.tables_from_proc
    }

    /// The kernel gave process `index` the table `new` in place of `old`
    /// (a `TABLE` event, read in order with the others): the segment of
    /// `old` is free. Unless userspace gave the process a table since
    /// the kernel's (this side's current one is not `old`): then the
    /// kernel's was replaced already, and its segment is free.
    pub fn built_by_kernel(&mut self, index: u32, old: u32, new: u32) {
        let segment_of = |packed: u32| module_table::first_slot(packed) / module_table::SLOTS;
        let new = segment_of(new);
        let current = self.by_index.get(&index).map(|(s, _, _)| *s);
        match current {
            Some(s) if old == 0 || s != segment_of(old) => self.give_back(new),
            _ => {
                if let Some((s, _, _)) = self.by_index.insert(index, (new, 0, Vec::new())) {
                    self.give_back(s);
                }
            }
        }
    }

    /// Process `index` ended: its segment is free.
    pub fn release(&mut self, index: u32) {
        if let Some((segment, _, _)) = self.by_index.remove(&index) {
            self.give_back(segment);
        }
    }

    /// A segment no process uses any more, to whichever side builds in it.
    fn give_back(&mut self, segment: u32) {
        if KERNEL_SEGMENTS.contains(&segment) {
            let _ = self.kernel_free.push(segment, 0);
        } else {
            self.free.push_back(segment);
        }
    }
}

/// A site key's bytes (what the kernel's table compares).
fn bytes_of(site: &AllocSite) -> [u8; std::mem::size_of::<AllocSite>()] {
    // SAFETY: plain #[repr(C)] data with explicit padding.
    unsafe { std::mem::transmute_copy(site) }
}

/// The ring of [`HostEvent`]s.
pub struct HostEvents(RingBuf<MapData>);

impl HostEvents {
    /// Waits up to `timeout` for an event (the kernel wakes the reader
    /// when one is queued and it had read every earlier one).
    pub fn wait(&self, timeout: std::time::Duration) {
        use std::os::fd::AsRawFd;
        let mut fd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    }

    /// The next event queued, if any.
    pub fn take_next(&mut self) -> Option<HostEvent> {
        let item = self.0.next()?;
        (item.len() >= std::mem::size_of::<HostEvent>())
            // SAFETY: the kernel wrote a `HostEvent` (plain data) there.
            .then(|| unsafe { std::ptr::read_unaligned(item.as_ptr() as *const HostEvent) })
    }
}

/// The ring of [`DeferredStack`]s.
pub struct DeferredStacks(RingBuf<MapData>);

impl DeferredStacks {
    /// The next stack queued, if any.
    pub fn take_next(&mut self) -> Option<Box<DeferredStack>> {
        let item = self.0.next()?;
        if item.len() < std::mem::size_of::<DeferredStack>() {
            return None;
        }
        // SAFETY: the kernel wrote a `DeferredStack` (plain data) there.
        Some(Box::new(unsafe {
            std::ptr::read_unaligned(item.as_ptr() as *const DeferredStack)
        }))
    }
}

impl Probes {
    /// Sets up `attach --all`'s state: memprof itself is left out, exits
    /// and `exec`s are watched.
    pub(super) fn start_host(&mut self, sizes: Sizes) -> Result<()> {
        self.host_rows = sizes.rows;
        self.leave_out(std::process::id(), host::IGNORED)?;
        let mut free: Queue<&mut MapData, u32> =
            Queue::try_from(self.map_mut(maps::FREE_SEGMENTS)?)?;
        for segment in KERNEL_SEGMENTS {
            free.push(segment, 0)?;
        }
        self.attach_raw_tracepoint(programs::PROCESS_EXEC, "sched_process_exec")?;
        // A kernel without the tracepoint only loses the OOM marks.
        if let Err(e) = self.attach_raw_tracepoint(programs::OOM_VICTIM, "mark_victim") {
            eprintln!("memprof: note: processes the OOM killer ends are not marked so: {e:#}");
        }
        Ok(())
    }

    /// `attach --comm/--exe`: the names (as [`host::comm_key`] makes
    /// them) and executables the kernel follows the processes of.
    pub fn select(&mut self, comms: &[[u8; 16]], exes: &[FileKey]) -> Result<()> {
        if comms.len() > host::SELECT_MAX as usize || exes.len() > host::SELECT_MAX as usize {
            anyhow::bail!(
                "at most {} --comm and {} --exe at once",
                host::SELECT_MAX,
                host::SELECT_MAX
            );
        }
        let mut names: aya::maps::Array<&mut MapData, [u8; 16]> =
            aya::maps::Array::try_from(self.map_mut(maps::SELECTED_COMMS)?)?;
        for (i, comm) in comms.iter().enumerate() {
            names.set(i as u32, comm, 0)?;
        }
        let mut files: BpfHashMap<&mut MapData, FileKey, u32> =
            BpfHashMap::try_from(self.map_mut(maps::SELECTED_EXES)?)?;
        for exe in exes {
            files.insert(exe, 1, 0)?;
        }
        Ok(())
    }

    /// Process `pid` is not followed: memprof itself (`host::IGNORED`),
    /// or one a session of its own follows (`host::SESSION`: its exit is
    /// told).
    pub fn leave_out(&mut self, pid: u32, index: u32) -> Result<()> {
        let mut processes: BpfHashMap<&mut MapData, u32, u32> =
            BpfHashMap::try_from(self.map_mut(maps::PROCESSES)?)?;
        processes.insert(pid, index, 0)?;
        Ok(())
    }

    /// Process `indexes` are done with (finalized, or dropped): the
    /// kernel gives them again to processes that start.
    pub fn free_indexes(&mut self, indexes: &HashSet<u32>) -> Result<()> {
        let mut free: Queue<&mut MapData, u32> =
            Queue::try_from(self.map_mut(maps::FREE_INDEXES)?)?;
        for &index in indexes {
            free.push(index, 0)?;
        }
        Ok(())
    }

    /// The ring of process events (once).
    pub fn host_events(&mut self) -> Result<HostEvents> {
        Ok(HostEvents(RingBuf::try_from(take_map(
            &mut self.ebpf,
            maps::HOST_EVENTS,
        )?)?))
    }

    /// The ring of stacks to finish in userspace (once).
    pub fn deferred_stacks(&mut self) -> Result<DeferredStacks> {
        Ok(DeferredStacks(RingBuf::try_from(take_map(
            &mut self.ebpf,
            maps::DEFERRED_STACKS,
        )?)?))
    }

    /// The CFI row table, for any thread.
    pub fn row_table(&self) -> Result<RowTable> {
        Ok(RowTable {
            rows: self.dup_map(maps::UNWIND_ROWS)?,
            known: BpfHashMap::try_from(aya::maps::Map::from_map_data(
                self.dup_map(maps::KNOWN_FILES)?,
            )?)?,
            capacity: self.host_rows,
        })
    }

    /// Every process's library loads and unloads: `dl_debug_state` on the
    /// dynamic linker `module` (its `_dl_debug_state` at `offset`).
    pub fn watch_linker(&mut self, module: &crate::modules::Module, offset: u64) -> Result<()> {
        self.attach_at(
            programs::DL_DEBUG_STATE,
            module,
            offset,
            0,
            "_dl_debug_state",
        )
    }

    /// The processes' module tables, for any thread.
    pub fn module_tables(&self) -> Result<ModuleTables> {
        let kernel_built = match super::kernel().task_vma_iter {
            true => None,
            false => Some(aya::maps::Array::try_from(aya::maps::Map::from_map_data(
                self.dup_map(maps::PROCESS_MODULES)?,
            )?)?),
        };
        Ok(ModuleTables {
            ranges: self.dup_map(maps::MODULE_RANGES)?,
            modules: self.dup_map(maps::PROCESS_MODULES)?,
            kernel_built,
            tables_from_proc: 0,
            kernel_free: Queue::try_from(aya::maps::Map::from_map_data(
                self.dup_map(maps::FREE_SEGMENTS)?,
            )?)?,
            free: (0..KERNEL_SEGMENTS.start).collect(),
            by_index: HashMap::new(),
            generation: 0,
        })
    }

    /// Takes the live blocks and the sites of the processes `indexes` out
    /// of the kernel's tables (they ended: nothing adds to them any more).
    pub fn take_ended(&mut self, indexes: &HashSet<u32>) -> Result<HashMap<u32, Prefetched>> {
        self.tables_of(indexes, true)
    }

    /// Takes out of `LIVE` the blocks of process `index` that its own
    /// allocator probes recorded (every kind but `rss`), once those came
    /// off: their frees are not seen any more. Their sizes.
    pub fn take_calls_live(&mut self, index: u32) -> Result<Vec<u64>> {
        let live_data = super::map_data(self.map(maps::LIVE)?)
            .ok_or_else(|| anyhow::anyhow!("map {} has an unexpected type", maps::LIVE))?;
        let mut keys = Vec::new();
        let mut seen = HashSet::new();
        super::batch::read_hash(live_data, |key: u64, block: LiveAlloc| {
            let (of, _) = host::split(key);
            if of == index && block.site.kind != AllocKind::Rss as u8 && seen.insert(key) {
                keys.push((key, block.size));
            }
        })?;
        let mut live: BpfHashMap<&mut MapData, u64, LiveAlloc> =
            BpfHashMap::try_from(self.map_mut(maps::LIVE)?)?;
        // One freed meanwhile is the kernel's to count.
        Ok(keys
            .into_iter()
            .filter(|(key, _)| live.remove(key).is_ok())
            .map(|(_, size)| size)
            .collect())
    }

    /// Reads the live blocks and the sites of the processes `indexes`,
    /// left in the kernel's tables (they run on: a snapshot).
    pub fn read_processes(&mut self, indexes: &HashSet<u32>) -> Result<HashMap<u32, Prefetched>> {
        self.tables_of(indexes, false)
    }

    /// The tables of processes `indexes`; `remove`: taken out.
    fn tables_of(
        &mut self,
        indexes: &HashSet<u32>,
        remove: bool,
    ) -> Result<HashMap<u32, Prefetched>> {
        let mut taken: HashMap<u32, Prefetched> = HashMap::new();
        if indexes.is_empty() {
            return Ok(taken);
        }
        // Read whole first (in batches), removed after. The kernel removes
        // entries meanwhile (other processes' frees): an entry read twice
        // is taken once.
        let live_data = super::map_data(self.map(maps::LIVE)?)
            .ok_or_else(|| anyhow::anyhow!("map {} has an unexpected type", maps::LIVE))?;
        let mut keys = Vec::new();
        let mut seen = HashSet::new();
        super::batch::read_hash(live_data, |key: u64, block: LiveAlloc| {
            let (index, addr) = host::split(key);
            if indexes.contains(&index) && seen.insert(key) {
                keys.push(key);
                if let Ok(block) = LiveBlock::try_from(&block) {
                    taken.entry(index).or_default().live.push((addr, block));
                }
            }
        })?;
        let mut live: BpfHashMap<&mut MapData, u64, LiveAlloc> =
            BpfHashMap::try_from(self.map_mut(maps::LIVE)?)?;
        for key in keys.iter().filter(|_| remove) {
            let _ = live.remove(key);
        }
        let sites_data = super::map_data(self.map(maps::SITE_TOTALS)?)
            .ok_or_else(|| anyhow::anyhow!("map {} has an unexpected type", maps::SITE_TOTALS))?;
        let mut keys = Vec::new();
        let mut seen = HashSet::new();
        super::batch::read_per_cpu_hash(
            sites_data,
            |site: AllocSite, per_cpu: &mut dyn Iterator<Item = SiteTotals>| {
                if indexes.contains(&site.process) && seen.insert(bytes_of(&site)) {
                    keys.push(site);
                    let mut sum = SiteTotals::default();
                    per_cpu.for_each(|totals| sum.add(&totals));
                    if let Ok(s) = Site::try_from(&site) {
                        taken.entry(site.process).or_default().sites.push((s, sum));
                    }
                }
            },
        )?;
        let mut sites: PerCpuHashMap<&mut MapData, AllocSite, SiteTotals> =
            PerCpuHashMap::try_from(self.map_mut(maps::SITE_TOTALS)?)?;
        for key in keys.iter().filter(|_| remove) {
            let _ = sites.remove(key);
        }
        Ok(taken)
    }
}
