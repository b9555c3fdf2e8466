//! What to attach where, decided before anything is attached: the
//! allocator functions of the chosen heaps ([`crate::allocators`]), the
//! offset of each probe ([`crate::probes::placement`]) and, for DWARF unwinding, the
//! CFI tables of every module ([`crate::unwind`]).
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use memprof_common::AllocKind;

use crate::allocators::{self, ResolvedFn, BOEHM, BOEHM_REFILL, LIBC};
use crate::modules::maps;
use crate::modules::ModuleCache;
use crate::options::{GcLiveness, GcSampling, Heap, SessionOptions, Unwind};
use crate::probes::placement::{self, Planned};
use crate::probes::ProbeOptions;
use crate::report;
use crate::tracee::{self, Tracee};
use crate::unwind::Tables;

/// The GC event ring buffer: ~65k events. Its reader is woken when 1 MiB
/// is queued and reads at least every 10 ms; the rest is room for the
/// reader's own merges (tens of ms: a merge holds the copy, and the
/// judging thread, which holds it longer, lets the reader drain the ring
/// meanwhile). Its pages are resident twice in memprof's RSS (the kernel
/// maps the data twice, for records that wrap).
const GC_EVENTS_BYTES: u32 = 4 << 20;
/// The ring when one refill in K > 1 is followed (`--gc-refill-every`,
/// the agent's way): K times fewer events; a program followed for days
/// would otherwise keep 8 MB of its ring resident in memprof.
const THINNED_GC_EVENTS_BYTES: u32 = 1 << 20;

/// The options a plan depends on.
pub struct Choice {
    pub heap: Heap,
    pub unwind: Unwind,
    pub probe_at_entry: bool,
    /// `--gc-sampling refill`.
    pub gc_refill: bool,
    /// A process `run` follows: what the command's plan said already
    /// (unwind table sizes, sampling notes) is not said again.
    pub quiet: bool,
}

impl Choice {
    /// What the plan depends on, of a session's options.
    pub fn of(options: &SessionOptions) -> Choice {
        Choice {
            heap: options.heap,
            unwind: options.unwind,
            probe_at_entry: options.probe_at_entry,
            gc_refill: options.gc_sampling == GcSampling::Refill,
            quiet: options.followed,
        }
    }
}

/// What to attach where.
pub struct Plan {
    /// The target's module files, each read once for the whole session.
    pub modules: ModuleCache,
    pub probes: Vec<Planned>,
    /// CFI tables of the target's modules (DWARF unwinding), else `None`.
    pub tables: Option<Tables>,
    /// How Boehm allocations are sampled, as planned.
    pub gc_sampling: PlannedGcSampling,
}

/// `--gc-sampling refill`, as the target's libgc allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedGcSampling {
    /// Every allocation (`--gc-sampling exact`, or no libgc).
    Exact,
    /// At refills, with this libgc's layout (in `module`).
    Refill {
        module: PathBuf,
        layout: crate::gc::refill::RefillLayout,
    },
    /// Asked for, not possible here (said once): sampled by bytes instead.
    ByBytes,
}

/// `--sample-bytes` when refill sampling is not possible.
pub const REFILL_FALLBACK_SAMPLE_BYTES: u64 = 512 * 1024;

impl Plan {
    /// The probes are loaded (the kernel has the unwind rows): what was
    /// read to build them is given back.
    pub fn loaded(&mut self) {
        if let Some(tables) = &mut self.tables {
            tables.release_rows();
        }
        self.modules.release_pages();
        crate::memory::trim();
    }

