//! What happens while the target runs, between attaching and the end:
//!
//! - **timeline**: every `--sample-period` (default 100 ms) the live
//!   blocks and bytes per kind ([`Sample`]), read in O(1): the kernel keeps
//!   per-kind totals of its live table (`LIVE_BY_KIND`) and memprof's copy
//!   of the GC objects keeps its own ([`crate::gc::copy::GcCopy::per_kind`]);
//!   the live table itself is never walked while the target runs (a
//!   1,000,000-block table took 0.3 to 0.7 s to read, holding its locks
//!   against the target's probes). The samples go into the profile and
//!   `report --format timeline|html` draws them. Sampling is kept under a
//!   tenth of memprof's time: should one sample take long, the next ones
//!   are spaced out, and memprof says so.
//! - **`--interval SECS`**: the top table, reprinted on stderr (the screen
//!   cleared first when stderr is a terminal, appended otherwise).
//! - **`--snapshot-every SECS`**: a complete profile written every SECS
//!   seconds without detaching, numbered after `-o`: `snap.mprof` gives
//!   `snap-0001.mprof`, `snap-0002.mprof`, … (for `report --diff`).
//!
//! The session asks [`Live::due`] at each step and sleeps at most
//! [`Live::timeout`]; it hands in the kernel's tables for a sample and its
//! own snapshot of the profile for a table or a file ([`Live::publish`]).
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use memprof_common::AllocKind;

use crate::options::LiveOptions;
use crate::outfile::OutFile;
use crate::profile::{self, Group, Profile, Sample, Timeline};
use crate::report::{self, markdown};

/// Sampling may take at most 1/MAX_DUTY of memprof's time.
const MAX_DUTY: u32 = 10;

/// The state kept while attached.
pub struct Live {
    options: LiveOptions,
    started: Instant,
    output: PathBuf,
    timeline: Timeline,
    next_sample: Option<Instant>,
    next_print: Option<Instant>,
    next_snapshot: Option<Instant>,
    snapshots: u32,
    /// The sample spacing last reported on stderr (it is reported again
    /// each time it doubles).
    reported_gap: Duration,
}

/// `snap.mprof`, 3 → `snap-0003.mprof` (next to it).
pub fn snapshot_path(output: &Path, n: u32) -> PathBuf {
    let stem = output
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".to_string());
    let name = match output.extension() {
        Some(ext) => format!("{stem}-{n:04}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{n:04}"),
    };
    output.with_file_name(name)
}

impl Live {
    /// `started` is when profiling started; `output` the profile path (snapshots are named after it).
    pub fn new(options: LiveOptions, started: Instant, output: &Path) -> Live {
        let now = Instant::now();
        Live {
            next_sample: options.sample_period.map(|_| now),
            next_print: options.interval.map(|d| now + d),
            next_snapshot: options.snapshot_every.map(|d| now + d),
            timeline: Timeline {
                period_s: options.sample_period.map_or(0.0, |d| d.as_secs_f64()),
                samples: Vec::new(),
                longest_read_s: 0.0,
            },
            options,
            started,
            output: output.to_path_buf(),
            snapshots: 0,
            reported_gap: Duration::ZERO,
        }
    }

    /// What is due now.
    pub fn due(&self) -> Due {
        let now = Instant::now();
        let due = |at: Option<Instant>| at.is_some_and(|t| now >= t);
        Due {
            sample: due(self.next_sample),
            print: due(self.next_print),
            snapshot: due(self.next_snapshot),
        }
    }

    /// The samples so far.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// How long the wait loop may sleep: `max`, or less if something is due sooner.
    pub fn timeout(&self, max: Duration) -> Duration {
        let now = Instant::now();
        [self.next_sample, self.next_print, self.next_snapshot]
            .into_iter()
            .flatten()
            .map(|due| due.saturating_duration_since(now))
            .fold(max, Duration::min)
            .max(Duration::from_millis(1))
    }

    /// Writes the `--snapshot-every` file and reprints the `--interval`
    /// table, as `due` says, from `profile` (the session's snapshot).
    pub fn publish(&mut self, profile: &Profile, due: Due) -> Result<()> {
        if due.snapshot {
            self.snapshots += 1;
            let path = snapshot_path(&self.output, self.snapshots);
            write_atomically(profile, &path)?;
            eprintln!("memprof: snapshot written to {}", path.display());
            self.next_snapshot = self.options.snapshot_every.map(|d| Instant::now() + d);
        }
        if due.print {
            self.print(profile)?;
            self.next_print = self.options.interval.map(|d| Instant::now() + d);
        }
        Ok(())
    }

