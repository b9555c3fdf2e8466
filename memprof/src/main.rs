//! The `memprof` binary: parses the command line and runs one subcommand.
//! Errors end the process with one line on stderr and exit code 1.
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use memprof::cli::{Cli, Command, ReportArgs, SessionArgs};
use memprof::live::LiveOptions;
use memprof::outfile::OutFile;
use memprof::probes::ProbeOptions;
use memprof::report::{diff, filter, Format};
use memprof::session::{self, GcLiveness, GcSampling, Heap, SessionOptions, Unwind};
use memprof::{allocators, profile, report};

fn main() -> ExitCode {
    memprof::memory::configure();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            // One line: the outermost context and the root cause.
            let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
            let mut line = chain.join(": ");
            line.retain(|c| c != '\n');
            eprintln!("memprof: error: {line}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Run {
            session,
            no_follow,
            command,
        } => {
            refuse_attach_flags(&command[0])?;
            let options = session::SessionOptions {
                follow: !no_follow,
                ..session_options(&session, None)?
            };
            session::run(&command, &options)
        }
        Command::Attach {
            pid,
            all,
            comm,
            exe,
            duration,
            session,
        } => {
            let duration = match duration {
                Some(d) if !(d > 0.0 && d.is_finite()) => {
                    bail!("--duration must be a positive number of seconds")
                }
                Some(d) => Some(Duration::from_secs_f64(d)),
                None => None,
            };
            let mut options = session_options(&session, duration)?;
            if all {
                if session.sample_bytes.is_none() {
                    options.probes.sample_bytes = SELECTION_SAMPLE_BYTES;
                }
                // Every GC allocation of every Crystal program would trap
                // (~1 µs each: a web server at 46 % of its throughput);
                // their heaps' growth shows in libc's mmap.
                options.heap = session.heap.unwrap_or(Heap::Libc);
                options.probes.max_live =
                    session
                        .max_live
                        .unwrap_or(match options.probes.sample_bytes {
                            0 => DEFAULT_MAX_LIVE,
                            _ => HOST_SAMPLED_MAX_LIVE,
                        });
                return memprof::host::attach_all(&options);
            }
            match pid {
                Some(pid) => session::attach(pid, &options),
                None => {
                    // Many processes: sampled unless asked otherwise.
                    if session.sample_bytes.is_none() {
                        options.probes.sample_bytes = SELECTION_SAMPLE_BYTES;
                        options.probes.max_live =
                            default_max_live(&session, SELECTION_SAMPLE_BYTES);
                    }
                    selection_gc_sampling(&session, &mut options);
                    session::attach_matching(&session::select::Selection::new(comm, exe)?, &options)
                }
            }
        }
        Command::Top {
            pid,
            comm,
            exe,
            count,
            duration,
            session,
        } => {
            if pid.is_empty() && comm.is_empty() && exe.is_empty() {
                bail!("memprof top: say which processes: --pid N, --comm NAME or --exe PATH (each repeatable)");
            }
            if session.sample_bytes.unwrap_or(0) > 0 {
                bail!("memprof top reads its live bytes without walking the tables: --sample-bytes does not apply (GC allocations are sampled at the collector's refills already)");
            }
            if count == Some(0) {
                bail!("--count must be at least 1");
            }
            let duration = seconds("--duration", duration)?;
            let refresh =
                seconds("--interval", session.interval)?.unwrap_or(memprof::top::DEFAULT_REFRESH);
            let mut options = session_options(&session, duration)?;
            // The sessions print nothing of their own; the table is the view.
            options.live = Default::default();
            selection_gc_sampling(&session, &mut options);
            let selection = session::select::Selection::new(comm, exe)?.with_pids(pid)?;
            session::top(&selection, &options, refresh, count)
        }
        Command::Probes {
            pid,
            probe_at_entry,
            heap,
        } => {
            let plan = session::plan_for_pid(pid, probe_at_entry, heap)?;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:<16} {:<28} {:>8}  why",
                "function", "module", "offset"
            )?;
            for p in plan {
                writeln!(
                    out,
                    "{:<16} {:<28} {:>8}  {}",
                    p.func.func.symbol,
                    allocators::short(&p.func.module),
                    format!("+{}", p.placement.offset),
                    p.placement.reason
                )?;
            }
            Ok(0)
        }
        Command::Heap {
            pid,
            wait,
            format,
            output,
            top,
            sizes,
            graph,
            ref_level,
            ref_limit,
        } => {
            if ref_limit == 0 {
                bail!("--ref-limit must be at least 1");
            }
            if !(wait > 0.0 && wait.is_finite()) {
                bail!("--wait must be a positive number of seconds");
            }
            let top = match (top, format) {
                (Some(0), _) => bail!("--top must be at least 1"),
                (Some(n), _) => Some(n),
                (None, memprof::census::HeapFormat::Markdown) => Some(40),
                (None, _) => None,
            };
            let options = memprof::census::HeapOptions {
                wait: Duration::from_secs_f64(wait),
                format,
                output,
                top,
                sizes,
                graph: graph.map(|t| (t, ref_level, ref_limit)),
            };
            memprof::census::heap(pid, &options).map(|()| 0)
        }
        Command::Report(args) => report_cmd(&args).map(|()| 0),
    }
}

