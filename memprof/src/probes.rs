//! Loading memprof's eBPF programs and attaching them to the target.
//!
//! The object is built by `build.rs` and embedded in the binary. Each
//! program is loaded once and attached to every function that shares its
//! argument layout; the attach cookie tells the program which
//! [`memprof_common::AllocKind`] it is counting. Every probe is scoped to the
//! target's pid. Dropping [`Probes`] (or memprof exiting, however it exits)
//! closes the links: the kernel then removes the breakpoints.
use std::num::NonZeroU32;

use anyhow::{anyhow, Context, Result};
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap};
use aya::programs::uprobe::UProbeLinkId;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};
use memprof_common::{
    config, counter, maps, programs, AllocSite, DwarfStack, GcEvent, LiveAlloc, ModuleRange,
    SiteTotals,
};

use crate::placement::Planned;
use crate::profile::Counters;
use crate::unwind::Tables;

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
}

/// How many module ranges the kernel's table holds (its size, 128, minus one).
pub const MAX_MODULES: usize = 127;

/// The loaded programs, with their links while attached.
pub struct Probes {
    ebpf: Ebpf,
    empty: bool,
    /// Every attached probe: (program name, link).
    links: Vec<(&'static str, UProbeLinkId)>,
    /// How many probes (entry + return) are attached.
    pub attached: usize,
    /// GC objects allocated and gone (see [`memprof_common::GcEvent`]).
    gc_events: Option<RingBuf<MapData>>,
    /// The module ranges the kernel has, and which half of its table holds them.
    module_ranges: Vec<ModuleRange>,
    module_half: u32,
}

/// Entries in each half of the kernel's module table.
const TABLE_SIZE: u32 = 128;

/// The maps, kept after the programs are detached so they can be read.
pub struct HeapMaps {
    pub live: HashMap<MapData, u64, LiveAlloc>,
    pub sites: PerCpuHashMap<MapData, AllocSite, SiteTotals>,
    pub stacks: StackTraceMap<MapData>,
    pub dwarf_stacks: HashMap<MapData, u64, DwarfStack>,
    /// Stacks were unwound with the CFI tables (`dwarf_stacks`), not frame pointers.
    pub dwarf: bool,
    counters: PerCpuArray<MapData, u64>,
}

impl Probes {
    /// Loads the eBPF object into the kernel (no probe attached yet).
    /// With `unwind_tables`, stacks are unwound in the kernel with those CFI
    /// rows; without, by frame pointers.
    pub fn load(options: &ProbeOptions, unwind_tables: Option<&Tables>) -> Result<Probes> {
        let rows = unwind_tables.map_or(1, |t| t.rows.len().max(1)) as u32;
        // Only the stack table of the chosen unwinder gets its full size
        // (the frame-pointer one is preallocated: ~1 KiB an entry).
        let (fp_stacks, dwarf_stacks) = match unwind_tables {
            Some(_) => (1, options.max_stacks),
            None => (options.max_stacks, 1),
        };
        let ebpf = EbpfLoader::new()
            .map_max_entries(maps::LIVE, options.max_live)
            .map_max_entries(maps::STACKS, fp_stacks)
            .map_max_entries(maps::DWARF_STACKS, dwarf_stacks)
            .map_max_entries(maps::SITE_TOTALS, options.max_sites)
            .map_max_entries(maps::UNWIND_ROWS, rows)
            .map_max_entries(maps::GC_EVENTS, options.gc_events_bytes.max(4096))
            .load(OBJECT)
            .map_err(|e| permission_hint(anyhow!(e), "loading the eBPF programs"))?;
        let mut probes = Probes {
            ebpf,
            empty: options.empty,
            links: Vec::new(),
            attached: 0,
            gc_events: None,
            module_ranges: Vec::new(),
            module_half: 0,
        };
        probes.gc_events = Some(RingBuf::try_from(
            probes
                .ebpf
                .take_map(maps::GC_EVENTS)
                .ok_or_else(|| anyhow!("eBPF object has no map GC_EVENTS"))?,
        )?);
        probes.set_enabled(true)?;
        if let Some(tables) = unwind_tables {
            let map = probes.map_mut(maps::UNWIND_ROWS)?;
            let mut rows: Array<&mut MapData, memprof_common::UnwindRow> = Array::try_from(map)?;
            for (i, row) in tables.rows.iter().enumerate() {
                rows.set(i as u32, row, 0)?;
            }
            probes.set_config(config::UNWIND_DWARF, 1)?;
        }
        let names: Vec<String> = probes.ebpf.programs().map(|(n, _)| n.to_string()).collect();
        for name in names {
            probes
                .program(&name)?
                .load()
                .map_err(|e| permission_hint(anyhow!(e), &format!("loading program {name}")))?;
        }
        Ok(probes)
    }

