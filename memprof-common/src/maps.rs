//! Map names in the eBPF object, grouped by the kernel file that declares
//! them.
//!
//! Each name is written twice: here, and as the identifier of the kernel's
//! `#[map] static` (aya-ebpf names a map after its static, or takes a
//! string literal in `#[map(name = "…")]`, never a constant, so the kernel
//! side cannot use these). [`ALL`] lists every map, and a userspace test
//! (`memprof::probes`) reads the built object and checks that its maps
//! are exactly [`ALL`]: a name changed on one side only fails that test,
//! not a session at run time.

// record: the core tables.
/// One `u32`: 1 while recording. Set to 0 to stop recording at once
/// (detaching uprobes takes a grace period each).
pub const ENABLED: &str = "ENABLED";
pub const COUNTERS: &str = "COUNTERS";
pub const LIVE: &str = "LIVE";
/// Per-CPU [`KindLive`](super::KindLive): what `LIVE` holds, per kind.
pub const LIVE_BY_KIND: &str = "LIVE_BY_KIND";
pub const SITE_TOTALS: &str = "SITE_TOTALS";
/// Per kind, the totals of the sites `SITE_TOTALS` had no room for.
pub const OVERFLOW_TOTALS: &str = "OVERFLOW_TOTALS";
pub const STACKS: &str = "STACKS";

// calls: the calls in flight.
pub const PENDING: &str = "PENDING";
/// Per CPU, a thread's idle slot before it goes into `PENDING` (not on
/// the 512-byte BPF stack).
pub const IDLE_SLOT: &str = "IDLE_SLOT";

// sampling.
/// `SAMPLE_QUANTILES` distances between sample points, bytes.
pub const SAMPLE_DISTANCES: &str = "SAMPLE_DISTANCES";
/// Per CPU, the bytes to the next sample point.
pub const SAMPLE_COUNTDOWN: &str = "SAMPLE_COUNTDOWN";

// prediction and refill.
/// How allocators' results are read at their entry ([`Predict`](crate::Predict)).
pub const PREDICT: &str = "PREDICT";
/// [`Refill`](super::Refill) settings, one entry.
pub const REFILL: &str = "REFILL";

// unwind: the CFI unwinder.
pub const DWARF_STACKS: &str = "DWARF_STACKS";
/// Stacks cut to their innermost `SHORT_FRAMES` frames, for when
/// `DWARF_STACKS` is full.
pub const SHORT_STACKS: &str = "SHORT_STACKS";
pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
pub const MODULE_RANGES: &str = "MODULE_RANGES";
/// One `u32`: which module table the unwinder searches, packed by
/// [`module_table::pack`](super::module_table::pack). Written by
/// userspace whenever the target's mappings change.
pub const MODULE_TABLE: &str = "MODULE_TABLE";
/// Per CPU, the stack being unwound (the kernel's scratch space).
pub const SCRATCH: &str = "SCRATCH";
/// Per CPU, CFI rows found by pc (the kernel's cache).
pub const ROW_CACHE: &str = "ROW_CACHE";

// gc: collections, userspace's copy, the kernel's verdicts.
/// One `u64`: collections seen so far (the probe on `GC_gc_no++` counts).
pub const GC_EPOCH: &str = "GC_EPOCH";
/// Ring buffer of [`GcEvent`](super::GcEvent)s.
pub const GC_EVENTS: &str = "GC_EVENTS";
/// One `u32`, 1: at the end of each collection's marking, stop the
/// collecting thread (if traced) with [`HOLD_SIGNAL`](super::HOLD_SIGNAL)
/// for the mark-bit pass. Written by userspace while running.
pub const GC_HOLD: &str = "GC_HOLD";
/// Threads (tid → 1) memprof traces: only those can be held at a collection.
pub const TRACED: &str = "TRACED";
/// tid → epoch: the thread is being stopped at the end of that
/// collection's marking for the mark-bit pass (removed by userspace).
pub const HELD: &str = "HELD";
/// [`KernelMarks`](super::KernelMarks), one entry.
pub const GC_MARKS: &str = "GC_MARKS";
/// The GC objects the kernel judges at each collection, and how many.
pub const GC_SLOTS: &str = "GC_SLOTS";
pub const GC_SLOT_COUNT: &str = "GC_SLOT_COUNT";

