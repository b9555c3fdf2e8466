//! `attach --all`: one load of the programs for every process. Each
//! process that allocates gets an index, in the kernel, at its first
//! allocation followed; its live blocks are keyed by the index and the
//! address ([`live_key`]), its sites carry it
//! ([`AllocSite::process`](crate::AllocSite::process)), its unwinder table is its own segment of
//! `MODULE_RANGES` (`PROCESS_MODULES`).

/// User addresses are below 2^47 (4-level paging): the index goes above.
pub const INDEX_SHIFT: u32 = 47;
/// Indexes a session can give (the ones above are counted, not followed).
pub const MAX_INDEX: u32 = 1 << (64 - INDEX_SHIFT);
/// The index of a process memprof does not follow (memprof itself): so
/// until it exits, unseen.
pub const IGNORED: u32 = u32::MAX;
/// The index of a process outside `run`'s family or `attach
/// --comm/--exe`'s selection: looked at again at its `exec`, forgotten
/// at its exit.
pub const UNSELECTED: u32 = u32::MAX - 1;
/// The index of a process given a session of its own (a Boehm GC
/// program): not followed here, through its `exec`s too; its exit and
/// an OOM kill are told (untraced, its session learns them only so).
/// The lowest of the indexes that are not a process's.
pub const SESSION: u32 = u32::MAX - 2;
/// Names and executables `attach --comm/--exe` can select.
pub const SELECT_MAX: u32 = 16;

/// A `--comm` name as the kernel keeps a task's: its first 15 bytes,
/// NUL-padded to 16.
pub fn comm_key(name: &str) -> [u8; 16] {
    let mut key = [0u8; 16];
    let bytes = name.as_bytes();
    let n = bytes.len().min(15);
    key[..n].copy_from_slice(&bytes[..n]);
    key
}

/// The `LIVE` key of the block at `addr` of process `index`.
#[inline(always)]
pub const fn live_key(addr: u64, index: u32) -> u64 {
    addr | (index as u64) << INDEX_SHIFT
}

/// `(index, addr)` back from a [`live_key`].
pub const fn split(key: u64) -> (u32, u64) {
    ((key >> INDEX_SHIFT) as u32, key & ((1 << INDEX_SHIFT) - 1))
}

/// [`HostEvent::op`]: the process's first allocation followed (its
/// index is new); `comm` is its name then.
pub const NEW: u8 = 0;
/// [`NEW`]'s `exit_code` for a process first seen allocating, not at an
/// `exec`: a forked child (or one running before memprof), which starts
/// with its parent's module table and maps what its parent maps.
pub const FORKED: u32 = 1;
/// The process exited (its main thread did): `exit_code` is the
/// kernel's (`wait` status); `index` [`UNSELECTED`] or [`SESSION`] for
/// one left out.
pub const EXIT: u8 = 1;
/// The dynamic linker changed the process's libraries.
pub const LIBRARIES: u8 = 2;
/// The process `exec`ed: the index it had is done.
pub const EXEC: u8 = 3;
/// An executable file mapping of the process, as the kernel saw it when
/// it built the process's module table ([`HostEvent::mapping`]): what
/// names and symbolizes a process gone before /proc was read.
pub const MAPPING: u8 = 4;
/// The kernel gave the process a module table of its own
/// ([`HostEvent::mapping`]`.start`: the packed table it replaced, `.end`:
/// the new one), built from [`KnownFile`]s.
pub const TABLE: u8 = 5;
/// The program the process `exec`ed now ([`HostEvent::path`], as given
/// to `execve`), after [`EXEC`] for its old index: its new index.
pub const PROGRAM: u8 = 6;
/// The kernel's OOM killer chose the process (`index`: its index, or
/// [`SESSION`] for one left out to a session of its own); its
/// [`EXIT`] follows.
pub const OOM: u8 = 7;

/// Bytes of a path an event carries (longer ones are cut: the process
/// is still named by its mappings' files).
pub const PATH_BYTES: usize = 256;

/// Bytes of a command line a [`NEW`] or [`PROGRAM`] event carries (its arguments,
/// each NUL-terminated, as /proc/PID/cmdline gives them; a longer one is
/// cut, and [`HostEvent::args_len`] says by how much).
pub const ARGS_BYTES: usize = 256;