/// `memprof run --pid 5 …`: clap takes an unknown flag for the command;
/// say which subcommand has it instead of "command not found: --pid".
fn refuse_attach_flags(first: &str) -> Result<()> {
    let flag = first.split('=').next().unwrap_or(first);
    if matches!(flag, "-p" | "--pid" | "-d" | "--duration") {
        bail!("{flag} is an option of `memprof attach`, not of `memprof run` (which starts the command given after --)");
    }
    Ok(())
}

/// `attach --comm/--exe`'s `--sample-bytes` when none is given.
const SELECTION_SAMPLE_BYTES: u64 = 524_288;

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

/// Processes selected by name (`attach --comm/--exe`, `top`): GC
/// allocations sampled at the collector's refills unless asked otherwise
/// (or refill sampling is ruled out: reuse liveness, frame pointers); a
/// process whose libgc lacks the functions falls back to bytes, quietly.
fn selection_gc_sampling(args: &SessionArgs, options: &mut session::SessionOptions) {
    if args.gc_sampling.is_none()
        && args.gc_liveness == GcLiveness::Marks
        && args.unwind != Unwind::Fp
    {
        options.gc_sampling = GcSampling::Refill;
    }
}

fn session_options(args: &SessionArgs, duration: Option<Duration>) -> Result<SessionOptions> {
    for (name, value) in [
        ("--max-live", args.max_live.unwrap_or(DEFAULT_MAX_LIVE)),
        ("--max-stacks", args.max_stacks),
        ("--max-sites", args.max_sites),
    ] {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    let gc_sampling = args.gc_sampling.unwrap_or(GcSampling::Exact);
    if gc_sampling == GcSampling::Refill {
        if args.gc_liveness == GcLiveness::Reuse {
            bail!("--gc-sampling refill needs --gc-liveness marks (a sample's objects are judged by the collector's mark bits)");
        }
        if args.unwind == Unwind::Fp {
            bail!("--gc-sampling refill needs --unwind dwarf (a refill's stack starts inside the collector)");
        }
    }
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
            host: false,
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
        gc_sampling,
        census: args.census,
        census_wait: match args.census_wait {
            s if s >= 0.0 && s.is_finite() => Duration::from_secs_f64(s),
            _ => bail!("--census-wait must be a number of seconds, 0 or more"),
        },
        gc_verdicts: args.gc_verdicts.clone(),
        follow: false,
        followed: false,
        live: LiveOptions {
            sample_period: (args.sample_period > 0)
                .then(|| Duration::from_millis(args.sample_period)),
            interval: seconds("--interval", args.interval)?,
            snapshot_every: seconds("--snapshot-every", args.snapshot_every)?,
            top: args.top,
        },
    })
}

/// A positive number of seconds from the command line.
fn seconds(flag: &str, value: Option<f64>) -> Result<Option<Duration>> {
    match value {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("{flag} must be a positive number of seconds")
        }
        Some(s) => Ok(Some(Duration::from_secs_f64(s))),
        None => Ok(None),
    }
}

