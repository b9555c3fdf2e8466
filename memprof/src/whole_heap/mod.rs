//! `memprof heap --pid N`: a one-shot census of a running program's whole
//! Boehm GC heap, judged by the collector itself, and where its RSS goes.
//!
//! 1. find the libgc the target uses and derive its layout
//!    ([`HeapReader`]); name the program's Crystal type ids from its code
//!    ([`crate::symbolize::type_ids`]);
//! 2. look at the program between collections ([`idle`]): stopped a
//!    moment, its collector at rest, and little allocated since its last
//!    collection (or `--wait 0`), the heap is copied then and there from
//!    the marks that collection left; the report says which collection,
//!    and the bytes allocated since, not classified ([`Taken::AtRest`]);
//! 3. otherwise (saying why on stderr) trace the target and put a probe on
//!    `GC_gc_no++` only (no allocation probe): the next collection stops
//!    its collector at the end of marking ([`crate::probes`], the hold of
//!    the mark-bit passes); while held: copy the block index, headers,
//!    mark bits and the memory of the blocks with marked objects
//!    ([`HeapReader::copy`]), the mappings and the resident pages of the
//!    heap blocks ([`rss::read`]); let the target go, untraced, probes
//!    removed ([`Taken::Held`]);
//! 4. judge every object ([`crate::gc::census::HeapCopy::census`]), name
//!    the types, with `--sizes` their retained bytes
//!    ([`crate::gc::census::HeapCopy::retained`]), build the RSS table
//!    ([`rss::table`]) and write the report ([`report`]).
//!
//! No collection within `--wait` seconds: the census from the last
//! collection's marks as in 2, saying so; one error line, exit 1, only if
//! there is none (or its collector is never at rest); the target is let
//! go as it was.
pub mod graph;
pub mod idle;
pub mod report;
pub mod roots;
pub mod rss;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::allocators::{self, BOEHM};
use crate::driver::{Driven, Driver, Flow};
use crate::gc::census::{Census, Counters, HeapCopy, HeapReader};
use crate::modules::ModuleCache;
use crate::outfile::OutFile;
use crate::probes::{ProbeOptions, Probes};
use crate::report::thousands;
use crate::symbolize::type_ids::{type_names, TypeNames, TypeOf};
use crate::tracee::preflight::{mapped_files, require_capabilities};
use crate::tracee::trace::{Event, Tracer};
use crate::tracee::{self, Tracee};

pub use report::HeapFormat;

/// `memprof heap` settings.
#[derive(Debug, Clone)]
pub struct HeapOptions {
    /// How long to wait for a collection.
    pub wait: Duration,
    pub format: HeapFormat,
    pub output: Option<PathBuf>,
    /// Type rows shown (markdown); all when `None`.
    pub top: Option<usize>,
    /// `--sizes`: retained bytes per type (large scanned objects are
    /// copied whole at the hold for it).
    pub sizes: bool,
    /// `--graph TYPE`, with `--ref-level` and `--ref-limit`.
    pub graph: Option<(String, usize, usize)>,
}

/// Everything the report is made of.
pub struct HeapReport {
    pub target: Tracee,
    pub copy: HeapCopy,
    pub census: Census,
    pub names: TypeNames,
    pub rss: Vec<rss::Row>,
    /// `--sizes`: retained bytes per type id.
    pub retained: Option<std::collections::BTreeMap<u32, u64>>,
    /// `--graph`: the referrers of a type's objects.
    pub graph: Option<graph::RefGraph>,
    /// `/proc/PID/smaps_rollup`'s Rss at the hold, to compare the table with.
    pub rollup_rss: Option<u64>,
    /// How long the collector was held (or the program stopped), and the
    /// census took afterwards.
    pub held: Duration,
    pub judged: Duration,
    /// At a held collection, or between collections.
    pub taken: Taken,
}

/// When the census was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// At a collection, its collector held at the end of its marking:
    /// every object judged.
    Held,
    /// Between collections, the program stopped and its collector at rest
    /// ([`idle`]): the last collection's marks; what was allocated since
    /// is not classified.
    AtRest {
        /// Bytes allocated since that collection (`GC_bytes_allocd`).
        allocated_since: Option<u64>,
        /// Why at rest and not at a collection, when the program was
        /// waited for in vain.
        note: Option<String>,
    },
}

/// The probes and the tracer while attached: on every way out, first no
/// more holds, then every thread let go (a held one without the signal).
struct Attached {
    probes: Probes,
    tracer: Tracer,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = self.probes.stop_holding();
        self.tracer.detach();
    }
}