// host: `attach --all`.
/// `attach --all`: tgid → its index ([`host`](super::host)); written
/// by the kernel only.
pub const PROCESSES: &str = "PROCESSES";
/// `attach --all`: index → its module table, packed by
/// [`module_table::pack`](super::module_table::pack) (0: none yet);
/// written by userspace.
pub const PROCESS_MODULES: &str = "PROCESS_MODULES";
/// `attach --all`: one `u64`, the next process index.
pub const PROCESS_COUNT: &str = "PROCESS_COUNT";
/// `attach --all`: ring of [`HostEvent`](super::HostEvent)s.
pub const HOST_EVENTS: &str = "HOST_EVENTS";
/// `attach --all`: [`FileKey`](super::host::FileKey) →
/// [`KnownFile`](super::host::KnownFile), the files whose rows are in
/// `UNWIND_ROWS`; written by userspace.
pub const KNOWN_FILES: &str = "KNOWN_FILES";
/// `attach --all`: a queue of the segments of `MODULE_RANGES` the kernel
/// may build a table in ([`KERNEL_SEGMENTS`](super::host::KERNEL_SEGMENTS));
/// userspace puts back those no process uses any more.
pub const FREE_SEGMENTS: &str = "FREE_SEGMENTS";
/// `attach --all`: a queue of the process indexes userspace is done
/// with (the process finalized): given again before new ones.
pub const FREE_INDEXES: &str = "FREE_INDEXES";
/// `attach --all`: per CPU, the table being built (its segment, its count).
pub const TABLE_BUILD: &str = "TABLE_BUILD";
/// `attach --all`: per CPU, a file's path being walked.
pub const PATH_WALK: &str = "PATH_WALK";
/// `attach --all`: ring of [`DeferredStack`](super::DeferredStack)s.
pub const DEFERRED_STACKS: &str = "DEFERRED_STACKS";
/// `attach --all`: the stack keys already sent to `DEFERRED_STACKS`
/// (an LRU hash: key → 1).
pub const DEFERRED_SENT: &str = "DEFERRED_SENT";
/// `attach --comm`: the names selected, as the kernel keeps a task's
/// `comm` ([`comm_key`](super::host::comm_key); empty entries unused).
pub const SELECTED_COMMS: &str = "SELECTED_COMMS";
/// `attach --exe`: the executables selected, by
/// [`FileKey`](super::host::FileKey).
pub const SELECTED_EXES: &str = "SELECTED_EXES";

// library_load: `_dl_debug_state`.
/// One `u32`, 1: the main thread is traced by memprof (`run`): signal it
/// when the dynamic linker has loaded libraries, so their ranges are known
/// before their code runs. Written by userspace.
pub const SIGNAL_ON_DLOPEN: &str = "SIGNAL_ON_DLOPEN";
/// One `u32`, set to 1 by the kernel when it sent that signal; cleared by
/// userspace. A map of its own: userspace never writes the kernel's flag
/// while writing another switch.
pub const DLOPEN_SIGNALLED: &str = "DLOPEN_SIGNALLED";

// rss: pages sampled at their first write.
/// `(process index, 2 MiB chunk)` → a bit per page of the chunk sampled
/// and live: what a range given back is looked through by.
pub const RSS_CHUNKS: &str = "RSS_CHUNKS";
/// Per CPU: a range being given back, between two steps of its walk.
pub const RSS_WALK: &str = "RSS_WALK";
/// Per process index: pages sampled so far, and the highest heap end one
/// was sampled under, and of which address space (an index is given
/// again). Sized by userspace.
pub const RSS_SAMPLED: &str = "RSS_SAMPLED";
/// Per CPU: the range last given back, and by which thread (`rss_stat`
/// fires once per page table a syscall empties).
pub const RSS_LAST_WALK: &str = "RSS_LAST_WALK";

/// Every map of the eBPF object.
pub const ALL: [&str; 47] = [
    ENABLED,
    COUNTERS,
    LIVE,
    LIVE_BY_KIND,
    SITE_TOTALS,
    OVERFLOW_TOTALS,
    STACKS,
    PENDING,
    IDLE_SLOT,
    SAMPLE_DISTANCES,
    SAMPLE_COUNTDOWN,
    PREDICT,
    REFILL,
    DWARF_STACKS,
    SHORT_STACKS,
    UNWIND_ROWS,
    MODULE_RANGES,
    MODULE_TABLE,
    SCRATCH,
    ROW_CACHE,
    GC_EPOCH,
    GC_EVENTS,
    GC_HOLD,
    TRACED,
    HELD,
    GC_MARKS,
    GC_SLOTS,
    GC_SLOT_COUNT,
    PROCESSES,
    PROCESS_MODULES,
    PROCESS_COUNT,
    HOST_EVENTS,
    SIGNAL_ON_DLOPEN,
    DLOPEN_SIGNALLED,
    KNOWN_FILES,
    FREE_SEGMENTS,
    FREE_INDEXES,
    TABLE_BUILD,
    DEFERRED_STACKS,
    DEFERRED_SENT,
    SELECTED_COMMS,
    SELECTED_EXES,
    PATH_WALK,
    RSS_CHUNKS,
    RSS_WALK,
    RSS_SAMPLED,
    RSS_LAST_WALK,
];
