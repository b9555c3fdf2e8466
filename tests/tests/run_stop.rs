//! `run` stopped (SIGINT, SIGTERM, SIGKILL) while its command is loading
//! libraries: the command is never killed by a signal memprof sent, is no
//! longer traced, and keeps running.
//!
//! The command (`fixtures/c/dlopen_loop.c`) loads and unloads libm in a
//! loop, so memprof's tracer stops it at nearly every moment. This test
//! process is made a child subreaper: the command, orphaned when memprof
//! ends, becomes its child, and its exit status can be read.
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use memprof_tests::*;

/// Stops of memprof in all: SIGINT, SIGTERM and SIGKILL in turn.
const STOPS: usize = 21;
/// Sessions at once.
const WORKERS: usize = 3;

#[test]
fn stopping_run_never_kills_a_command_in_a_library_load() {
    // SAFETY: prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
    let dir = TempDir::new("run-stop");
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= STOPS {
                    break;
                }
                stop_once(&dir, i);
            });
        }
    });
}

fn stop_once(dir: &TempDir, i: usize) {
    let signal = [libc::SIGINT, libc::SIGTERM, libc::SIGKILL][i % 3];
    let profile = dir.join(&format!("stop-{i}.mprof"));
    let mut command = memprof([
        OsStr::new("run"),
        OsStr::new("-o"),
        profile.as_os_str(),
        OsStr::new("--"),
        OsStr::new(fixture::DLOPEN_LOOP),
    ]);
    let mut memprof = ChildGuard(
        command
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn memprof"),
    );
    let mut stderr = Lines::new("memprof stderr", memprof.0.stderr.take().unwrap());
    let line = stderr.wait_for("memprof: profiling", timeout());
    let pid: i32 = line
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    let command = Command(pid);
    // A moment into the loop: 50 to 450 ms, spread over the runs.
    std::thread::sleep(Duration::from_millis(50 + (i as u64 * 137) % 400));
    memprof.signal(signal);
    let status = memprof.wait_timeout(timeout());
    assert_eq!(
        command.exit(),
        None,
        "stop {i} (signal {signal}): the command ended; memprof {status}:\n{}",
        stderr.all().join("\n")
    );
    assert_eq!(
        command.tracer(),
        0,
        "stop {i}: still traced after memprof ended"
    );
    // Nothing memprof set up reaches it later.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        command.exit(),
        None,
        "stop {i} (signal {signal}): the command ended after memprof"
    );
    // It ends by our SIGKILL, nothing else.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let mut raw = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut raw, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(raw) && libc::WTERMSIG(raw) == libc::SIGKILL,
        "stop {i}: the command ended with status {raw:#x}"
    );
}

/// The command, orphaned by memprof and adopted by this test (subreaper).
struct Command(i32);

impl Command {
    /// How it ended (the raw wait status), or `None` while it runs.
    fn exit(&self) -> Option<String> {
        let mut raw = 0;
        let r = unsafe { libc::waitpid(self.0, &mut raw, libc::WNOHANG) };
        match r {
            0 => None,
            r if r == self.0 && libc::WIFSIGNALED(raw) => {
                Some(format!("killed by signal {}", libc::WTERMSIG(raw)))
            }
            r if r == self.0 => Some(format!("exited with code {}", libc::WEXITSTATUS(raw))),
            _ => Some(format!(
                "not our child any more (waitpid: {})",
                std::io::Error::last_os_error()
            )),
        }
    }

    /// `TracerPid` from its status.
    fn tracer(&self) -> u32 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0)).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("TracerPid")
    }
}

/// A test that fails leaves no command looping.
impl Drop for Command {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGKILL) };
        let mut raw = 0;
        unsafe { libc::waitpid(self.0, &mut raw, libc::WNOHANG) };
    }
}
