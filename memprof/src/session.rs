//! One profiling session, start to end: the pipeline the other modules
//! implement, in order.
//!
//! 1. find the target ([`crate::target`]) and its allocator functions
//!    ([`crate::allocators`]), choose probe offsets ([`crate::placement`]);
//! 2. load and attach the probes ([`crate::probes`]) — for `run`, while the
//!    command is held right after its `exec`;
//! 3. wait for the end: the target exits, Ctrl-C / SIGTERM, or `--duration`;
//!    meanwhile keep a view of its mappings for symbolization;
//! 4. detach, read the kernel's tables ([`crate::heap`]), symbolize
//!    ([`crate::symbolize`]), write the profile ([`crate::profile`]) and print
//!    the top of the table ([`crate::report`]).
//!
//! The probes are detached on every path out: [`Probes`] closes its links
//! when dropped, and the kernel closes them if memprof itself dies.
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use memprof_common::AllocKind;

use crate::allocators::{self, BOEHM, LIBC};
use crate::gc::pass::Judge;
use crate::live::{Live, LiveOptions};
use crate::modules::ModuleCache;
use crate::placement::{self, Planned};
use crate::probes::{ProbeOptions, Probes};
use crate::profile::{ExitInfo, ProbeInfo, Profile, TargetInfo};
use crate::report::{self, markdown};
use crate::target::launch::{self, ExitStatus};
use crate::target::maps::{self, MapsCache};
use crate::target::trace::{Event, Tracer};
use crate::target::{self, Target};
use crate::unwind::Tables;
use crate::{heap, symbolize};

/// How often the mappings are re-read while the target runs.
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// `run`: after Ctrl-C, how long to wait for the command to exit by itself
/// (it usually got the same Ctrl-C) before detaching from it.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Which allocator families to probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Heap {
    /// libc (malloc & co, mmap) and the Boehm GC, whichever the target has.
    All,
    /// Only the Boehm GC (`GC_malloc` & co).
    Gc,
    /// Only libc: malloc & co and mmap.
    Libc,
}

/// How to capture stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    /// DWARF: right for code with and without frame pointers.
    Auto,
    /// Frame pointers only (cheaper; short stacks for code without them).
    Fp,
    /// CFI tables from each module's .eh_frame, unwound in the kernel.
    Dwarf,
}

/// Settings shared by `run` and `attach`.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub output: Option<PathBuf>,
    pub probes: ProbeOptions,
    pub probe_at_entry: bool,
    pub duration: Option<Duration>,
    pub heap: Heap,
    pub unwind: Unwind,
    /// Rows of the table printed at the end.
    pub top: usize,
    /// Timeline sampling, `--interval`, `--snapshot-every`.
    pub live: LiveOptions,
    pub gc_liveness: GcLiveness,
    /// Write every mark-bit verdict here (`--gc-verdicts`, for tests).
    pub gc_verdicts: Option<PathBuf>,
}

/// How dead Boehm GC objects are recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GcLiveness {
    /// Read the collector's mark bits after every collection (the
    /// collecting thread is held meanwhile; memprof traces the target),
    /// plus address reuse.
    Marks,
    /// Only address reuse: an object counts as live until GC_free or
    /// until its address is allocated again (no tracing, no pause).
    Reuse,
}

/// What to attach where, decided before anything is attached.
pub struct Plan {
    pub probes: Vec<Planned>,
    /// CFI tables of the target's modules (DWARF unwinding), else `None`.
    pub tables: Option<Tables>,
    /// The target's module files, each read once for the whole session.
    pub modules: ModuleCache,
}

impl Plan {
    /// The module holding the probed Boehm GC (libgc.so or the executable).
    fn gc_module(&self) -> Option<PathBuf> {
        self.probes
            .iter()
            .find(|p| matches!(p.func.func.kind, AllocKind::Gc | AllocKind::GcAtomic))
            .map(|p| p.func.module.clone())
    }

    fn unwind_name(&self) -> &'static str {
        if self.tables.is_some() {
            "dwarf"
        } else {
            "fp"
        }
    }
}

