//! Each file `attach --all` sees mapped, examined once, by device and
//! inode (whatever its path in each process's root): its allocator
//! functions probed for every process, its CFI rows written once into the
//! kernel's table, its parse shared by the processes that map it.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memprof_common::host::{FileKey, KnownFile};
use memprof_common::ModuleRange;

use crate::modules::maps::{self, Mapping};
use crate::modules::{Module, ModuleCache, Segment};
use crate::options::{SessionOptions, Unwind};
use crate::plan::{Choice, Plan};
use crate::probes::{Probes, ProcessProbes, RowTable};
use crate::unwind::ModuleTable;

use super::file_ids::file_id_of_meta;
use super::file_ids::{file_id, kernel_key, FileId};
use super::row_space::{Refusal, RowSpace};

#[derive(Default)]
struct FileEntry {
    module: Option<Arc<Module>>,
}

/// A file's rows in the kernel's table, and its segments (for its load
/// bias).
struct FileRows {
    start: u32,
    count: u32,
    segments: Vec<Segment>,
    /// The file parsed, while a process maps it (its symbols and
    /// sections weigh more than its rows: let go when it is unnamed).
    module: Option<Arc<Module>>,
    owner: u32,
    /// What the kernel is told of it (`None`: not told).
    known: Option<(FileKey, KnownFile)>,
    /// When a process last mapped it, as far as memprof knows.
    last_used: Instant,
    /// Not named to the kernel any more (unused for [`UNUSED_UNNAMED`]).
    unnamed: bool,
}

/// A file no process followed has mapped for this long is no longer
/// named to the kernel (the tables it builds leave it out)...
const UNUSED_UNNAMED: Duration = Duration::from_secs(5);
/// ...and this long, its rows are let go, or sooner, the least recently
/// used first, when a file needs their room ([`Unwinding::make_room`]).
/// Kept that long because a build runs the same compiler again and again:
/// let go after 10 s, `rustc`'s rows were built and written anew for each
/// `cargo build` (2.5 s of the agent's CPU for a 0.5 s build).
const UNUSED_LET_GO: Duration = Duration::from_secs(600);

/// The files' CFI rows in the kernel, shared by the event reader (which
/// gives a process its table the moment it is seen, writing the rows of
/// its small files itself) and the main loop (the big ones).
pub type RowIndex = Arc<Mutex<Unwinding>>;

pub struct Unwinding {
    table: RowTable,
    space: RowSpace,
    files: HashMap<FileId, FileRows>,
    /// Files whose rows were built or are being built (by either thread).
    tried: HashSet<FileId>,
    /// Of those, the ones being built.
    building: HashSet<FileId>,
    /// Of those, the ones given no room: tried again once room is let go.
    refused: HashSet<FileId>,
    /// Files given no rows, by why (the count at the end).
    pub refusals: BTreeMap<&'static str, u64>,
    /// Each kind of refusal is said once per owner.
    said: HashSet<(&'static str, u32)>,
    /// Files whose rows were let go, no process mapping them any more.
    pub let_go: u64,
}

impl Unwinding {
    pub fn new(table: RowTable) -> RowIndex {
        Arc::new(Mutex::new(Unwinding {
            space: RowSpace::new(table.capacity()),
            table,
            files: HashMap::new(),
            tried: HashSet::new(),
            building: HashSet::new(),
            refused: HashSet::new(),
            refusals: BTreeMap::new(),
            said: HashSet::new(),
            let_go: 0,
        }))
    }

    /// A file of `owner` given no rows because `why` (said the first time
    /// of each kind for each owner: one user cannot fill root's terminal).
    fn refuse(
        &mut self,
        kind: &'static str,
        owner: u32,
        path: &std::path::Path,
        why: &dyn std::fmt::Display,
    ) {
        *self.refusals.entry(kind).or_default() += 1;
        if self.said.insert((kind, owner)) {
            eprintln!(
                "memprof: {} gets no unwind rows: {why}; stacks through it end there unless memprof can finish them itself (said once per user; the count at the end)",
                crate::text::lossy_path(path)
            );
        }
    }

