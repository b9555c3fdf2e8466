//! Every load-time setting: `Global`s userspace sets when it loads the
//! object (`EbpfLoader::override_global`, names in
//! `memprof_common::globals`). They are constants to the verifier, which
//! drops the paths they turn off: a setting costs nothing where it is off.
//!
//! What changes while running (the module table in use, the GC hold, the
//! library-load signal) is no setting: those are one-entry maps, in the
//! files of their concern.
use aya_ebpf::Global;
use memprof_common::host::KernelLayout;

/// 1: fold recursion in DWARF stacks (`--keep-recursion` sets 0). A
/// load-time constant: the verifier drops the path not taken.
#[unsafe(no_mangle)]
pub(crate) static FOLD_RECURSION: Global<u32> = Global::new(1);
/// 1: unwind with the CFI tables (`UNWIND_ROWS`), 0: frame pointers.
#[unsafe(no_mangle)]
pub(crate) static UNWIND_DWARF: Global<u32> = Global::new(0);
/// 1: sample allocations (`--sample-bytes`), 0: follow every one.
#[unsafe(no_mangle)]
pub(crate) static SAMPLING: Global<u32> = Global::new(0);
/// K > 0: GC allocations are sampled at refills (`--gc-sampling
/// refill`), one refill in K followed (`--gc-refill-every`): the GC
/// calls probed are not drawn by `SAMPLING`. 0: off.
#[unsafe(no_mangle)]
pub(crate) static GC_REFILL: Global<u32> = Global::new(0);
/// 1: userspace keeps the copy of the GC objects: GC allocations and
/// frees go to the `GC_EVENTS` ring buffer only, not to `LIVE`.
#[unsafe(no_mangle)]
pub(crate) static GC_COPY: Global<u32> = Global::new(0);
/// 1: the kernel judges the GC objects of the copy by the collector's
/// mark bits itself, at each collection (`GC_MARKS`, `GC_SLOTS`).
#[unsafe(no_mangle)]
pub(crate) static GC_VERDICTS: Global<u32> = Global::new(0);
/// 1: `attach --all`: every process, state per process (`PROCESSES`).
#[unsafe(no_mangle)]
pub(crate) static HOST: Global<u32> = Global::new(0);
/// `run`'s family (its command's pid): only the processes it started,
/// directly or not, are followed (the command has a session of its
/// own). 0: every process of the machine (`attach --all`).
#[unsafe(no_mangle)]
pub(crate) static FAMILY_ROOT: Global<u32> = Global::new(0);
/// 1: `attach --comm/--exe`: only the processes the selection names
/// (`SELECTED_COMMS`, `SELECTED_EXES`) are followed.
#[unsafe(no_mangle)]
pub(crate) static SELECTING: Global<u32> = Global::new(0);
/// Offsets in `task_struct` (`attach --all`'s process events).
#[unsafe(no_mangle)]
pub(crate) static TASK_REAL_PARENT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_EXIT_CODE: Global<u32> = Global::new(0);
/// `task_struct.start_time`'s offset, and when the programs were loaded
/// (monotonic ns): which processes first seen allocating are children
/// forked since.
#[unsafe(no_mangle)]
pub(crate) static TASK_START_TIME: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static HOST_STARTED_NS: Global<u64> = Global::new(0);
/// Offsets in the kernel's memory-map structures (`attach --all`'s
/// tables built in the kernel). Read a field at a time ([`layout!`]).
#[unsafe(no_mangle)]
pub(crate) static KERNEL_LAYOUT: Global<KernelLayout> = Global::new(KernelLayout {
    vma_start: 0,
    vma_end: 0,
    vma_flags: 0,
    vma_pgoff: 0,
    vma_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    bprm_filename: 0,
    task_mm: 0,
    mm_exe_file: 0,
    mm_arg_start: 0,
    mm_arg_end: 0,
    mm_brk: 0,
    path_mnt: 0,
    path_dentry: 0,
    dentry_parent: 0,
    dentry_name: 0,
    vfsmount_root: 0,
    mount_mnt: 0,
    mount_parent: 0,
    mount_mountpoint: 0,
});

/// One field of [`KERNEL_LAYOUT`], read where it is: `load()` would copy
/// all 88 bytes onto the stack, whose 512 bytes a whole call chain shares.
#[macro_export]
macro_rules! layout {
    ($field:ident) => {{
        #[allow(unused_unsafe)]
        let value = unsafe {
            let all = core::ptr::addr_of!($crate::settings::KERNEL_LAYOUT)
                as *const memprof_common::host::KernelLayout;
            core::ptr::read_volatile(core::ptr::addr_of!((*all).$field))
        };
        value
    }};
}
