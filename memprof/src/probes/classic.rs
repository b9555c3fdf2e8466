//! Classic uprobes: one perf event per probe, for kernels without
//! multi-uprobe links (Linux < 6.6, [`super::kernel`]).
//!
//! Each probe is a perf event of the kernel's `uprobe` PMU (the file's
//! path, the offset, and a bit for a return probe), and the program is
//! attached to it by a BPF link that carries the probe's cookie
//! (`BPF_LINK_CREATE` with `BPF_PERF_EVENT`; cookies there since Linux
//! 5.15). The program must be loaded for perf events (expected attach
//! type 0, `multi.rs`). Closing the link and the event detaches the probe;
//! the kernel then waits for grace periods under a global mutex, ~0.1 s a
//! probe, one probe at a time: why multi-uprobe links come first, and why
//! the links are closed off memprof's main path (`Probes::detach`).
//!
//! aya 0.14's `UProbe` does the same for a program aya loaded itself; these
//! programs are loaded from the instructions `multi.rs` relocates (their
//! kfunc calls linked), so the two calls are made here.
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_cmd, perf_event_attr, PERF_FLAG_FD_CLOEXEC,
};

use super::syscall::bpf;
use super::Link;

/// The uprobe PMU as sysfs describes it.
#[derive(Debug, Clone, Copy)]
struct UprobePmu {
    /// The perf event type of uprobes.
    kind: u32,
    /// The bit of `config` that makes a return probe.
    return_bit: u32,
}

const PMU_DIR: &str = "/sys/bus/event_source/devices/uprobe";

/// The uprobe PMU, read once.
fn uprobe_pmu() -> Result<UprobePmu> {
    static PMU: OnceLock<Result<UprobePmu, String>> = OnceLock::new();
    PMU.get_or_init(|| read_pmu().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn read_pmu() -> Result<UprobePmu> {
    let read = |name: &str| -> Result<String> {
        let path = format!("{PMU_DIR}/{name}");
        std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
    };
    let kind = read("type")?
        .trim()
        .parse()
        .context("the uprobe PMU's type")?;
    let format = read("format/retprobe")?;
    let return_bit = parse_return_bit(&format)
        .ok_or_else(|| anyhow!("{PMU_DIR}/format/retprobe: unexpected {format:?}"))?;
    Ok(UprobePmu { kind, return_bit })
}

/// `config:0` → 0.
fn parse_return_bit(format: &str) -> Option<u32> {
    format.trim().strip_prefix("config:")?.parse().ok()
}

/// Attaches `program` at `probes` (file offset, cookie) of the file at
/// `path`, at the returns if `at_return`, for process `pid` (0: every
/// process). One [`Link`] per probe, each closed on its own.
pub(super) fn attach(
    program: RawFd,
    path: &Path,
    probes: &[(u64, u64)],
    pid: u32,
    at_return: bool,
) -> Result<Vec<Link>> {
    use std::os::unix::ffi::OsStrExt;
    let pmu = uprobe_pmu()?;
    let path = CString::new(path.as_os_str().as_bytes())?;
    probes
        .iter()
        .map(|&(offset, cookie)| {
            let event = open_event(pmu, &path, offset, pid, at_return)?;
            let link = link_event(program, &event, cookie)?;
            // Closed in this order: the program first, then the probe.
            Ok(Link(vec![link, event]))
        })
        .collect()
}

/// A uprobe perf event at `offset` of `path`.
fn open_event(
    pmu: UprobePmu,
    path: &CString,
    offset: u64,
    pid: u32,
    at_return: bool,
) -> Result<OwnedFd> {
    // SAFETY: plain data; all-zero is the kernel's "unset".
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.type_ = pmu.kind;
    if at_return {
        attr.config = 1 << pmu.return_bit;
    }
    attr.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = offset;
    // Every process: an event of one CPU (the program runs on every CPU's
    // hits all the same); one process: its threads, on any CPU.
    let (pid, cpu) = match pid {
        0 => (-1, 0),
        pid => (pid as libc::pid_t, -1),
    };
    // SAFETY: `attr` and the path it points to live across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("perf_event_open of a uprobe");
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches `program` to the perf `event`, with `cookie`.
fn link_event(program: RawFd, event: &OwnedFd, cookie: u64) -> Result<OwnedFd> {
    // SAFETY: plain data; all-zero is the kernel's "unset".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the union members BPF_LINK_CREATE reads for a perf event.
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = program as u32;
    link.__bindgen_anon_2.target_fd = event.as_raw_fd() as u32;
    link.attach_type = bpf_attach_type::BPF_PERF_EVENT as u32;
    link.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).context("linking a program to a uprobe perf event")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_return_bit_is_read_from_the_format() {
        assert_eq!(parse_return_bit("config:0\n"), Some(0));
        assert_eq!(parse_return_bit("config:63"), Some(63));
        assert_eq!(parse_return_bit("config1:0"), None);
    }
}