/// `memprof run`: launches `command` under the probes. Returns the exit code
/// memprof should exit with (the command's own).
pub fn run(command: &[String], options: &SessionOptions) -> Result<i32> {
    require_root()?;
    let exe = target::find_command(&command[0])?;
    let output = Output::create(options.output.as_ref(), &exe, None)?;
    let plan = plan_for(&exe, &[], options)?;
    let mut probes = Probes::load(&probe_options(&plan, options), plan.tables.as_ref())?;

    let signals = Signals::block()?;
    let mut child = launch::launch(&exe, command, &signals.original)?;
    let pid = child.pid;
    let mut maps = MapsCache::default();
    let mut gc = GcWatch::new(&plan, options, pid);
    let prepared = probes.attach(pid, &plan.probes).and_then(|()| {
        probes.set_traced(pid)?;
        gc.start(&mut probes, pid)?;
        if let Some(tables) = &plan.tables {
            update_ranges(&mut probes, tables, &mut maps, pid)?;
            // Libraries are mapped by the dynamic linker after this point:
            // have it stop the command each time, to place them in time.
            if let Some(ld_so) = target::interpreter(&plan.modules, &exe) {
                let dl_debug_state =
                    allocators::symbol_in(&plan.modules, &ld_so, "_dl_debug_state");
                if let Some((_, offset)) = dl_debug_state {
                    probes.watch_library_loads(pid, &ld_so, offset)?;
                }
            }
        }
        Ok(())
    });
    if let Err(e) = prepared {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = child.poll(&mut |_| {});
        return Err(e);
    }
    let started = (Instant::now(), SystemTime::now());
    let mut live = Live::new(options.live.clone(), started.0, &output.path);
    let header = || describe("run", pid, command, &exe, &plan, started);
    child.resume_signal(pid, 0, false);
    eprintln!(
        "memprof: profiling {} (pid {pid}, {} probes, {} unwinding)",
        command.join(" "),
        probes.attached,
        plan.unwind_name()
    );

    let deadline = options.duration.map(|d| started.0 + d);
    let mut grace: Option<Instant> = None;
    let mut last_refresh = Instant::now();
    let status = loop {
        match signals.wait(live.timeout(Duration::from_millis(200))) {
            Some(sig) if sig == libc::SIGINT || sig == libc::SIGTERM => {
                grace.get_or_insert(Instant::now() + EXIT_GRACE);
            }
            _ => {}
        }
        let exited = follow(&mut child, &mut probes, &mut gc, &plan, &mut maps)?;
        if exited.is_some() {
            break exited;
        }
        gc.drain(&mut probes);
        let now = Instant::now();
        if grace.is_some_and(|g| now >= g) || deadline.is_some_and(|d| now >= d) {
            maps.refresh(pid);
            gc.read_heap_stats();
            probes.stop_holding()?;
            child.detach();
            eprintln!("memprof: stopped profiling; pid {pid} keeps running");
            break None;
        }
        if now - last_refresh >= MAPS_REFRESH {
            refresh(&mut probes, &plan, &mut maps, pid)?;
            last_refresh = now;
        }
        let gc_heap = live.sample_due().then(|| gc.heap_size_now()).flatten();
        live.tick(&probes, &maps, gc.sites(), gc_heap, &header)?;
    };
    if let Some(status) = status {
        eprintln!("memprof: {} {status}", command.join(" "));
    }
    let target = Target {
        pid,
        exe,
        command: command.to_vec(),
    };
    let exit = status.map(|s| match s {
        ExitStatus::Code(c) => ExitInfo {
            code: Some(c),
            signal: None,
        },
        ExitStatus::Signal(s) => ExitInfo {
            code: None,
            signal: Some(s),
        },
    });
    // `signals` stays blocked until the profile is written (dropped on
    // return): a second Ctrl-C must not lose it.
    finish(
        "run", &target, probes, gc, &plan, &maps, started, exit, output, options, live,
    )?;
    Ok(status.map_or(0, ExitStatus::shell_code))
}

