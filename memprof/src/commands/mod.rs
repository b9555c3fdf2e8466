//! The subcommands, from the parsed command line to the mode that runs
//! them: each command's options are checked and built here ([`flags`]
//! for the profiling sessions', [`report`] for `memprof report`), then the
//! long-running modes go through one [`Driver`].
pub(crate) mod agent;
pub mod cli;
mod flags;
pub(crate) mod report;
pub(crate) mod top;

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::allocators;
use crate::commands::cli::{Cli, Command, SessionArgs};
use crate::driver::Driver;
use crate::options::{Heap, SessionOptions};
use crate::session::drive;
use crate::session::machine::select::Selection;
use flags::{seconds, selection_gc_sampling, session_options};

/// Runs the command line's subcommand; returns memprof's exit code.
pub fn run_cli(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Report(args) => report::report(&args).map(|()| 0),
        Command::Probes {
            pid,
            kernel,
            probe_at_entry,
            heap,
        } => match (pid, kernel) {
            (Some(pid), false) => probes(pid, probe_at_entry, heap),
            _ => {
                println!("{}", crate::probes::kernel().summary());
                Ok(0)
            }
        },
        command => {
            // The long-running modes: Ctrl-C, SIGTERM and SIGCHLD are the
            // driver's from here until the profile is written. First of
            // all: once blocked, they stay blocked (a signal that comes
            // while the kernel is probed waits for the driver).
            let driver = Driver::new()?;
            // What the kernel offers, found before anything is loaded.
            let kernel = crate::probes::kernel();
            if session_args(&command).is_some_and(|session| session.verbose) {
                eprintln!("memprof: {}", kernel.summary());
            }
            crate::tracee::preflight::raise_open_files_limit();
            long_running(&driver, command)
        }
    }
}

/// The profiling options of `command`, if it takes them.
fn session_args(command: &Command) -> Option<&SessionArgs> {
    match command {
        Command::Run { session, .. }
        | Command::Attach { session, .. }
        | Command::Top { session, .. }
        | Command::Agent { session, .. } => Some(session),
        Command::Report(_) | Command::Probes { .. } | Command::Heap { .. } => None,
    }
}

/// `--rss` and `--rss-only` follow page faults through the machine-wide
/// modes only.
fn no_rss(session: &SessionArgs, mode: &str) -> Result<()> {
    if session.rss || session.rss_only {
        bail!("--rss and --rss-only follow resident memory with attach --all, --comm, --exe and the agent, not with {mode} (yet): try attach --exe PATH");
    }
    Ok(())
}

/// `run`, `attach`, `top` and `heap`, under `driver`.
fn long_running(driver: &Driver, command: Command) -> Result<i32> {
    match command {
        Command::Run {
            session,
            no_follow,
            command,
        } => {
            refuse_attach_flags(&command[0].to_string_lossy())?;
            no_rss(&session, "run")?;
            let options = SessionOptions {
                follow: !no_follow,
                ..session_options(&session, None)?
            };
            let options = flags::refills_checked(&session, options)?;
            drive::run(driver, &command, &options)
        }
        Command::Attach {
            pid,
            all,
            comm,
            exe,
            duration,
            session,
        } => {
            let duration = seconds("--duration", duration)?;
            let options = session_options(&session, duration)?;
            match (all, pid) {
                (true, _) => {
                    let options =
                        flags::refills_checked(&session, flags::for_all(&session, options))?;
                    crate::session::machine::attach_all(driver, &options)
                }
                (false, Some(pid)) => {
                    no_rss(&session, "attach --pid")?;
                    drive::attach(driver, pid, &flags::refills_checked(&session, options)?)
                }
                (false, None) => {
                    let options = flags::for_selection(&session, options);
                    let options = flags::refills_checked(&session, options)?;
                    drive::attach_matching(driver, &Selection::new(comm, exe)?, &options)
                }
            }
        }
        Command::Top {
            agent,
            pid,
            comm,
            exe,
            count,
            duration,
            session,
        } => match agent {
            Some(socket) => top_agent(driver, &socket, (pid, comm, exe), count, duration, &session),
            None => top(driver, (pid, comm, exe), count, duration, &session),
        },
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
            if !(wait >= 0.0 && wait.is_finite()) {
                bail!("--wait must be 0 (never wait) or a positive number of seconds");
            }
            let top = match (top, format) {
                (Some(0), _) => bail!("--top must be at least 1"),
                (Some(n), _) => Some(n),
                (None, crate::whole_heap::HeapFormat::Markdown) => Some(40),
                (None, _) => None,
            };
            let options = crate::whole_heap::HeapOptions {
                wait: Duration::from_secs_f64(wait),
                format,
                output,
                top,
                sizes,
                graph: graph.map(|t| (t, ref_level, ref_limit)),
            };
            crate::whole_heap::run(driver, pid, &options).map(|()| 0)
        }
        Command::Agent {
            comm,
            exe,
            socket,
            group,
            listen,
            allow_remote,
            metrics_top,
            dir,
            dir_budget,
            dir_every,
            calls,
            examine,
            escalate,
            escalate_for,
            escalate_max,
            duration,
            session,
        } => {
            if session.output.is_some() {
                bail!("memprof agent writes no profile file: it serves its profiles (GET /api/profile?pid=N&format=json, or /debug/pprof/heap?pid=N)");
            }
            let duration = seconds("--duration", duration)?;
            let options = flags::for_agent(&session, session_options(&session, duration)?, calls);
            let options = flags::refills_checked(&session, options)?;
            let selection = match comm.is_empty() && exe.is_empty() {
                true => None,
                false => Some(Selection::new(comm, exe)?),
            };
            let serve = crate::commands::agent::ServeOptions {
                socket,
                group,
                listen,
                allow_remote,
                metrics_top,
                dir: dir
                    .map(|dir| -> Result<_> {
                        Ok(crate::commands::agent::dir::DirOptions {
                            dir,
                            budget: dir_budget,
                            every: seconds("--dir-every", Some(dir_every))?
                                .unwrap_or(Duration::from_secs(60)),
                        })
                    })
                    .transpose()?,
                // With --calls every process is probed already.
                escalate: crate::commands::agent::escalate::EscalateOptions {
                    growth: match (calls, escalate) {
                        (false, crate::commands::cli::Escalate(Some((growth, window)))) => Some((
                            growth,
                            seconds("--escalate", Some(window))?.unwrap_or_default(),
                        )),
                        _ => None,
                    },
                    hold: seconds("--escalate-for", Some(escalate_for))?.unwrap_or_default(),
                    at_most: escalate_max,
                    named: examine
                        .iter()
                        .map(|n| crate::commands::agent::escalate::Named::parse(n))
                        .collect(),
                },
            };
            crate::commands::agent::run(driver, selection, &options, &serve)
        }
        Command::Report(_) | Command::Probes { .. } => bail!("not a long-running command"),
    }
}

