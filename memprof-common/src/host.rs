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
/// The index of a process memprof does not follow (memprof itself).
pub const IGNORED: u32 = u32::MAX;

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
/// The process exited (its main thread did): `exit_code` is the
/// kernel's (`wait` status).
pub const EXIT: u8 = 1;
/// The dynamic linker changed the process's libraries.
pub const LIBRARIES: u8 = 2;
/// The process `exec`ed: the index it had is done.
pub const EXEC: u8 = 3;

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
    /// [`EXIT`]: the wait status.
    pub exit_code: u32,
    pub comm: [u8; 16],
    /// One of this module's event codes.
    pub op: u8,
    pub _pad: [u8; 7],
}
