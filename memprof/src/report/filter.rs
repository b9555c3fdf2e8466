//! Which groups a report shows, for every format: `--kind`, `--function`,
//! `--source`, `--exclude-function`, `--size-min`/`--size-max`, and the
//! lifetime views `--leaked` and `--temporary`. [`Filter::apply`] returns a
//! new profile with only the matching groups; the writers then see nothing
//! else (`--min-bytes`, `--top` and `--depth` stay with
//! [`super::Options`]).
//!
//! `--temporary` rewrites each group's live count and bytes into the
//! allocations that died soon after they were made, so every format (tables,
//! flamegraph, pprof's `inuse_*`) ranks stacks by short-lived churn:
//!
//! ```
//! use memprof::profile::{Group, Lifetimes, Profile};
//! use memprof::report::filter::Filter;
//! let mut profile = Profile::default();
//! let mut lifetimes = Lifetimes::default();
//! lifetimes.record(50_000); // died after 50 µs
//! profile.groups.push(Group { kind: "libc".into(), total_count: 2, total_bytes: 64, lifetimes, ..Default::default() });
//! let filter = Filter { temporary: true, ..Filter::default() };
//! let shown = filter.apply(profile);
//! assert_eq!((shown.groups[0].live_count, shown.groups[0].live_bytes), (1, 32));
//! ```
use anyhow::{bail, Result};
use regex::Regex;

use crate::profile::{Group, Profile};

/// Kinds a group can have.
pub const KINDS: [&str; 5] = ["libc", "mmap", "gc", "gc_atomic", "rss"];

/// Default of `--temporary-ms`.
pub const DEFAULT_TEMPORARY_MS: u64 = 10;

/// Group filters; the default keeps everything.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Keep only these kinds (empty: all).
    pub kinds: Vec<String>,
    /// Keep groups with a frame whose function matches.
    pub function: Option<Regex>,
    /// Keep groups with a frame whose `file:line` matches.
    pub source: Option<Regex>,
    /// Drop groups with a frame whose function matches.
    pub exclude_function: Option<Regex>,
    /// Mean allocation size (`total_bytes / total_count`) bounds, inclusive.
    pub size_min: Option<u64>,
    pub size_max: Option<u64>,
    /// Only groups with blocks still live at the end.
    pub leaked: bool,
    /// Count only allocations that died soon (see [`Filter::temporary_count`]).
    pub temporary: bool,
    /// "Soon" for libc and mmap blocks, nanoseconds.
    pub temporary_ns: u64,
    /// Only these processes, by pid and by program name (`--pid`,
    /// `--comm`; empty: all). See [`Filter::check_processes`].
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            kinds: Vec::new(),
            function: None,
            source: None,
            exclude_function: None,
            size_min: None,
            size_max: None,
            leaked: false,
            temporary: false,
            temporary_ns: DEFAULT_TEMPORARY_MS * 1_000_000,
            pids: Vec::new(),
            comms: Vec::new(),
        }
    }
}

/// Compiles a `--function`-style regular expression; the error names the flag.
pub fn regex(flag: &str, pattern: Option<&str>) -> Result<Option<Regex>> {
    pattern
        .map(|p| {
            Regex::new(p).map_err(|e| {
                // regex's message spans lines; keep the last (the reason).
                let why = e.to_string();
                let why = why.lines().last().unwrap_or("").trim().to_string();
                anyhow::anyhow!("{flag}: bad regular expression {p:?}: {why}")
            })
        })
        .transpose()
}

/// Checks `--kind` values (comma-separated or repeated).
pub fn kinds(given: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for kind in given.iter().flat_map(|k| k.split(',')) {
        let kind = kind.trim();
        if !KINDS.contains(&kind) {
            bail!(
                "--kind: unknown kind {kind:?} (kinds are {})",
                KINDS.join(", ")
            );
        }
        out.push(kind.to_string());
    }
    Ok(out)
}