    /// Room for `count` rows of a file of `owner`, where there is or
    /// where the rows of files no process uses (no longer named to the
    /// kernel) are let go for them, the least recently used first (only
    /// `owner`'s when its share is what refused them).
    fn make_room(&mut self, count: u32, owner: u32) -> Result<u32, Refusal> {
        loop {
            let refusal = match self.space.take(count, owner) {
                Ok(start) => return Ok(start),
                Err(refusal) => refusal,
            };
            let oldest = self
                .files
                .iter()
                .filter(|(_, f)| f.unnamed)
                .filter(|(_, f)| match refusal {
                    Refusal::OwnerShare { .. } => f.owner == owner,
                    Refusal::Full => true,
                })
                .min_by_key(|(_, f)| f.last_used)
                .map(|(id, _)| id.clone());
            let Some(id) = oldest else {
                return Err(refusal);
            };
            self.let_go(&id);
        }
    }

    /// File `id`'s rows let go, their room free.
    fn let_go(&mut self, id: &FileId) {
        if let Some(file) = self.files.remove(id) {
            self.space.give_back(file.start, file.count, file.owner);
            self.tried.remove(id);
            self.let_go += 1;
        }
    }

    /// Files with rows in the kernel's table.
    pub fn with_rows(&self) -> usize {
        self.files.len()
    }

