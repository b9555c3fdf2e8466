//! `memprof agent --dir DIR`: each process's profile kept on disk, so a
//! restarted agent serves the processes an earlier one saw.
//!
//! Each file is one process's profile in the profile file's format (the
//! bytes `/api/profile?pid=N&format=mprof` serves), named
//! `<pid>-<start_unix>-<program>.mprof`: a newer snapshot of the same
//! process replaces the older one (written under a temporary name,
//! `O_EXCL|O_NOFOLLOW`, synced, then renamed over it).
//!
//! When: every `--dir-every` seconds, the running processes whose figures
//! (live blocks and bytes per kind, allocations, collections) changed
//! since their last snapshot; each process that ended, once, with its
//! exit; and at the end (SIGTERM), every process not written as it is.
//! The driver's thread writes them between its steps, at most
//! [`STEP_BUDGET`] of writing per step (at least one file): a round over
//! many processes is spread over the steps that follow.
//!
//! The directory's snapshots stay within `--dir-budget` bytes: after each
//! write the oldest are deleted (ended processes' first, by when they were
//! written, then running processes' latest), each deletion counted.
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::{running_row, ProcessRow};
use crate::driver::{Figures, Profiling};
use crate::profile::Profile;
use crate::session::selected::Selected;

/// Writing per driver's step at most (at least one file is written).
pub const STEP_BUDGET: Duration = Duration::from_millis(20);

/// What `--dir`, `--dir-budget` and `--dir-every` ask.
#[derive(Debug, Clone)]
pub struct DirOptions {
    pub dir: PathBuf,
    pub budget: u64,
    pub every: Duration,
}

/// What `/metrics` says of the directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirCounts {
    pub written: u64,
    pub deleted: u64,
    pub failed: u64,
    /// Files found unreadable at the start (skipped).
    pub unreadable: u64,
    pub files: u64,
    pub bytes: u64,
}

/// One snapshot file in the directory.
#[derive(Debug, Clone)]
struct Snap {
    pid: u32,
    /// Its row, as `/api/processes` lists it (as ended).
    row: ProcessRow,
    size: u64,
    /// When it was written.
    written: SystemTime,
}

/// A process's figures, as compared between two rounds.
type Key = (
    [[u64; 2]; memprof_common::AllocKind::COUNT],
    u64,
    Option<u64>,
);

fn key(f: &Figures) -> Key {
    (f.live, f.allocations, f.collections)
}

/// A running process's latest snapshot.
struct Latest {
    name: String,
    /// When it started (seconds since the epoch), as its name says.
    start: f64,
    key: Option<Key>,
}

/// What is to be written next.
enum Job {
    Running(u32, Key),
    Ended(u32, u64),
}

/// The snapshots directory of one agent.
pub struct Snapshots {
    path: PathBuf,
    /// The directory, open: every file is named relative to it.
    dir: File,
    budget: u64,
    every: Duration,
    files: HashMap<String, Snap>,
    /// Processes running now, by pid: their latest file.
    latest: HashMap<u32, Latest>,
    /// Ended processes written: pid and end (its bits).
    ended_written: HashSet<(u32, u64)>,
    next_round: Instant,
    queue: VecDeque<Job>,
    counts: DirCounts,
    last_error: Option<String>,
}

impl Snapshots {
    /// The directory checked (root's, not writable by group or others;
    /// made 0700 if missing), and the snapshots in it read (those that
    /// cannot be read are skipped, one line each).
    pub fn open(options: &DirOptions) -> Result<Snapshots> {
        let path = &options.dir;
        super::serve::private_dir(
            &format!("--dir {}", path.display()),
            path,
            "anyone who can write there could put profiles of their own in the agent's, or links",
            0o700,
        )?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .with_context(|| format!("--dir {}", path.display()))?;
        let mut snapshots = Snapshots {
            path: path.clone(),
            dir,
            budget: options.budget,
            every: options.every,
            files: HashMap::new(),
            latest: HashMap::new(),
            ended_written: HashSet::new(),
            next_round: Instant::now() + options.every,
            queue: VecDeque::new(),
            counts: DirCounts::default(),
            last_error: None,
        };
        snapshots.read_all()?;
        snapshots.within_budget();
        Ok(snapshots)
    }

