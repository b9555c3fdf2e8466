//! Attaching the loaded programs to functions of the target.
//!
//! Each program is loaded once and attached with one multi-uprobe link per
//! file (`multi.rs`) to every function of that file that shares its
//! argument layout; each offset's cookie tells the program which
//! [`memprof_common::AllocKind`] it is counting and how to read the
//! arguments. Every probe is scoped to the target's pid, and its link is
//! kept in [`Probes`] until it is dropped.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use aya::programs::RawTracePoint;
use memprof_common::programs;

use super::{multi, permission_hint, Probes};
use crate::modules::{Module, ModuleCache};
use crate::placement::Planned;

/// The probes of one link: a program in one file.
#[derive(Default)]
struct LinkPlan {
    /// (file offset, cookie) of each probe.
    probes: Vec<(u64, u64)>,
    /// The functions, for messages.
    symbols: Vec<&'static str>,
    /// The module's own path, for messages.
    module: PathBuf,
}

impl Probes {
    /// Attaches the entry (and return) probe of every planned function, for
    /// `pid` only, on the very file `pid` maps (read through `modules`).
    pub fn attach(&mut self, pid: u32, plan: &[Planned], modules: &ModuleCache) -> Result<()> {
        // Keyed (entry?, program, file): the return probes come first. A
        // return probe sits at the same offset as its entry (%rsp still
        // points at the return address there, placement guarantees it). With
        // it attached first, a call entering between the two has a return
        // probe and no pending entry (ignored), never a pending entry whose
        // return nobody sees.
        let mut links: BTreeMap<(bool, &'static str, PathBuf), LinkPlan> = BTreeMap::new();
        for planned in plan {
            let f = &planned.func;
            let file = modules.get(&f.module)?.fd_path();
            let cookie = memprof_common::cookie::new(f.func.kind, f.func.layout);
            let offset = f.file_offset + planned.placement.offset;
            let (entry, exit) = if self.empty {
                (
                    programs::EMPTY,
                    f.func.exit_program.map(|_| programs::EMPTY_RET),
                )
            } else {
                (f.func.entry_program, f.func.exit_program)
            };
            let probes = exit
                .map(|p| (false, p))
                .into_iter()
                .chain(std::iter::once((true, entry)));
            for (is_entry, program) in probes {
                let link = links.entry((is_entry, program, file.clone())).or_default();
                link.probes.push((offset, cookie));
                link.symbols.push(f.func.symbol);
                link.module = f.module.clone();
            }
        }
        for ((is_entry, program, file), link) in links {
            let count = link.probes.len();
            self.link(program, &file, &link.probes, pid, !is_entry)
                .with_context(|| {
                    format!(
                        "attaching {program} to {} in {}",
                        link.symbols.join(", "),
                        link.module.display()
                    )
                })?;
            self.attached += count;
        }
        Ok(())
    }

    /// Attaches the program that removes an exiting thread's slot of the
    /// pending-call table (a raw tracepoint: no tracefs needed). The
    /// entry probe keeps each thread's slot between calls, so without it
    /// the table would fill with the threads that are gone.
    pub(super) fn watch_thread_exits(&mut self) -> Result<()> {
        let program: &mut RawTracePoint = self
            .ebpf
            .program_mut(programs::THREAD_EXIT)
            .context("eBPF object has no program thread_exit")?
            .try_into()?;
        program
            .load()
            .map_err(|e| permission_hint(e.into(), "loading program thread_exit"))?;
        program
            .attach("sched_process_exit")
            .map_err(|e| permission_hint(e.into(), "attaching to sched_process_exit"))?;
        Ok(())
    }

    /// Attaches `program` (no cookie) at file `offset` of `module`, for
    /// `pid` only. Errors say `what` was being attached.
    pub(super) fn attach_at(
        &mut self,
        program: &'static str,
        module: &Module,
        offset: u64,
        pid: u32,
        what: &str,
    ) -> Result<()> {
        self.link(program, &module.fd_path(), &[(offset, 0)], pid, false)
            .with_context(|| format!("attaching to {what} in {}", module.path().display()))
    }

    /// One multi-uprobe link of `program` at `probes` of `file`.
    fn link(
        &mut self,
        program: &'static str,
        file: &std::path::Path,
        probes: &[(u64, u64)],
        pid: u32,
        at_return: bool,
    ) -> Result<()> {
        let fd = self
            .programs
            .get(program)
            .map_err(|e| permission_hint(e, &format!("loading program {program}")))?;
        let link = multi::attach(fd, file, probes, pid, at_return)
            .map_err(|e| permission_hint(e, "attaching a uprobe"))?;
        self.links.push((program, link));
        Ok(())
    }
}