    /// Of the files with rows, those no process of `in_use` maps: no
    /// longer named to the kernel after [`UNUSED_UNNAMED`], their rows
    /// let go after [`UNUSED_LET_GO`] (the files refused room are tried
    /// again then); one mapped again is named again.
    pub fn let_go_unused(&mut self, in_use: &HashSet<&FileId>, now: Instant) {
        let mut gone = Vec::new();
        for (id, file) in &mut self.files {
            if in_use.contains(id) || self.building.contains(id) {
                file.last_used = now;
                if file.unnamed {
                    if let Some((key, known)) = file.known {
                        file.unnamed = self.table.name(key, known).is_err();
                    }
                }
                continue;
            }
            let unused = now.saturating_duration_since(file.last_used);
            if unused >= UNUSED_UNNAMED && !file.unnamed {
                if let Some((key, _)) = &file.known {
                    if self.table.unname(key).is_err() {
                        continue; // still named: its rows stay
                    }
                }
                file.unnamed = true;
                file.module = None;
            }
            if file.unnamed && unused >= UNUSED_LET_GO {
                gone.push(id.clone());
            }
        }
        for id in &gone {
            self.let_go(id);
        }
        if !gone.is_empty() {
            for id in self.refused.drain() {
                self.tried.remove(&id);
            }
        }
    }
}

/// Where the dynamic linker finds libraries (Debian's multiarch first).
const LIBRARY_DIRS: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

/// The reader builds the rows of files up to this size at once (a few
/// milliseconds); bigger ones wait for the main loop.
pub const SMALL_FILE: u64 = 8 << 20;

/// Writes the rows of each file of `mappings` (a process's executable
/// ones, its files read through `cache`) that has none yet (only those
/// of at most `max_size` bytes, if given).
/// `between` is called before each file is built.
pub fn add_rows(
    rows: &RowIndex,
    mappings: &[Mapping],
    cache: &ModuleCache,
    max_size: Option<u64>,
    between: &mut dyn FnMut(),
) {
    for m in mappings {
        {
            let mut unwinding = rows.lock().unwrap_or_else(|e| e.into_inner());
            if unwinding.tried.contains(&m.file_id) {
                // Being built by the other thread: the reader waits for
                // it (a small file's take milliseconds), the table it
                // gives the process then has it.
                if max_size.is_some() {
                    for _ in 0..BUILD_WAITS {
                        if !unwinding.building.contains(&m.file_id) {
                            break;
                        }
                        drop(unwinding);
                        between();
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        unwinding = rows.lock().unwrap_or_else(|e| e.into_inner());
                    }
                }
                continue;
            }
            let small = max_size.is_none_or(|max| {
                cache
                    .open_file(&m.path)
                    .and_then(|f| f.metadata())
                    .is_ok_and(|meta| meta.len() <= max)
            });
            if !small {
                continue;
            }
            unwinding.tried.insert(m.file_id.clone());
            unwinding.building.insert(m.file_id.clone());
        }
        between();
        let added = build_rows(rows, m, cache);
        let mut unwinding = rows.lock().unwrap_or_else(|e| e.into_inner());
        unwinding.building.remove(&m.file_id);
        if let Some(file) = added {
            unwinding.files.insert(m.file_id.clone(), file);
        }
    }
}

/// How many milliseconds the reader waits for rows the main loop is building.
const BUILD_WAITS: u32 = 100;

/// The rows of the file of `m`, written into the kernel's table where
/// there is room for them (within its owner's share).
fn build_rows(rows: &RowIndex, m: &Mapping, cache: &ModuleCache) -> Option<FileRows> {
    // Built without the lock: the other thread goes on meanwhile.
    let module = cache.get(&m.path).ok()?;
    let owner = module.owner().unwrap_or(u32::MAX);
    let table = ModuleTable::build(&module);
    module.release_pages();
    let table = match table {
        Ok(table) if !table.rows.is_empty() => table,
        Ok(_) => return None,
        Err(e) => {
            let mut unwinding = rows.lock().unwrap_or_else(|e| e.into_inner());
            let why = format!("{e:#}");
            unwinding.refuse("unreadable or over the budget", owner, &m.path, &why);
            return None;
        }
    };
    let count = table.rows.len() as u32;
    let mut unwinding = rows.lock().unwrap_or_else(|e| e.into_inner());
    let start = match unwinding.make_room(count, owner) {
        Ok(start) => start,
        Err(refusal) => {
            unwinding.refused.insert(m.file_id.clone());
            let kind = match refusal {
                Refusal::OwnerShare { .. } => "over their owner's share",
                Refusal::Full => "the table full",
            };
            unwinding.refuse(kind, owner, &m.path, &refusal);
            return None;
        }
    };
    if let Err(e) = unwinding.table.write(start, &table.rows) {
        unwinding.space.give_back(start, count, owner);
        eprintln!(
            "memprof: the unwind rows of {} could not be written: {e:#}",
            m.path.display()
        );
        return None;
    }
    // The kernel builds the tables of the processes that map it from now
    // on itself, from their first allocation.
    let mut known = None;
    if let (Some(key), Some(vaddr_less_offset)) =
        (kernel_key(&m.file_id), module.exec_vaddr_less_offset())
    {
        let told = KnownFile {
            row_start: start,
            row_count: count,
            vaddr_less_offset,
        };
        match unwinding.table.name(key, told) {
            Ok(()) => known = Some((key, told)),
            Err(e) => eprintln!(
                "memprof: the kernel is not told of {}'s rows (its processes wait for memprof's tables): {e:#}",
                m.path.display()
            ),
        }
    }
    Some(FileRows {
        start,
        count,
        segments: module.segments().to_vec(),
        module: Some(module),
        owner,
        known,
        last_used: Instant::now(),
        unnamed: false,
    })
}

/// The unwinder's module table for `mappings` (a process's executable
/// ones): the ranges of the files with rows.
pub fn ranges(rows: &RowIndex, mappings: &[Mapping]) -> Vec<ModuleRange> {
    let rows = rows.lock().unwrap_or_else(|e| e.into_inner());
    let mut ranges: Vec<ModuleRange> = mappings
        .iter()
        .filter_map(|m| {
            let file = rows.files.get(&m.file_id)?;
            Some(ModuleRange {
                start: m.start,
                end: m.end,
                bias: Segment::bias(&file.segments, m)?,
                row_start: file.start,
                row_count: file.count,
            })
        })
        .collect();
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// The files seen so far.
pub struct Files {
    /// Files named by the kernel that could not be opened as the very
    /// file mapped (gone, replaced, not a regular file): not tried again.
    unopenable: HashSet<FileId>,
    choice: Choice,
    /// Files whose allocator functions were looked for (and probed).
    examined: HashSet<FileId>,
    entries: HashMap<FileId, FileEntry>,
    pub rows: RowIndex,
    /// Files with probes on them.
    probed: usize,
    /// Profiling has begun: a file probed from now on was mapped by a
    /// process that ran unprobed until then (said).
    pub started: bool,
    /// What was said of those files, for the session's notes.
    pub probed_late: Vec<String>,
    /// The allocator functions are probed (`--rss-only`: not; the files'
    /// rows are still written, for the page faults' stacks).
    calls: bool,
    /// Opens of files named by the kernel refused for want of a resource
    /// (descriptors, memory).
    pub refused: u64,
}

impl Files {
    pub fn new(options: &SessionOptions, rows: RowTable) -> Files {
        Files {
            choice: Choice {
                heap: options.heap,
                // The rows are written here, per file, not by the plan.
                unwind: Unwind::Fp,
                probe_at_entry: options.probe_at_entry,
                gc_refill: false,
                quiet: true,
            },
            unopenable: HashSet::new(),
            examined: HashSet::new(),
            entries: HashMap::new(),
            rows: Unwinding::new(rows),
            probed: 0,
            started: false,
            probed_late: Vec::new(),
            refused: 0,
            calls: options.calls,
        }
    }

    /// Whether every process's allocator functions are probed (`--calls`).
    pub fn calls_probed(&self) -> bool {
        self.calls
    }

    /// How many files have probes.
    pub fn probed(&self) -> usize {
        self.probed
    }

    /// Probes the allocator libraries a program started later would get
    /// from the dynamic linker (each `libc.so.6` and `libgc.so*` of the
    /// standard library directories), before any process maps them: its
    /// first allocations are not missed while memprof examines them. The
    /// dynamic linker itself (`ld-linux*.so*`) is watched for library
    /// loads: a program whose table was made before its libraries were
    /// mapped gets them at its first `_dl_debug_state`.
    pub fn probe_system_libraries(&mut self, probes: &mut Probes) {
        let mut found: Vec<(PathBuf, FileId)> = Vec::new();
        for dir in LIBRARY_DIRS {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name != "libc.so.6"
                    && !name.starts_with("libgc.so")
                    && !name.starts_with("ld-linux")
                {
                    continue;
                }
                let Ok(path) = std::fs::canonicalize(entry.path()) else {
                    continue;
                };
                let Some(id) = file_id(&path) else {
                    continue;
                };
                if !found.iter().any(|(_, f)| *f == id) {
                    found.push((path, id));
                }
            }
        }
        let mapping = |(path, id): (PathBuf, FileId)| Mapping {
            start: 0,
            end: 0,
            file_offset: 0,
            executable: true,
            path,
            file_id: id,
        };
        let (linkers, allocators): (Vec<_>, Vec<_>) = found.into_iter().partition(|(path, _)| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ld-linux"))
        });
        let allocators: Vec<Mapping> = allocators.into_iter().map(mapping).collect();
        // Through memprof's own view of the files (no process yet).
        for m in &allocators {
            self.examine_files(
                probes,
                &m.path,
                std::slice::from_ref(m),
                &ModuleCache::default(),
            );
        }
        // Each dynamic linker with a libc beside it, as a program maps
        // them: its `_dl_debug_state` is watched (a file examined alone
        // has no allocator, and nothing of it would be).
        let Some(libc) = allocators.iter().find(|m| m.path.ends_with("libc.so.6")) else {
            return;
        };
        for linker in linkers.into_iter().map(mapping) {
            let path = linker.path.clone();
            self.examine_files(
                probes,
                &path,
                &[linker, libc.clone()],
                &ModuleCache::default(),
            );
        }
    }