impl Filter {
    /// True when no filter is set (the profile can be used as it is).
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
            && self.function.is_none()
            && self.source.is_none()
            && self.exclude_function.is_none()
            && self.size_min.is_none()
            && self.size_max.is_none()
            && !self.leaked
            && !self.temporary
            && self.pids.is_empty()
            && self.comms.is_empty()
    }

    /// Whether `--pid` / `--comm` name process `p`.
    fn names(&self, p: &crate::profile::ProcessInfo) -> bool {
        self.pids.contains(&p.pid) || self.comms.iter().any(|c| c == p.comm())
    }

    /// `--pid` / `--comm`: fails, in one line, unless they name a process
    /// whose allocations `profile` has ([`Filter::apply`] keeps those).
    pub fn check_processes(&self, profile: &Profile) -> Result<()> {
        if self.pids.is_empty() && self.comms.is_empty() {
            return Ok(());
        }
        let all = profile.processes();
        let chosen: Vec<_> = all.iter().filter(|p| self.names(p)).collect();
        if chosen.iter().any(|p| p.profiled) {
            return Ok(());
        }
        let list = all
            .iter()
            .map(|p| {
                let mark = if p.profiled { "" } else { ", not profiled" };
                format!("{} {}{mark}", p.pid, p.comm())
            })
            .collect::<Vec<_>>()
            .join("; ");
        match chosen.first() {
            Some(p) => bail!(
                "pid {} ({}) was started by the command but not profiled (--no-follow, or it ended within 0.2 s of a fork without an exec); this profile has: {list}",
                p.pid,
                p.comm()
            ),
            None => bail!("no such process in this profile (--pid/--comm); it has: {list}"),
        }
    }

    /// `profile` with only the matching groups (rewritten for `--temporary`).
    pub fn apply(&self, mut profile: Profile) -> Profile {
        let chosen = self.choose_processes(&mut profile);
        let groups = std::mem::take(&mut profile.groups);
        profile.groups = groups
            .into_iter()
            .filter(|g| {
                chosen
                    .as_ref()
                    .is_none_or(|c| c.contains(&profile.pid_of(g)))
            })
            .filter(|g| self.matches(&profile, g))
            .filter_map(|g| {
                if !self.temporary {
                    return Some(g);
                }
                let n = self.temporary_count(&g);
                (n > 0).then(|| Group {
                    live_count: n,
                    live_bytes: n * mean_size(&g),
                    ..g
                })
            })
            .collect();
        profile
    }

    /// `--pid` / `--comm`: the profiled processes chosen (`None`: all).
    /// One process chosen becomes the profile's target, with its own
    /// counters; the GC summary, census and timeline are the command's,
    /// and go with another process.
    fn choose_processes(&self, profile: &mut Profile) -> Option<Vec<u32>> {
        if self.pids.is_empty() && self.comms.is_empty() {
            return None;
        }
        let chosen: Vec<_> = profile
            .processes()
            .into_iter()
            .filter(|p| p.profiled)
            .filter(|p| self.names(p))
            .collect();
        profile.processes = chosen.clone();
        if let [one] = &chosen[..] {
            if one.pid != profile.target.pid {
                profile.gc = None;
                profile.census = None;
                profile.timeline = Default::default();
                profile.exit = one.exit;
                profile.duration_s = one.end_s.unwrap_or(profile.duration_s) - one.start_s;
            }
            profile.target = crate::profile::TargetInfo {
                pid: one.pid,
                command: one.command.clone(),
                exe: one.exe.clone(),
            };
            if let Some(counters) = &one.counters {
                profile.counters = counters.clone();
            }
        }
        Some(chosen.iter().map(|p| p.pid).collect())
    }

    /// Whether `group` (of `profile`) passes the kind, name, source, size
    /// and `--leaked` filters.
    pub fn matches(&self, profile: &Profile, group: &Group) -> bool {
        if !self.kinds.is_empty() && !self.kinds.contains(&group.kind) {
            return false;
        }
        if self.leaked && group.live_count == 0 {
            return false;
        }
        let any = |re: &Regex, text: &dyn Fn(&crate::profile::Frame) -> String| {
            profile.frames(group).any(|f| re.is_match(&text(f)))
        };
        let function = |f: &crate::profile::Frame| f.function.clone();
        let source = |f: &crate::profile::Frame| match (&f.file, f.line) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            (Some(file), None) => file.clone(),
            _ => String::new(),
        };
        if self.function.as_ref().is_some_and(|re| !any(re, &function)) {
            return false;
        }
        if self.source.as_ref().is_some_and(|re| !any(re, &source)) {
            return false;
        }
        if self
            .exclude_function
            .as_ref()
            .is_some_and(|re| any(re, &function))
        {
            return false;
        }
        let size = mean_size(group);
        if self.size_min.is_some_and(|min| size < min)
            || self.size_max.is_some_and(|max| size > max)
        {
            return false;
        }
        true
    }

    /// Allocations of `group` that died soon: for GC kinds, collected at the
    /// first collection after their allocation; for libc and mmap, freed
    /// within `temporary_ns` (whole lifetime-histogram buckets, so rounded up
    /// to the next bucket bound: 100 µs, 1 ms, 10 ms, 100 ms, 1 s, …).
    pub fn temporary_count(&self, group: &Group) -> u64 {
        if group.kind.starts_with("gc") {
            group.lifetimes.within_first_collection
        } else {
            group.lifetimes.died_within(self.temporary_ns)
        }
    }
}