    /// One timeline sample: `per_kind` live blocks and bytes (read in
    /// O(1) by the session), and `GC_get_heap_size()` where readable.
    /// `t0`: when the session started reading them.
    pub fn sample(&mut self, t0: Instant, per_kind: PerKind, gc_heap_bytes: Option<u64>) {
        self.timeline.samples.push(Sample {
            t_s: t0.duration_since(self.started).as_secs_f64(),
            live: per_kind.into_map(),
            gc_heap_bytes,
            estimated: false,
        });
        let took = t0.elapsed();
        let period = self.options.sample_period.unwrap_or_default();
        let gap = period.max(took * MAX_DUTY);
        self.timeline.longest_read_s = self.timeline.longest_read_s.max(took.as_secs_f64());
        if gap > period && gap >= self.reported_gap * 2 {
            self.reported_gap = gap;
            eprintln!(
                "memprof: reading the live totals for the timeline took {:.0} ms: samples every {:.1} s instead of {:.1} s",
                took.as_secs_f64() * 1e3,
                gap.as_secs_f64(),
                period.as_secs_f64()
            );
        }
        self.next_sample = Some(t0 + gap);
    }

    fn print(&self, profile: &Profile) -> Result<()> {
        let mut err = std::io::stderr().lock();
        if std::io::stderr().is_terminal() {
            write!(err, "\x1b[2J\x1b[H")?;
        } else {
            writeln!(err)?;
        }
        markdown::header(profile, &mut err)?;
        let options = report::Options {
            top: Some(self.options.top),
            ..report::Options::default()
        };
        markdown::table(profile, &options, &mut err)?;
        err.flush()?;
        Ok(())
    }

    /// The timeline, ended with the final figures of `groups` (and the GC
    /// heap size) at `duration_s`.
    pub fn into_timeline(
        mut self,
        groups: &[Group],
        duration_s: f64,
        gc_heap_bytes: Option<u64>,
    ) -> Timeline {
        if self.options.sample_period.is_some() {
            let mut live: BTreeMap<String, [u64; 2]> = BTreeMap::new();
            for g in groups.iter().filter(|g| g.live_count > 0) {
                let sum = live.entry(g.kind.clone()).or_default();
                sum[0] += g.live_count;
                sum[1] += g.live_bytes;
            }
            self.timeline.samples.push(Sample {
                t_s: duration_s,
                live,
                gc_heap_bytes,
                estimated: false,
            });
        }
        self.timeline
    }
}

/// What is due at one step of the session.
#[derive(Debug, Clone, Copy, Default)]
pub struct Due {
    pub sample: bool,
    pub print: bool,
    pub snapshot: bool,
}

/// Live blocks and bytes per allocation kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerKind([[u64; 2]; AllocKind::ALL.len()]);

impl PerKind {
    /// From `[blocks, bytes]` per kind (indexed by [`AllocKind`]).
    pub fn from_array(per_kind: [[u64; 2]; memprof_common::AllocKind::COUNT]) -> PerKind {
        PerKind(per_kind)
    }

    /// By kind name, the kinds with live blocks only (a timeline sample).
    pub fn into_map(self) -> BTreeMap<String, [u64; 2]> {
        AllocKind::ALL
            .into_iter()
            .filter(|&kind| self.0[kind as usize][0] > 0)
            .map(|kind| (kind.name().to_string(), self.0[kind as usize]))
            .collect()
    }
}

/// Writes whole or not at all ([`OutFile`]): a reader never sees half a profile.
fn write_atomically(profile: &Profile, path: &Path) -> Result<()> {
    let write = || -> Result<()> {
        let mut file = OutFile::create(path)?;
        profile::write(profile, &mut file)?;
        file.commit()
    };
    write().with_context(|| format!("cannot write snapshot {}", path.display()))
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::live::{snapshot_path, Live};
        use crate::options::LiveOptions;
        use std::time::{Duration, Instant};
        let live = Live::new(LiveOptions::default(), Instant::now(), "app.mprof".as_ref());
        assert!(live.timeout(Duration::from_millis(200)) <= Duration::from_millis(100));
        assert_eq!(
            snapshot_path("out/snap.mprof".as_ref(), 2).to_str(),
            Some("out/snap-0002.mprof")
        );
    }
}
