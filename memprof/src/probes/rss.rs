//! `--rss`: the page-fault program and the programs on the syscalls that
//! give memory back (`memprof-ebpf/src/rss.rs` says what they keep).
use anyhow::Result;
use memprof_common::programs;

use super::Probes;

impl Probes {
    /// Attaches the program on the syscalls that give memory back (raw
    /// tracepoint `sys_enter`: no tracefs, no kprobes, which some kernels
    /// are built without; no `sys_exit`, which would double what every
    /// syscall of the machine pays), then the page-fault program (raw
    /// tracepoint `page_fault_user`): a page sampled is never missed when
    /// given back.
    pub(super) fn start_rss(&mut self) -> Result<()> {
        self.attach_raw_tracepoint(programs::MM_SYSCALL, "sys_enter")?;
        self.attach_raw_tracepoint(programs::PAGE_FAULT, "page_fault_user")
    }
}
