//! What a host gives `memprof agent` while it runs, besides snapshots:
//! every running process's figures (read from the kernel's tables, not
//! symbolized: a scrape of 500 processes stays cheap), and the processes
//! that ended, as kept ([`KEEP_ENDED`](super::KEEP_ENDED)).
use std::collections::{HashMap, HashSet};

use anyhow::Result;

use super::Host;
use crate::driver::Figures;
use crate::probes::Site;
use crate::profile::{ProcessInfo, Profile};

impl Host {
    /// The figures of every process followed that has not ended.
    pub(crate) fn figures(&mut self) -> Result<Vec<Figures>> {
        let running: HashSet<u32> = self
            .processes
            .values()
            .filter(|p| p.end_s.is_none())
            .map(|p| p.index)
            .collect();
        let mut tables = self.probes.read_processes(&running)?;
        let sample_bytes = self.probes.sample_bytes();
        let mut out = Vec::new();
        for index in running {
            let Some(p) = self.processes.get(&index) else {
                continue;
            };
            let mut figures = Figures {
                pid: p.pid,
                program: p.name(),
                exe: p.exe.clone(),
                ..Figures::default()
            };
            // A program that rewrote its command line into one string
            // (Chromium's helpers) is named by its executable.
            if figures.program.is_empty() || figures.program.contains(char::is_whitespace) {
                figures.program = std::path::Path::new(&p.exe)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
            }
            let Some(tables) = tables.remove(&index) else {
                out.push(figures);
                continue;
            };
            // Per site, as the profile scales them (each by its mean size).
            let mut live: HashMap<Site, [u64; 2]> = HashMap::new();
            for (_, block) in &tables.live {
                let sum = live.entry(block.site).or_default();
                sum[0] += 1;
                sum[1] += block.size;
            }
            for (site, [count, bytes]) in live {
                let (count, bytes) = crate::sampling::scale(count, bytes, sample_bytes);
                let kind = &mut figures.live[site.kind as usize];
                kind[0] += count;
                kind[1] += bytes;
            }
            figures.allocations = tables
                .sites
                .iter()
                .map(|(_, t)| crate::sampling::scale(t.count, t.bytes, sample_bytes).0)
                .sum();
            out.push(figures);
        }
        Ok(out)
    }

    /// How process `pid`, left out to a session, exited lately.
    pub(crate) fn exit_of(&self, pid: u32) -> Option<crate::profile::ExitInfo> {
        self.exits
            .iter()
            .rev()
            .find(|(p, _)| *p == pid)
            .map(|(_, e)| *e)
    }

    /// The processes that ended and are kept, oldest first, each with
    /// what it held live when it ended: blocks and bytes per kind (by
    /// [`memprof_common::AllocKind`]'s number).
    pub(crate) fn ended(&self) -> Vec<(ProcessInfo, [[u64; 2]; memprof_common::AllocKind::COUNT])> {
        let mut ended = Vec::new();
        for profile in self.merged.iter().chain(&self.done) {
            // One pass over the groups (a merged profile holds 1,000 processes).
            let mut live: HashMap<(u32, u32), [[u64; 2]; memprof_common::AllocKind::COUNT]> =
                HashMap::new();
            for g in &profile.groups {
                let Some(kind) = crate::profile::kind_index(&g.kind) else {
                    continue;
                };
                let sum = &mut live.entry((g.pid, g.pid_reuse)).or_default()[kind];
                sum[0] += g.live_count;
                sum[1] += g.live_bytes;
            }
            for p in profile.processes.iter().filter(|p| p.end_s.is_some()) {
                let held = live.get(&(p.pid, p.pid_reuse)).copied().unwrap_or_default();
                ended.push((p.clone(), held));
            }
        }
        ended.sort_by(|a, b| {
            a.0.end_s
                .unwrap_or(0.0)
                .total_cmp(&b.0.end_s.unwrap_or(0.0))
        });
        ended
    }

    /// The pids of the processes that ended, kept (no pass over the
    /// groups, nothing cloned: the agent's history asks every 5 s).
    pub(crate) fn ended_pids(&self) -> Vec<u32> {
        let kept = self.merged.iter().chain(&self.done);
        kept.flat_map(|p| &p.processes)
            .filter(|p| p.end_s.is_some())
            .map(|p| p.pid)
            .collect()
    }

    /// How many processes that ended are kept.
    pub(crate) fn ended_count(&self) -> usize {
        self.merged
            .iter()
            .chain(&self.done)
            .map(|p| p.processes.iter().filter(|p| p.end_s.is_some()).count())
            .sum()
    }

    /// The profile of the last process `pid` that ended, as kept (a pid
    /// that `exec`ed ended once per program).
    pub(crate) fn ended_profile(&self, pid: u32) -> Option<Profile> {
        let end = |i: &ProcessInfo| i.end_s.unwrap_or(0.0);
        let done = self
            .done
            .iter()
            .filter_map(|p| Some((p, p.processes.first()?)))
            .filter(|(_, i)| i.pid == pid && i.end_s.is_some())
            .max_by(|a, b| end(a.1).total_cmp(&end(b.1)));
        let merged = self.merged.as_ref().and_then(|m| {
            let info = m
                .processes
                .iter()
                .filter(|i| i.pid == pid && i.end_s.is_some())
                .max_by(|a, b| end(a).total_cmp(&end(b)))?;
            Some((m, info))
        });
        match (done, merged) {
            (Some((p, i)), Some((_, j))) if end(i) >= end(j) => Some(p.clone()),
            (Some((p, _)), None) => Some(p.clone()),
            (_, Some((m, info))) => Some(part_of(m, info)),
            (None, None) => None,
        }
    }
}

/// Process `info`'s part of a profile of many: its groups, its stacks,
/// its counters.
fn part_of(profile: &Profile, info: &ProcessInfo) -> Profile {
    let mut part = Profile {
        groups: profile
            .groups
            .iter()
            .filter(|g| g.pid == info.pid && g.pid_reuse == info.pid_reuse)
            .cloned()
            .collect(),
        stacks: profile.stacks.clone(),
        processes: vec![info.clone()],
        counters: info.counters.clone().unwrap_or_default(),
        exit: info.exit,
        target: crate::profile::TargetInfo {
            pid: info.pid,
            command: info.command.clone(),
            exe: info.exe.clone(),
        },
        probes: profile.probes.clone(),
        memprof_version: profile.memprof_version.clone(),
        kernel: profile.kernel.clone(),
        mode: profile.mode.clone(),
        start_unix_s: profile.start_unix_s,
        duration_s: info.end_s.unwrap_or(profile.duration_s),
        unwind: profile.unwind.clone(),
        sample_bytes: profile.sample_bytes,
        gc_sampling: profile.gc_sampling.clone(),
        gc_refill_every: profile.gc_refill_every,
        ..Profile::default()
    };
    part.compact_stacks();
    part
}
