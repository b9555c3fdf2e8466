//! `memprof top --agent`: the table of a running agent's processes
//! ([`Table`], fed by `GET /api/processes` at each refresh instead of
//! sessions of memprof's own).
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::agent::{client, ProcessRow};
use crate::driver::{Driven, Driver, Flow};
use crate::session::table::{Table, Vitals};

/// The default refresh interval.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);

/// `memprof top --agent`: the table of a running agent's processes
/// (`GET /api/processes` at each refresh; no probes of memprof's own),
/// those `filter` keeps.
pub fn from_agent(
    driver: &Driver,
    socket: &Path,
    filter: &AgentFilter,
    (refresh, count, duration): (Duration, Option<u32>, Option<Duration>),
) -> anyhow::Result<i32> {
    // No agent: one line, before the screen is taken.
    client::processes(socket)?;
    let mut top = AgentTop {
        socket,
        filter,
        watching: format!("{} (the agent on {})", filter.describe(), socket.display()),
        table: Some(Table::new(refresh, count)),
    };
    let end = driver.drive(&mut top, duration);
    // The terminal is given back before an error is printed.
    drop(top.table.take());
    end?;
    Ok(0)
}

/// Which of an agent's processes `top --agent` shows: the running ones
/// these name (any, when none is given).
#[derive(Debug, Clone, Default)]
pub struct AgentFilter {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub exes: Vec<PathBuf>,
}

impl AgentFilter {
    /// Whether row `r` is shown.
    pub fn keeps(&self, r: &ProcessRow) -> bool {
        if self.pids.is_empty() && self.comms.is_empty() && self.exes.is_empty() {
            return true;
        }
        self.pids.contains(&r.pid)
            || self.comms.contains(&r.comm)
            || self.exes.iter().any(|e| {
                Path::new(&r.exe) == e
                    || std::fs::canonicalize(e).is_ok_and(|c| Path::new(&r.exe) == c)
            })
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = self.pids.iter().map(|p| format!("pid {p}")).collect();
        parts.extend(self.comms.iter().map(|c| format!("--comm {c}")));
        parts.extend(self.exes.iter().map(|e| format!("--exe {}", e.display())));
        match parts.is_empty() {
            true => "every process".to_string(),
            false => parts.join(", "),
        }
    }
}

/// A running process's row, as `top` shows it.
impl From<&ProcessRow> for Vitals {
    fn from(r: &ProcessRow) -> Vitals {
        Vitals {
            pid: r.pid,
            command: r.comm.clone(),
            live_bytes: r.live_bytes,
            allocations: r.allocations,
            collections: r.collections.unwrap_or(0),
        }
    }
}

struct AgentTop<'a> {
    socket: &'a Path,
    filter: &'a AgentFilter,
    watching: String,
    table: Option<Table>,
}

impl Driven for AgentTop<'_> {
    fn due(&mut self) -> anyhow::Result<Flow> {
        let Some(table) = &mut self.table else {
            return Ok(Flow::Stop);
        };
        let (socket, filter) = (self.socket, self.filter);
        table.due(
            || {
                Ok(client::processes(socket)?
                    .iter()
                    .filter(|r| r.running && filter.keeps(r))
                    .map(Vitals::from)
                    .collect())
            },
            &self.watching,
        )
    }

    fn timeout(&self) -> Duration {
        // `q` is looked at this often between tables.
        let wait = self.table.as_ref().map_or(Duration::ZERO, Table::wait);
        wait.min(Duration::from_millis(100))
    }

    fn step(&mut self) -> anyhow::Result<Flow> {
        Ok(Flow::Go)
    }
}