/// `memprof heap --pid PID`.
pub fn run(driver: &Driver, pid: u32, options: &HeapOptions) -> Result<()> {
    if !tracee::is_alive(pid) {
        bail!("no process with pid {pid}");
    }
    require_capabilities()?;
    let target = Tracee::attach(pid)?;
    tracee::check_architecture(pid, &target.exe)?;
    let cache = ModuleCache::of_process(pid);
    let modules = tracee::modules(&target.exe, &mapped_files(pid)?);
    let gc_module = allocators::resolve(&cache, &modules, BOEHM)?
        .into_iter()
        .find(|r| r.func.symbol == "GC_malloc")
        .map(|r| r.module)
        .ok_or_else(|| {
            anyhow!(
                "pid {pid} ({}) has no Boehm GC heap: GC_malloc is defined neither in it nor in a library it loaded (`memprof heap` reads the heap of programs using the Boehm GC, as Crystal's do)",
                allocators::short(&target.exe)
            )
        })?;
    let reader = HeapReader::new(cache.get(&gc_module)?)?;
    let names = type_names(&*cache.get(&target.exe)?);
    // A destination that cannot be written fails before attaching.
    let file = options.output.as_deref().map(OutFile::create).transpose()?;
    // Retained sizes and the graph need the words of large scanned objects.
    let whole = options.sizes || options.graph.is_some();
    let parts = (whole, options.graph.is_some());
    // libgc's code in the target, to tell a thread collecting (not when
    // libgc is linked into the program).
    let gc_code: Option<Vec<(u64, u64)>> = (gc_module != target.exe)
        .then(|| -> Result<Vec<(u64, u64)>> {
            let module = cache.get(&gc_module)?;
            let bias = module.load_bias(pid)?;
            Ok(module
                .code_ranges()
                .map(|(a, b)| (a.wrapping_add(bias), b.wrapping_add(bias)))
                .collect())
        })
        .transpose()?;
    let now = options.wait.is_zero();
    let (held, taken) = match idle::look(pid, &reader, gc_code.as_deref(), now, parts)? {
        idle::Look::Now(held, counters) => (
            *held,
            Taken::AtRest {
                allocated_since: counters.bytes_allocd,
                note: None,
            },
        ),
        idle::Look::Wait { why, .. } if now => bail!(
            "{why}: --wait 0 reads the marks only from a collector at rest; run `memprof heap` with --wait SECONDS to census at its next collection"
        ),
        idle::Look::Wait { why, counters } => {
            // One line, once waiting (the probe on).
            // --wait 0 is a way out only when the marks could be read.
            let hint = match counters {
                Some(c) if c.gc_no > 0 => " (--wait 0: census now from the last collection's marks)",
                _ => "",
            };
            let waiting = format!(
                "memprof: {why}: waiting up to {} s for its next collection, for an exact census{hint}",
                options.wait.as_secs_f64()
            );
            match hold_and_copy(driver, pid, &reader, (options.wait, &waiting), parts)? {
                Some(held) => (held, Taken::Held),
                None => at_rest_after_wait(
                    pid,
                    &reader,
                    gc_code.as_deref(),
                    counters,
                    options.wait,
                    parts,
                )?,
            }
        }
    };
    let report = judge(target, held, names, &cache, options, taken)?;
    // Said when something is not classified (an idle program's census
    // is exact: nothing allocated since).
    if let Taken::AtRest {
        allocated_since, ..
    } = &report.taken
    {
        if *allocated_since == Some(0) {
            return write(&report, options, file);
        }
        let since = allocated_since.map_or("an unknown number of".to_string(), thousands);
        eprintln!(
            "memprof: census from the marks of pid {pid}'s collection {}: {since} bytes allocated since are not classified",
            report.copy.gc_no
        );
    }
    write(&report, options, file)
}

