//! Why the kernel's verifier refused a program, said in one short block.
//!
//! The verifier's instruction log (level 1) of memprof's larger programs
//! is megabytes long and its tail is the last path walked, never the
//! reason. Its statistics log (level 4) holds the reason alone: the
//! messages it prints at the refusal, then `verification time …`, `stack
//! depth a+b+c` and `processed N insns …`. So a refused program is loaded
//! again twice: at level 4 for the message, and at level 1 into a 16 MiB
//! buffer written to a file for whoever needs the whole walk:
//!
//! ```text
//! loading program alloc_session: the kernel's verifier refused it: combined
//! stack size of 3 calls is 640. Too large (processed 253370 insns, stack depth
//! 0+464+16+0+0+0+0+168+248+8+0+0+408+8); whole log:
//! /tmp/memprof-verifier-alloc_session-30895.log
//! ```
//!
//! (At level 1 the verifier keeps only the path that failed: for a
//! refusal after every path was walked, like this one, the file holds the
//! message alone.)
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{anyhow, Result};

/// The statistics log is a few lines.
const STATS_LOG_BYTES: usize = 1 << 20;
/// The instruction log, written to a file.
const FULL_LOG_BYTES: usize = 16 << 20;

/// `BPF_LOG_LEVEL1`: every instruction walked.
const LOG_INSTRUCTIONS: u32 = 1;
/// `BPF_LOG_STATS`: the messages and the statistics only.
const LOG_STATS: u32 = 4;

/// The error for program `name`, refused with `first`: `load` loads it
/// again with a log level and a buffer for the log (and if it loads
/// then, the program is returned after all).
pub(super) fn explain_refusal(
    name: &str,
    first: std::io::Error,
    mut load: impl FnMut(u32, &mut [u8]) -> std::io::Result<OwnedFd>,
) -> Result<OwnedFd> {
    let mut stats = vec![0u8; STATS_LOG_BYTES];
    if let Ok(fd) = load(LOG_STATS, &mut stats) {
        return Ok(fd);
    }
    let refusal = Refusal::read(&text_of(&stats));
    let mut full = vec![0u8; FULL_LOG_BYTES];
    let cut = match load(LOG_INSTRUCTIONS, &mut full) {
        Ok(fd) => return Ok(fd),
        Err(e) => e.raw_os_error() == Some(libc::ENOSPC),
    };
    let saved = save_log(name, &text_of(&full));
    let whole_log = match (saved, cut) {
        (Ok(path), false) => format!("whole log: {}", path.display()),
        (Ok(path), true) => format!(
            "log (cut at {} MiB, the whole did not fit): {}",
            FULL_LOG_BYTES >> 20,
            path.display()
        ),
        (Err(e), _) => format!("the whole log could not be written: {e}"),
    };
    let figures = refusal.figures();
    let why = match refusal.message {
        Some(message) => format!("the kernel's verifier refused it: {message}"),
        // No message: not the verifier's refusal (a program too large, no
        // memory): the errno says it.
        None => format!("the kernel refused it: {first}"),
    };
    // The caller's context names the program ("loading program NAME").
    Err(anyhow!("{why}{figures}; {whole_log}"))
}

/// The text of a log buffer the kernel filled.
fn text_of(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).into_owned()
}

/// What a statistics log (level 4) says of a refusal.
#[derive(Debug, Default, PartialEq, Eq)]
struct Refusal {
    /// The verifier's message (its last lines before the statistics, at
    /// most [`MESSAGE_LINES`], joined with "; ").
    message: Option<String>,
    /// `processed N insns`.
    processed: Option<String>,
    /// `stack depth a+b+c`.
    stack_depth: Option<String>,
}

/// Lines of the message kept: a refusal is one line, at times with a
/// line of context before it.
const MESSAGE_LINES: usize = 2;

/// A line the verifier prints before it walks the program, whatever
/// comes after: not the reason of a refusal. Linux 6.1 says of each
/// function whose arguments its BTF does not type "reg type unsupported
/// for arg#0 function alloc_enter#5" (it is then verified with its
/// caller, as memprof's functions are meant to be).
fn is_notice(line: &str) -> bool {
    line.starts_with("reg type unsupported for arg#")
}

impl Refusal {
    fn read(log: &str) -> Refusal {
        let is_statistics = |line: &str| {
            line.starts_with("verification time")
                || line.starts_with("stack depth")
                || line.starts_with("processed ")
        };
        let lines: Vec<&str> = log.lines().map(str::trim_end).collect();
        let statistics = lines
            .iter()
            .position(|line| is_statistics(line))
            .unwrap_or(lines.len());
        let message: Vec<&str> = lines[..statistics]
            .iter()
            .copied()
            .filter(|line| !line.trim().is_empty() && !is_notice(line))
            .collect();
        let message = message[message.len().saturating_sub(MESSAGE_LINES)..].join("; ");
        let find = |prefix: &str| {
            lines[statistics..]
                .iter()
                .find(|line| line.starts_with(prefix))
        };
        Refusal {
            message: (!message.is_empty()).then_some(message),
            // "processed 12345 insns (limit 1000000) max_states_per_insn …"
            processed: find("processed ").map(|line| match line.find(" insns") {
                Some(end) => line[..end + " insns".len()].to_string(),
                None => line.to_string(),
            }),
            stack_depth: find("stack depth").map(|line| line.to_string()),
        }
    }

