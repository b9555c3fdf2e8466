//! x86-64 machine-code analysis, in one place: decoding ([`decode`]), a
//! module's PLT stubs ([`plt`]), which registers an instruction writes
//! ([`regs`]), which instructions a uprobe emulates ([`uprobe`]), and a
//! symbolic executor that follows every path of a function and lets its
//! caller interpret what it reads ([`explore`], over the values of
//! [`value`]). The modules they read ([`crate::modules`]) know nothing of
//! machine code.
//!
//! Probe placement ([`crate::probes::placement`]) and libgc layout recognition
//! ([`crate::gc`]) both build on these parts, and not on each other.
//!
//! ```text
//! // glibc's free: test %rdi,%rdi ; je … ; push %rbp
//! let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
//! let insns = decode::function(&code, 0x98ef0);
//! assert!(!uprobe::emulated(&insns[0]) && uprobe::emulated(&insns[1]));
//! ```
pub(crate) mod decode;
pub(crate) mod explore;
pub(crate) mod plt;
pub(crate) mod regs;
pub(crate) mod uprobe;
pub(crate) mod value;
