//! Command-line interface.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::options::{CensusWhen, GcLiveness, GcSampling, Heap, Unwind};
use crate::report::{Count, Format};

/// Where the agent serves unless `--socket` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/memprof/agent.sock";

/// The agent's `--dir-every` unless given, in seconds.
pub const DEFAULT_EVERY_S: f64 = 60.0;

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
memprof report app.mprof --format html -o r.html    one page: summary, timeline, flamegraph, tables\n  \
memprof report --diff snap-0001.mprof snap-0002.mprof   what grew between two snapshots\n  \
sudo memprof probes --pid 1234                      show where the probes would go and why\n  \
sudo memprof heap --pid 1234                        live objects per type in the whole GC heap, and where the RSS goes\n\n\
run, attach, top, probes and heap need root (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE)."
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
        /// Profile the command's own process only. By default every process
        /// it starts (and they start) is profiled too, each a process of
        /// the one profile (`memprof report FILE --pid N`): one that runs a
        /// program (`exec`) from that program's first instruction (it waits
        /// ~0.5 s there while its probes load), a forked worker from 0.2 s
        /// after its fork. Either way, every process started is listed with
        /// its parent, program and exit.
        #[arg(long)]
        no_follow: bool,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<std::ffi::OsString>,
    },
    /// Profile a running process (or every process of a program); it keeps
    /// running when memprof ends.
    ///
    /// Only allocations made while attached are seen; frees of older blocks
    /// are counted as "frees of unknown blocks". Ends on Ctrl-C, SIGTERM,
    /// --duration, or when the process exits (with --comm/--exe: Ctrl-C,
    /// SIGTERM or --duration).
    #[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["pid", "comm", "exe", "all"]))]
    Attach {
        /// Process id to attach to.
        #[arg(long, short, conflicts_with_all = ["comm", "exe", "all"])]
        pid: Option<u32>,
        /// Every process of the machine that allocates, those running and
        /// those that start while memprof runs (each from its first
        /// allocation followed; a process that lives 5 ms too), with one
        /// load of the probes: each allocator file (each libc, each
        /// libgc, each program with its own) is probed once, for every
        /// process, and the kernel keeps each process's tables apart.
        /// Sampled (--sample-bytes 524288) unless given; GC objects are
        /// judged by address reuse only (no mark bits: nothing is traced).
        /// Ends on Ctrl-C, SIGTERM or --duration.
        #[arg(long, conflicts_with_all = ["comm", "exe"])]
        all: bool,
        /// Every process running this program (the kernel's name of it:
        /// the program file's name as `exec` set it, its first 15
        /// characters, e.g. `puma`), those running now and those that
        /// start while memprof runs, each from its first allocation (a
        /// process that lives a millisecond too), each a process of the one
        /// profile. Repeatable (16 at most). One load of the probes, as
        /// --all: the kernel checks each new process's name and executable
        /// (the probes sit on the allocator files, so every process's
        /// calls trap; those not selected return at once, ~1 µs). A program
        /// that allocates with the Boehm GC (Crystal) also gets a session
        /// of its own once seen (~0.5 s): its collections held, its mark
        /// bits read.
        #[arg(long, value_name = "NAME")]
        comm: Vec<String>,
        /// Every process running this executable (the file: its device and
        /// inode; static Crystal binaries too), now and as they start.
        /// Repeatable (16 at most); combines with --comm.
        #[arg(long, value_name = "PATH")]
        exe: Vec<PathBuf>,
        /// Stop after this many seconds.
        #[arg(long, short)]
        duration: Option<f64>,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// A live table of the selected processes' heaps, like `top`.
    ///
    /// One row per process, ranked by live bytes and refreshed every
    /// --interval seconds (default 1): live bytes (libc, mmap and GC), their
    /// growth a second over the last interval, allocations a second (GC
    /// objects estimated with --gc-sampling refill) and GC collections a
    /// second. Processes are selected as `attach` selects them, now and as
    /// they start; each is attached to with a session of its own (~0.5 s,
    /// ~126 MB of kernel memory at the default --max-live) and let go,
    /// untraced, at the end. `q` quits in a terminal; without one, each
    /// refresh is appended to stdout. No profile is written unless -o asks
    /// for one. libc figures are exact; GC ones are estimated from the
    /// collector's refills unless --gc-sampling exact. --sample-bytes does
    /// not apply.
    ///
    /// With --agent, the figures are a running `memprof agent`'s instead
    /// (its /api/processes, asked at each refresh over its socket): no
    /// probes are loaded and nothing is attached to; every running process
    /// the agent follows is shown, or those --pid, --comm and --exe name.
    ///
    /// Examples:
    ///   sudo memprof top --comm puma --comm my_server
    ///   sudo memprof top --agent                      every process the agent follows
    ///   sudo memprof top --agent /run/memprof/agent.sock --comm puma --count 3
    #[command(verbatim_doc_comment)]
    Top {
        /// Read the figures from a running `memprof agent` on this socket
        /// (/run/memprof/agent.sock unless given) instead of attaching:
        /// --pid, --comm and --exe then only choose the rows (none: every
        /// running process the agent follows).
        #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = DEFAULT_SOCKET)]
        agent: Option<PathBuf>,
        /// A process to watch (repeatable).
        #[arg(long, short, value_name = "PID")]
        pid: Vec<u32>,
        /// Every process running this program, now and as they start (repeatable).
        #[arg(long, value_name = "NAME")]
        comm: Vec<String>,
        /// Every process running this executable, now and as they start (repeatable).
        #[arg(long, value_name = "PATH")]
        exe: Vec<PathBuf>,
        /// Stop after this many refreshes.
        #[arg(long, value_name = "N")]
        count: Option<u32>,
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
        #[arg(long, short, required_unless_present = "kernel")]
        pid: Option<u32>,
        /// Only what the running kernel offers the probes (multi-uprobe
        /// links, uprobe sessions, the task-VMA iterator), and what each
        /// absence costs; printed first with --pid too.
        #[arg(long, conflicts_with = "pid")]
        kernel: bool,
        /// Show the +0 placement used with --probe-at-entry.
        #[arg(long)]
        probe_at_entry: bool,
        /// Which allocators: libc, gc or all.
        #[arg(long, value_enum, default_value_t = Heap::All)]
        heap: Heap,
    },
    /// Census of a running program's whole Boehm GC heap, and where its RSS goes.
    ///
    /// Judges every object in every heap block by the collector's own
    /// verdict (live = marked at its last collection): live objects and
    /// bytes per type (Crystal type ids, named from the program's
    /// constructors), per kind and size class, and a table of the
    /// process's resident memory that adds up to its RSS.
    ///
    /// An idle program (one that collected, then allocated little: at most
    /// 256 KiB or 1% of its heap) is answered at once: memprof stops it for
    /// a moment with its collector at rest and reads the marks its last
    /// collection left. Objects allocated since that collection are not
    /// marked yet and are not classified; the report says which
    /// collection it describes and how many bytes were allocated since.
    ///
    /// A program that allocated more since (or never collected) is waited
    /// for: memprof says so on stderr, attaches without allocation probes,
    /// and at its next collection, its collector held at the end of
    /// marking (world stopped, marks final), copies the block headers,
    /// mark bits and live objects' first bytes, then lets it go: every
    /// object judged. No collection within --wait: the census from the
    /// last collection's marks, saying so (or, if it never collected, an
    /// error).
    Heap {
        /// Process id.
        #[arg(long, short)]
        pid: u32,
        /// Seconds to wait for a collection when one is needed for an
        /// exact census; 0: never wait, census now from the last
        /// collection's marks, stating what they cannot classify.
        #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
        wait: f64,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = crate::whole_heap::HeapFormat::Markdown)]
        format: crate::whole_heap::HeapFormat,
        /// Write to this file instead of standard output (written whole, only on success).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Type rows shown in markdown [default: 40].
        #[arg(long, value_name = "N")]
        top: Option<usize>,
        /// Also retained bytes per type (as perf-tools MemProf's
        /// log_object_sizes): the bytes of every live object reachable from
        /// the type's objects, each once. Copies large scanned objects
        /// whole while the collector is held.
        #[arg(long)]
        sizes: bool,
        /// Also the objects that point to objects of TYPE (a name of the
        /// type table: `Author`, `Array(Author) buffer`, `(type 28)`),
        /// level by level, as a mermaid graph (MemProf's
        /// pretty_log_object_graph). Copies large scanned objects whole
        /// while the collector is held.
        #[arg(long, value_name = "TYPE")]
        graph: Option<String>,
        /// --graph: levels of referrers followed.
        #[arg(long, default_value_t = 3, value_name = "N")]
        ref_level: usize,
        /// --graph: objects of TYPE followed, and referrers of each object shown.
        #[arg(long, default_value_t = 10, value_name = "N")]
        ref_limit: usize,
    },
    /// Profile every process of the machine continuously, and serve what
    /// is known while it runs: Prometheus metrics, Go-style heap profiles
    /// for pprof, Parca and Pyroscope, a JSON API and a live page.
    ///
    /// Follows every process (or those --comm/--exe select), those running
    /// and those that start, as `attach --all` does: their resident memory
    /// by stack (each page's first write, kind rss), sampled by bytes
    /// (--sample-bytes 524288 unless given), with nothing run per
    /// allocation call (--calls: libc and mmap calls too, in every process;
    /// --examine: in the processes named; --escalate: in a process whose
    /// resident memory keeps growing, for a window); each program that
    /// allocates with the Boehm GC (Crystal) gets a session of its own, its
    /// GC objects sampled at the collector's refills and judged by its mark
    /// bits. Runs until SIGTERM or Ctrl-C (or --duration), then lets every
    /// process go, untraced.
    ///
    /// Serves HTTP on a Unix socket (root's alone unless --group), and on a
    /// TCP address only when --listen asks:
    ///
    ///   /metrics                          Prometheus text format: live bytes and blocks per process and kind, allocations, GC collections, losses
    ///   /debug/pprof/heap?pid=N           Go's heap profile (alloc_objects, alloc_space, inuse_objects, inuse_space; resident_pages, resident_space); ?comm=NAME: a program's processes merged; &seconds=S: what was allocated in the next S seconds
    ///   /api/processes                    JSON: the processes followed, and those that ended (the last 1,000 kept)
    ///   /api/escalations                  JSON: the processes given allocator probes of their own (--examine, --escalate), and when
    ///   /api/profile?pid=N&format=F       one process's profile in a format of `memprof report` (json unless F)
    ///   /                                 a page: processes by live bytes, refreshed; a click shows one's profile
    ///
    /// With --dir DIR, each process's profile is also kept in DIR (one .mprof
    /// file each, replaced by its next snapshot; within --dir-budget), and an
    /// agent started again with the same DIR serves those processes as ended.
    ///
    /// Examples:
    ///   sudo memprof agent
    ///   sudo curl --unix-socket /run/memprof/agent.sock http://agent/metrics
    ///   sudo memprof agent --listen 127.0.0.1:6060 --comm my_server
    ///   go tool pprof http://127.0.0.1:6060/debug/pprof/heap?comm=my_server
    ///   sudo memprof agent --dir /var/lib/memprof --dir-budget 200M
    #[command(verbatim_doc_comment)]
    Agent {
        /// Every process running this program (the kernel's name of it),
        /// now and as they start (repeatable); by default every process.
        #[arg(long, value_name = "NAME")]
        comm: Vec<String>,
        /// Every process running this executable, now and as they start (repeatable).
        #[arg(long, value_name = "PATH")]
        exe: Vec<PathBuf>,
        /// The Unix socket to serve on (its directory is made if missing).
        #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
        socket: PathBuf,
        /// A group whose members may connect to the socket too (mode 0660);
        /// by default only root can (mode 0600).
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// Also serve HTTP on this address (e.g. 127.0.0.1:6060). A
        /// loopback address unless --allow-remote: everything served
        /// (command lines, executables, stacks) is readable by whoever
        /// reaches it, without authentication.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
        /// Let --listen take an address other machines can reach.
        #[arg(long, requires = "listen")]
        allow_remote: bool,
        /// /metrics: processes with labels of their own (pid, comm, exe),
        /// the most live bytes first; the others are summed in one series
        /// with pid="other", so the series stay bounded.
        #[arg(long, default_value_t = 100, value_name = "N")]
        metrics_top: usize,
        /// Keep each process's profile in this directory, so that an agent
        /// started again with the same --dir (after a restart, a reboot)
        /// serves the processes seen before: listed in /api/processes as
        /// ended, their profiles in /api/profile?pid=N, /debug/pprof/heap
        /// and `memprof report --agent --pid N`. One file per process,
        /// PID-STARTUNIX-PROGRAM.mprof (a profile file: `memprof report`
        /// reads it), replaced by each newer snapshot: every --dir-every
        /// seconds for the processes whose figures changed since their
        /// last one, once with its exit when a process ends, and at SIGTERM.
        /// The directory must be root's and writable by root alone; it is
        /// made (mode 0700) if missing. Example: --dir /var/lib/memprof
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// --dir: the most its snapshots may take; after each write the
        /// oldest are deleted until they fit (ended processes' first, then
        /// running ones'), counted in memprof_dir_snapshots_deleted_total.
        /// A number of bytes, or with K, M, G or T (powers of 1024; KiB,
        /// MB… read the same), e.g. 200M.
        #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size, requires = "dir")]
        dir_budget: u64,
        /// --dir: seconds between two snapshots of a process whose figures changed.
        #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_EVERY_S, requires = "dir")]
        dir_every: f64,
        /// Probe the allocator functions too (every libc `malloc` and
        /// `free` of every process followed traps into the kernel, 1-2
        /// µs each: a release `cargo build` took 15 times as long). By
        /// default the agent follows resident memory only (--rss-only):
        /// no process pays anything per allocation call.
        #[arg(long, conflicts_with = "rss_only")]
        calls: bool,
        /// Probe the allocator functions of this process (a pid), or of
        /// every process of this program (the name /api/processes gives),
        /// for it alone, as long as it runs: its libc and mmap stacks
        /// beside its resident memory, no other process paying anything
        /// (repeatable; looked at every 5 s).
        #[arg(long, value_name = "PID|NAME", conflicts_with = "calls")]
        examine: Vec<String>,
        /// Escalate a process whose resident memory keeps growing: when
        /// the resident bytes memprof counts for it grew by GROWTH over
        /// the last SECONDS (and it was followed all that time), its
        /// allocator functions are probed, for it alone, for
        /// --escalate-for seconds, once per process; then the probes come
        /// off. `off`: never. Looked at every 5 s.
        #[arg(long, value_name = "GROWTH/SECONDS", default_value = "32M/60", value_parser = parse_escalate)]
        escalate: Escalate,
        /// How long an escalated process keeps its allocator probes.
        #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
        escalate_for: f64,
        /// Processes escalated at once, at most (others wait for a place).
        #[arg(long, value_name = "N", default_value_t = 2)]
        escalate_max: usize,
        /// Stop after this many seconds.
        #[arg(long, short)]
        duration: Option<f64>,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Print a profile written by run or attach.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// Where to write the profile [default: NAME.mprof for run, NAME-PID.mprof for attach].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Capacity of the kernel's live-block table (libc and mmap blocks; GC
    /// objects too with --gc-liveness reuse); blocks beyond it are counted
    /// as lost. GC objects judged by mark bits are in memprof's own copy.
    /// The table is preallocated: ~126 MB of kernel memory at 1048576.
    /// [default: 1048576; 65536 when allocations are sampled by bytes,
    /// as for attach --comm/--exe, where each process has a table: a
    /// sampled table holds about one block per 512 KiB live]
    #[arg(long, value_name = "N")]
    pub max_live: Option<u32>,
    /// Capacity of the kernel's stack table (distinct call stacks, DWARF
    /// unwinding: filled on demand); once it is full, new stacks are recorded
    /// under their innermost frame alone (marked truncated, counted as
    /// "stacks degraded"; nothing is lost).
    #[arg(long, default_value_t = 1 << 16, value_name = "N")]
    pub max_stacks: u32,
    /// Capacity of the per-site totals table (filled on demand); sites beyond
    /// it are added to one overflow group per kind (totals exact, no stack).
    #[arg(long, default_value_t = 1 << 18, value_name = "N")]
    pub max_sites: u32,
    /// A line on stderr for each process an event concerns (one gone
    /// before its mappings were read, an allocator probed late), not only
    /// one summary line per kind of event every 10 s (attach --all,
    /// --comm, --exe, run's processes).
    #[arg(long)]
    pub verbose: bool,
    /// Put every entry probe at the first instruction (no placement; slower, for comparison).
    #[arg(long)]
    pub probe_at_entry: bool,
    /// Attach probes that record nothing (benchmark of the bare probe cost).
    #[arg(long, hide = true)]
    pub empty_probes: bool,
    /// Rows of the table printed at the end.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Which allocators to profile: libc (malloc & co, mmap), gc (Boehm GC), or all
    /// [default: all; libc for attach --all].
    #[arg(long, value_enum)]
    pub heap: Option<Heap>,
    /// How to capture call stacks. dwarf unwinds in the kernel with CFI tables
    /// built from each module's .eh_frame (works without frame pointers, e.g.
    /// Crystal); fp follows frame pointers (cheaper). auto = dwarf.
    /// dwarf folds recursion (see --keep-recursion); fp keeps every frame
    /// it walks.
    #[arg(long, value_enum, default_value_t = Unwind::Auto)]
    pub unwind: Unwind,
    /// DWARF unwinding: keep every frame of recursive calls. By default a
    /// frame whose function is one of the 4 frames kept just inside it is
    /// left out (direct and short mutual recursion fold into their innermost
    /// call, the callers outside stay), so each recursion path is not a
    /// stack of its own; such stacks are marked folded.
    #[arg(long)]
    pub keep_recursion: bool,
    /// Sample allocations instead of following every one: on average one
    /// sample point every N bytes allocated (a Poisson process over bytes,
    /// as tcmalloc and Go do), so an allocation of s bytes is followed
    /// (stack, free, GC verdict) with probability 1 - exp(-s/N). Reports
    /// scale each stack's counts and bytes to unbiased estimates and say so.
    /// Frees of blocks not sampled count as frees of unknown blocks.
    /// 0 follows every allocation [default: 0; 524288 for attach --comm
    /// and --exe]. With --gc-sampling refill it samples the other
    /// allocators (libc), GC ones being sampled at the refills.
    #[arg(long, value_name = "N")]
    pub sample_bytes: Option<u64>,
    /// Resident memory by stack too (attach --all, --comm, --exe; the
    /// agent's default): each page of memory a process writes for the
    /// first time (its page fault, which the kernel pays for anyway),
    /// with the stack that wrote it, whatever allocated it (glibc,
    /// jemalloc, Go, the JVM, the Boehm GC's heap, a bare mmap); given
    /// back when its range is unmapped or discarded (munmap, madvise
    /// DONTNEED/FREE/REMOVE, brk lowered, mremap shrinking, mmap MAP_FIXED over
    /// it). Sampled as allocations are (--sample-bytes; a page weighs
    /// 4 KiB; 0: every page). Its own kind in reports: `rss`. A page
    /// read before it is written is the kernel's zero page: not counted.
    #[arg(long)]
    pub rss: bool,
    /// Only resident memory (--rss): no probe on any allocator function,
    /// so no process pays anything per allocation call (a malloc loop
    /// runs at full speed); what costs is a sampled page fault's stack.
    /// The agent's default.
    #[arg(long, conflicts_with = "rss")]
    pub rss_only: bool,
    /// How Boehm GC allocations are followed. exact: every GC_malloc and
    /// GC_malloc_atomic call is probed (about a microsecond each). refill:
    /// the collector's fast path is left alone; memprof probes where a
    /// thread's free list runs out and is refilled (GC_generic_malloc_many,
    /// about one call per block of objects: 1 in 72 allocations on
    /// binary-trees), and what the free lists do not serve (a thread's
    /// first objects of each size, large objects: exact). The allocation
    /// that ran a list out is a sample standing for the list's objects:
    /// its stack, its object tracked and judged by the mark bits; reports
    /// scale counts and bytes to estimates and say so. Needs mark bits
    /// (--gc-liveness marks) and DWARF unwinding; where the target's libgc
    /// lacks those functions memprof says so and samples by bytes
    /// (--sample-bytes 524288) instead. libc allocations stay exact, or
    /// sampled by --sample-bytes if given. [default: exact; refill for
    /// attach --comm/--exe and top, with --gc-liveness marks and DWARF
    /// unwinding]
    #[arg(long, value_enum, value_name = "HOW")]
    pub gc_sampling: Option<GcSampling>,
    /// With --gc-sampling refill: follow one refill in K, drawn at random,
    /// each standing for K lists (reports scale by it and say so). The
    /// others cost only the probe's trap (about 1 µs), not the stack,
    /// the return probe and the verdict: the price of refill sampling on
    /// a program that allocates all the time (a web server) falls by
    /// about K. 1 follows every refill. [default: 1; 16 for agent]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=255))]
    pub gc_refill_every: Option<u32>,
    /// How dead Boehm GC objects are found. marks: after every collection,
    /// read the collector's own mark bits (memprof traces the target with
    /// ptrace and holds the collecting thread, world already stopped, while
    /// it reads them: a pause of about 45 ms per collection with 1,000,000
    /// tracked objects, 4 ms with 100,000, see `cargo xtask bench`), plus
    /// address reuse. reuse: only address reuse
    /// (an object counts as live until GC_free or until its address is
    /// allocated again; no tracing, no pause, overstates live memory).
    /// memprof falls back to reuse, and says so, when the target's libgc is
    /// not one it can read or the target cannot be traced (a debugger).
    #[arg(long, value_enum, default_value_t = GcLiveness::Marks)]
    pub gc_liveness: GcLiveness,
    /// A census of the whole GC heap by type in the profile (what `memprof
    /// heap` prints; `report --format types` shows it), each object judged
    /// by the collector at a held collection. start: at the first one, the
    /// objects live before memprof attached. end: at the first one after
    /// the session is asked to end (Ctrl-C, SIGTERM, --duration), what is
    /// live as memprof leaves; memprof waits up to --census-wait for it
    /// (Ctrl-C again skips). both: start and end (attach's default).
    /// periodic: both, and at collections in between as a budget allows
    /// (at most ~1/20 of the time). off: none (run's default: memprof saw
    /// every allocation). Each census holds the collector about 1 ms per
    /// MB of GC heap while memprof copies the heap, and memprof keeps that
    /// copy until the census is done.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub census: Option<CensusWhen>,
    /// How long the end census waits for the target to collect, in
    /// seconds (an idle program may not collect at all: then the last
    /// census taken stands for the end, and the profile says so).
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub census_wait: f64,
    /// Write each mark-bit verdict to FILE: `<GC_gc_no> <address> live|dead <why>`.
    #[arg(long, hide = true, value_name = "FILE")]
    pub gc_verdicts: Option<PathBuf>,
    /// Timeline: this often, sample the live blocks and bytes per kind (and
    /// the GC heap size) into the profile (report --format timeline|html
    /// draws them); 0 turns it off. A sample reads per-kind totals the
    /// kernel and memprof keep as blocks come and go (exact, O(1)); GC
    /// objects freed or collected count until the next mark-bit pass. The
    /// target is not stopped; sampling is kept under a tenth of memprof's
    /// time (samples spaced out, and memprof says so).
    #[arg(long, default_value_t = crate::options::DEFAULT_SAMPLE_MS, value_name = "MS")]
    pub sample_period: u64,
    /// Reprint the top table (--top rows) on stderr every SECS seconds while
    /// profiling: the screen is cleared first when stderr is a terminal,
    /// tables are appended otherwise. Off by default.
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// Write a complete profile every SECS seconds without detaching,
    /// numbered after --output: -o snap.mprof writes snap-0001.mprof,
    /// snap-0002.mprof, … (compare two with report --diff). The final
    /// profile is still written to --output at the end. Off by default.
    #[arg(long, value_name = "SECS")]
    pub snapshot_every: Option<f64>,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Filters apply to every format (and to both profiles of --diff). \
--leaked and --temporary are lifetime views; with --temporary the live counts and bytes \
of every format are those of the allocations that died soon (bytes = count × mean \
allocation size)."
)]
pub struct ReportArgs {
    /// Profile file (.mprof) written by run or attach.
    #[arg(required_unless_present_any = ["diff", "agent"])]
    pub file: Option<PathBuf>,
    /// Read the profile from a running `memprof agent` instead of a file:
    /// the process --pid names (or the running processes of --comm,
    /// merged), as it is now, or as it ended if it ended (the agent's
    /// socket: /run/memprof/agent.sock unless it was given another).
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["file", "diff"], num_args = 0..=1, default_missing_value = DEFAULT_SOCKET)]
    pub agent: Option<PathBuf>,
    /// Output format. pprof is binary (gzipped protobuf): write it with -o.
    /// With --diff: markdown or json.
    #[arg(long, short, value_enum, default_value_t = Format::Markdown)]
    pub format: Format,
    /// Compare two profiles of the same program: per stack (kind and
    /// frames), live count and bytes in AFTER minus BEFORE, biggest growth
    /// first; --format markdown or json.
    #[arg(long, num_args = 2, value_names = ["BEFORE", "AFTER"], conflicts_with = "file")]
    pub diff: Option<Vec<PathBuf>>,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Leave out stacks with fewer live bytes [default: 1024 for markdown and tsv, 0 for the other formats].
    /// With --diff: leave out stacks whose live bytes changed by less.
    #[arg(long, value_name = "BYTES")]
    pub min_bytes: Option<u64>,
    /// Frames shown per stack [default: 5 for markdown and tsv, all for json].
    #[arg(long, value_name = "N")]
    pub depth: Option<usize>,
    /// Skip this many innermost frames of every stack.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub skip: usize,
    /// Show at most N stacks (types: N types) [default: all; 50 in the html tables].
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
    /// Folded and flamegraph: what a stack's width counts, bytes or objects (blocks).
    #[arg(long, value_enum, default_value_t = Count::Bytes)]
    pub count: Count,
    /// Folded and flamegraph: count everything allocated during the run
    /// instead of what was live at the end.
    #[arg(long)]
    pub total: bool,
    /// Flamegraph: icicle graph, roots at the top (as flamegraph.pl --inverted).
    #[arg(long)]
    pub inverted: bool,
    /// Only this process's allocations (repeatable). `memprof report FILE`
    /// lists the processes of a session first (a profile from `run`: the
    /// command and every process it started).
    #[arg(long, value_name = "PID")]
    pub pid: Vec<u32>,
    /// Only the allocations of processes running this program (the file
    /// name of its command, e.g. `sort`; repeatable).
    #[arg(long, value_name = "NAME")]
    pub comm: Vec<String>,
    /// Only these kinds: libc, mmap, gc, gc_atomic (comma-separated or repeated) [default: all].
    #[arg(long, value_name = "KIND")]
    pub kind: Vec<String>,
    /// Only stacks with a frame whose function name matches REGEX (Rust regex syntax, unanchored).
    #[arg(long, value_name = "REGEX")]
    pub function: Option<String>,
    /// Only stacks with a frame whose source `file:line` matches REGEX (e.g. 'app\.cr:4[0-9]$').
    #[arg(long, value_name = "REGEX")]
    pub source: Option<String>,
    /// Leave out stacks with a frame whose function name matches REGEX.
    #[arg(long, value_name = "REGEX")]
    pub exclude_function: Option<String>,
    /// Only stacks whose mean allocation size (total_bytes / total_count of
    /// the stack) is at least BYTES.
    #[arg(long, value_name = "BYTES")]
    pub size_min: Option<u64>,
    /// Only stacks whose mean allocation size (total_bytes / total_count of
    /// the stack) is at most BYTES.
    #[arg(long, value_name = "BYTES")]
    pub size_max: Option<u64>,
    /// Lifetime view: only stacks with blocks still live at the end.
    #[arg(long, conflicts_with = "temporary")]
    pub leaked: bool,
    /// Lifetime view: only allocations that died soon after they were made:
    /// GC objects collected at the first collection after their allocation;
    /// libc and mmap blocks freed within --temporary-ms. Counts and bytes
    /// shown are those allocations (bytes = count × mean allocation size).
    #[arg(long)]
    pub temporary: bool,
    /// "Soon" for --temporary (libc and mmap), milliseconds; lifetimes are
    /// kept in buckets (0.1, 1, 10, 100 ms, 1, 10, 100 s), so this is
    /// rounded up to the next bucket bound.
    #[arg(long, default_value_t = crate::report::filter::DEFAULT_TEMPORARY_MS, value_name = "MS")]
    pub temporary_ms: u64,
    /// Only GC stacks that leak, most growth first: seen at 6 or more
    /// collections (at least half of those judged), each quarter of the
    /// history's mean live count above the one before, the last quarter's
    /// lowest above the first's highest, rising at a quarter or more of the
    /// collections. Growth in bytes = objects gained × mean object
    /// size. (Needs `--gc-liveness marks` when profiling; for libc blocks
    /// the plain table, "still live at the end", is the leak view.)
    #[arg(long)]
    pub leaks: bool,
}