    /// The snapshots there at the start; temporary files a killed agent
    /// left removed.
    fn read_all(&mut self) -> Result<()> {
        let entries = std::fs::read_dir(&self.path)
            .with_context(|| format!("--dir {}", self.path.display()))?;
        let mut names: Vec<String> = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.') && name.ends_with(TEMPORARY) {
                // `.NAME.PID.memprof-tmp`: left by an agent that is gone.
                let writer = name
                    .strip_suffix(TEMPORARY)
                    .and_then(|n| n.rsplit('.').next())
                    .and_then(|pid| pid.parse::<u32>().ok());
                if writer.is_none_or(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                    self.unlink(&name);
                }
            } else if !name.starts_with('.') && name.ends_with(".mprof") {
                names.push(name);
            }
        }
        names.sort();
        for name in names {
            match self.read(&name) {
                Ok((profile, size, written)) => {
                    let row = row_of(&profile, written);
                    self.files.insert(
                        name,
                        Snap {
                            pid: row.pid,
                            row,
                            size,
                            written,
                        },
                    );
                }
                Err(e) => {
                    self.counts.unreadable += 1;
                    eprintln!(
                        "memprof agent: --dir {}: {name} skipped: {}",
                        self.path.display(),
                        crate::text::visible(&format!("{e:#}").replace('\n', " "))
                    );
                }
            }
        }
        Ok(())
    }

    /// Snapshot `name`'s profile, size and time.
    fn read(&self, name: &str) -> Result<(Profile, u64, SystemTime)> {
        let fd = openat(
            &self.dir,
            name,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )?;
        // SAFETY: a descriptor just opened, owned by nothing else.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let meta = file.metadata()?;
        if !meta.is_file() {
            bail!("not a regular file");
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes)?;
        let profile = crate::profile::parse(&bytes)?;
        Ok((profile, meta.len(), meta.modified()?))
    }

    /// What `/metrics` says.
    pub fn counts(&self) -> DirCounts {
        DirCounts {
            files: self.files.len() as u64,
            bytes: self.files.values().map(|s| s.size).sum(),
            ..self.counts
        }
    }

    /// The processes of the directory, each pid's latest, as ended,
    /// but those `listed` has and those this agent follows running (one
    /// whose end its events have not told yet is not ended here either:
    /// its row would say so without its exit).
    pub fn rows(&self, listed: &HashSet<u32>) -> Vec<ProcessRow> {
        let mut latest: HashMap<u32, &Snap> = HashMap::new();
        let shown = |s: &&Snap| !listed.contains(&s.pid) && !self.latest.contains_key(&s.pid);
        for snap in self.files.values().filter(shown) {
            let entry = latest.entry(snap.pid).or_insert(snap);
            if snap.written > entry.written {
                *entry = snap;
            }
        }
        latest.into_values().map(|s| s.row.clone()).collect()
    }

    /// The latest snapshot of a process `pid`, read from the directory.
    pub fn profile(&self, pid: u32) -> Option<Result<Profile>> {
        let (name, _) = self
            .files
            .iter()
            .filter(|(_, s)| s.pid == pid)
            .max_by_key(|(_, s)| s.written)?;
        Some(self.read(name).map(|(profile, _, _)| profile))
    }

    /// Between two steps: a round begun when due, and some of it written
    /// ([`STEP_BUDGET`]); `all`: a round now, written whole (the end).
    pub fn work(&mut self, followed: &mut Selected, all: bool) {
        if all || (self.queue.is_empty() && Instant::now() >= self.next_round) {
            self.next_round = Instant::now() + self.every;
            self.queue.clear();
            self.plan(followed);
        }
        let began = Instant::now();
        while let Some(job) = self.queue.pop_front() {
            match job {
                Job::Running(pid, key) => self.write_running(followed, pid, key),
                Job::Ended(pid, end) => self.write_ended(followed, pid, end),
            }
            if !all && began.elapsed() >= STEP_BUDGET {
                break;
            }
        }
    }

    /// A round: the ended processes not written yet, then the running
    /// ones whose figures changed since their last snapshot.
    fn plan(&mut self, followed: &mut Selected) {
        let ended: HashSet<(u32, u64)> = followed
            .ended()
            .iter()
            .map(|e| (e.info.pid, e.info.end_s.unwrap_or(0.0).to_bits()))
            .collect();
        // What is remembered stays bounded: the ended processes kept, the
        // running ones.
        self.ended_written.retain(|e| ended.contains(e));
        for &(pid, end) in &ended {
            if !self.ended_written.contains(&(pid, end)) {
                self.queue.push_back(Job::Ended(pid, end));
            }
        }
        let figures = followed.figures().unwrap_or_default();
        let pids: HashSet<u32> = figures
            .iter()
            .map(|f| f.pid)
            .chain(ended.iter().map(|e| e.0))
            .collect();
        self.latest.retain(|pid, _| pids.contains(pid));
        for f in figures {
            let key = key(&f);
            let unchanged = self.latest.get(&f.pid).is_some_and(|l| l.key == Some(key));
            if !unchanged {
                self.queue.push_back(Job::Running(f.pid, key));
            }
        }
    }

    fn write_running(&mut self, followed: &mut Selected, pid: u32, key: Key) {
        if !followed.pids().contains(&pid) {
            return; // ended meanwhile: written as such
        }
        let Ok(profile) = followed.snapshot(pid) else {
            return;
        };
        let name = self.name_for(&profile);
        if self.write(&name, &profile) {
            if let Some(latest) = self.latest.get_mut(&pid) {
                latest.key = Some(key);
            }
        }
    }

    fn write_ended(&mut self, followed: &Selected, pid: u32, end: u64) {
        let Some(profile) = followed.ended_profile(pid) else {
            return;
        };
        let info = profile.processes().into_iter().find(|i| i.pid == pid);
        if info.and_then(|i| i.end_s).map(f64::to_bits) != Some(end) {
            return; // another process of that pid ended since
        }
        let name = self.name_for(&profile);
        self.latest.remove(&pid);
        self.ended_written.insert((pid, end));
        self.write(&name, &profile);
    }

    /// `<pid>-<start_unix>-<program>.mprof`; the name of its latest
    /// snapshot for a process written before (the same start).
    fn name_for(&mut self, profile: &Profile) -> String {
        let pid = profile.target.pid;
        let info = profile.processes().into_iter().find(|i| i.pid == pid);
        let start = profile.start_unix_s + info.as_ref().map_or(0.0, |i| i.start_s);
        if let Some(latest) = self.latest.get(&pid) {
            if (latest.start - start).abs() < 2.0 {
                return latest.name.clone();
            }
        }
        let comm = info.as_ref().map_or("", |i| i.comm());
        let program: String = comm
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '_',
            })
            .take(64)
            .collect();
        let name = format!("{pid}-{}-{program}.mprof", start.max(0.0) as u64);
        self.latest.insert(
            pid,
            Latest {
                name: name.clone(),
                start,
                key: None,
            },
        );
        name
    }

    /// Writes `profile` as `name` (replacing it), then keeps the budget;
    /// whether it was written (a failure is said once per kind).
    fn write(&mut self, name: &str, profile: &Profile) -> bool {
        let mut bytes = Vec::new();
        let written =
            crate::profile::write(profile, &mut bytes).and_then(|()| self.replace(name, &bytes));
        match written {
            Ok(()) => {
                self.counts.written += 1;
                let now = SystemTime::now();
                self.files.insert(
                    name.to_string(),
                    Snap {
                        pid: profile.target.pid,
                        row: row_of(profile, now),
                        size: bytes.len() as u64,
                        written: now,
                    },
                );
                self.within_budget();
                true
            }
            Err(e) => {
                self.counts.failed += 1;
                let message = format!("{e:#}");
                if self.last_error.as_ref() != Some(&message) {
                    eprintln!(
                        "memprof agent: --dir {}: cannot write {name}: {message} (said once; counted in memprof_dir_snapshot_failures_total)",
                        self.path.display()
                    );
                    self.last_error = Some(message);
                }
                false
            }
        }
    }

    /// `bytes` as file `name`: a temporary file made (never an existing
    /// one or a link), synced, renamed over `name`.
    fn replace(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let temporary = format!(".{name}.{}{TEMPORARY}", std::process::id());
        let fd = openat(
            &self.dir,
            &temporary,
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
        )?;
        // SAFETY: a descriptor just opened, owned by nothing else.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let done = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                let (from, to) = (c_name(&temporary)?, c_name(name)?);
                let dir = self.dir.as_raw_fd();
                // SAFETY: two names relative to a directory we hold open.
                match unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error().into()),
                }
            });
        if done.is_err() {
            self.unlink(&temporary);
        } else {
            // The rename itself made durable.
            let _ = self.dir.sync_all();
        }
        done
    }

    /// The oldest snapshots deleted until the directory is within the
    /// budget: those of processes not running first, then the running
    /// ones' latest, each by when it was written.
    fn within_budget(&mut self) {
        let mut total: u64 = self.files.values().map(|s| s.size).sum();
        if total <= self.budget {
            return;
        }
        let running: HashSet<&str> = self.latest.values().map(|l| l.name.as_str()).collect();
        let mut order: Vec<(bool, SystemTime, String)> = self
            .files
            .iter()
            .map(|(name, s)| (running.contains(name.as_str()), s.written, name.clone()))
            .collect();
        order.sort();
        for (_, _, name) in order {
            if total <= self.budget {
                break;
            }
            self.unlink(&name);
            if let Some(snap) = self.files.remove(&name) {
                total -= snap.size;
                self.counts.deleted += 1;
            }
        }
    }

    fn unlink(&self, name: &str) {
        if let Ok(name) = c_name(name) {
            // SAFETY: a name relative to a directory we hold open.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) };
        }
    }
}