    /// Finds the allocator functions of the chosen heaps in process
    /// `pid`'s `exe` and libraries `loaded` (paths as `pid` sees them,
    /// opened through it: [`ModuleCache::of_process`]), places their
    /// probes, and builds the unwind tables.
    pub fn new(
        cache: ModuleCache,
        exe: &Path,
        loaded: &[PathBuf],
        choice: &Choice,
    ) -> Result<Plan> {
        let modules = tracee::modules(exe, loaded);
        let libc = allocators::resolve(&cache, &modules, LIBC)?;
        let mut gc = allocators::resolve(&cache, &modules, BOEHM)?;
        let mut gc_table = BOEHM;
        let mut gc_sampling = PlannedGcSampling::Exact;
        if choice.gc_refill && choice.heap != Heap::Libc {
            gc_sampling = plan_refill(&cache, &gc, choice.quiet);
            if let PlannedGcSampling::Refill { .. } = gc_sampling {
                gc = allocators::resolve(&cache, &modules, BOEHM_REFILL)?;
                gc_table = BOEHM_REFILL;
            }
        }
        let (libc_ok, gc_ok) = (
            allocators::require(&libc, LIBC, &modules),
            allocators::require(&gc, gc_table, &modules),
        );
        let resolved: Vec<_> = match choice.heap {
            Heap::Libc => {
                libc_ok?;
                libc
            }
            Heap::Gc => {
                gc_ok?;
                gc
            }
            Heap::All => match (libc_ok.is_ok(), gc_ok.is_ok()) {
                (false, false) => return Err(libc_ok.unwrap_err()),
                (true, false) => libc,
                (false, true) => gc,
                (true, true) => libc.into_iter().chain(gc).collect(),
            },
        };
        let tables = match choice.unwind {
            Unwind::Fp => None,
            Unwind::Auto | Unwind::Dwarf => {
                let started = Instant::now();
                let tables = Tables::build(&cache, &modules);
                if !choice.quiet {
                    eprintln!(
                        "memprof: unwind tables: {} rows from {} modules ({:.1} s)",
                        report::thousands(tables.rows.len() as u64),
                        tables.module_count(),
                        started.elapsed().as_secs_f64()
                    );
                }
                Some(tables)
            }
        };
        Ok(Plan {
            modules: cache,
            probes: placement::plan(&resolved, choice.probe_at_entry),
            tables,
            gc_sampling,
        })
    }

    /// The module holding the probed Boehm GC (libgc.so or the executable).
    pub fn gc_module(&self) -> Option<PathBuf> {
        self.probes
            .iter()
            .find(|p| matches!(p.func.func.kind, AllocKind::Gc | AllocKind::GcAtomic))
            .map(|p| p.func.module.clone())
    }

    pub fn unwind_name(&self) -> &'static str {
        if self.tables.is_some() {
            "dwarf"
        } else {
            "fp"
        }
    }

    /// The map sizes and modes to load the probes with.
    pub fn probe_options(&self, options: &SessionOptions) -> ProbeOptions {
        let mut probes = options.probes.clone();
        if self.gc_module().is_some() && options.gc_liveness == GcLiveness::Marks {
            probes.gc_events_bytes = GC_EVENTS_BYTES;
        }
        match self.gc_sampling {
            // Every allocator by bytes, unless asked for a distance already.
            PlannedGcSampling::ByBytes if probes.sample_bytes == 0 => {
                probes.sample_bytes = REFILL_FALLBACK_SAMPLE_BYTES
            }
            PlannedGcSampling::Refill { .. } => {
                probes.gc_refill = true;
                if probes.gc_refill_every > 1 && probes.gc_events_bytes > 0 {
                    probes.gc_events_bytes = THINNED_GC_EVENTS_BYTES;
                }
            }
            _ => {}
        }
        probes
    }
}

/// Refill sampling in the libgc of `gc` (the resolved `BOEHM` functions),
/// or why not (said here once).
fn plan_refill(cache: &ModuleCache, gc: &[ResolvedFn], quiet: bool) -> PlannedGcSampling {
    let Some(module) = gc.first().map(|f| f.module.clone()) else {
        if !quiet {
            eprintln!("memprof: note: --gc-sampling refill: the target has no Boehm GC; its allocations are followed as usual");
        }
        return PlannedGcSampling::Exact;
    };
    let layout = cache
        .get(&module)
        .map_err(anyhow::Error::from)
        .and_then(|m| crate::gc::refill::RefillLayout::derive(&m));
    match layout {
        Ok(layout) => {
            if layout.size_reg.is_none() {
                eprintln!(
                    "memprof: note: --gc-sampling refill: the requested size is not kept across the refill in {}; samples count the collector's object size",
                    module.display()
                );
            }
            PlannedGcSampling::Refill { module, layout }
        }
        Err(e) => {
            eprintln!(
                "memprof: note: --gc-sampling refill is not possible here ({e:#}); sampling by bytes instead (--sample-bytes {REFILL_FALLBACK_SAMPLE_BYTES})"
            );
            PlannedGcSampling::ByBytes
        }
    }
}

/// `memprof probes`: where each probe would go in `pid`, and why.
pub fn plan_for_pid(pid: u32, probe_at_entry: bool, heap: Heap) -> Result<Vec<Planned>> {
    let target = Tracee::attach(pid)?;
    let loaded: Vec<PathBuf> = maps::read(pid)?.into_iter().map(|m| m.path).collect();
    let choice = Choice {
        heap,
        unwind: Unwind::Fp, // the tables are not needed to show placements
        probe_at_entry,
        gc_refill: false,
        quiet: false,
    };
    Ok(Plan::new(ModuleCache::of_process(pid), &target.exe, &loaded, &choice)?.probes)
}
