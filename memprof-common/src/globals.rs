//! Names of the load-time constants of the eBPF object (`Global`s set with
//! `EbpfLoader::override_global`): the verifier sees their values and drops
//! the paths they turn off.

/// `u32`, 1: fold recursion in DWARF stacks (default), 0: keep every frame.
pub const FOLD_RECURSION: &str = "FOLD_RECURSION";
/// `u32`, 1: unwind with the CFI tables (`UNWIND_ROWS`), 0: frame pointers.
pub const UNWIND_DWARF: &str = "UNWIND_DWARF";
/// `u32`, 1: sample allocations (`--sample-bytes`, distances in
/// `SAMPLE_DISTANCES`), 0: follow every one (default).
pub const SAMPLING: &str = "SAMPLING";
/// `u32`, 1: Boehm GC allocations are sampled at the collector's refills
/// (`--gc-sampling refill`): the GC functions probed are followed
/// whatever `SAMPLING` draws (it samples the others by bytes).
pub const GC_REFILL: &str = "GC_REFILL";
/// `u32`, 1: `attach --all`: the probes sit on files, for every
/// process; state is kept per process ([`host`](super::host)).
pub const HOST: &str = "HOST";
/// `u32`s, offsets in the running kernel's `task_struct` (from its
/// BTF), for `attach --all`'s process events: `real_parent`, `tgid`,
/// `exit_code`.
pub const TASK_REAL_PARENT: &str = "TASK_REAL_PARENT";
pub const TASK_TGID: &str = "TASK_TGID";
pub const TASK_EXIT_CODE: &str = "TASK_EXIT_CODE";
/// `u32`: `task_struct.start_time`'s offset; `u64`: when memprof loaded
/// the programs (`CLOCK_MONOTONIC` ns, the clock of `start_time`). A
/// process first seen allocating that started after it is a forked child
/// of a followed process (it takes its parent's module table); one that
/// started before is not (it ran before memprof, its parent's table is
/// not its mappings).
pub const TASK_START_TIME: &str = "TASK_START_TIME";
pub const HOST_STARTED_NS: &str = "HOST_STARTED_NS";
pub const FAMILY_ROOT: &str = "FAMILY_ROOT";
/// `u32`, 1: `attach --comm/--exe`: only the processes whose `comm` is
/// in `SELECTED_COMMS` or whose executable is in `SELECTED_EXES`.
pub const SELECTING: &str = "SELECTING";
/// [`KernelLayout`](super::host::KernelLayout): offsets in the running
/// kernel's `vm_area_struct`, `file`, `inode`, `super_block` and
/// `linux_binprm`, for `attach --all`'s tables built in the kernel.
pub const KERNEL_LAYOUT: &str = "KERNEL_LAYOUT";
/// `u32`, 1: userspace keeps the copy of the GC objects (their mark bits
/// are read): GC allocations and frees go to the `GC_EVENTS` ring buffer
/// only, not to `LIVE`.
pub const GC_COPY: &str = "GC_COPY";
/// `u32`, 1: the kernel judges the GC objects of the copy by the
/// collector's mark bits itself, at each collection's end of marking
/// (`--gc-sampling refill`: few objects, see
/// [`KernelMarks`](super::KernelMarks)), and streams its verdicts; no hold
/// is needed for them. Only with [`GC_COPY`].
pub const GC_VERDICTS: &str = "GC_VERDICTS";

/// Every load-time constant of the eBPF object (checked against the
/// object by a userspace test, as [`maps::ALL`](super::maps::ALL) is).
pub const ALL: [&str; 15] = [
    FOLD_RECURSION,
    UNWIND_DWARF,
    SAMPLING,
    GC_REFILL,
    HOST,
    TASK_REAL_PARENT,
    TASK_TGID,
    TASK_EXIT_CODE,
    TASK_START_TIME,
    HOST_STARTED_NS,
    FAMILY_ROOT,
    SELECTING,
    KERNEL_LAYOUT,
    GC_COPY,
    GC_VERDICTS,
];