    fn program(&mut self, name: &str) -> Result<&mut UProbe> {
        let program = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?;
        Ok(program.try_into()?)
    }

    /// Attaches the entry (and return) probe of every planned function, for `pid` only.
    pub fn attach(&mut self, pid: u32, plan: &[Planned]) -> Result<()> {
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).context("pid 0")?);
        for planned in plan {
            let f = &planned.func;
            let cookie = Some(f.func.kind as u64);
            let offset = f.file_offset + planned.placement.offset;
            let (entry, exit) = if self.empty {
                (
                    programs::EMPTY,
                    f.func.exit_program.map(|_| programs::EMPTY_RET),
                )
            } else {
                (f.func.entry_program, f.func.exit_program)
            };
            // The return probe sits at the same offset: %rsp still points at
            // the return address there (placement guarantees it), and one
            // breakpoint serves both.
            for program in std::iter::once(entry).chain(exit) {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie,
                };
                let link = self
                    .program(program)?
                    .attach(point, &f.module, scope)
                    .map_err(|e| permission_hint(anyhow!(e), "attaching a uprobe"))
                    .with_context(|| {
                        format!(
                            "attaching {program} to {} in {}",
                            f.func.symbol,
                            f.module.display()
                        )
                    })?;
                self.links.push((program, link));
                self.attached += 1;
            }
        }
        Ok(())
    }

    fn map_mut(&mut self, name: &str) -> Result<&mut Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
    }

    fn set_enabled(&mut self, on: bool) -> Result<()> {
        let mut enabled: Array<&mut MapData, u32> = Array::try_from(self.map_mut(maps::ENABLED)?)?;
        enabled.set(0, u32::from(on), 0)?;
        Ok(())
    }

    fn set_config(&mut self, index: u32, value: u32) -> Result<()> {
        let mut config: Array<&mut MapData, u32> = Array::try_from(self.map_mut(maps::CONFIG)?)?;
        config.set(index, value, 0)?;
        Ok(())
    }

    /// Tells the unwinder where each module is mapped (sorted by address).
    ///
    /// The kernel's table is double: the new ranges go into the half not in
    /// use, then one write of `MODULE_COUNT` switches halves, so a probe
    /// never unwinds with a half-written (or empty) table. Unchanged ranges
    /// are not rewritten.
    pub fn set_module_ranges(&mut self, ranges: &[ModuleRange]) -> Result<()> {
        let ranges = &ranges[..ranges.len().min(MAX_MODULES)];
        if ranges == self.module_ranges.as_slice() {
            return Ok(());
        }
        self.module_half ^= 1;
        let offset = self.module_half * TABLE_SIZE;
        {
            let mut table: Array<&mut MapData, ModuleRange> =
                Array::try_from(self.map_mut(maps::MODULE_RANGES)?)?;
            for (i, range) in ranges.iter().enumerate() {
                table.set(offset + i as u32, range, 0)?;
            }
        }
        self.module_ranges = ranges.to_vec();
        self.set_config(
            config::MODULE_COUNT,
            ranges.len() as u32 | self.module_half << 8,
        )
    }

    /// `run` only: have `dl_debug_state` stop the traced main thread when the
    /// dynamic linker loads libraries. `module` is the dynamic linker and
    /// `file_offset` its `_dl_debug_state`.
    pub fn watch_library_loads(
        &mut self,
        pid: u32,
        module: &std::path::Path,
        file_offset: u64,
    ) -> Result<()> {
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).context("pid 0")?);
        let link = self
            .program(programs::DL_DEBUG_STATE)?
            .attach(
                UProbeAttachLocation::AbsoluteOffset(file_offset),
                module,
                scope,
            )
            .with_context(|| format!("attaching to _dl_debug_state in {}", module.display()))?;
        self.links.push((programs::DL_DEBUG_STATE, link));
        self.set_config(config::SIGNAL_ON_DLOPEN, 1)
    }

    /// Puts a collection probe on each `GC_gc_no++` (file `offsets` in
    /// `module`) and has the kernel hold the collecting thread for the
    /// mark-bit pass when it is one memprof traces ([`Self::set_traced`]).
    pub fn watch_collections(
        &mut self,
        pid: u32,
        module: &std::path::Path,
        offsets: &[u64],
    ) -> Result<()> {
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).context("pid 0")?);
        for &offset in offsets {
            let link = self
                .program(programs::GC_COLLECTION)?
                .attach(UProbeAttachLocation::AbsoluteOffset(offset), module, scope)
                .map_err(|e| permission_hint(anyhow!(e), "attaching a uprobe"))
                .with_context(|| {
                    format!(
                        "attaching to GC_gc_no++ at {offset:#x} in {}",
                        module.display()
                    )
                })?;
            self.links.push((programs::GC_COLLECTION, link));
            self.attached += 1;
        }
        self.set_config(config::GC_HOLD, 1)
    }

    /// No more holds at collections (before the tracer lets the threads go).
    pub fn stop_holding(&mut self) -> Result<()> {
        self.set_config(config::GC_HOLD, 0)
    }

    /// Marks thread `tid` as traced by memprof: the kernel may hold it.
    pub fn set_traced(&mut self, tid: u32) -> Result<()> {
        let mut traced: HashMap<&mut MapData, u32, u32> =
            HashMap::try_from(self.map_mut(maps::TRACED)?)?;
        traced.insert(tid, 1, 0)?;
        Ok(())
    }

    /// If the kernel is holding `tid` at a collection, the collection's
    /// epoch (and the hold is cleared).
    pub fn take_held(&mut self, tid: u32) -> Result<Option<u64>> {
        let mut held: HashMap<&mut MapData, u32, u64> =
            HashMap::try_from(self.map_mut(maps::HELD)?)?;
        match held.get(&tid, 0) {
            Ok(epoch) => {
                held.remove(&tid)?;
                Ok(Some(epoch))
            }
            Err(_) => Ok(None),
        }
    }

    /// Collections the kernel saw and could not hold for (summed over CPUs).
    pub fn collections_not_held(&self) -> Result<u64> {
        self.counter(counter::GC_NOT_HELD)
    }

    /// One of the kernel's counters, summed over CPUs, while attached.
    fn counter(&self, index: u32) -> Result<u64> {
        let map = self
            .ebpf
            .map(maps::COUNTERS)
            .ok_or_else(|| anyhow!("eBPF object has no map COUNTERS"))?;
        let counters: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        Ok(counters.get(&index, 0)?.iter().sum())
    }

    /// Hands every GC event the kernel queued to `apply`, in order.
    pub fn drain_gc_events(&mut self, mut apply: impl FnMut(&GcEvent)) {
        let Some(ring) = &mut self.gc_events else {
            return;
        };
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<GcEvent>() {
                // SAFETY: the kernel wrote a GcEvent (plain data); unaligned read.
                let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<GcEvent>()) };
                apply(&event);
            }
        }
    }

    /// GC events lost because the ring buffer was full (summed over CPUs).
    pub fn gc_events_lost(&self) -> Result<u64> {
        self.counter(counter::GC_EVENTS_LOST)
    }

    /// Removes dead blocks from the live table.
    pub fn forget_live(&self, addresses: &[u64]) -> Result<()> {
        batch::delete(self.live_fd()?, addresses)
    }

    fn live_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::{AsFd, AsRawFd};
        match self.ebpf.map(maps::LIVE) {
            Some(Map::HashMap(data)) => Ok(data.fd().as_fd().as_raw_fd()),
            _ => Err(anyhow!("eBPF object has no hash map LIVE")),
        }
    }

    /// Whether the kernel sent the library-load signal since the last call.
    pub fn take_library_load_signal(&mut self) -> Result<bool> {
        let mut config: Array<&mut MapData, u32> = Array::try_from(self.map_mut(maps::CONFIG)?)?;
        let sent = config.get(&config::DLOPEN_SIGNALLED, 0)? == 1;
        if sent {
            config.set(config::DLOPEN_SIGNALLED, 0, 0)?;
        }
        Ok(sent)
    }

    /// Stops recording at once and starts detaching in the background.
    ///
    /// Every program turns into a no-op when the `ENABLED` switch is
    /// cleared, so the kernel's tables no longer change; nothing signals
    /// the target any more.
    pub fn disable(&mut self) -> Result<()> {
        self.set_enabled(false)?;
        self.set_config(config::SIGNAL_ON_DLOPEN, 0)
    }

    /// Closes every link. Closing a uprobe costs the kernel a grace period
    /// (~0.1 s each, serialized), so the links are closed on a thread while
    /// the caller symbolizes; [`Detaching::wait`] joins it. No probe is left
    /// in the target after that.
    pub fn detach(self) -> Detaching {
        Detaching(std::thread::spawn(move || drop(self)))
    }
}