/// `memprof attach`: profiles a running process until Ctrl-C, SIGTERM,
/// `--duration` or its exit, and leaves it running.
pub fn attach(pid: u32, options: &SessionOptions) -> Result<i32> {
    if !target::is_alive(pid) {
        bail!("no process with pid {pid}");
    }
    require_root()?;
    let target = Target::attach(pid)?;
    let loaded: Vec<PathBuf> = maps::read(pid)
        .with_context(|| format!("cannot read the mappings of pid {pid}"))?
        .into_iter()
        .map(|m| m.path)
        .collect();
    let output = Output::create(options.output.as_ref(), &target.exe, Some(pid))?;
    let plan = plan_for(&target.exe, &loaded, options)?;
    let mut probes = Probes::load(&probe_options(&plan, options), plan.tables.as_ref())?;
    let signals = Signals::block()?;
    let mut maps = MapsCache::default();
    if let Some(tables) = &plan.tables {
        update_ranges(&mut probes, tables, &mut maps, pid)?;
    }
    // Collections are watched before allocations are: every GC object
    // recorded then reaches the mark-bit pass's copy.
    let mut gc = GcWatch::new(&plan, options, pid);
    let mut tracer = gc.trace(&mut probes, pid)?;
    if let Err(e) = probes.attach(pid, &plan.probes) {
        if let Some(tracer) = &mut tracer {
            tracer.detach();
        }
        return Err(e);
    }
    let started = (Instant::now(), SystemTime::now());
    let mut live = Live::new(options.live.clone(), started.0, &output.path);
    let header = || describe("attach", pid, &target.command, &target.exe, &plan, started);
    eprintln!(
        "memprof: attached to pid {pid} ({} probes, {} unwinding); Ctrl-C to stop{}",
        probes.attached,
        plan.unwind_name(),
        options
            .duration
            .map(|d| format!(", or wait {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );

    let deadline = options.duration.map(|d| started.0 + d);
    let mut last_refresh = Instant::now();
    let mut exited = false;
    loop {
        if let Some(sig) = signals.wait(live.timeout(Duration::from_millis(100))) {
            if sig == libc::SIGINT || sig == libc::SIGTERM {
                break;
            }
        }
        if let Some(tracer) = &mut tracer {
            follow(tracer, &mut probes, &mut gc, &plan, &mut maps)?;
        }
        gc.drain(&mut probes);
        if !target::is_alive(pid) {
            exited = true;
            eprintln!("memprof: pid {pid} exited");
            break;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        if now - last_refresh >= MAPS_REFRESH {
            refresh(&mut probes, &plan, &mut maps, pid)?;
            last_refresh = now;
        }
        let gc_heap = live.sample_due().then(|| gc.heap_size_now()).flatten();
        live.tick(&probes, &maps, gc.sites(), gc_heap, &header)?;
    }
    maps.refresh(pid);
    if !exited {
        gc.read_heap_stats();
    }
    // No new holds, then let every thread go.
    probes.stop_holding()?;
    if let Some(tracer) = &mut tracer {
        tracer.detach();
    }
    // `signals` stays blocked until the profile is written (dropped on
    // return): a second Ctrl-C must not lose it.
    let exit = exited.then_some(ExitInfo {
        code: None,
        signal: None,
    });
    finish(
        "attach", &target, probes, gc, &plan, &maps, started, exit, output, options, live,
    )?;
    Ok(0)
}

/// Handles what the traced target did since the last call: its exit stop
/// (mappings and GC heap figures read while they exist), memprof's own
/// signals (a library load: new unwinding ranges; a collection held: the
/// mark-bit pass), and its exit, returned.
fn follow(
    tracer: &mut Tracer,
    probes: &mut Probes,
    gc: &mut GcWatch,
    plan: &Plan,
    maps: &mut MapsCache,
) -> Result<Option<ExitStatus>> {
    let pid = tracer.pid;
    while let Some(event) = tracer.poll(&mut |tid| {
        let _ = probes.set_traced(tid);
    })? {
        match event {
            Event::Exiting => {
                maps.refresh(pid);
                gc.read_heap_stats();
            }
            Event::Signal { tid, signal } => {
                let ours = if signal == libc::SIGTRAP {
                    let load = tid == pid && probes.take_library_load_signal()?;
                    if load {
                        if let Some(tables) = &plan.tables {
                            update_ranges(probes, tables, maps, pid)?;
                        }
                    }
                    load
                } else {
                    gc.on_hold(probes, tid)?
                };
                tracer.resume_signal(tid, signal, !ours);
            }
            Event::Exited(status) => return Ok(Some(status)),
        }
    }
    Ok(None)
}

/// Re-reads the mappings: for symbolization and, when unwinding with DWARF,
/// for the kernel's module ranges.
fn refresh(probes: &mut Probes, plan: &Plan, maps: &mut MapsCache, pid: u32) -> Result<()> {
    match &plan.tables {
        Some(tables) => update_ranges(probes, tables, maps, pid),
        None => {
            maps.refresh(pid);
            Ok(())
        }
    }
}

fn update_ranges(
    probes: &mut Probes,
    tables: &Tables,
    maps: &mut MapsCache,
    pid: u32,
) -> Result<()> {
    if let Some(now) = maps.refresh(pid) {
        probes.set_module_ranges(&tables.ranges(&now))?;
    }
    Ok(())
}

/// `memprof probes`: where each probe would go in `pid`, and why.
pub fn plan_for_pid(pid: u32, probe_at_entry: bool, heap: Heap) -> Result<Vec<Planned>> {
    let target = Target::attach(pid)?;
    let loaded: Vec<PathBuf> = maps::read(pid)?.into_iter().map(|m| m.path).collect();
    let options = SessionOptions {
        output: None,
        probes: ProbeOptions {
            max_live: 1,
            max_stacks: 1,
            max_sites: 1,
            empty: false,
            gc_events_bytes: 0,
        },
        probe_at_entry,
        duration: None,
        heap,
        unwind: Unwind::Fp, // the tables are not needed to show placements
        top: 0,
        live: LiveOptions::default(),
        gc_liveness: GcLiveness::Reuse,
        gc_verdicts: None,
    };
    Ok(plan_for(&target.exe, &loaded, &options)?.probes)
}

/// Finds the allocator functions of the chosen heaps, places their probes,
/// and builds the unwind tables.
fn plan_for(exe: &std::path::Path, loaded: &[PathBuf], options: &SessionOptions) -> Result<Plan> {
    let cache = ModuleCache::default();
    let modules = target::modules(&cache, exe, loaded);
    let libc = allocators::resolve(&cache, &modules, LIBC)?;
    let gc = allocators::resolve(&cache, &modules, BOEHM)?;
    let (libc_ok, gc_ok) = (
        allocators::require(&libc, LIBC, &modules),
        allocators::require(&gc, BOEHM, &modules),
    );
    let resolved: Vec<_> = match options.heap {
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
    let tables = match options.unwind {
        Unwind::Fp => None,
        Unwind::Auto | Unwind::Dwarf => {
            let started = Instant::now();
            let tables = Tables::build(&cache, &modules);
            eprintln!(
                "memprof: unwind tables: {} rows from {} modules ({:.1} s)",
                report::thousands(tables.rows.len() as u64),
                tables.module_count(),
                started.elapsed().as_secs_f64()
            );
            Some(tables)
        }
    };
    Ok(Plan {
        probes: placement::plan(&resolved, options.probe_at_entry),
        tables,
        modules: cache,
    })
}

/// The GC event ring buffer: enough for ~1M allocations between two reads
/// (the session reads it at least every 200 ms, and at each collection).
const GC_EVENTS_BYTES: u32 = 64 << 20;

fn probe_options(plan: &Plan, options: &SessionOptions) -> ProbeOptions {
    let mut probes = options.probes.clone();
    if plan.gc_module().is_some() && options.gc_liveness == GcLiveness::Marks {
        probes.gc_events_bytes = GC_EVENTS_BYTES;
    }
    probes
}

/// The mark-bit passes of a session with a GC heap, or why there are none.
struct GcWatch {
    judge: Option<Judge>,
    /// Why dead GC objects are found by address reuse only (no GC heap: None).
    fallback: Option<String>,
    /// The collector's heap figures at the end.
    heap_stats: Option<crate::gc::HeapStats>,
    pid: u32,
}

impl GcWatch {
    fn new(plan: &Plan, options: &SessionOptions, pid: u32) -> GcWatch {
        let mut watch = GcWatch {
            judge: None,
            fallback: None,
            heap_stats: None,
            pid,
        };
        let Some(module) = plan.gc_module() else {
            return watch;
        };
        if options.gc_liveness == GcLiveness::Reuse {
            watch.fallback = Some("--gc-liveness reuse".into());
            return watch;
        }
        match Judge::new(&plan.modules, pid, &module, options.gc_verdicts.as_deref()) {
            Ok(judge) => watch.judge = Some(judge),
            Err(e) => watch.fall_back(format!("{e:#}")),
        }
        watch
    }

    /// Says once why mark bits are not read, and stops reading them.
    fn fall_back(&mut self, why: String) {
        eprintln!("memprof: GC mark bits not read ({why}); dead GC objects are found by address reuse only");
        self.judge = None;
        self.fallback = Some(why);
    }

    /// Attaches the collection probes (the caller traces the target).
    fn start(&mut self, probes: &mut Probes, pid: u32) -> Result<()> {
        if let Some(judge) = &self.judge {
            probes.watch_collections(pid, judge.module(), &judge.collection_offsets())?;
        }
        Ok(())
    }

    /// `attach`: traces the target's threads so collectors can be held, and
    /// attaches the collection probes. `None` without a GC heap or when
    /// tracing is refused (then address reuse only).
    fn trace(&mut self, probes: &mut Probes, pid: u32) -> Result<Option<Tracer>> {
        if self.judge.is_none() {
            return Ok(None);
        }
        match Tracer::seize(pid, &mut |tid| {
            let _ = probes.set_traced(tid);
        }) {
            Ok(tracer) => {
                self.start(probes, pid)?;
                Ok(Some(tracer))
            }
            Err(e) => {
                self.fall_back(format!("{e:#}"));
                Ok(None)
            }
        }
    }

    /// A thread stopped with the hold signal: if the kernel is holding it
    /// at a collection, judge the tracked objects now. Returns whether the
    /// signal was memprof's.
    fn on_hold(&mut self, probes: &mut Probes, tid: u32) -> Result<bool> {
        let Some(epoch) = probes.take_held(tid)? else {
            return Ok(false);
        };
        let Some(judge) = &mut self.judge else {
            return Ok(true);
        };
        probes.drain_gc_events(|event| judge.apply(event));
        let result = judge.pass(epoch).and_then(|dead| probes.forget_live(&dead));
        if let Err(e) = result {
            judge.not_judged(1);
            self.fall_back(format!("the mark-bit pass failed: {e:#}"));
            probes.stop_holding()?;
        }
        Ok(true)
    }

    /// Keeps the copy of the GC objects current (the ring buffer must not fill).
    fn drain(&mut self, probes: &mut Probes) {
        if let Some(judge) = &mut self.judge {
            probes.drain_gc_events(|event| judge.apply(event));
        }
    }

    /// The collector's heap figures, while the target's memory is readable.
    fn read_heap_stats(&mut self) {
        if let Some(stats) = self.judge.as_mut().and_then(|j| j.heap_stats()) {
            self.heap_stats = Some(stats);
        }
    }

    /// `GC_get_heap_size()` now (for the timeline), where readable.
    fn heap_size_now(&mut self) -> Option<u64> {
        self.read_heap_stats();
        self.heap_stats.as_ref().map(|s| s.heap_size)
    }

    fn sites(&self) -> Option<&[(memprof_common::AllocSite, crate::gc::pass::SiteGc)]> {
        self.judge.as_ref().map(|j| j.sites())
    }

    fn summary(&mut self, probes: &Probes) -> Option<crate::profile::GcSummary> {
        let _ = self.pid;
        let mut summary = match (&mut self.judge, &self.fallback) {
            (Some(judge), _) => {
                let _ = judge.finish();
                let mut s = judge.summary().clone();
                s.collections_not_judged += probes.collections_not_held().unwrap_or(0);
                s.events_lost = probes.gc_events_lost().unwrap_or(0);
                s
            }
            (None, Some(why)) => crate::profile::GcSummary {
                liveness: format!("address reuse only ({why}): a GC object counts as live until GC_free or until its address is allocated again"),
                ..Default::default()
            },
            (None, None) => return None,
        };
        if let Some(stats) = &self.heap_stats {
            summary.heap_size = Some(stats.heap_size);
            summary.free_bytes = Some(stats.free_bytes);
            summary.unmapped_bytes = Some(stats.unmapped_bytes);
        }
        Some(summary)
    }
}

/// Detaches, collects, symbolizes, writes the profile, prints the summary.
#[allow(clippy::too_many_arguments)]
fn finish(
    mode: &str,
    target: &Target,
    probes: Probes,
    mut gc: GcWatch,
    plan: &Plan,
    maps: &MapsCache,
    started: (Instant, SystemTime),
    exit: Option<ExitInfo>,
    mut output: Output,
    options: &SessionOptions,
    live: Live,
) -> Result<()> {
    let duration = started.0.elapsed();
    let attached = probes.attached;
    let gc_summary = gc.summary(&probes);
    let (heap_maps, detaching) = probes.stop()?;
    let counters = heap_maps.counters()?;
    let raw = heap::collect(&heap_maps, gc.sites())?;
    drop(heap_maps);
    let groups = symbolize::symbolize(raw, maps, true);
    let timeline = live.into_timeline(
        &groups,
        duration.as_secs_f64(),
        gc_summary.as_ref().and_then(|g| g.heap_size),
    );
    let profile = Profile {
        duration_s: duration.as_secs_f64(),
        exit,
        gc: gc_summary,
        counters,
        groups,
        timeline,
        ..describe(
            mode,
            target.pid,
            &target.command,
            &target.exe,
            plan,
            started,
        )
    };
    let mut buffered = std::io::BufWriter::new(&mut output.file);
    crate::profile::write(&profile, &mut buffered)
        .and_then(|_| Ok(buffered.flush()?))
        .with_context(|| format!("cannot write profile to {}", output.path.display()))?;
    output.written = true;
    let output = output.path.clone();

    let mut stderr = std::io::stderr().lock();
    writeln!(stderr)?;
    markdown::header(&profile, &mut stderr)?;
    let table = report::Options {
        top: Some(options.top),
        ..report::Options::default()
    };
    markdown::table(&profile, &table, &mut stderr)?;
    writeln!(stderr)?;
    writeln!(
        stderr,
        "memprof: profile written to {} (memprof report {} --format markdown|tsv|json)",
        output.display(),
        output.display()
    )?;
    eprintln!(
        "memprof: detaching {} probes (the kernel takes ~0.1 s each)",
        attached
    );
    detaching.wait();
    Ok(())
}

/// The metadata of a profile (for `--snapshot-every` and `--interval`):
/// what [`finish`] writes, less the tables.
fn describe(
    mode: &str,
    pid: u32,
    command: &[String],
    exe: &std::path::Path,
    plan: &Plan,
    started: (Instant, SystemTime),
) -> Profile {
    Profile {
        memprof_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: mode.to_string(),
        target: TargetInfo {
            pid,
            command: command.to_vec(),
            exe: exe.display().to_string(),
        },
        start_unix_s: started
            .1
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        unwind: plan.unwind_name().to_string(),
        probes: plan
            .probes
            .iter()
            .map(|p| ProbeInfo {
                function: p.func.func.symbol.to_string(),
                module: p.func.module.display().to_string(),
                entry_offset: p.placement.offset,
                emulated: p.placement.emulated,
                reason: p.placement.reason.clone(),
            })
            .collect(),
        ..Profile::default()
    }
}

/// The profile file, created up front so a bad path fails before anything
/// is attached; removed again if the session fails before writing it.
struct Output {
    path: PathBuf,
    file: File,
    written: bool,
}

impl Output {
    fn create(given: Option<&PathBuf>, exe: &std::path::Path, pid: Option<u32>) -> Result<Output> {
        let path = match given {
            Some(p) => p.clone(),
            None => {
                let name = allocators::short(exe);
                PathBuf::from(match pid {
                    Some(pid) => format!("{name}-{pid}.mprof"),
                    None => format!("{name}.mprof"),
                })
            }
        };
        let file = File::create(&path)
            .map_err(|e| anyhow::anyhow!("cannot write profile to {}: {}", path.display(), e))?;
        Ok(Output {
            path,
            file,
            written: false,
        })
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn require_root() -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "memprof must run as root: loading eBPF programs and attaching uprobes needs CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (try sudo)"
        );
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGCHLD, blocked and received synchronously with
/// `sigtimedwait`, so the wait loop wakes at once when the target stops or
/// the user interrupts, without handlers. The mask is restored on drop.
struct Signals {
    set: libc::sigset_t,
    /// The mask before blocking: what a launched command must start with.
    original: libc::sigset_t,
}

impl Signals {
    fn block() -> Result<Signals> {
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut original: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
                libc::sigaddset(&mut set, sig);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut original) != 0 {
                bail!("cannot block signals");
            }
            Ok(Signals { set, original })
        }
    }

    /// Waits up to `timeout` for one of the signals.
    fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.original, std::ptr::null_mut()) };
    }
}
