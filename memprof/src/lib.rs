//! memprof: a memory profiler for Linux that attaches to a program from
//! outside, with eBPF uprobes on its allocator functions.
//!
//! As a library, memprof offers what a program needs to work with the
//! profiles the `memprof` command writes:
//!
//! - [`profile`]: read a `.mprof` file ([`profile::load`], [`profile::parse`],
//!   with a typed [`profile::ProfileError`]) or write one;
//! - [`report`]: render a profile in any of the command's formats
//!   ([`report::render`]);
//! - [`cli`] and [`run_cli`]: the command line itself, for the `memprof`
//!   binary.
//!
//! Everything else is the command's own pipeline, private to the crate.
//! Its modules, in the order one allocation goes through them (and
//! `docs/ARCHITECTURE.md` draws the same map):
//!
//! | stage | module |
//! |---|---|
//! | the command line, checked, a mode chosen | `cli`, `commands` |
//! | what a session is asked to do | `options` |
//! | the one loop of every long-running mode; signals, output, profile header, merge | `driver` |
//! | the process, its modules, launching it held | `target` |
//! | each module file of the target, mapped and parsed once | `modules` |
//! | which functions to probe, where they are | `allocators` |
//! | where in each function to put the probe (x86 analysis: `x86`) | `placement` |
//! | reading an allocator's result at its entry | `predict` |
//! | `--gc-sampling refill`: what weighs a free-list refill | `refill` |
//! | `--sample-bytes`: the kernel's distances, the scale-up | `sampling` |
//! | `.eh_frame` → compact CFI rows for the kernel's unwinder | `unwind` |
//! | which probes where, before anything is attached | `plan` |
//! | the eBPF programs: loading, attaching, their tables, the GC hold | `probes` |
//! | the whole pipeline of one process, for `run` and `attach` | `session` |
//! | `attach --all`: every process of the machine, one load of the probes | `machine` |
//! | GC liveness: libgc's layout, the copy of GC objects, mark bits, the census | `gc` |
//! | timeline sampling, `--interval`, `--snapshot-every` while attached | `live` |
//! | `memprof top`: the watched processes' running figures | `top` |
//! | the kernel's tables → groups per stack | `groups` |
//! | addresses → names and `file:line` | `symbolize` |
//! | Crystal names, allocator plumbing, allocated classes | `crystal` |
//! | the `.mprof` file | [`profile`] |
//! | output files written whole or not at all | `outfile` |
//! | markdown, tsv, json, folded, flamegraph, pprof, timeline, html, diff | [`report`] |
//! | `memprof heap`: the whole GC heap at one collection, and where the RSS goes | `whole_heap` |
//! | `memprof agent`: every process, served while it runs (metrics, pprof, JSON, a page) | `agent` |
//! | memprof's own memory; progress bars on a terminal | `memory`, `progress` |
//! | a target's names shown as data, never terminal commands | [`text`] |

/// memprof's messages quote targets' command lines and file names: this
/// `eprintln!`, in scope in every module below in place of std's, writes
/// them with their control characters escaped ([`text::to_stderr`]).
macro_rules! eprintln {
    () => {
        $crate::text::to_stderr(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::text::to_stderr(format_args!($($arg)*))
    };
}

pub mod commands;
pub mod profile;
pub mod report;
pub mod text;

pub(crate) mod allocators;

pub(crate) mod crystal;
pub(crate) mod driver;
pub(crate) mod gc;
pub(crate) mod groups;
pub(crate) mod live;
pub(crate) mod machine;
pub(crate) mod memory;
pub(crate) mod modules;
pub(crate) mod options;
pub(crate) mod outfile;
pub(crate) mod placement;
pub(crate) mod plan;
pub(crate) mod predict;
pub(crate) mod probes;
pub(crate) mod progress;
pub(crate) mod refill;
pub(crate) mod sampling;
pub(crate) mod session;
pub(crate) mod symbolize;
pub(crate) mod tracee;
pub(crate) mod unwind;
pub(crate) mod whole_heap;
pub(crate) mod x86;

pub use commands::run_cli;
pub use memory::configure as configure_memory;