fn report_cmd(args: &ReportArgs) -> Result<()> {
    filter::check_sizes(args.size_min, args.size_max)?;
    let filter = filter::Filter {
        kinds: filter::kinds(&args.kind)?,
        function: filter::regex("--function", args.function.as_deref())?,
        source: filter::regex("--source", args.source.as_deref())?,
        exclude_function: filter::regex("--exclude-function", args.exclude_function.as_deref())?,
        size_min: args.size_min,
        size_max: args.size_max,
        leaked: args.leaked,
        temporary: args.temporary,
        temporary_ns: args.temporary_ms.saturating_mul(1_000_000),
        pids: args.pid.clone(),
        comms: args.comm.clone(),
    };
    let mut options = report::Options {
        min_bytes: args.min_bytes,
        depth: args.depth,
        skip: args.skip,
        top: args.top,
        skip_runtime: args.skip_runtime,
        count: args.count,
        total: args.total,
        inverted: args.inverted,
        filters: describe_filters(args),
        keep_order: false,
    };
    if args.diff.is_some() && !args.format.diffable() {
        bail!(
            "--diff writes markdown or json, not {}",
            clap::ValueEnum::to_possible_value(&args.format).map_or_else(
                || format!("{:?}", args.format),
                |v| v.get_name().to_string()
            )
        );
    }
    if args.format == Format::Pprof
        && args.output.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        bail!("pprof is binary (gzipped protobuf): write it to a file with -o FILE.pb.gz");
    }
    let mut loaded = match (&args.diff, &args.file) {
        (Some(files), _) => {
            let [before, after] = [0, 1].map(|i| profile::load(&files[i]));
            let (before, after) = (before?, after?);
            filter.check_processes(&before)?;
            filter.check_processes(&after)?;
            let (before, after) = (filter.apply(before), filter.apply(after));
            diff::check_compatible(&before, &after)?;
            vec![before, after]
        }
        (None, Some(file)) => {
            let profile = profile::load(file)?;
            filter.check_processes(&profile)?;
            vec![if filter.is_empty() {
                profile
            } else {
                filter.apply(profile)
            }]
        }
        (None, None) => bail!("no profile given"),
    };
    // --leaks: its own table in markdown; for the other formats (and
    // both profiles of --diff), only the leaking stacks, ranked by growth.
    let leak_table = args.leaks && args.format == Format::Markdown && args.diff.is_none();
    if args.leaks && !leak_table {
        for profile in &mut loaded {
            *profile = report::leaks::leaking(std::mem::take(profile));
        }
        options.keep_order = true;
        options.min_bytes.get_or_insert(0);
    }
    // -o: written whole or not at all; else stdout.
    let mut file = args.output.as_deref().map(OutFile::create).transpose()?;
    let mut stdout = std::io::stdout().lock();
    let out: &mut dyn Write = match &mut file {
        Some(file) => file,
        None => &mut stdout,
    };
    // One profile, or the two of --diff.
    let written = match &loaded[..] {
        [profile] if leak_table => report::leaks::write(profile, &options, out),
        [profile] => report::render(profile, args.format, &options, out),
        [before, after, ..] => {
            let files = args.diff.as_deref().unwrap_or_default();
            let names = [0, 1].map(|i| files[i].to_str().unwrap_or("?"));
            diff::write(
                before,
                after,
                names,
                args.format == Format::Json,
                &options,
                out,
            )
        }
        [] => Ok(()),
    }
    .and_then(|()| out.flush().map_err(Into::into))
    .and_then(|()| file.map_or(Ok(()), OutFile::commit));
    match written {
        // `memprof report … | head` is done, not failed.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// The filters given, in words, for report headers.
fn describe_filters(args: &ReportArgs) -> Option<String> {
    let mut parts = Vec::new();
    if !args.kind.is_empty() {
        parts.push(format!("--kind {}", args.kind.join(",")));
    }
    for pid in &args.pid {
        parts.push(format!("--pid {pid}"));
    }
    for comm in &args.comm {
        parts.push(format!("--comm {comm}"));
    }
    for (flag, value) in [
        ("--function", &args.function),
        ("--source", &args.source),
        ("--exclude-function", &args.exclude_function),
    ] {
        if let Some(v) = value {
            parts.push(format!("{flag} '{v}'"));
        }
    }
    if let Some(min) = args.size_min {
        parts.push(format!("--size-min {min} (mean allocation size)"));
    }
    if let Some(max) = args.size_max {
        parts.push(format!("--size-max {max} (mean allocation size)"));
    }
    if args.leaked {
        parts.push("--leaked (stacks with blocks live at the end)".to_string());
    }
    if args.temporary {
        parts.push(format!(
            "--temporary: live counts and bytes are the allocations that died soon (GC: at the first collection; libc and mmap: within {} ms)",
            args.temporary_ms
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Whether writing failed because the reader went away (`… | head`),
/// whichever writer met it.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == BrokenPipe)
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
    })
}
