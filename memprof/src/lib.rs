//! memprof: a memory profiler for Linux that attaches to a program from
//! outside, with eBPF uprobes on its allocator functions.
//!
//! The modules follow one allocation from the probe to the printed table:
//!
//! | stage | module |
//! |---|---|
//! | the process, its modules, launching it held | [`target`] |
//! | each module file of the target, mapped and parsed once | [`modules`] |
//! | which functions to probe, where they are | [`allocators`] |
//! | where in each function to put the probe (x86 analysis: `x86`) | [`placement`] |
//! | `--gc-sampling refill`: what weighs a free-list refill | [`refill`] |
//! | the eBPF programs: loading, attaching, their tables, the GC hold | [`probes`] |
//! | the kernel's tables → groups per stack | [`heap`] |
//! | addresses → names and `file:line` | [`symbolize`] |
//! | Crystal names, allocator plumbing, allocated classes | [`crystal`] |
//! | the `.mprof` file | [`profile`] |
//! | output files written whole or not at all | [`outfile`] |
//! | markdown, tsv, json, folded, flamegraph, pprof, timeline, html, diff | [`report`] |
//! | what a session is asked to do | [`options`] |
//! | which probes where, before anything is attached | [`plan`] |
//! | the whole pipeline of one process, for `run` and `attach` | [`session`] |
//! | `attach --all`: every process, one load of the probes | [`host`] |
//! | timeline sampling, `--interval`, `--snapshot-every` while attached | [`live`] |
//! | `memprof heap`: the whole GC heap at one collection, and where the RSS goes | [`census`] |
//! | the one loop of every long-running mode; signals, output, profile header, merge | [`driver`] |
//! | the subcommands: options checked, a mode run under the driver | [`commands`] |
//! | progress bars on a terminal | [`progress`] |
pub mod allocators;
pub mod census;
pub mod cli;
pub mod commands;
pub mod crystal;
pub mod driver;
pub mod gc;
pub mod heap;
pub mod host;
pub mod live;
pub mod memory;
pub mod modules;
pub mod options;
pub mod outfile;
pub mod placement;
pub mod plan;
pub mod predict;
pub mod probes;
pub mod profile;
pub mod progress;
pub mod refill;
pub mod report;
pub mod sampling;
pub mod session;
pub mod symbolize;
pub mod target;
pub mod top;
pub mod unwind;
pub(crate) mod x86;

pub use commands::run_cli;