/// No collection came within `--wait`: the census from the last
/// collection's marks, saying so, if there was one (and its collector is
/// at rest); else the error it always was.
fn at_rest_after_wait(
    pid: u32,
    reader: &HeapReader,
    gc_code: Option<&[(u64, u64)]>,
    counters: Option<Counters>,
    wait: Duration,
    parts: (bool, bool),
) -> Result<(Held, Taken)> {
    let never = || {
        anyhow!(
            "pid {pid} did not collect within {} s: a Boehm GC collects when the program allocates; put it under load (or have it call GC.collect) and run `memprof heap` again, or give it longer with --wait SECONDS",
            wait.as_secs_f64()
        )
    };
    if counters.is_some_and(|c| c.gc_no == 0) {
        return Err(never());
    }
    match idle::look(pid, reader, gc_code, true, parts) {
        Ok(idle::Look::Now(held, counters)) => Ok((
            *held,
            Taken::AtRest {
                allocated_since: counters.bytes_allocd,
                note: Some(format!(
                    "no collection came within {} s",
                    wait.as_secs_f64()
                )),
            },
        )),
        // Never at rest: the deadline's error, and why not the marks.
        Ok(idle::Look::Wait { why, .. }) => Err(anyhow!(
            "{}; its last collection's marks could not be read either: {why}",
            never()
        )),
        Err(e) => Err(e),
    }
}

/// Judges every object of the copy, names their types, builds the RSS
/// table and, when asked, the retained sizes and the referrers' graph.
fn judge(
    target: Tracee,
    (copy, snapshot, rollup_rss, held, root_memory): Held,
    names: TypeNames,
    cache: &ModuleCache,
    options: &HeapOptions,
    taken: Taken,
) -> Result<HeapReport> {
    let pid = target.pid;
    let started = Instant::now();
    let census = copy.census(&|word, kind, size| {
        names.type_of_given(word, crate::gc::census::is_atomic(kind), size) != TypeOf::NotAType
    });
    let rss = rss::table(&snapshot, &gc_blocks(&copy, &census));
    let graph = (options.sizes || options.graph.is_some()).then(|| copy.graph(&census.objects));
    let retained = graph
        .as_ref()
        .filter(|_| options.sizes)
        .map(|g| copy.retained(&census.objects, g));
    let ref_graph = match (&graph, &options.graph) {
        (Some(g), Some((type_name, level, limit))) => {
            let fields = crate::crystal::fields::field_names(&*cache.get(&target.exe)?);
            let mut walked = graph::walk(
                &census.objects,
                g,
                &|o| crate::gc::census::names::object_name(&names, o.word, o.kind),
                &|class, off| fields.get(class)?.get(&u64::from(off)).cloned(),
                (type_name, *level, *limit),
            )?;
            if let Some(memory) = &root_memory {
                walked.roots = roots::find(memory, &graph_nodes(&walked, &census), cache, pid);
            }
            Some(walked)
        }
        _ => None,
    };
    Ok(HeapReport {
        target,
        copy,
        census,
        names,
        rss,
        retained,
        graph: ref_graph,
        rollup_rss,
        held,
        judged: started.elapsed(),
        taken,
    })
}

/// The objects of the graph walked, with their sizes, by address.
fn graph_nodes(walked: &graph::RefGraph, census: &Census) -> Vec<(u64, u64)> {
    let objects = &census.objects;
    let mut nodes: Vec<(u64, u64)> = walked
        .nodes
        .iter()
        .filter_map(|&(a, _)| {
            let i = objects.partition_point(|o| o.start < a);
            objects.get(i).filter(|o| o.start == a).map(|o| (a, o.size))
        })
        .collect();
    nodes.sort_unstable();
    nodes
}

/// Writes the report to `file` (`-o`, written whole) or stdout.
fn write(report: &HeapReport, options: &HeapOptions, mut file: Option<OutFile>) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    let out: &mut dyn std::io::Write = match &mut file {
        Some(file) => file,
        None => &mut stdout,
    };
    let written = report::write(report, options, out)
        .and_then(|()| out.flush().map_err(Into::into))
        .and_then(|()| file.map_or(Ok(()), OutFile::commit));
    match written {
        // `memprof heap … | head` is done, not failed.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// What [`hold_and_copy`] brings back: the copy, the mappings and resident
/// pages, smaps_rollup's Rss, how long the hold lasted, and (`--graph`)
/// the memory that may hold roots.
pub(super) type Held = (
    HeapCopy,
    rss::Snapshot,
    Option<u64>,
    Duration,
    Option<roots::RootMemory>,
);

/// Attaches, waits for the next collection, copies the heap while the
/// collector is held, lets the target go. `(whole, with_roots)`: large
/// scanned objects copied whole; the memory that may hold roots read.
fn hold_and_copy(
    driver: &Driver,
    pid: u32,
    reader: &HeapReader,
    (wait, waiting): (Duration, &str),
    (whole, with_roots): (bool, bool),
) -> Result<Option<Held>> {
    let mut probes = Probes::load(&ProbeOptions::smallest(), None)?;
    let tracer = Tracer::seize(pid, &mut |tid| {
        let _ = probes.set_traced(tid);
    })?;
    let mut attached = Attached { probes, tracer };
    attached.probes.watch_collections(
        pid,
        reader.module(),
        &reader.collection_increments(),
        true,
    )?;
    eprintln!("{waiting}");
    let mut hold = Hold {
        pid,
        reader,
        whole,
        with_roots,
        attached,
        copied: None,
    };
    driver.drive(&mut hold, Some(wait))?;
    let Hold {
        mut attached,
        copied,
        ..
    } = hold;
    // Let go before anything else is computed.
    attached.probes.stop_holding()?;
    attached.tracer.detach();
    drop(attached);
    // Ctrl-C and an exit end it with their own error: `None` is the deadline.
    copied.transpose()
}

/// `memprof heap`'s wait for the next collection, and the copy at its hold.
struct Hold<'a> {
    pid: u32,
    reader: &'a HeapReader,
    whole: bool,
    with_roots: bool,
    attached: Attached,
    /// What the hold copied (or how copying failed).
    copied: Option<Result<Held>>,
}

