//! What every mode checks of the machine and the target before it
//! attaches anything: memprof's capabilities, the files the target maps.
//! (Here, below the driver, because launching restores the open-files
//! limit this raises.)
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::modules::maps;

/// The files `pid` maps, from its own mappings.
pub fn mapped_files(pid: u32) -> Result<Vec<PathBuf>> {
    Ok(maps::read(pid)
        .with_context(|| format!("cannot read the mappings of pid {pid}"))?
        .into_iter()
        .map(|m| m.path)
        .collect())
}

/// memprof needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) for the
/// probes and CAP_SYS_PTRACE to trace the target and read its memory:
/// checked as capabilities, not as uid 0.
pub fn require_capabilities() -> Result<()> {
    const CAP_SYS_PTRACE: u32 = 19;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if !(has(CAP_BPF) && has(CAP_PERFMON) || has(CAP_SYS_ADMIN)) {
        missing.extend(["CAP_BPF", "CAP_PERFMON"]);
    }
    if !has(CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE");
    }
    if !missing.is_empty() {
        bail!(
            "memprof needs {} to load eBPF programs, attach uprobes and trace the target: run it as root (sudo) or grant them",
            missing.join(", ")
        );
    }
    Ok(())
}

/// The open-files limit memprof was started with (its soft limit), given
/// back to the commands it starts; `u64::MAX`: not changed.
static STARTED_WITH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Raises memprof's open-files limit to the hard limit: `attach --all`
/// and `run`'s family hold a descriptor per distinct file their processes
/// map, and the probes' maps and links take a few hundred. What is still
/// refused is counted (`short_of_resources`), never silently lost.
pub fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let started = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            STARTED_WITH.store(started, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// In a command memprof starts, between its fork and its `exec`: the
/// open-files limit memprof was started with (only a syscall: safe
/// after a fork).
pub fn restore_open_files_limit() {
    let started = STARTED_WITH.load(std::sync::atomic::Ordering::Relaxed);
    if started == u64::MAX {
        return;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = started;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