/// The end of a temporary file's name.
const TEMPORARY: &str = ".memprof-tmp";

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).context("a file name with a NUL")
}

fn openat(dir: &File, name: &str, flags: libc::c_int) -> Result<libc::c_int> {
    let name = c_name(name)?;
    // SAFETY: a name relative to a directory we hold open.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

/// A snapshot's row in `/api/processes`: an ended process (or one whose
/// end was not seen: its last snapshot's time stands for its end).
fn row_of(profile: &Profile, written: SystemTime) -> ProcessRow {
    let pid = profile.target.pid;
    let info = profile
        .processes()
        .into_iter()
        .find(|i| i.pid == pid)
        .unwrap_or_default();
    let live = profile.live_per_kind();
    let figures = Figures {
        pid,
        program: info.comm().to_string(),
        exe: info.exe.clone(),
        live,
        allocations: info
            .counters
            .as_ref()
            .map_or(profile.counters.allocs, |c| c.allocs),
        collections: profile.gc.as_ref().map(|g| g.collections),
        gc_heap_bytes: None,
    };
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    ProcessRow {
        running: false,
        exit: profile.exit.or(info.exit),
        end_unix_s: Some(
            info.end_s
                .map_or(unix(written), |e| profile.start_unix_s + e),
        ),
        ..running_row(&figures)
    }
}