impl Probes {
    /// Second handles on the kernel's tables while the probes stay attached
    /// (timeline samples, `--interval`, `--snapshot-every`): reads see the
    /// tables as the probes change them.
    pub fn peek(&self) -> Result<HeapMaps> {
        let open = |name: &str| -> Result<Map> {
            let map = self
                .ebpf
                .map(name)
                .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
            let data = match map {
                Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuHashMap(d)
                | Map::PerCpuArray(d)
                | Map::Array(d)
                | Map::StackTraceMap(d) => d,
                _ => return Err(anyhow!("map {name} has an unexpected type")),
            };
            // A duplicate of memprof's own descriptor (opening the map by
            // id would need CAP_SYS_ADMIN).
            let fd = std::os::fd::AsFd::as_fd(data.fd()).try_clone_to_owned()?;
            Ok(Map::from_map_data(MapData::from_fd(fd)?)?)
        };
        let config: Array<&MapData, u32> = Array::try_from(
            self.ebpf
                .map(maps::CONFIG)
                .ok_or_else(|| anyhow!("eBPF object has no map {}", maps::CONFIG))?,
        )?;
        Ok(HeapMaps {
            live: HashMap::try_from(open(maps::LIVE)?)?,
            sites: PerCpuHashMap::try_from(open(maps::SITE_TOTALS)?)?,
            stacks: StackTraceMap::try_from(open(maps::STACKS)?)?,
            dwarf_stacks: HashMap::try_from(open(maps::DWARF_STACKS)?)?,
            dwarf: config.get(&config::UNWIND_DWARF, 0)? == 1,
            counters: PerCpuArray::try_from(open(maps::COUNTERS)?)?,
        })
    }
}