    /// ` (processed N insns, stack depth a+b)`, or nothing.
    fn figures(&self) -> String {
        let figures: Vec<&str> = [&self.processed, &self.stack_depth]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        match figures.is_empty() {
            true => String::new(),
            false => format!(" ({})", figures.join(", ")),
        }
    }
}

/// Writes `log` to a new file of its own in `$TMPDIR` (else /tmp):
/// `memprof-verifier-PROGRAM-PID.log`, created with `O_EXCL` and
/// `O_NOFOLLOW` (a file or link planted there is never written through).
fn save_log(program: &str, log: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let pid = std::process::id();
    let mut last = None;
    for n in 0..10 {
        let name = match n {
            0 => format!("memprof-verifier-{program}-{pid}.log"),
            n => format!("memprof-verifier-{program}-{pid}-{n}.log"),
        };
        let path = dir.join(name);
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        match opened {
            Ok(mut file) => {
                file.write_all(log.as_bytes())?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EEXIST)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_last_lines_before_the_statistics() {
        let log = "combined stack size of 2 calls is 640. Too large\n\
                   verification time 123456 usec\n\
                   stack depth 456+168\n\
                   processed 12345 insns (limit 1000000) max_states_per_insn 4 total_states 1234 peak_states 1234 mark_read 12\n";
        let refusal = Refusal::read(log);
        assert_eq!(
            refusal.message.as_deref(),
            Some("combined stack size of 2 calls is 640. Too large")
        );
        assert_eq!(
            refusal.figures(),
            " (processed 12345 insns, stack depth 456+168)"
        );
    }

    #[test]
    fn a_message_of_several_lines_keeps_its_last_two() {
        let log = "one\n\ntwo\nthree\nprocessed 7 insns (limit 1000000)\n";
        let refusal = Refusal::read(log);
        assert_eq!(refusal.message.as_deref(), Some("two; three"));
        assert_eq!(refusal.figures(), " (processed 7 insns)");
    }

    /// Linux 6.1's refusal of memprof's `alloc_enter` (Debian's
    /// 6.1.0-57, 2026-12-04; the verification time made up).
    #[test]
    fn notices_printed_before_the_walk_are_not_the_reason() {
        let log = "reg type unsupported for arg#0 function alloc_enter#5\n\
                   BPF program is too large. Processed 1000001 insn\n\
                   verification time 61225017 usec\n\
                   stack depth 144+16+0+0+0+0+16+208+56+0+8+0\n\
                   processed 1000001 insns (limit 1000000) max_states_per_insn 17 total_states 12685 peak_states 5928 mark_read 35\n";
        let refusal = Refusal::read(log);
        assert_eq!(
            refusal.message.as_deref(),
            Some("BPF program is too large. Processed 1000001 insn")
        );
    }

    #[test]
    fn an_empty_log_has_no_message() {
        assert_eq!(Refusal::read(""), Refusal::default());
        assert_eq!(Refusal::default().figures(), "");
    }

    #[test]
    fn a_refusal_is_one_short_block_with_the_log_in_a_file() {
        let dir = std::env::temp_dir();
        let log = b"R1 invalid mem access 'scalar'\nverification time 9 usec\nstack depth 8\nprocessed 3 insns (limit 1000000)\n\0\0";
        let mut calls = Vec::new();
        let err = explain_refusal(
            "unit_test_prog",
            std::io::Error::from_raw_os_error(libc::EACCES),
            |level, buffer| {
                calls.push(level);
                buffer[..log.len()].copy_from_slice(log);
                Err(std::io::Error::from_raw_os_error(libc::EACCES))
            },
        )
        .unwrap_err();
        assert_eq!(calls, [LOG_STATS, LOG_INSTRUCTIONS]);
        let text = format!("{err:#}");
        assert!(
            text.starts_with("the kernel's verifier refused it: R1 invalid mem access 'scalar' (processed 3 insns, stack depth 8); whole log: "),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
        let path = text.rsplit("whole log: ").next().unwrap();
        assert!(
            path.starts_with(dir.to_str().unwrap()) || path.starts_with("/tmp"),
            "{path}"
        );
        let written = std::fs::read_to_string(path).unwrap();
        assert!(written.starts_with("R1 invalid mem access"));
        std::fs::remove_file(path).unwrap();
    }
}