impl Driven for Hold<'_> {
    fn timeout(&self) -> Duration {
        Duration::from_millis(50)
    }

    fn interrupted(&mut self) -> Result<Flow> {
        bail!(
            "interrupted before pid {} collected; it runs on, untouched",
            self.pid
        )
    }

    fn step(&mut self) -> Result<Flow> {
        let pid = self.pid;
        let Attached { probes, tracer } = &mut self.attached;
        let event = tracer.poll(&mut |tid| {
            let _ = probes.set_traced(tid);
        })?;
        match event {
            Some(Event::Signal { tid, signal }) => {
                let started = Instant::now();
                if probes.take_held(tid)?.is_none() {
                    // The program's own SIGURG.
                    tracer.resume_signal(tid, signal, true);
                    return Ok(Flow::Go);
                }
                let copied = copy_held(pid, tid, self.reader, self.whole, self.with_roots);
                probes.stop_holding()?;
                tracer.resume_signal(tid, 0, false);
                let held = started.elapsed();
                self.copied = Some(copied.map(|(c, s, r, m)| (c, s, r, held, m)));
                Ok(Flow::Stop)
            }
            Some(Event::Exited(_)) => bail!("pid {pid} exited before its next collection"),
            // An exit coming; an `exec` is not reported by an attach's tracer.
            Some(Event::Exiting | Event::Exec) | None => Ok(Flow::Go),
        }
    }
}

/// What [`copy_held`] copies: [`Held`] but the time held.
pub(super) type Copied = (
    HeapCopy,
    rss::Snapshot,
    Option<u64>,
    Option<roots::RootMemory>,
);

/// While the collector is held: the heap, the mappings and resident
/// pages of its blocks, smaps_rollup's Rss, and (`with_roots`) the memory
/// that may hold roots.
pub(super) fn copy_held(
    pid: u32,
    tid: u32,
    reader: &HeapReader,
    whole: bool,
    with_roots: bool,
) -> Result<Copied> {
    let copy = reader.copy(pid, whole)?;
    let ranges: Vec<(u64, u64)> = copy
        .blocks
        .iter()
        .map(|b| (b.addr, b.bytes(copy.hblksize)))
        .collect();
    let snapshot = rss::read(pid, &ranges)?;
    let memory = with_roots
        .then(|| roots::read(pid, tid, &snapshot.mappings))
        .transpose()?;
    Ok((copy, snapshot, rollup_rss(pid), memory))
}

/// Whether writing failed because the reader went away (`… | head`).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}

/// `Rss` of `/proc/PID/smaps_rollup`.
fn rollup_rss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The heap's blocks with what the census found in them, for the RSS table.
fn gc_blocks(copy: &HeapCopy, census: &Census) -> Vec<rss::GcBlock> {
    let mut live = census.object_blocks.iter().peekable();
    copy.blocks
        .iter()
        .map(|b| {
            let in_block = match live.peek() {
                Some(&&(addr, _, l)) if addr == b.addr => {
                    live.next();
                    Some(l)
                }
                _ => None,
            };
            rss::GcBlock {
                start: b.addr,
                live: in_block.unwrap_or(0),
                free_block: in_block.is_none(),
            }
        })
        .collect()
}