/// Probes being detached on a background thread.
pub struct Detaching(std::thread::JoinHandle<()>);

impl Detaching {
    /// Waits until every probe is detached.
    pub fn wait(self) {
        let _ = self.0.join();
    }
}

impl HeapMaps {
    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters> {
        let get = |index: u32| -> Result<u64> { Ok(self.counters.get(&index, 0)?.iter().sum()) };
        Ok(Counters {
            live_map_full: get(counter::LIVE_FULL)?,
            sites_map_full: get(counter::SITES_FULL)?,
            stack_errors: get(counter::STACK_ERRORS)?,
            pending_full: get(counter::PENDING_FULL)?,
            unknown_frees: get(counter::UNKNOWN_FREES)?,
            allocs: get(counter::ALLOCS)?,
            frees: get(counter::FREES)?,
            failed_allocs: get(counter::FAILED_ALLOCS)?,
            truncated_stacks: get(counter::TRUNCATED_STACKS)?,
        })
    }
}

/// `BPF_MAP_DELETE_BATCH`, which aya 0.14 does not wrap: thousands of
/// entries per syscall.
mod batch {
    use anyhow::{bail, Result};
    use std::os::fd::RawFd;

    const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
    /// Entries per call.
    const CHUNK: usize = 65536;

    /// The `batch` member of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }

    fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> std::io::Result<()> {
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub fn delete(fd: RawFd, keys: &[u64]) -> Result<()> {
        for chunk in keys.chunks(CHUNK) {
            let mut attr = BatchAttr {
                keys: chunk.as_ptr() as u64,
                count: chunk.len() as u32,
                map_fd: fd as u32,
                ..BatchAttr::default()
            };
            if let Err(e) = bpf(BPF_MAP_DELETE_BATCH, &mut attr) {
                // ENOENT: a key already gone (freed meanwhile); delete the rest one by one.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    bail!("removing dead objects from the live table: {e}");
                }
                for key in &chunk[attr.count as usize..] {
                    let mut one = BatchAttr {
                        keys: key as *const u64 as u64,
                        count: 1,
                        map_fd: fd as u32,
                        ..BatchAttr::default()
                    };
                    let _ = bpf(BPF_MAP_DELETE_BATCH, &mut one);
                }
            }
        }
        Ok(())
    }
}

/// Loading or attaching fails with EPERM without the capabilities: say which.
fn permission_hint(err: anyhow::Error, what: &str) -> anyhow::Error {
    let text = format!("{err:#}");
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        anyhow!("{what} was not permitted: memprof needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)")
    } else {
        err.context(what.to_string())
    }
}
