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
//! - [`commands`]: the command line itself ([`commands::cli`],
//!   [`commands::run_cli`]), for the `memprof` binary.
//!
//! Everything else is the command's own pipeline, private to the crate,
//! in layers: a module imports only from its own layer or those below
//! (`docs/ARCHITECTURE.md`, "Layers", which a test holds the code to).
//!
//! | layer | modules |
//! |---|---|
//! | 10 entry points for `fuzz/` only (hidden) | `fuzzing` |
//! | 9 the command line, each command's mode, the agent, `top` | [`commands`] |
//! | 8 one process, a selection, `run`'s family, every process; `memprof heap` | `session`, `whole_heap` |
//! | 7 the one loop of every mode, signals, a profile's header and output | `driver` |
//! | 6 the kernel's tables → the profile's groups; live sampling; what to attach where | `groups`, `live`, `plan` |
//! | 5 the Boehm GC; what a session is asked; results read at an allocator's entry | `gc`, `options`, `predict` |
//! | 4 addresses and type ids named; reports; the eBPF programs and maps | `symbolize`, [`report`], `probes` |
//! | 3 the process launched or attached; x86 code; Crystal names; allocators; unwind tables | `tracee`, `x86`, `crystal`, `allocators`, `unwind` |
//! | 2 the `.mprof` file; the target's files and mappings | [`profile`], `modules` |
//! | 1 text as shown; sampling arithmetic; memprof's own memory; output files | [`text`], `sampling`, [`memory`], `progress`, `outfile` |

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
#[doc(hidden)]
pub mod fuzzing;
pub mod memory;
pub mod profile;
pub mod report;
pub mod text;

pub(crate) mod allocators;
pub(crate) mod crystal;
pub(crate) mod driver;
pub(crate) mod gc;
pub(crate) mod groups;
pub(crate) mod live;
pub(crate) mod modules;
pub(crate) mod options;
pub(crate) mod outfile;
pub(crate) mod plan;
pub(crate) mod predict;
pub(crate) mod probes;
pub(crate) mod progress;
pub(crate) mod sampling;
pub(crate) mod session;
pub(crate) mod symbolize;
pub(crate) mod tracee;
pub(crate) mod unwind;
pub(crate) mod whole_heap;
pub(crate) mod x86;
