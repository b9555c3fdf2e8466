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
//! mapped and relocated, before any constructor. A breakpoint there, set
//! and removed with ptrace, stops the command at that moment; the libraries
//! are then read from its own mappings, as `attach` reads them.
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::launch::ExitStatus;
use super::maps::{self, Mapping};

/// `_r_debug.r_state` (after `int r_version`, `r_map`, `r_brk`).
const R_STATE_OFFSET: u64 = 24;
/// `RT_CONSISTENT`: the link map is complete.
const RT_CONSISTENT: u64 = 0;
/// int3
const BREAKPOINT: u8 = 0xcc;

/// Lets the held command `pid` (a single thread, stopped at its exec) run
/// until its initial libraries are mapped; returns at once for a static
/// executable. The command is stopped again when this returns.
pub fn run_to_libraries(pid: u32) -> Result<()> {
    let mappings =
        maps::read(pid).with_context(|| format!("cannot read the mappings of pid {pid}"))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("cannot read the executable of pid {pid}"))?;
    // At the exec stop only the executable and its interpreter are mapped.
    let Some(ld_so) = mappings
        .iter()
        .find(|m| m.path != exe)
        .map(|m| m.path.clone())
    else {
        return Ok(());
    };
    let data = crate::modules::ModuleCache::of_process(pid)
        .open_file(&ld_so)
        .and_then(|mut file| {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut data).map(|_| data)
        })
        .with_context(|| format!("cannot read the dynamic linker {}", ld_so.display()))?;
    let (Some(hook), Some(r_debug)) = (
        symbol_address(&data, "_dl_debug_state"),
        symbol_address(&data, "_r_debug"),
    ) else {
        bail!(
            "the dynamic linker {} has no _dl_debug_state or _r_debug: cannot know when the command's libraries are loaded",
            ld_so.display()
        );
    };
    let base = load_base(&mappings, &ld_so)
        .with_context(|| format!("{} is not mapped from its start", ld_so.display()))?;
    let hook = base + hook;
    let state = base + r_debug + R_STATE_OFFSET;
    let original = peek(pid, hook)?;
    poke(pid, hook, with_low_byte(original, BREAKPOINT))?;
    loop {
        resume(pid, libc::PTRACE_CONT, 0)?;
        let status = wait_stop(pid)?;
        let signal = libc::WSTOPSIG(status);
        let at_hook =
            status >> 16 == 0 && signal == libc::SIGTRAP && registers(pid)?.rip == hook + 1;
        if !at_hook {
            // Another stop (a signal for the command, an event): passed on.
            let deliver = if status >> 16 == 0 { signal } else { 0 };
            resume_with(pid, deliver)?;
            continue;
        }
        // Back to the hook's first instruction, unpatched.
        poke(pid, hook, original)?;
        let mut regs = registers(pid)?;
        regs.rip = hook;
        set_registers(pid, &regs)?;
        if peek(pid, state)? & 0xffff_ffff == RT_CONSISTENT {
            return Ok(());
        }
        // Not yet (RT_ADD): run the hook's instruction, then patch again.
        resume(pid, libc::PTRACE_SINGLESTEP, 0)?;
        wait_stop(pid)?;
        poke(pid, hook, with_low_byte(original, BREAKPOINT))?;
    }
}

/// Where the file's address 0 is in the process (the mapping of offset 0).
fn load_base(mappings: &[Mapping], path: &Path) -> Option<u64> {
    mappings
        .iter()
        .find(|m| m.path == path && m.file_offset == 0)
        .map(|m| m.start)
}

/// The address of a defined symbol (function or data) in an ELF file.
fn symbol_address(data: &[u8], name: &str) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(data).ok()?;
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.is_definition() && s.address() != 0 && s.name() == Ok(name))
        .map(|s| s.address())
}

fn with_low_byte(word: u64, byte: u8) -> u64 {
    (word & !0xff) | u64::from(byte)
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

fn poke(pid: u32, addr: u64, word: u64) -> Result<()> {
    if unsafe { libc::ptrace(libc::PTRACE_POKEDATA, pid as i32, addr, word) } == -1 {
        bail!(
            "cannot write the command's memory at {addr:#x}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn registers(pid: u32) -> Result<libc::user_regs_struct> {
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    if unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid as i32, 0, &mut regs) } == -1 {
        bail!(
            "cannot read the command's registers: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(regs)
}

fn set_registers(pid: u32, regs: &libc::user_regs_struct) -> Result<()> {
    if unsafe { libc::ptrace(libc::PTRACE_SETREGS, pid as i32, 0, regs) } == -1 {
        bail!(
            "cannot set the command's registers: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn resume(pid: u32, request: libc::c_uint, signal: i32) -> Result<()> {
    if unsafe { libc::ptrace(request, pid as i32, 0, signal as libc::c_long) } == -1 {
        bail!(
            "cannot resume the command: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn resume_with(pid: u32, signal: i32) -> Result<()> {
    resume(pid, libc::PTRACE_CONT, signal)
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
