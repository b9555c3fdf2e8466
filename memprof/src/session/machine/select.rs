//! `attach --comm NAME` / `--exe PATH` (and `top --pid`): which processes a selection names,
//! now and as they start (memprof looks again every [`RESCAN`]).
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};

use super::file_ids;

/// How often /proc is read again for processes started since.
pub const RESCAN: Duration = Duration::from_millis(100);

/// Every process running now that has a program (kernel threads have
/// none), memprof excluded.
pub fn all_processes() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Processes by program name and by executable.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// The program's file name: the first word of its command line, or
    /// the kernel's `comm` (15 characters at most).
    pub comms: Vec<String>,
    /// Executables, as given (compared as the files they name).
    pub exes: Vec<PathBuf>,
    /// Processes named by pid (`memprof top --pid`): selected while alive.
    pub pids: Vec<u32>,
}

impl Selection {
    /// Checks that every `--exe` names a file; keeps its canonical path.
    pub fn new(comms: Vec<String>, exes: Vec<PathBuf>) -> Result<Selection> {
        let exes = exes
            .into_iter()
            .map(|e| match std::fs::canonicalize(&e) {
                Ok(path) if path.is_file() => Ok(path),
                Ok(_) => bail!("--exe {}: not a file", e.display()),
                Err(err) => bail!("--exe {}: {err}", e.display()),
            })
            .collect::<Result<_>>()?;
        Ok(Selection {
            comms,
            exes,
            pids: Vec::new(),
        })
    }

    /// Also selects `pids` (each must be running now).
    pub fn with_pids(mut self, pids: Vec<u32>) -> Result<Selection> {
        for &pid in &pids {
            if pid == 0 || !crate::tracee::is_alive(pid) {
                bail!("no process with pid {pid}");
            }
        }
        self.pids = pids;
        Ok(self)
    }

    /// The `--comm` names as the kernel compares them (its `comm`: the
    /// first 15 bytes).
    pub fn kernel_comms(&self) -> Result<Vec<[u8; 16]>> {
        Ok(self
            .comms
            .iter()
            .map(|c| memprof_common::host::comm_key(c))
            .collect())
    }

    /// The `--exe` files as the kernel names them (device and inode).
    pub fn kernel_exes(&self) -> Result<Vec<memprof_common::host::FileKey>> {
        self.exes
            .iter()
            .map(|e| {
                file_key(e).ok_or_else(|| {
                    anyhow::anyhow!("--exe {}: cannot read its device and inode", e.display())
                })
            })
            .collect()
    }

    /// What it selects, for messages and the profile's name.
    pub fn describe(&self) -> String {
        let mut words: Vec<String> = self.pids.iter().map(|p| format!("--pid {p}")).collect();
        words.extend(self.comms.iter().map(|c| format!("--comm {c}")));
        words.extend(self.exes.iter().map(|e| format!("--exe {}", e.display())));
        words.join(" ")
    }

    /// The processes it selects now (memprof itself excluded).
    pub fn matching(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let me = std::process::id();
        let mut pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me && self.selects(pid))
            .collect();
        pids.sort_unstable();
        pids
    }

    fn selects(&self, pid: u32) -> bool {
        if self.pids.contains(&pid) {
            return true;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        // Kernel threads have no executable.
        let Some(exe) = exe else {
            return false;
        };
        let exe = crate::modules::strip_deleted(&exe);
        if self.exes.iter().any(|e| e == &exe) {
            return true;
        }
        if self.comms.is_empty() {
            return false;
        }
        // Names are any bytes (a Latin-1 file name): each matches as
        // itself or as memprof shows it (`top`'s COMMAND, `\xe9` escapes).
        let comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
        let comm = comm.strip_suffix(b"\n").unwrap_or(&comm);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let program = Path::new(OsStr::from_bytes(argv0))
            .file_name()
            .map_or(&[][..], |n| n.as_bytes());
        let names = [program, comm];
        self.comms.iter().any(|c| {
            names
                .iter()
                .any(|&n| c.as_bytes() == n || *c == crate::text::visible_bytes(n))
        })
    }
}
/// The kernel's name of the file at `path` (device and inode).
fn file_key(path: &Path) -> Option<memprof_common::host::FileKey> {
    file_ids::kernel_key(&file_ids::file_id(path)?)
}