/// `--escalate`: a growth of bytes over seconds, or never (`off`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Escalate(pub Option<(u64, f64)>);

/// `--escalate`: `GROWTH/SECONDS` (`32M/60`), or `off`.
pub fn parse_escalate(text: &str) -> Result<Escalate, String> {
    if text.trim() == "off" {
        return Ok(Escalate(None));
    }
    let wrong = || format!("{text:?}: say GROWTH/SECONDS (e.g. 32M/60), or off");
    let (growth, seconds) = text.split_once('/').ok_or_else(wrong)?;
    let growth = parse_size(growth)?;
    let seconds: f64 = seconds.trim().parse().map_err(|_| wrong())?;
    if !(seconds.is_finite() && seconds > 0.0) || growth == 0 {
        return Err(wrong());
    }
    Ok(Escalate(Some((growth, seconds))))
}

/// A size: bytes, or a number with K, M, G or T (powers of 1024; `KiB`,
/// `MB`, `m` read the same): `200M`, `1.5G`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?}: a size is bytes, or a number with K, M, G or T (e.g. 200M)"
            ))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?}: a size is bytes, or a number with K, M, G or T (e.g. 200M)")
    })?;
    let bytes = value * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes < u64::MAX as f64) {
        return Err(format!("{text:?}: too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("200M"), Ok(200 << 20));
        assert_eq!(parse_size("200MiB"), Ok(200 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("10 KB"), Ok(10240));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
    }
}
