//! Running a command held after its `exec` until its dynamic linker has
//! mapped the libraries it starts with, and not one instruction of theirs
//! has run.
//!
//! memprof must know a command's libraries (libc, libgc) to place their
//! probes before their code runs, and must never execute a file of the
//! target's to learn them (`ld.so --list`, what `ldd` does, runs the
//! interpreter the executable names, which its owner controls). So the
//! linker itself tells: it calls `_dl_debug_state` (the debugger hook) with
//! `_r_debug.r_state == RT_CONSISTENT` once the initial libraries are
//! mapped and relocated, before any constructor. The caller stops the
//! command there with the library-load uprobe (which sends SIGURG: if
//! memprof dies meanwhile, the probe goes with it and a pending SIGURG is
//! ignored, so nothing it set up can kill the command); the libraries are
//! then read from its own mappings, as `attach` reads them.
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::exit::ExitStatus;
use crate::modules::maps::{self, Mapping};
use crate::modules::{Module, ModuleCache};

/// `_r_debug.r_state` (after `int r_version`, `r_map`, `r_brk`).
const R_STATE_OFFSET: u64 = 24;
/// `RT_CONSISTENT`: the link map is complete.
const RT_CONSISTENT: u64 = 0;

/// The dynamic linker's debugger hook in a command held after its `exec`.
pub struct LinkerHook {
    /// The dynamic linker, as the command maps it.
    pub ld_so: std::sync::Arc<Module>,
    /// The file offset of `_dl_debug_state` (where the uprobe goes).
    pub offset: u64,
    /// The address of `_r_debug.r_state` in the command.
    state: u64,
}

/// The hook of `pid`'s dynamic linker; `None` for a static executable.
pub fn linker_hook(pid: u32, modules: &ModuleCache) -> Result<Option<LinkerHook>> {
    let mappings =
        maps::read(pid).with_context(|| format!("cannot read the mappings of pid {pid}"))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("cannot read the executable of pid {pid}"))?;
    // At the exec stop only the executable and its interpreter are mapped.
    let Some(path) = mappings
        .iter()
        .find(|m| m.path != exe)
        .map(|m| m.path.clone())
    else {
        return Ok(None);
    };
    let ld_so = modules.get(&path)?;
    let missing = || {
        anyhow::anyhow!(
            "the dynamic linker {} has no _dl_debug_state or _r_debug: cannot know when the command's libraries are loaded",
            path.display()
        )
    };
    let hook = ld_so.symbol("_dl_debug_state").ok_or_else(missing)?;
    let r_debug = ld_so.symbol("_r_debug").ok_or_else(missing)?.address;
    let offset = ld_so.file_offset(hook.address).ok_or_else(missing)?;
    let base = load_base(&mappings, &path)
        .with_context(|| format!("{} is not mapped from its start", path.display()))?;
    Ok(Some(LinkerHook {
        ld_so,
        offset,
        state: base + r_debug + R_STATE_OFFSET,
    }))
}

/// Lets the held command `pid` (a single thread, stopped at its exec) run
/// until the hook reports its initial libraries mapped. `ours` tells
/// whether a stop with `signal` is the library-load uprobe's. The command
/// is stopped when this returns.
pub fn run_to_libraries(
    pid: u32,
    hook: &LinkerHook,
    signal: i32,
    ours: &mut dyn FnMut() -> Result<bool>,
) -> Result<()> {
    let mut deliver = 0;
    loop {
        resume(pid, deliver)?;
        let status = wait_stop(pid)?;
        let stopped_by = (status >> 16 == 0).then(|| libc::WSTOPSIG(status));
        deliver = 0;
        match stopped_by {
            Some(s) if s == signal && ours()? => {
                // The hook ran: done once the link map is complete.
                let state = peek(pid, hook.state)? & 0xffff_ffff;
                if state == RT_CONSISTENT {
                    return Ok(());
                }
            }
            // A signal for the command: passed on. An event stop: resumed.
            Some(s) => deliver = s,
            None => {}
        }
    }
}

/// Where the file's address 0 is in the process (the mapping of offset 0).
fn load_base(mappings: &[Mapping], path: &Path) -> Option<u64> {
    mappings
        .iter()
        .find(|m| m.path == path && m.file_offset == 0)
        .map(|m| m.start)
}

fn peek(pid: u32, addr: u64) -> Result<u64> {
    // PEEKDATA returns the word; errno tells an error from a word of -1.
    unsafe { *libc::__errno_location() = 0 };
    let word = unsafe { libc::ptrace(libc::PTRACE_PEEKDATA, pid as i32, addr, 0) };
    let err = std::io::Error::last_os_error();
    if word == -1 && err.raw_os_error() != Some(0) {
        bail!("cannot read the command's memory at {addr:#x}: {err}");
    }
    Ok(word as u64)
}

fn resume(pid: u32, signal: i32) -> Result<()> {
    if unsafe { libc::ptrace(libc::PTRACE_CONT, pid as i32, 0, signal as libc::c_long) } == -1 {
        bail!(
            "cannot resume the command: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Waits for the command's next stop; its exit is an error (it ended
/// before its libraries were loaded).
fn wait_stop(pid: u32) -> Result<i32> {
    let mut status = 0;
    loop {
        let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::__WALL) };
        if r == pid as i32 {
            if let Some(exit) = ExitStatus::from_wait(status) {
                bail!("the command {exit} before its libraries were loaded");
            }
            return Ok(status);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            bail!("waiting for pid {pid}: {err}");
        }
    }
}
