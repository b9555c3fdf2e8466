//! Numbers from Linux the kernel side needs (it has no libc), and the
//! signal that stops a traced thread.
use crate::HOLD_SIGNAL;

/// The signal that stops the traced main thread when the dynamic linker
/// has loaded libraries (`run`): memprof, tracing it, takes it. The hold
/// signal too (SIGURG, ignored by default), never SIGTRAP: one left pending
/// when memprof stops or dies must not kill the program. The tracer tells
/// the two apart with the kernel's flags (`DLOPEN_SIGNALLED`, `HELD`).
pub const LIBRARY_LOAD_SIGNAL: u32 = HOLD_SIGNAL;

/// Linux signal numbers (x86-64) the kernel programs send; the eBPF side
/// has no libc.
pub mod signal {
    pub const SIGTRAP: u32 = 5;
    pub const SIGURG: u32 = 23;
}

/// Linux errno values the kernel programs test for (BPF helpers return
/// them negated).
pub mod errno {
    /// The key is already in the map (`BPF_NOEXIST` insert).
    pub const EEXIST: i32 = 17;
}
