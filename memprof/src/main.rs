//! The `memprof` binary: parses the command line and runs one subcommand.
//! Errors end the process with one line on stderr and exit code 1.
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use memprof::cli::{Cli, Command, ReportArgs, SessionArgs};
use memprof::probes::ProbeOptions;
use memprof::session::{self, SessionOptions};
use memprof::{allocators, profile, report};

fn main() -> ExitCode {
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
        Command::Run { session, command } => {
            session::run(&command, &session_options(&session, None)?)
        }
        Command::Attach {
            pid,
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
            session::attach(pid, &session_options(&session, duration)?)
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
        Command::Report(args) => report_cmd(&args).map(|()| 0),
    }
}

fn session_options(args: &SessionArgs, duration: Option<Duration>) -> Result<SessionOptions> {
    for (name, value) in [
        ("--max-live", args.max_live),
        ("--max-stacks", args.max_stacks),
        ("--max-sites", args.max_sites),
    ] {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    Ok(SessionOptions {
        output: args.output.clone(),
        probes: ProbeOptions {
            max_live: args.max_live,
            max_stacks: args.max_stacks,
            max_sites: args.max_sites,
            empty: args.empty_probes,
            gc_events_bytes: 0, // sized by the session when GC objects are judged
        },
        probe_at_entry: args.probe_at_entry,
        duration,
        heap: args.heap,
        unwind: args.unwind,
        top: args.top,
        gc_liveness: args.gc_liveness,
        gc_verdicts: args.gc_verdicts.clone(),
    })
}

fn report_cmd(args: &ReportArgs) -> Result<()> {
    let mut profile = profile::load(&args.file)?;
    let mut options = report::Options {
        min_bytes: args.min_bytes,
        depth: args.depth,
        skip: args.skip,
        top: args.top,
        skip_runtime: args.skip_runtime,
        keep_order: false,
    };
    let leak_table = args.leaks && args.format == report::Format::Markdown;
    if args.leaks && !leak_table {
        profile = report::leaks::leaking(&profile);
        options.keep_order = true;
        options.min_bytes.get_or_insert(0);
    }
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let written = if leak_table {
        report::leaks::write(&profile, &options, &mut out)
    } else {
        report::render(&profile, args.format, &options, &mut out)
    }
    .and_then(|()| out.flush().map_err(Into::into));
    match written {
        // `memprof report … | head` is done, not failed.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
