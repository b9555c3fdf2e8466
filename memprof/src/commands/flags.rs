//! The options of a profiling session, from the command line's flags:
//! checked, with each mode's defaults.
use std::time::Duration;

use anyhow::{bail, Result};

use crate::commands::cli::SessionArgs;
use crate::options::LiveOptions;
use crate::options::{GcLiveness, GcSampling, Heap, SessionOptions, Unwind};
use crate::probes::ProbeOptions;

/// `attach --comm/--exe`'s `--sample-bytes` when none is given.
const SELECTION_SAMPLE_BYTES: u64 = 524_288;
/// `memprof agent`'s `--gc-refill-every` when none is given: a web
/// server refills its lists ~10,000 times a second; following each one
/// (stack, return probe, verdict) cost it ~5 % of its requests.
const AGENT_REFILL_EVERY: u32 = 16;

/// `--max-live` unless given: the live table is preallocated (~130 MB of
/// kernel memory at the full size, per process profiled), and sampling by
/// bytes keeps about one block per `sample_bytes` live in it.
const DEFAULT_MAX_LIVE: u32 = 1 << 20;
const SAMPLED_MAX_LIVE: u32 = 1 << 16;
/// `attach --all`, sampled: one live table for every process (31 MB).
const HOST_SAMPLED_MAX_LIVE: u32 = 1 << 18;

fn default_max_live(args: &SessionArgs, sample_bytes: u64) -> u32 {
    match (args.max_live, sample_bytes) {
        (Some(n), _) => n,
        (None, 0) => DEFAULT_MAX_LIVE,
        (None, _) => SAMPLED_MAX_LIVE,
    }
}

/// `attach --all`: sampled unless asked otherwise, libc and mmap only
/// unless asked otherwise, one live table for every process.
pub(super) fn for_all(args: &SessionArgs, mut options: SessionOptions) -> SessionOptions {
    if args.sample_bytes.is_none() {
        options.probes.sample_bytes = SELECTION_SAMPLE_BYTES;
    }
    // Every GC allocation of every Crystal program would trap
    // (~1 µs each: a web server at 46 % of its throughput);
    // their heaps' growth shows in libc's mmap.
    options.heap = args.heap.unwrap_or(Heap::Libc);
    options.probes.max_live = args.max_live.unwrap_or(match options.probes.sample_bytes {
        0 => DEFAULT_MAX_LIVE,
        _ => HOST_SAMPLED_MAX_LIVE,
    });
    options
}

/// `memprof agent`: as `attach --comm/--exe` (libc and mmap sampled by
/// bytes, each Boehm GC program's objects at its collector's refills),
/// with one live table for every process, as `attach --all`.
pub(super) fn for_agent(
    args: &SessionArgs,
    options: SessionOptions,
    calls: bool,
) -> SessionOptions {
    let mut options = for_selection(args, options);
    options.resident = true;
    // Resident memory only unless the allocator functions are asked for.
    if !calls {
        options.rss = true;
        options.probes.rss = true;
        options.calls = false;
    }
    options.probes.gc_refill_every = args.gc_refill_every.unwrap_or(AGENT_REFILL_EVERY);
    if args.max_live.is_none() && options.probes.sample_bytes > 0 {
        options.probes.max_live = HOST_SAMPLED_MAX_LIVE;
    }
    options
}

/// `attach --comm/--exe`: many processes, sampled unless asked otherwise.
pub(super) fn for_selection(args: &SessionArgs, mut options: SessionOptions) -> SessionOptions {
    if args.sample_bytes.is_none() {
        options.probes.sample_bytes = SELECTION_SAMPLE_BYTES;
        options.probes.max_live = default_max_live(args, SELECTION_SAMPLE_BYTES);
    }
    selection_gc_sampling(args, &mut options);
    options
}

