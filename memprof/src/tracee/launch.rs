//! Starting a command so that nothing it does escapes the probes.
//!
//! The child is forked, waits on a pipe, and is then traced with
//! `PTRACE_SEIZE` before it `exec`s: the kernel stops it right after the
//! `exec` (`PTRACE_EVENT_EXEC`), when its new image is in place but not one
//! instruction of it has run. The session attaches the probes and lets it go
//! ([`Tracer::resume_signal`] with no signal); the [`Tracer`] then follows
//! every thread (see [`super::trace`]).
//!
//! (`std::process::Command` cannot do this: a `pre_exec` hook that stops the
//! child deadlocks, because `spawn` waits for the `exec`.)
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Result};

pub use super::exit::ExitStatus;
use super::trace::{self, Tracer};

/// Forks and execs `exe` with `argv`, held stopped after the `exec`.
/// `child_mask` is the signal mask the command starts with (the caller
/// blocks signals it waits for; the child must not inherit that).
pub fn launch(exe: &Path, argv: &[OsString], child_mask: &libc::sigset_t) -> Result<Tracer> {
    let exe_c = CString::new(exe.as_os_str().as_bytes())?;
    let argv_c: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let (go_r, go_w) = pipe()?;
    let (err_r, err_w) = pipe()?;

    // SAFETY: the child only calls async-signal-safe functions before exec.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork failed: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let pipes = [go_r, go_w, err_r, err_w];
        // SAFETY: this is the child of the fork.
        unsafe { exec_in_child(pipes, child_mask, &exe_c, &argv_p) }
    }
    let pid_u = pid as u32;
    unsafe {
        libc::close(go_r);
        libc::close(err_w);
    }
    let options = libc::PTRACE_O_TRACEEXEC | trace::OPTIONS | trace::FAMILY_OPTIONS;
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, options as libc::c_long) };
    if seized == -1 {
        let err = std::io::Error::last_os_error();
        unsafe {
            libc::close(go_w);
            libc::close(err_r);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        bail!("cannot trace the command (ptrace: {err}); memprof run needs CAP_SYS_PTRACE");
    }
    unsafe {
        libc::write(go_w, b"g".as_ptr().cast(), 1);
        libc::close(go_w);
    }
    let child = Tracer::for_launched(pid_u);
    wait_for_exec(pid, err_r, exe)?;
    Ok(child)
}

/// The forked child: waits for memprof's go byte (it is traced by then),
/// then runs the command; `execv`'s errno goes back through the error pipe.
/// `pipes`: the go pipe's ends, then the error pipe's.
unsafe fn exec_in_child(
    pipes: [libc::c_int; 4],
    child_mask: &libc::sigset_t,
    exe_c: &CString,
    argv_p: &[*const libc::c_char],
) -> ! {
    let [go_r, go_w, err_r, err_w] = pipes;
    unsafe {
        libc::close(go_w);
        libc::close(err_r);
        libc::sigprocmask(libc::SIG_SETMASK, child_mask, std::ptr::null_mut());
        let mut byte = 0u8;
        // EOF instead of the go byte: memprof gave up; do not run the command.
        if libc::read(go_r, (&mut byte as *mut u8).cast(), 1) != 1 {
            libc::_exit(127);
        }
        // Its open-files limit as memprof's user gave it, not memprof's.
        crate::tracee::preflight::restore_open_files_limit();
        libc::execv(exe_c.as_ptr(), argv_p.as_ptr());
        let errno = *libc::__errno_location();
        libc::write(err_w, (&errno as *const i32).cast(), 4);
        libc::_exit(127);
    }
}

/// Waits for the exec stop of the launched `pid`, passing on any signal
/// that arrives before it; an error if the command exited first (with
/// `execv`'s errno from `err_r`, when it failed).
fn wait_for_exec(pid: libc::pid_t, err_r: libc::c_int, exe: &Path) -> Result<()> {
    loop {
        let status = wait(pid, 0)?.expect("blocking wait");
        if let Some(exit) = ExitStatus::from_wait(status) {
            let mut errno = 0i32;
            let n = unsafe { libc::read(err_r, (&mut errno as *mut i32).cast(), 4) };
            unsafe { libc::close(err_r) };
            if n == 4 {
                bail!(
                    "cannot execute {}: {}",
                    exe.display(),
                    std::io::Error::from_raw_os_error(errno)
                );
            }
            bail!("the command {exit} before it started");
        }
        if status >> 8 == (libc::SIGTRAP | (libc::PTRACE_EVENT_EXEC << 8)) {
            break;
        }
        unsafe {
            libc::ptrace(
                libc::PTRACE_CONT,
                pid,
                0,
                stop_signal(status) as libc::c_long,
            )
        };
    }
    unsafe { libc::close(err_r) };
    Ok(())
}

/// The signal to deliver when resuming from a signal-delivery stop.
fn stop_signal(status: i32) -> i32 {
    if libc::WIFSTOPPED(status) && status >> 16 == 0 {
        libc::WSTOPSIG(status)
    } else {
        0
    }
}

/// `waitpid` with `__WALL`; `None` when `WNOHANG` found nothing.
fn wait(pid: i32, flags: i32) -> Result<Option<i32>> {
    let mut status = 0;
    loop {
        let r = unsafe { libc::waitpid(pid, &mut status, flags | libc::__WALL) };
        if r == pid {
            return Ok(Some(status));
        }
        if r == 0 {
            return Ok(None);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            bail!("waiting for pid {pid}: {err}");
        }
    }
}

fn pipe() -> Result<(i32, i32)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}
