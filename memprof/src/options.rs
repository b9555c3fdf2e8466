//! What a profiling session is asked to do: the options of `run`,
//! `attach` and `top`, built from the command line by [`crate::commands`]
//! and read by every stage below.
use std::path::PathBuf;
use std::time::Duration;

use crate::probes::ProbeOptions;

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
    /// `--gc-sampling`: every Boehm allocation, or samples at refills.
    pub gc_sampling: GcSampling,
    /// `--census` (`None`: the mode's default, [`CensusWhen::or_default`]).
    pub census: Option<CensusWhen>,
    /// How long the end census waits for a collection (`--census-wait`).
    pub census_wait: Duration,
    /// Write every mark-bit verdict here (`--gc-verdicts`, for tests).
    pub gc_verdicts: Option<PathBuf>,
    /// `run`: profile the processes the command starts too (`--no-follow`: not).
    pub follow: bool,
    /// This session is one of a process `run` follows (said in one line).
    pub followed: bool,
    /// `--verbose`: a line on stderr for each process an event concerns,
    /// not only one summary line per kind of event.
    pub verbose: bool,
    /// `memprof agent`: a daemon left on, whose wakeups on a quiet machine
    /// count more than reading a new process within the millisecond
    /// (`machine::events`: after a quiet second, the kernel's wakeup, up to
    /// 4 ms late, is waited for instead of looking every millisecond).
    pub resident: bool,
    /// `--rss`: pages at their first write, sampled, by stack (host
    /// modes only).
    pub rss: bool,
    /// Host modes: the allocator functions are probed (`--rss-only`: not).
    pub calls: bool,
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

/// How Boehm GC allocations are followed (`--gc-sampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GcSampling {
    /// Every `GC_malloc`/`GC_malloc_atomic` call is probed.
    Exact,
    /// Samples where a thread's free list is refilled, each standing for
    /// the objects of the list; the free lists' fast path is not probed
    /// ([`crate::gc::refill`]).
    Refill,
}

/// Default `--sample-period`, milliseconds.
pub const DEFAULT_SAMPLE_MS: u64 = 100;

/// What is done while the target runs ([`crate::live`]): settings from
/// the command line.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Timeline sampling period; `None` turns sampling off.
    pub sample_period: Option<Duration>,
    /// `--interval`: reprint the top table this often.
    pub interval: Option<Duration>,
    /// `--snapshot-every`: write a numbered profile this often.
    pub snapshot_every: Option<Duration>,
    /// Rows of the reprinted table.
    pub top: usize,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            sample_period: Some(Duration::from_millis(DEFAULT_SAMPLE_MS)),
            interval: None,
            snapshot_every: None,
            top: 10,
        }
    }
}

/// When a profile gets a census of the whole GC heap by type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CensusWhen {
    /// At the first held collection: what was live before memprof.
    Start,
    /// At the first collection after the session is asked to end
    /// (waiting up to `--census-wait`): what is live as memprof leaves.
    End,
    /// Both (attach's default).
    Both,
    /// Both, and at collections in between as a budget allows.
    Periodic,
    /// None.
    Off,
}

impl CensusWhen {
    /// Whether the first held collection is censused.
    pub fn at_first(self) -> bool {
        matches!(
            self,
            CensusWhen::Start | CensusWhen::Both | CensusWhen::Periodic
        )
    }

    /// Whether the session waits for a collection to census at its end.
    pub fn at_end(self) -> bool {
        matches!(
            self,
            CensusWhen::End | CensusWhen::Both | CensusWhen::Periodic
        )
    }

    /// `--census`, or the mode's default: `attach` censuses what was
    /// live before it and what is live as it leaves; `run` saw every
    /// allocation, and a census holds the collector ~1 ms per MB of heap
    /// (and keeps a copy of the heap in memprof) for what the profile has.
    pub fn or_default(when: Option<CensusWhen>, mode: Mode) -> CensusWhen {
        when.unwrap_or(match mode {
            Mode::Attach => CensusWhen::Both,
            Mode::Run => CensusWhen::Off,
        })
    }
}

impl SessionOptions {
    /// The options of the probes `run` follows its command's processes
    /// with ([`crate::session::machine::Family`]): as the command's, but the
    /// collector's allocation functions are not probed when the command
    /// samples its collector at refills (a uprobe sits on the file: the
    /// command would take a trap at each of its own GC allocations).
    pub fn for_family(&self) -> SessionOptions {
        let mut options = self.for_followed();
        if self.gc_sampling == GcSampling::Refill && self.heap == Heap::All {
            options.heap = Heap::Libc;
        }
        options
    }

    /// The options of a session whose profile becomes part of another's
    /// (a process `run` follows, one `attach --comm/--exe` selects): no
    /// file, no live output or census of its own, its plan said quietly.
    pub fn for_followed(&self) -> SessionOptions {
        SessionOptions {
            output: None,
            live: LiveOptions::default(),
            census: Some(CensusWhen::Off),
            followed: true,
            ..self.clone()
        }
    }
}

/// How the session started: `run` launched the target, `attach` found it running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Attach,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Run => "run",
            Mode::Attach => "attach",
        }
    }
}
