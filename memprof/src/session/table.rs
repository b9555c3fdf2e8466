//! `memprof top`: the selected processes' heaps as a table, one row per
//! process ranked by live bytes, refreshed every interval: live bytes, their
//! growth over the last interval, allocations and GC collections a second.
//!
//! The figures are each session's running ones ([`Session::vitals`]: the
//! kernel's per-kind totals and the GC copy's, O(1)), so a refresh costs
//! no walk of any table. In a terminal the screen is redrawn and `q` quits
//! (stdin is read without waiting for a line, and restored at the end);
//! otherwise each refresh is appended, with the time it was taken.
//!
//! [`Session::vitals`]: crate::session::Session::vitals
use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::driver::Flow;
use crate::text::bytes;

/// What `memprof top` shows of one process ([`crate::session::Session::vitals`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vitals {
    pub pid: u32,
    /// The program's file name.
    pub command: String,
    /// Live bytes now (libc, mmap and GC).
    pub live_bytes: u64,
    /// Allocations so far (GC objects estimated with refill sampling).
    pub allocations: u64,
    /// GC collections seen so far.
    pub collections: u64,
}

/// One row: a process and its rates over the last interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub pid: u32,
    pub command: String,
    pub live_bytes: u64,
    /// Live bytes gained (lost: negative) a second, over the last interval.
    pub growth_per_s: f64,
    pub allocations_per_s: f64,
    pub collections_per_s: f64,
}

/// The rows of a refresh, ranked by live bytes (then pid): each process's
/// figures now against its last ones (`last`, updated), `elapsed` apart. A
/// process seen for the first time has no rates yet (0).
pub fn rows(
    vitals: &[Vitals],
    last: &mut HashMap<u32, (Instant, Vitals)>,
    now: Instant,
) -> Vec<Row> {
    let mut rows: Vec<Row> = vitals
        .iter()
        .map(|v| {
            let per_s = |then: Option<&(Instant, Vitals)>, f: fn(&Vitals) -> f64| match then {
                Some((at, old)) => {
                    let dt = now.duration_since(*at).as_secs_f64();
                    if dt > 0.0 {
                        (f(v) - f(old)) / dt
                    } else {
                        0.0
                    }
                }
                None => 0.0,
            };
            let then = last.get(&v.pid);
            Row {
                pid: v.pid,
                command: v.command.clone(),
                live_bytes: v.live_bytes,
                growth_per_s: per_s(then, |v| v.live_bytes as f64),
                allocations_per_s: per_s(then, |v| v.allocations as f64),
                collections_per_s: per_s(then, |v| v.collections as f64),
            }
        })
        .collect();
    last.retain(|pid, _| vitals.iter().any(|v| v.pid == *pid));
    for v in vitals {
        last.insert(v.pid, (now, v.clone()));
    }
    rows.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.pid.cmp(&b.pid)));
    rows
}

/// The table of `rows`, with a header line. Programs name themselves:
/// their names are shown with control characters escaped ([`crate::text`]).
pub fn table(rows: &[Row], heading: &str, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "{}", crate::text::visible(heading))?;
    writeln!(
        out,
        "{:>8}  {:<16} {:>14} {:>14} {:>12} {:>6}",
        "PID", "COMMAND", "LIVE", "GROWTH/s", "ALLOCS/s", "GC/s"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:>8}  {:<16} {:>14} {:>14} {:>12} {:>6.1}",
            r.pid,
            truncate(&crate::text::visible(&r.command), 16),
            bytes(r.live_bytes as f64),
            signed_bytes(r.growth_per_s),
            count(r.allocations_per_s),
            r.collections_per_s
        )?;
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn signed_bytes(b: f64) -> String {
    match b {
        b if b > 0.5 => format!("+{}", bytes(b)),
        b if b < -0.5 => format!("-{}", bytes(b)),
        _ => "0 B".into(),
    }
}

