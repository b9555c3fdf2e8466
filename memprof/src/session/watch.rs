//! `memprof attach --comm NAME` / `--exe PATH` and `memprof top`: every
//! process a [`Selection`] names, those running and those that start while
//! memprof runs, until Ctrl-C, SIGTERM or `--duration`; one profile, one
//! process each.
//!
//! `attach` follows them with one load of the probes ([`Family::select`]):
//! the kernel checks each new process's `comm` and executable, and a
//! process that lives a millisecond is followed from its first allocation.
//! A program that allocates with the Boehm GC gets a session of its own
//! besides (its collections held, its mark bits read), as under `run`.
//!
//! `top` shows their heaps as a table: each process found in /proc
//! (within [`RESCAN`]) gets a session of its own from then on.
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::drive::Followed;
use super::selected::Selected;
use super::Session;
use crate::driver::{profiles, Driven, Driver, Flow, Output, Profiling};
use crate::options::{GcSampling, SessionOptions};
use crate::profile::Profile;
use crate::session::machine::select::{Selection, RESCAN};

/// `memprof attach --comm NAME` / `--exe PATH`.
pub fn attach_matching(
    driver: &Driver,
    selection: &Selection,
    options: &SessionOptions,
) -> Result<i32> {
    let mut output = Output::create(
        options.output.as_ref(),
        Path::new(&selection_name(selection)),
        None,
    )?;
    let started = Instant::now();
    let mut selected = Selected::new(Some(selection.clone()), options)?;
    say_watching(selection, options, false);
    eprintln!(
        "memprof: the probes sit on the allocator files ({} probed): every process's allocations trap into the kernel while memprof runs (1–2 µs each); those of processes not selected return at once",
        selected.files_probed()
    );
    driver.drive(&mut selected, options.duration)?;
    let Some(profile) = profiles::merge(None, selected.finish()?) else {
        bail!(
            "no process of {} allocated while memprof watched ({:.1} s): nothing to write",
            selection.describe(),
            started.elapsed().as_secs_f64()
        );
    };
    output.write_and_print(&profile, options.top)?;
    Ok(0)
}

/// `memprof top`: [`attach_matching`] with the processes' heaps shown
/// every `refresh` (`count` times, or until `q`, Ctrl-C, SIGTERM,
/// `--duration`); a profile is written only if `-o` asks for one.
pub fn top(
    driver: &Driver,
    selection: &Selection,
    options: &SessionOptions,
    refresh: Duration,
    count: Option<u32>,
) -> Result<i32> {
    watch_matching(driver, selection, options, (refresh, count))
}

/// `top`: the processes `selection` names, each with a session of its
/// own, until the end, shown as a table every `refresh` (`count` times).
fn watch_matching(
    driver: &Driver,
    selection: &Selection,
    options: &SessionOptions,
    (refresh, count): (Duration, Option<u32>),
) -> Result<i32> {
    let top = Some((refresh, count));
    let mut output = match (top, &options.output) {
        (Some(_), None) => None,
        _ => Some(Output::create(
            options.output.as_ref(),
            Path::new(&selection_name(selection)),
            None,
        )?),
    };
    let mut watch = Watch {
        selection,
        options,
        followed: Followed::default(),
        seen: HashSet::new(),
        tries: std::collections::HashMap::new(),
        last_scan: None,
        top: top.map(|(refresh, count)| super::table::Table::new(refresh, count)),
    };
    let started = Instant::now();
    say_watching(selection, options, top.is_some());
    driver.drive(&mut watch, options.duration)?;
    // The terminal is given back before anything else is printed.
    drop(watch.top.take());
    let profiles = watch.followed.finish();
    let Some(output) = &mut output else {
        eprintln!(
            "memprof: watched {} process{}; each runs on, untraced",
            profiles.len(),
            if profiles.len() == 1 { "" } else { "es" }
        );
        return Ok(0);
    };
    // The first process attached to stands for the session; the others join it.
    let Some(profile) = profiles::merge(None, profiles) else {
        bail!(
            "no process of {} ran while memprof watched ({:.1} s): nothing to write",
            selection.describe(),
            started.elapsed().as_secs_f64()
        );
    };
    output.write_and_print(&profile, options.top)?;
    Ok(0)
}

/// The first line: what is watched, how it is sampled, how it ends.
fn say_watching(selection: &Selection, options: &SessionOptions, top: bool) {
    let mut sampled = match options.probes.sample_bytes {
        0 => String::new(),
        n => format!(", sampled (--sample-bytes {n}; 0: every allocation)"),
    };
    if options.gc_sampling == GcSampling::Refill {
        sampled.push_str(
            ", GC allocations at the collector's refills (--gc-sampling exact: every one)",
        );
    }
    eprintln!(
        "memprof: {} every process of {} (now and as they start){sampled}; Ctrl-C to stop{}",
        if top { "watching" } else { "profiling" },
        selection.describe(),
        options
            .duration
            .map(|d| format!(", or wait {} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
}

/// The profile's default name: the first program the selection names.
fn selection_name(selection: &Selection) -> String {
    match (selection.comms.first(), selection.exes.first()) {
        (Some(comm), _) => comm.clone(),
        (None, Some(exe)) => crate::text::lossy_path(exe),
        (None, None) => "attach".to_string(),
    }
}

/// The processes a selection names, as the driver steps them.
struct Watch<'a> {
    selection: &'a Selection,
    options: &'a SessionOptions,
    followed: Followed,
    /// Every process attached to (or tried), never again.
    seen: HashSet<u32>,
    /// Attaches that failed, per process still looked at again.
    tries: std::collections::HashMap<u32, u32>,
    last_scan: Option<Instant>,
    top: Option<super::table::Table>,
}

/// Scans a process whose attach failed is looked at in, before it is
/// given up (a second at `RESCAN`'s pace).
const ATTACH_TRIES: u32 = 10;

impl Driven for Watch<'_> {
    /// Processes started since the last look, then `top`'s table when due.
    fn due(&mut self) -> Result<Flow> {
        if self.last_scan.is_none_or(|t| t.elapsed() >= RESCAN) {
            self.last_scan = Some(Instant::now());
            for pid in self.selection.matching() {
                if self.seen.contains(&pid) {
                    continue;
                }
                let session = Session::attach_followed(pid, self.options);
                // A process caught while the dynamic linker still maps its
                // libraries has no allocator yet: looked at again at the
                // next scans, a few times, before it is given up.
                if session.is_err() && crate::tracee::is_alive(pid) {
                    let tries = self.tries.entry(pid).or_insert(0);
                    *tries += 1;
                    if *tries < ATTACH_TRIES {
                        continue;
                    }
                }
                self.seen.insert(pid);
                self.followed.started(pid, session);
            }
        }
        let Some(top) = &mut self.top else {
            return Ok(Flow::Go);
        };
        let followed = &mut self.followed;
        top.due(
            || {
                Ok(followed
                    .running()
                    .iter_mut()
                    .filter_map(|s| s.vitals().ok())
                    .collect())
            },
            &self.selection.describe(),
        )
    }

    fn timeout(&self) -> Duration {
        let wait = self.followed.timeout(RESCAN);
        match &self.top {
            Some(top) => wait.min(top.wait()),
            None => wait,
        }
    }

    fn step(&mut self) -> Result<Flow> {
        self.followed.step(self.options);
        Ok(Flow::Go)
    }
}

impl Profiling for Watch<'_> {
    fn pids(&self) -> Vec<u32> {
        self.followed.pids()
    }

    fn snapshot(&mut self, pid: u32) -> Result<Profile> {
        self.followed.snapshot(pid)
    }
}
