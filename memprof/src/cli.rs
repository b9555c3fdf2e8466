//! Command-line interface.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::report::Format;
use crate::session::{GcLiveness, Heap, Unwind};

#[derive(Debug, Parser)]
#[command(
    name = "memprof",
    version,
    about = "Memory profiler for running Linux programs: every malloc, calloc, realloc, free and mmap, seen from outside with eBPF",
    long_about = "memprof attaches eBPF uprobes to a program's allocator functions (libc malloc and \
friends, mmap/munmap) without changing or restarting it. It keeps a table of live blocks per call \
stack in the kernel and, at the end, writes a self-contained profile (.mprof) and prints the stacks \
holding the most live memory.\n\n\
Examples:\n  \
sudo memprof run -o app.mprof -- ./app --flag      profile a command from its first instruction\n  \
sudo memprof attach --pid 1234 --duration 30        profile a running process for 30 s\n  \
memprof report app.mprof --format markdown          read a profile (no root needed)\n  \
sudo memprof probes --pid 1234                      show where the probes would go and why\n\n\
run, attach and probes need root (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a command and profile it from its first instruction.
    ///
    /// The command is held right after exec until every probe is attached,
    /// so nothing it allocates is missed. When it exits, the profile is
    /// written and the top live stacks are printed. memprof exits with the
    /// command's exit code. Ctrl-C stops profiling (the command gets it too).
    Run {
        #[command(flatten)]
        session: SessionArgs,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<String>,
    },
    /// Profile a running process; it keeps running when memprof ends.
    ///
    /// Only allocations made while attached are seen; frees of older blocks
    /// are counted as "frees of unknown blocks". Ends on Ctrl-C, SIGTERM,
    /// --duration, or when the process exits.
    Attach {
        /// Process id to attach to.
        #[arg(long, short)]
        pid: u32,
        /// Stop after this many seconds.
        #[arg(long, short)]
        duration: Option<f64>,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Show where each probe goes in a running process, and why.
    ///
    /// An entry probe on an instruction the kernel emulates (push, jmp, jcc,
    /// call, nop) costs ~0.8 µs a hit; one that must be single-stepped ~10 µs.
    /// memprof moves each probe to the first emulated instruction reached
    /// with the arguments, %rsp and %rbp still intact.
    Probes {
        /// Process id.
        #[arg(long, short)]
        pid: u32,
        /// Show the +0 placement used with --probe-at-entry.
        #[arg(long)]
        probe_at_entry: bool,
        /// Which allocators: libc, gc or all.
        #[arg(long, value_enum, default_value_t = Heap::All)]
        heap: Heap,
    },
    /// Print a profile written by run or attach.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// Where to write the profile [default: NAME.mprof for run, NAME-PID.mprof for attach].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Capacity of the kernel's live-block table; blocks beyond it are counted as lost.
    #[arg(long, default_value_t = 1 << 20, value_name = "N")]
    pub max_live: u32,
    /// Capacity of the kernel's stack table (distinct call stacks); allocations
    /// with a stack beyond it are counted as "stacks not captured".
    #[arg(long, default_value_t = 1 << 16, value_name = "N")]
    pub max_stacks: u32,
    /// Capacity of the per-stack totals table.
    #[arg(long, default_value_t = 1 << 16, value_name = "N")]
    pub max_sites: u32,
    /// Put every entry probe at the first instruction (no placement; slower, for comparison).
    #[arg(long)]
    pub probe_at_entry: bool,
    /// Attach probes that record nothing (benchmark of the bare probe cost).
    #[arg(long, hide = true)]
    pub empty_probes: bool,
    /// Rows of the table printed at the end.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Which allocators to profile: libc (malloc & co, mmap), gc (Boehm GC), or all.
    #[arg(long, value_enum, default_value_t = Heap::All)]
    pub heap: Heap,
    /// How to capture call stacks. dwarf unwinds in the kernel with CFI tables
    /// built from each module's .eh_frame (works without frame pointers, e.g.
    /// Crystal); fp follows frame pointers (cheaper). auto = dwarf.
    #[arg(long, value_enum, default_value_t = Unwind::Auto)]
    pub unwind: Unwind,
    /// How dead Boehm GC objects are found. marks: after every collection,
    /// read the collector's own mark bits (memprof traces the target with
    /// ptrace and holds the collecting thread, world already stopped, while
    /// it reads them: a pause of ~1 ms per 10,000 tracked objects, see
    /// `cargo xtask bench`), plus address reuse. reuse: only address reuse
    /// (an object counts as live until GC_free or until its address is
    /// allocated again; no tracing, no pause, overstates live memory).
    /// memprof falls back to reuse, and says so, when the target's libgc is
    /// not one it can read or the target cannot be traced (a debugger).
    #[arg(long, value_enum, default_value_t = GcLiveness::Marks)]
    pub gc_liveness: GcLiveness,
    /// Write each mark-bit verdict to FILE: `<GC_gc_no> <address> live|dead <why>`.
    #[arg(long, hide = true, value_name = "FILE")]
    pub gc_verdicts: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Profile file (.mprof) written by run or attach.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Format::Markdown)]
    pub format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Leave out stacks with fewer live bytes [default: 1024 for markdown and tsv, 0 for json].
    #[arg(long, value_name = "BYTES")]
    pub min_bytes: Option<u64>,
    /// Frames shown per stack [default: 5 for markdown and tsv, all for json].
    #[arg(long, value_name = "N")]
    pub depth: Option<usize>,
    /// Skip this many innermost frames of every stack.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub skip: usize,
    /// Show at most N stacks.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Hide the allocator plumbing at the top of each stack (GC_malloc,
    /// GC.malloc, __crystal_malloc64, Pointer(T).malloc, …), so the first frame
    /// shown is the allocation site; --skip-runtime=false shows it.
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub skip_runtime: bool,
    /// Only GC stacks that leak, most growth first: seen at 3 or more
    /// collections, more live objects at the last than at the first, rose
    /// at more collections than it fell, and within 10% of its highest
    /// count at the end. Growth in bytes = objects gained × mean object
    /// size. (Needs `--gc-liveness marks` when profiling; for libc blocks
    /// the plain table, "still live at the end", is the leak view.)
    #[arg(long)]
    pub leaks: bool,
}