/// A change to the processes of `attach --all` (the `HOST_EVENTS` ring).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HostEvent {
    /// `bpf_ktime_get_ns()`.
    pub time_ns: u64,
    pub tgid: u32,
    pub index: u32,
    /// Its parent's tgid ([`NEW`]).
    pub ppid: u32,
    /// [`EXIT`]: the wait status. [`NEW`]: [`FORKED`] or 0.
    pub exit_code: u32,
    pub comm: [u8; 16],
    /// One of this module's event codes.
    pub op: u8,
    pub _pad: [u8; 7],
    /// [`MAPPING`] (and [`TABLE`]).
    pub mapping: MappedFile,
    /// [`PROGRAM`]: NUL-terminated. [`NEW`]: its executable's, as
    /// [`MAPPING`] carries a path.
    pub path: [u8; PATH_BYTES],
    /// [`NEW`], [`PROGRAM`]: the bytes of its command line (`mm_struct`'s
    /// `arg_start..arg_end`), of which the first [`ARGS_BYTES`] are in
    /// `args`; 0 when they could not be read. A process gone before /proc
    /// is read is still named by its whole command.
    pub args_len: u32,
    pub _pad2: u32,
    pub args: [u8; ARGS_BYTES],
}

/// An executable file mapping, as the kernel's `vm_area_struct` says it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    /// In pages.
    pub pgoff: u64,
    pub file: FileKey,
}

/// A file as the kernel names it: the `s_dev` of its filesystem
/// (`MAJOR << 20 | MINOR`) and its inode number, as /proc/PID/maps shows
/// them. Key of `KNOWN_FILES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// A file whose CFI rows are in `UNWIND_ROWS`: the kernel builds the
/// module table of a process that maps it without waiting for userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownFile {
    pub row_start: u32,
    pub row_count: u32,
    /// Its executable segment's address minus its file offset: a
    /// mapping at `start` of page `pgoff` has the load bias
    /// `start - pgoff * 4096 - vaddr_less_offset`.
    pub vaddr_less_offset: u64,
}

/// Segments of `MODULE_RANGES` the kernel takes its tables from
/// (`FREE_SEGMENTS`): the upper half; userspace's are the lower one.
pub const KERNEL_SEGMENTS: core::ops::Range<u32> =
    crate::module_table::SEGMENTS / 2..crate::module_table::SEGMENTS;

/// Offsets in the running kernel's structures (from its BTF) the
/// kernel's table building reads (`globals::KERNEL_LAYOUT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
    pub vma_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `linux_binprm.filename`.
    pub bprm_filename: u32,
    /// `task_struct.mm` and `mm_struct.exe_file` (`--exe`).
    pub task_mm: u32,
    pub mm_exe_file: u32,
    /// `mm_struct.arg_start` and `arg_end`: the command line.
    pub mm_arg_start: u32,
    pub mm_arg_end: u32,
    /// `mm_struct.brk`: the heap's end, before a `brk` that shrinks it.
    pub mm_brk: u32,
    /// A file's path, walked up as the kernel's `d_path` does: `file.f_path`'s
    /// `mnt` and `dentry`, `dentry.d_parent`, `dentry.d_name.name`,
    /// `vfsmount.mnt_root`, and `struct mount`'s `mnt`, `mnt_parent`,
    /// `mnt_mountpoint`.
    pub path_mnt: u32,
    pub path_dentry: u32,
    pub dentry_parent: u32,
    pub dentry_name: u32,
    pub vfsmount_root: u32,
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
}

/// Components of a path [`MAPPING`] carries for a file the kernel has no
/// rows for (`HostEvent::path`): innermost first, each NUL-terminated,
/// at most [`PATH_COMPONENT`] bytes each.
pub const PATH_COMPONENTS: usize = 24;
/// Bytes a component of such a path may have (with its NUL).
pub const PATH_COMPONENT: usize = 64;

/// `VM_EXEC` of `vm_area_struct.vm_flags`.
pub const VM_EXEC: u64 = 0x4;