fn count(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.1} M", n / 1e6),
        n if n >= 1e4 => format!("{:.1} k", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// The screen (or the appended tables) and the keyboard.
pub struct View {
    last: HashMap<u32, (Instant, Vitals)>,
    started: Instant,
    /// stdout is a terminal: redraw in place.
    redraw: bool,
    /// stdin is a terminal, read key by key until dropped.
    keys: Option<RawKeys>,
}

impl View {
    pub fn new() -> View {
        View {
            last: HashMap::new(),
            started: Instant::now(),
            redraw: io::stdout().is_terminal(),
            keys: RawKeys::new(),
        }
    }

    /// Shows the processes' `vitals` now; `watching`: what is selected.
    pub fn refresh(&mut self, vitals: &[Vitals], watching: &str) -> io::Result<()> {
        let now = Instant::now();
        let rows = rows(vitals, &mut self.last, now);
        let mut out = io::stdout().lock();
        if self.redraw {
            // Home, then clear: the table is drawn over the last one.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        let quit = if self.keys.is_some() {
            "q quits"
        } else {
            "Ctrl-C quits"
        };
        let heading = format!(
            "memprof top: {} process{} of {watching}, at {:.1} s; {quit}",
            rows.len(),
            if rows.len() == 1 { "" } else { "es" },
            now.duration_since(self.started).as_secs_f64()
        );
        table(&rows, &heading, &mut out)?;
        if !self.redraw {
            writeln!(out)?;
        }
        out.flush()
    }

    /// Whether `q` was pressed (always false without a terminal on stdin).
    pub fn quit_pressed(&mut self) -> bool {
        self.keys.as_mut().is_some_and(RawKeys::q_pressed)
    }
}

impl Default for View {
    fn default() -> Self {
        Self::new()
    }
}

/// stdin of a terminal, read without waiting for a line and without echo;
/// its settings are restored when dropped.
struct RawKeys {
    saved: libc::termios,
}

impl RawKeys {
    fn new() -> Option<RawKeys> {
        if !io::stdin().is_terminal() {
            return None;
        }
        // SAFETY: termios is plain data, filled by tcgetattr.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(RawKeys { saved })
    }

    fn q_pressed(&mut self) -> bool {
        let mut buf = [0u8; 16];
        // VMIN 0, VTIME 0: returns at once with what was typed.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        n > 0 && buf[..n as usize].iter().any(|&b| b == b'q' || b == b'Q')
    }
}

impl Drop for RawKeys {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `new`.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved) };
    }
}

/// The table shown every `refresh`, `count` times at most (whichever
/// mode gives the figures: sessions of memprof's own, or an agent's).
pub struct Table {
    view: View,
    refresh: Duration,
    count: Option<u32>,
    /// When it is shown next.
    next: Instant,
    shown: u32,
}

impl Table {
    pub fn new(refresh: Duration, count: Option<u32>) -> Table {
        Table {
            view: View::new(),
            refresh,
            count,
            next: Instant::now(),
            shown: 0,
        }
    }

    /// Shows the table when due (its figures asked of `vitals` then);
    /// [`Flow::Stop`] after the last of `--count`, or at `q`.
    pub fn due(
        &mut self,
        vitals: impl FnOnce() -> anyhow::Result<Vec<Vitals>>,
        watching: &str,
    ) -> anyhow::Result<Flow> {
        if Instant::now() >= self.next {
            self.view.refresh(&vitals()?, watching)?;
            self.shown += 1;
            // A refresh made late (attaching to new processes took
            // longer) sets the next from now: missed ones are not replayed
            // as a burst of tables of one instant.
            self.next = (self.next + self.refresh).max(Instant::now() + self.refresh / 2);
            if self.count.is_some_and(|n| self.shown >= n) {
                return Ok(Flow::Stop);
            }
        }
        Ok(match self.view.quit_pressed() {
            true => Flow::Stop,
            false => Flow::Go,
        })
    }

    /// How long until the next table.
    pub fn wait(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vitals(pid: u32, live: u64, allocations: u64) -> Vitals {
        Vitals {
            pid,
            command: format!("p{pid}"),
            live_bytes: live,
            allocations,
            collections: 0,
        }
    }

    #[test]
    fn ranked_by_live_bytes_with_rates_over_the_interval() {
        let mut last = HashMap::new();
        let t0 = Instant::now();
        let first = rows(&[vitals(1, 100, 10), vitals(2, 50, 0)], &mut last, t0);
        assert_eq!(first[0].pid, 1);
        assert_eq!(
            first[0].growth_per_s, 0.0,
            "no rate before a second refresh"
        );
        let t1 = t0 + Duration::from_secs(2);
        let second = rows(&[vitals(1, 100, 30), vitals(2, 450, 0)], &mut last, t1);
        assert_eq!(
            second.iter().map(|r| r.pid).collect::<Vec<_>>(),
            vec![2, 1],
            "the one that grew is first"
        );
        assert_eq!(second[0].growth_per_s, 200.0);
        assert_eq!(second[1].allocations_per_s, 10.0);
    }

    #[test]
    fn a_process_gone_is_forgotten() {
        let mut last = HashMap::new();
        let t0 = Instant::now();
        rows(&[vitals(1, 1, 1)], &mut last, t0);
        rows(&[vitals(2, 1, 1)], &mut last, t0 + Duration::from_secs(1));
        assert!(!last.contains_key(&1));
    }

    #[test]
    fn units() {
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(signed_bytes(-2048.0), "-2.0 KiB");
        assert_eq!(count(12_345.0), "12.3 k");
    }
}