/// `memprof top`: the processes selected by pid, name or executable.
fn top(
    driver: &Driver,
    (pid, comm, exe): (Vec<u32>, Vec<String>, Vec<std::path::PathBuf>),
    count: Option<u32>,
    duration: Option<f64>,
    session: &SessionArgs,
) -> Result<i32> {
    no_rss(session, "top")?;
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
        seconds("--interval", session.interval)?.unwrap_or(crate::commands::top::DEFAULT_REFRESH);
    let mut options = session_options(session, duration)?;
    // The sessions print nothing of their own; the table is the view.
    options.live = Default::default();
    selection_gc_sampling(session, &mut options);
    let options = flags::refills_checked(session, options)?;
    let selection = Selection::new(comm, exe)?.with_pids(pid)?;
    drive::top(driver, &selection, &options, refresh, count)
}

/// `memprof top --agent`: the figures a running agent serves, its rows
/// those `--pid/--comm/--exe` name (any, when none is given).
fn top_agent(
    driver: &Driver,
    socket: &std::path::Path,
    (pids, comms, exes): (Vec<u32>, Vec<String>, Vec<std::path::PathBuf>),
    count: Option<u32>,
    duration: Option<f64>,
    session: &SessionArgs,
) -> Result<i32> {
    if count == Some(0) {
        bail!("--count must be at least 1");
    }
    if session.output.is_some() {
        bail!("memprof top --agent writes no profile: ask the agent for one (memprof report --agent --pid N)");
    }
    let duration = seconds("--duration", duration)?;
    let refresh =
        seconds("--interval", session.interval)?.unwrap_or(crate::commands::top::DEFAULT_REFRESH);
    let filter = crate::commands::top::AgentFilter { pids, comms, exes };
    crate::commands::top::from_agent(driver, socket, &filter, (refresh, count, duration))
}

/// `memprof probes --pid N`: where the probes would go, and why; first,
/// what the kernel offers them.
fn probes(pid: u32, probe_at_entry: bool, heap: Heap) -> Result<i32> {
    let plan = crate::plan::plan_for_pid(pid, probe_at_entry, heap)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}\n", crate::probes::kernel().summary())?;
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

/// `memprof run --pid 5 …`: clap takes an unknown flag for the command;
/// say which subcommand has it instead of "command not found: --pid".
fn refuse_attach_flags(first: &str) -> Result<()> {
    let flag = first.split('=').next().unwrap_or(first);
    if matches!(flag, "-p" | "--pid" | "-d" | "--duration") {
        bail!("{flag} is an option of `memprof attach`, not of `memprof run` (which starts the command given after --)");
    }
    Ok(())
}
