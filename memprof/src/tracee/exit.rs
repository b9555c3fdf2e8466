//! How a target ended ([`ExitStatus`]), from a `wait` status.
use crate::profile::ExitInfo;

/// How the target ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    pub(crate) fn from_wait(status: i32) -> Option<ExitStatus> {
        if libc::WIFEXITED(status) {
            Some(ExitStatus::Code(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ExitStatus::Signal(libc::WTERMSIG(status)))
        } else {
            None
        }
    }

    /// The exit code a shell would show (128 + signal for a signal).
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exited with code {c}"),
            ExitStatus::Signal(s) => write!(f, "was killed by signal {s}"),
        }
    }
}

/// As the profile records it.
impl From<ExitStatus> for ExitInfo {
    fn from(status: ExitStatus) -> ExitInfo {
        match status {
            ExitStatus::Code(c) => ExitInfo {
                code: Some(c),
                signal: None,
                oom_killed: false,
            },
            ExitStatus::Signal(s) => ExitInfo {
                code: None,
                signal: Some(s),
                oom_killed: false,
            },
        }
    }
}