/// Mean size of one allocation of `group` (`total_bytes / total_count`, or
/// the live figures when the totals are missing), rounded down.
fn mean_size(group: &Group) -> u64 {
    group
        .total_bytes
        .checked_div(group.total_count)
        .or_else(|| group.live_bytes.checked_div(group.live_count))
        .unwrap_or(0)
}

/// Checks the `--size-min`/`--size-max` pair.
pub fn check_sizes(min: Option<u64>, max: Option<u64>) -> Result<()> {
    if let (Some(min), Some(max)) = (min, max) {
        if min > max {
            bail!("--size-min {min} is larger than --size-max {max}: nothing could match");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Frame;

    fn group(kind: &str, name: &str, count: u64, bytes: u64) -> (Group, Vec<Frame>) {
        let group = Group {
            kind: kind.into(),
            live_count: count,
            live_bytes: bytes,
            total_count: count,
            total_bytes: bytes,
            ..Group::default()
        };
        let frame = Frame {
            function: name.into(),
            file: Some("/src/a.c".into()),
            line: Some(7),
            ..Frame::default()
        };
        (group, vec![frame])
    }

    fn names(filter: &Filter) -> Vec<String> {
        let mut p = Profile::default();
        for (g, frames) in [
            group("libc", "make_foo", 10, 480),
            group("gc", "Foo.new", 2, 64),
            group("mmap", "big", 1, 1 << 20),
        ] {
            p.push(g, frames);
        }
        let shown = filter.apply(p);
        shown
            .groups
            .iter()
            .map(|g| shown.frames(g).next().unwrap().function.clone())
            .collect()
    }

    #[test]
    fn filters_by_kind_name_source_and_size() {
        let f = Filter {
            kinds: kinds(&["gc,libc".into()]).unwrap(),
            ..Filter::default()
        };
        assert_eq!(names(&f), ["make_foo", "Foo.new"]);
        let f = Filter {
            function: regex("--function", Some("^Foo\\.")).unwrap(),
            ..Filter::default()
        };
        assert_eq!(names(&f), ["Foo.new"]);
        let f = Filter {
            exclude_function: regex("--exclude-function", Some("foo")).unwrap(),
            ..Filter::default()
        };
        assert_eq!(names(&f), ["Foo.new", "big"]);
        let f = Filter {
            source: regex("--source", Some("a\\.c:7$")).unwrap(),
            size_min: Some(40),
            size_max: Some(48),
            ..Filter::default()
        };
        assert_eq!(names(&f), ["make_foo"]);
    }

    #[test]
    fn bad_input_is_one_clear_line() {
        let e = regex("--function", Some("(")).unwrap_err().to_string();
        assert!(e.starts_with("--function: bad regular expression"), "{e}");
        assert!(!e.contains('\n'));
        let e = kinds(&["heap".into()]).unwrap_err().to_string();
        assert!(e.contains("unknown kind \"heap\""), "{e}");
    }

    #[test]
    fn temporary_uses_the_lifetime_histogram() {
        let (mut g, _) = group("libc", "f", 0, 0);
        g.total_count = 4;
        g.total_bytes = 400;
        for ns in [50_000, 5_000_000, 50_000_000] {
            g.lifetimes.record(ns);
        }
        let f = Filter {
            temporary: true,
            ..Filter::default()
        };
        assert_eq!(f.temporary_count(&g), 2);
        let shown = f.apply(Profile {
            groups: vec![g],
            ..Profile::default()
        });
        assert_eq!(shown.groups[0].live_bytes, 200);
    }
}
