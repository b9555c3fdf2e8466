//! `--rss`: the page-fault program and the programs on the syscalls that
//! give memory back (`memprof-ebpf/src/rss.rs` says what they keep).
use anyhow::Result;
use memprof_common::programs;

use super::Probes;

impl Probes {
    /// Attaches the program that sees memory given back, then the
    /// page-fault program (raw tracepoint `page_fault_user`): a page
    /// sampled is never missed when given back. Memory given back is seen
    /// where the kernel lowers a process's resident count (raw tracepoint
    /// `rss_stat`), inside the syscalls that give it back; on a kernel
    /// without it, at every syscall's entry (`sys_enter`, which every
    /// syscall of the machine pays for: `dd bs=1` of 6 MB took 1.55 s
    /// untraced, 2.17 s with it). Raw tracepoints both: no tracefs, no
    /// kprobes, which some kernels are built without.
    pub(super) fn start_rss(&mut self) -> Result<()> {
        if huge_pages_always() {
            eprintln!("memprof: transparent huge pages are on for every mapping (/sys/kernel/mm/transparent_hugepage/enabled: always): a first write that maps a 2 MiB page is one fault, counted as one 4 KiB page, so --rss under-counts large anonymous regions (madvise MADV_NOHUGEPAGE, or the setting madvise, counts them)");
        }
        if let Err(e) = self.attach_raw_tracepoint(programs::RSS_CHANGED, "rss_stat") {
            eprintln!("memprof: --rss sees memory given back at every syscall's entry (the kernel's tracepoint rss_stat cannot be used: {e:#}); every syscall of the machine pays about 0.1 µs for it");
            self.attach_raw_tracepoint(programs::MM_SYSCALL, "sys_enter")?;
        }
        self.attach_raw_tracepoint(programs::PAGE_FAULT, "page_fault_user")
    }
}

/// Whether the kernel gives anonymous memory huge pages wherever it can
/// (`always`): one fault then maps 2 MiB, which the fault's program
/// cannot tell from a 4 KiB one.
fn huge_pages_always() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"))
}
