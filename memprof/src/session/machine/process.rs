//! One process of `attach --all`, from its first allocation followed to
//! its exit (or `exec`): who it is, what it maps, where its module table
//! is in the kernel.
use std::path::PathBuf;

use super::events::ReadNow;
use crate::modules::maps::{Mapping, MapsCache};
use crate::modules::ModuleCache;
use crate::profile::{ExitInfo, ProcessInfo};

/// A process the kernel gave an index.
pub struct HostProcess {
    pub pid: u32,
    /// Its index in the kernel's tables ([`memprof_common::host`]),
    /// given again to a later process once this one is finalized.
    pub index: u32,
    /// The order it was seen in (indexes are reused: not theirs).
    pub seq: u64,
    pub ppid: u32,
    pub ns_pid: Option<u32>,
    /// Its command line (its kernel name alone when it was gone before
    /// memprof read it) and executable.
    pub command: Vec<String>,
    pub exe: String,
    /// Seconds since profiling started.
    pub start_s: f64,
    pub end_s: Option<f64>,
    pub exit: Option<ExitInfo>,
    /// Every executable mapping seen, for symbols after it is gone.
    pub maps: MapsCache,
    /// Its files, opened through it as soon as seen mapped.
    pub modules: ModuleCache,
    /// Its mappings as last read (and which reading), not yet given to
    /// the unwinder by the main loop.
    pub latest: Option<(u64, Vec<Mapping>)>,
    /// Its mappings could never be read (gone first), from /proc or from
    /// the kernel: its frames are addresses, not names.
    pub unread: bool,
    /// First seen allocating, not at an `exec`: it mapped what its parent
    /// maps (its parent's table unwound it).
    pub forked: bool,
    /// Its index ended with an `exec`: a reading of /proc may have been
    /// of the program it became.
    pub execed: bool,
    /// Executable mappings the kernel told of files memprof could not
    /// open yet: named once another process's reading opens them.
    pub unknown: Vec<Mapping>,
    /// Memprof was refused the reading of its mappings or one of its
    /// files for want of a resource (descriptors, memory).
    pub refused: bool,
    /// The kernel's OOM killer chose it.
    pub oom_killed: bool,
    /// Blocks (and bytes) its own allocator probes recorded, let go when
    /// they came off.
    pub calls_let_go: (u64, u64),
}

/// What the kernel said of a process when it gave it its index (empty:
/// not read).
#[derive(Debug, Clone, Default)]
pub struct Told {
    /// The kernel's name for it then.
    pub comm: String,
    /// Its command line then (a fork's is its parent's).
    pub command: Vec<String>,
    /// The command line was longer than the event carries.
    pub cut: bool,
    /// The path of the program it ran then.
    pub exe: String,
}

impl HostProcess {
    /// A process just seen (its first allocation followed): what the
    /// kernel `told` of it then, and what /proc still says of it. `now`: as read right after the
    /// kernel gave it its index (its `exec`, or its first allocation
    /// followed).
    pub fn seen(
        pid: u32,
        index: u32,
        ppid: u32,
        start_s: f64,
        now: Option<ReadNow>,
        told: Told,
    ) -> HostProcess {
        let target = now.as_ref().and_then(|n| n.target.clone());
        let ns_pid = now.as_ref().and_then(|n| n.ns_pid);
        let (command, exe) = match target {
            Some(t) if !t.command.is_empty() => (t.command, crate::text::lossy_path(&t.exe)),
            Some(t) => (vec![told.comm.clone()], crate::text::lossy_path(&t.exe)),
            None => (vec![told.comm.clone()], String::new()),
        };
        // The kernel's, of the program the index is for: /proc may be
        // read after the process is gone, or after a fork `exec`ed (a
        // shell's child would be named after the program it became). A
        // command line the event cut is taken whole from /proc.
        let read_whole = target_read(&now) && told.cut;
        let command = match told.command.is_empty() || read_whole {
            true => command,
            false => told.command,
        };
        let exe = match told.exe.is_empty() {
            true => exe,
            false => told.exe,
        };
        let mut process = HostProcess {
            pid,
            index,
            seq: 0,
            ppid,
            ns_pid,
            command,
            exe,
            start_s,
            end_s: None,
            exit: None,
            maps: MapsCache::default(),
            modules: ModuleCache::of_process(pid),
            latest: None,
            unread: true,
            forked: false,
            execed: false,
            unknown: Vec::new(),
            refused: false,
            oom_killed: false,
            calls_let_go: (0, 0),
        };
        if let Some(read) = now {
            process.take(read);
        }
        process
    }

    /// Takes in what was read of it meanwhile.
    pub fn take(&mut self, read: ReadNow) {
        self.maps.merge(read.maps.clone());
        self.modules.absorb(read.modules);
        self.latest = Some((read.reading, read.maps));
        self.unread = false;
    }

    /// An executable mapping of a file memprof has (`module`), as the
    /// kernel told it: its frames there are named even if it is gone
    /// before /proc is read.
    pub fn mapped(&mut self, mapping: Mapping, module: std::sync::Arc<crate::modules::Module>) {
        self.modules.adopt(&mapping.path, module);
        self.maps.merge(vec![mapping]);
        self.unread = false;
    }

    /// The program it `exec`ed, as given to `execve`: its executable
    /// when neither the kernel's `NEW` event nor /proc named it.
    pub fn program(&mut self, path: &str) {
        if self.exe.is_empty() && !path.is_empty() {
            self.exe = path.to_string();
            if self.command.len() <= 1 {
                self.command = vec![path.to_string()];
            }
        }
    }

    /// The executable mappings last read, taken (`None`: none new).
    pub fn take_latest(&mut self) -> Option<(u64, Vec<Mapping>)> {
        self.latest.take()
    }

    /// Its line of the profile's process table.
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            pid_reuse: 0,
            ns_pid: self.ns_pid,
            ppid: self.ppid,
            command: self.command.clone(),
            exe: self.exe.clone(),
            start_s: self.start_s,
            end_s: self.end_s,
            exit: self.exit,
            profiled: true,
            profiled_from_s: None,
            counters: None,
        }
    }

    /// Whether memprof was short of a resource for it (see [`Self::refused`]).
    pub fn short_of_resources(&self) -> bool {
        self.refused || self.modules.refused()
    }

    /// The program's file name, for messages.
    pub fn name(&self) -> String {
        let program = self.command.first().cloned().unwrap_or_default();
        PathBuf::from(program)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Whether /proc gave the process's command line.
fn target_read(now: &Option<ReadNow>) -> bool {
    now.as_ref()
        .and_then(|n| n.target.as_ref())
        .is_some_and(|t| !t.command.is_empty())
}