/// Processes selected by name (`attach --comm/--exe`, `top`): GC
/// allocations sampled at the collector's refills unless asked otherwise
/// (or refill sampling is ruled out: reuse liveness, frame pointers); a
/// process whose libgc lacks the functions falls back to bytes, quietly.
pub(super) fn selection_gc_sampling(args: &SessionArgs, options: &mut SessionOptions) {
    if args.gc_sampling.is_none()
        && args.gc_liveness == GcLiveness::Marks
        && args.unwind != Unwind::Fp
    {
        options.gc_sampling = GcSampling::Refill;
    }
}

/// The mode's options, refused if `--gc-refill-every` is given where the
/// GC allocations are not sampled at refills (it would change nothing).
pub(super) fn refills_checked(
    args: &SessionArgs,
    options: SessionOptions,
) -> Result<SessionOptions> {
    if args.gc_refill_every.is_some() && options.gc_sampling != GcSampling::Refill {
        bail!("--gc-refill-every thins the samples of --gc-sampling refill, and GC allocations are not sampled at refills here: add --gc-sampling refill");
    }
    Ok(options)
}

/// The options every session mode starts from.
pub(super) fn session_options(
    args: &SessionArgs,
    duration: Option<Duration>,
) -> Result<SessionOptions> {
    check_limits(args)?;
    Ok(SessionOptions {
        output: args.output.clone(),
        probes: ProbeOptions {
            max_live: default_max_live(args, args.sample_bytes.unwrap_or(0)),
            max_stacks: args.max_stacks,
            max_sites: args.max_sites,
            empty: args.empty_probes,
            gc_events_bytes: 0, // sized by the session when GC objects are judged
            keep_recursion: args.keep_recursion,
            sample_bytes: args.sample_bytes.unwrap_or(0),
            // Set by the plan, which knows whether the target's libgc allows it.
            gc_refill: false,
            gc_refill_every: args.gc_refill_every.unwrap_or(1),
            host: false,
            family_root: 0,
            selecting: false,
            rss: args.rss || args.rss_only,
            // Set by the session, which knows whether mark bits are read.
            gc_copy: false,
            gc_verdicts: false,
        },
        probe_at_entry: args.probe_at_entry,
        duration,
        heap: args.heap.unwrap_or(Heap::All),
        unwind: args.unwind,
        top: args.top,
        gc_liveness: args.gc_liveness,
        gc_sampling: args.gc_sampling.unwrap_or(GcSampling::Exact),
        census: args.census,
        census_wait: match args.census_wait {
            s if s >= 0.0 && s.is_finite() => Duration::from_secs_f64(s),
            _ => bail!("--census-wait must be a number of seconds, 0 or more"),
        },
        gc_verdicts: args.gc_verdicts.clone(),
        follow: false,
        followed: false,
        verbose: args.verbose,
        resident: false,
        rss: args.rss || args.rss_only,
        calls: !args.rss_only,
        live: LiveOptions {
            sample_period: (args.sample_period > 0)
                .then(|| Duration::from_millis(args.sample_period)),
            interval: seconds("--interval", args.interval)?,
            snapshot_every: seconds("--snapshot-every", args.snapshot_every)?,
            top: args.top,
        },
    })
}

/// The table sizes at least 1; `--gc-sampling refill` with what it needs.
fn check_limits(args: &SessionArgs) -> Result<()> {
    for (name, value) in [
        ("--max-live", args.max_live.unwrap_or(DEFAULT_MAX_LIVE)),
        ("--max-stacks", args.max_stacks),
        ("--max-sites", args.max_sites),
    ] {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if args.gc_sampling == Some(GcSampling::Refill) {
        if args.gc_liveness == GcLiveness::Reuse {
            bail!("--gc-sampling refill needs --gc-liveness marks (a sample's objects are judged by the collector's mark bits)");
        }
        if args.unwind == Unwind::Fp {
            bail!("--gc-sampling refill needs --unwind dwarf (a refill's stack starts inside the collector)");
        }
    }
    Ok(())
}

/// A positive number of seconds from the command line.
pub(super) fn seconds(flag: &str, value: Option<f64>) -> Result<Option<Duration>> {
    match value {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("{flag} must be a positive number of seconds")
        }
        Some(s) => Ok(Some(Duration::from_secs_f64(s))),
        None => Ok(None),
    }
}