    /// Whether every file of `mappings` was examined already.
    pub fn examined_all(&self, mappings: &[Mapping]) -> bool {
        mappings.iter().all(|m| self.examined.contains(&m.file_id))
    }

    /// [`Self::examine`] of process `pid`'s mappings now.
    pub fn examine_pid(&mut self, probes: &mut Probes, pid: u32) {
        let Ok(mappings) = maps::read(pid) else {
            return; // gone, or a kernel thread
        };
        let mappings: Vec<Mapping> = mappings.into_iter().filter(|m| m.executable).collect();
        if mappings.iter().all(|m| self.examined.contains(&m.file_id)) {
            return;
        }
        self.examine(probes, pid, &mappings, &ModuleCache::of_process(pid));
    }

    /// Probes the allocator functions of the files of `mappings`
    /// (process `pid`'s executable ones, its files read through `cache`)
    /// not examined yet, for every process.
    pub fn examine(
        &mut self,
        probes: &mut Probes,
        pid: u32,
        mappings: &[Mapping],
        cache: &ModuleCache,
    ) {
        if mappings.iter().all(|m| self.examined.contains(&m.file_id)) {
            return;
        }
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            return;
        };
        let exe = crate::modules::strip_deleted(&exe);
        self.examine_files(probes, &exe, mappings, cache);
    }

    /// [`Self::examine`] of `mappings` (`exe`'s files), whichever are new.
    fn examine_files(
        &mut self,
        probes: &mut Probes,
        exe: &std::path::Path,
        mappings: &[Mapping],
        cache: &ModuleCache,
    ) {
        let new: Vec<&Mapping> = mappings
            .iter()
            .filter(|m| !self.examined.contains(&m.file_id))
            .collect();
        if new.is_empty() {
            return;
        }
        for m in &new {
            self.examined.insert(m.file_id.clone());
        }
        // The unwinder's rows of every file now: a process that starts
        // later and maps them is unwound from its first allocation.
        add_rows(&self.rows, mappings, cache, None, &mut || {});
        let plan_cache = cache.sibling();
        for m in mappings {
            if let Some(module) = self.module_of(m, cache) {
                plan_cache.adopt(&m.path, module);
            }
        }
        let loaded: Vec<PathBuf> = mappings.iter().map(|m| m.path.clone()).collect();
        // A process without any allocator memprof knows: nothing to probe.
        let Ok(plan) = Plan::new(plan_cache, exe, &loaded, &self.choice) else {
            return;
        };
        let new_paths: HashSet<&std::path::Path> = new.iter().map(|m| m.path.as_path()).collect();
        let planned: Vec<_> = plan
            .probes
            .iter()
            .filter(|p| new_paths.contains(p.func.module.as_path()))
            .cloned()
            .collect();
        self.attach(probes, exe, &planned, &plan);
        watch_linkers(probes, &new, &plan);
        for (path, module) in plan.modules.parsed() {
            if let Some(m) = mappings.iter().find(|m| m.path == path) {
                let entry = self.entries.entry(m.file_id.clone()).or_default();
                entry.module.get_or_insert(module);
            }
        }
    }

    /// Attaches the `planned` probes (`exe`'s new files), for every process.
    fn attach(
        &mut self,
        probes: &mut Probes,
        exe: &std::path::Path,
        planned: &[crate::probes::placement::Planned],
        plan: &Plan,
    ) {
        if planned.is_empty() || !self.calls {
            return;
        }
        let files: HashSet<&PathBuf> = planned.iter().map(|p| &p.func.module).collect();
        match probes.attach(0, planned, &plan.modules) {
            Ok(()) => {
                self.probed += files.len();
                if self.started {
                    for file in &files {
                        self.probed_late.push(format!(
                            "{} probed now, for every process: {} mapped it first, and what it allocated through it before is not seen",
                            file.display(),
                            exe.display()
                        ));
                    }
                }
            }
            Err(e) => eprintln!(
                "memprof: the allocators of {} are not probed: {e:#}",
                files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Probes the allocator functions of every file process `pid` maps,
    /// for `pid` alone (`memprof agent`'s escalations and `--examine`):
    /// no other process gets a breakpoint. Its files' parses are shared
    /// with the files examined already. Says which files were probed.
    pub fn probe_process(
        &mut self,
        probes: &mut Probes,
        pid: u32,
    ) -> anyhow::Result<(ProcessProbes, Vec<PathBuf>)> {
        use anyhow::Context;
        let mappings: Vec<Mapping> = maps::read(pid)
            .with_context(|| format!("reading pid {pid}'s mappings"))?
            .into_iter()
            .filter(|m| m.executable)
            .collect();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("reading pid {pid}'s executable"))?;
        let exe = crate::modules::strip_deleted(&exe);
        let cache = ModuleCache::of_process(pid);
        let plan_cache = cache.sibling();
        for m in &mappings {
            if let Some(module) = self.module_of(m, &cache) {
                plan_cache.adopt(&m.path, module);
            }
        }
        let loaded: Vec<PathBuf> = mappings.iter().map(|m| m.path.clone()).collect();
        let plan = Plan::new(plan_cache, &exe, &loaded, &self.choice)?;
        let files: Vec<PathBuf> = plan
            .probes
            .iter()
            .map(|p| p.func.module.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let own = probes.attach_to_process(pid, &plan.probes, &plan.modules)?;
        Ok((own, files))
    }

    /// Files held parsed.
    pub fn parsed(&self) -> usize {
        self.entries.values().filter(|e| e.module.is_some()).count()
    }

    /// The files parsed that `keep` does not keep, let go (their
    /// symbols, sections and mapping: a file mapped again is parsed
    /// again; its probes stay, and it is not examined again).
    pub fn let_go_modules(&mut self, keep: impl Fn(&FileId) -> bool) {
        self.entries.retain(|id, _| keep(id));
    }

    /// The file `id`, parsed, if memprof has seen it: examined, or with
    /// rows.
    pub fn module_by_id(&self, id: &FileId) -> Option<Arc<Module>> {
        if let Some(module) = self.entries.get(id).and_then(|e| e.module.clone()) {
            return Some(module);
        }
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.files.get(id).and_then(|f| f.module.clone())
    }

    /// File `id`, mapped at `m` by a process memprof may not have read in
    /// time: opened by the path the kernel named it by (`path`), only if
    /// that is the very file mapped (device and inode, checked on the
    /// descriptor) and a regular file, without blocking; its rows are
    /// added. `None` when it cannot be.
    pub fn open_named(&mut self, m: &Mapping) -> Option<Arc<Module>> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(module) = self.module_by_id(&m.file_id) {
            return Some(module);
        }
        if self.unopenable.contains(&m.file_id) || !m.path.is_absolute() {
            return None;
        }
        let opened = crate::modules::shared::open_shared(&m.file_id, || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&m.path)
        });
        let opened = match opened {
            // Refused for want of descriptors or memory: tried again later.
            Err(e) if crate::modules::shared::is_refusal(&e) => {
                self.refused += 1;
                return None;
            }
            Err(_) => None,
            Ok(f) => Some(f).filter(|f| {
                f.metadata()
                    .is_ok_and(|meta| meta.is_file() && file_id_of_meta(&meta) == m.file_id)
            }),
        };
        let Some(module) = opened.and_then(|f| Module::from_file(&m.path, f).ok()) else {
            self.unopenable.insert(m.file_id.clone());
            return None;
        };
        let module = Arc::new(module);
        let cache = ModuleCache::default();
        cache.adopt(&m.path, Arc::clone(&module));
        add_rows(
            &self.rows,
            std::slice::from_ref(m),
            &cache,
            None,
            &mut || {},
        );
        self.entries.entry(m.file_id.clone()).or_default().module = Some(Arc::clone(&module));
        Some(module)
    }

    /// The module mapped at `m`, parsed once per file (through `cache`,
    /// the process's files).
    fn module_of(&mut self, m: &Mapping, cache: &ModuleCache) -> Option<Arc<Module>> {
        let entry = self.entries.entry(m.file_id.clone()).or_default();
        if let Some(module) = &entry.module {
            cache.adopt(&m.path, Arc::clone(module));
            return Some(Arc::clone(module));
        }
        let module = cache.get(&m.path).ok()?;
        entry.module = Some(Arc::clone(&module));
        Some(module)
    }
}

/// The dynamic linker among the `new` files: its library loads, for
/// every process.
fn watch_linkers(probes: &mut Probes, new: &[&Mapping], plan: &Plan) {
    for m in new {
        let Ok(module) = plan.modules.get(&m.path) else {
            continue;
        };
        let hook = module
            .symbol("_dl_debug_state")
            .and_then(|s| module.file_offset(s.address));
        if let Some(offset) = hook {
            if let Err(e) = probes.watch_linker(&module, offset) {
                eprintln!(
                    "memprof: library loads through {} are not seen: {e:#}",
                    m.path.display()
                );
            }
        }
    }
}
