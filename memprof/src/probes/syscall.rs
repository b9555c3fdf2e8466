//! The `bpf(2)` calls aya has no API for: loading a program with an
//! expected attach type of its own (multi-uprobe links, uprobe sessions),
//! shared by the kernel's feature probe and the programs' loader.
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};

/// `BPF_TRACE_UPROBE_SESSION`: newer than aya-obj's bindings.
pub(super) const BPF_TRACE_UPROBE_SESSION: u32 = 57;

/// The `bpf(2)` call `cmd`, for commands that return a new descriptor.
pub(super) fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a zero-initialised `bpf_attr` whose pointers point
    // at memory alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// The `BPF_PROG_LOAD` attributes of a uprobe program
/// (`BPF_PROG_TYPE_KPROBE`) of `instructions`, GPL, with
/// `expected_attach_type`; the rest unset.
pub(super) fn uprobe_program_attr(
    instructions: &[bpf_insn],
    expected_attach_type: u32,
) -> bpf_attr {
    // SAFETY: plain data; all-zero is the kernel's "unset".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the union member BPF_PROG_LOAD reads.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    u.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
    u.expected_attach_type = expected_attach_type;
    u.insn_cnt = instructions.len() as u32;
    u.insns = instructions.as_ptr() as u64;
    u.license = c"GPL".as_ptr() as u64;
    attr
}
