//! Attaching the loaded programs to functions of the target.
//!
//! Each program is loaded once and attached to every function that shares
//! its argument layout; the attach cookie tells the program which
//! [`memprof_common::AllocKind`] it is counting. Every probe is scoped to
//! the target's pid, and its link is kept in [`Probes`] until it is dropped.
use std::num::NonZeroU32;

use anyhow::{anyhow, Context, Result};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use memprof_common::programs;

use super::{permission_hint, Probes};
use crate::modules::{Module, ModuleCache};
use crate::placement::Planned;

impl Probes {
    /// Loads every program of the object into the kernel (the verifier runs here).
    pub(super) fn load_programs(&mut self) -> Result<()> {
        let names: Vec<String> = self.ebpf.programs().map(|(n, _)| n.to_string()).collect();
        for name in names {
            self.program(&name)?
                .load()
                .map_err(|e| permission_hint(e.into(), &format!("loading program {name}")))?;
        }
        Ok(())
    }

    fn program(&mut self, name: &str) -> Result<&mut UProbe> {
        let program = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?;
        Ok(program.try_into()?)
    }

    /// Attaches the entry (and return) probe of every planned function, for
    /// `pid` only, on the very file `pid` maps (read through `modules`).
    pub fn attach(&mut self, pid: u32, plan: &[Planned], modules: &ModuleCache) -> Result<()> {
        let scope = one_process(pid)?;
        for planned in plan {
            let f = &planned.func;
            let file = modules.get(&f.module)?.fd_path();
            let cookie = Some(f.func.kind as u64);
            let offset = f.file_offset + planned.placement.offset;
            let (entry, exit) = if self.empty {
                (
                    programs::EMPTY,
                    f.func.exit_program.map(|_| programs::EMPTY_RET),
                )
            } else {
                (f.func.entry_program, f.func.exit_program)
            };
            // The return probe sits at the same offset: %rsp still points at
            // the return address there (placement guarantees it), and one
            // breakpoint serves both. It is attached first: a call entering
            // between the two then has a return probe and no pending entry
            // (ignored), never a pending entry whose return nobody sees.
            for program in exit.into_iter().chain(std::iter::once(entry)) {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie,
                };
                let link = self
                    .program(program)?
                    .attach(point, &file, scope)
                    .map_err(|e| permission_hint(e.into(), "attaching a uprobe"))
                    .with_context(|| {
                        format!(
                            "attaching {program} to {} in {}",
                            f.func.symbol,
                            f.module.display()
                        )
                    })?;
                self.links.push((program, link));
                self.attached += 1;
            }
        }
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
        let scope = one_process(pid)?;
        let link = self
            .program(program)?
            .attach(
                UProbeAttachLocation::AbsoluteOffset(offset),
                module.fd_path(),
                scope,
            )
            .map_err(|e| permission_hint(e.into(), "attaching a uprobe"))
            .with_context(|| format!("attaching to {what} in {}", module.path().display()))?;
        self.links.push((program, link));
        Ok(())
    }
}

fn one_process(pid: u32) -> Result<UProbeScope> {
    Ok(UProbeScope::OneProcess(
        NonZeroU32::new(pid).context("pid 0")?,
    ))
}
