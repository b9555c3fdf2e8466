//! Attaching the loaded programs to functions of the target.
//!
//! Each program is loaded once and attached with one multi-uprobe link per
//! file (`multi.rs`) to every function of that file that shares its
//! argument layout, or, on a kernel without them, one perf event per
//! function (`classic.rs`); each offset's cookie tells the program which
//! [`memprof_common::AllocKind`] it is counting and how to read the
//! arguments. Every probe is scoped to the target's pid, and its link is
//! kept in [`Probes`] until it is dropped.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use aya::programs::RawTracePoint;
use memprof_common::programs;

use super::multi::{self, Attach};
use super::{classic, kernel, permission_hint, Detaching, Link, Probes};
use crate::modules::{Module, ModuleCache};
use crate::probes::placement::Planned;

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
        // Keyed (how, program, file): the return probes come first. A
        // return probe sits at the same offset as its entry (%rsp still
        // points at the return address there, placement guarantees it). With
        // it attached first, a call entering between the two has a return
        // probe and no pending entry (ignored), never a pending entry whose
        // return nobody sees. (A session is both at once.)
        //
        // A session when sampling: its entry skips the return of every
        // call it does not follow (binary-trees 12: 0.71× the empty-probe
        // floor, against 1.18× with the pair). And when an allocator's
        // results are read at its entry (`crate::predict`: `GC_malloc`,
        // `GC_malloc_atomic`, glibc's `malloc`): its entry skips the return
        // of most calls. Else the pair: following every call, it is
        // cheaper (1.63× against 1.72×: the session's return goes through
        // the kernel's per-consumer bookkeeping). Without sessions (Linux
        // < 6.13), the pair, and no result read at the entry.
        let sessions = kernel().uprobe_session;
        self.predict = self.predict && !self.empty && sessions;
        // With a predicted allocator, every allocating function gets the
        // session: one program to load and verify, not three (`memprof
        // run -- /bin/true`: 0.59 s against 0.79 s), for a return that
        // costs a little more on the functions not predicted.
        let session = !self.empty && (self.sample_bytes > 0 || self.predict) && sessions;
        let mut links: BTreeMap<(Attach, &'static str, PathBuf), LinkPlan> = BTreeMap::new();
        for planned in plan {
            let f = &planned.func;
            let file = modules.get(&f.module)?.fd_path();
            let cookie = memprof_common::cookie::new(f.func.kind, f.func.layout);
            let offset = f.file_offset + planned.placement.offset;
            let probes = match (f.func.exit_program, self.empty) {
                (None, false) => vec![(Attach::Entry, f.func.entry_program)],
                (None, true) => vec![(Attach::Entry, programs::EMPTY)],
                (Some(_), true) => vec![
                    (Attach::Return, programs::EMPTY_RET),
                    (Attach::Entry, programs::EMPTY),
                ],
                (Some(_), false) if session && f.func.entry_program == programs::ALLOC_ENTER => {
                    vec![(Attach::Session, programs::ALLOC_SESSION)]
                }
                (Some(exit), false) => vec![
                    (Attach::Return, exit),
                    (Attach::Entry, f.func.entry_program),
                ],
            };
            for (how, program) in probes {
                let link = links.entry((how, program, file.clone())).or_default();
                link.probes.push((offset, cookie));
                link.symbols.push(f.func.symbol);
                link.module = f.module.clone();
            }
        }
        for ((how, program, file), link) in links {
            // A session is an entry and a return probe.
            let count = link.probes.len() * if how == Attach::Session { 2 } else { 1 };
            self.link(program, &file, &link.probes, pid, how)
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

    /// [`Self::attach`] for process `pid` alone, its links kept apart:
    /// they come off when the [`ProcessProbes`] is dropped, and no other
    /// process gets a breakpoint meanwhile (a uprobe opened for one
    /// process is written into that process's memory only).
    pub fn attach_to_process(
        &mut self,
        pid: u32,
        plan: &[Planned],
        modules: &ModuleCache,
    ) -> Result<ProcessProbes> {
        let (links, attached) = (self.links.len(), self.attached);
        let result = self.attach(pid, plan, modules);
        let own = ProcessProbes {
            links: self.links.split_off(links),
        };
        // `attached` counts the probes on every process.
        self.attached = attached;
        // On an error the links made so far come off with `own`.
        result.map(|()| own)
    }

    /// Attaches the program that removes an exiting thread's slot of the
    /// pending-call table (a raw tracepoint: no tracefs needed). The
    /// entry probe keeps each thread's slot between calls, so without it
    /// the table would fill with the threads that are gone.
    pub(super) fn watch_thread_exits(&mut self) -> Result<()> {
        self.attach_raw_tracepoint(programs::THREAD_EXIT, "sched_process_exit")
    }

    /// Loads `program` and attaches it to the raw tracepoint `tracepoint`.
    pub(super) fn attach_raw_tracepoint(&mut self, program: &str, tracepoint: &str) -> Result<()> {
        let loaded: &mut RawTracePoint = self
            .ebpf
            .program_mut(program)
            .with_context(|| format!("eBPF object has no program {program}"))?
            .try_into()?;
        loaded
            .load()
            .map_err(|e| permission_hint(e.into(), &format!("loading program {program}")))?;
        loaded
            .attach(tracepoint)
            .map_err(|e| permission_hint(e.into(), &format!("attaching to {tracepoint}")))?;
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
        self.attach_at_with_cookie(program, module, (offset, 0), pid, what)
    }

    /// [`Self::attach_at`] at `(offset, cookie)`: the probe's attach cookie.
    pub(super) fn attach_at_with_cookie(
        &mut self,
        program: &'static str,
        module: &Module,
        (offset, cookie): (u64, u64),
        pid: u32,
        what: &str,
    ) -> Result<()> {
        self.link(
            program,
            &module.fd_path(),
            &[(offset, cookie)],
            pid,
            Attach::Entry,
        )
        .with_context(|| format!("attaching to {what} in {}", module.path().display()))
    }

    /// `program` at `probes` of `file`: one multi-uprobe link, or where
    /// the kernel has none, a classic uprobe each.
    fn link(
        &mut self,
        program: &'static str,
        file: &std::path::Path,
        probes: &[(u64, u64)],
        pid: u32,
        how: Attach,
    ) -> Result<()> {
        let fd = self
            .programs
            .get(program)
            .map_err(|e| permission_hint(e, &format!("loading program {program}")))?;
        let attached = if kernel().multi_uprobe {
            multi::attach(fd, file, probes, pid, how).map(|link| vec![Link(vec![link])])
        } else {
            debug_assert!(how != Attach::Session, "a session without multi-uprobes");
            classic::attach(fd, file, probes, pid, how == Attach::Return)
        };
        let links = attached.map_err(|e| permission_hint(e, "attaching a uprobe"))?;
        self.links.extend(links);
        Ok(())
    }
}

/// The probes of one process ([`Probes::attach_to_process`]), detached
/// when dropped (on a thread: a link's close waits for the kernel's grace
/// periods, and the caller is the event loop).
pub struct ProcessProbes {
    links: Vec<Link>,
}

impl ProcessProbes {
    /// Detaches them on a thread; [`Detaching::wait`] joins it.
    pub fn detach(mut self) -> Detaching {
        let links = std::mem::take(&mut self.links);
        Detaching(std::thread::spawn(move || drop(links)))
    }
}

impl Drop for ProcessProbes {
    fn drop(&mut self) {
        let links = std::mem::take(&mut self.links);
        if !links.is_empty() {
            std::thread::spawn(move || drop(links));
        }
    }
}
