//! What `attach --all` says on stderr of its processes as they come and
//! go: one summary line per kind of event, every few seconds while the
//! kind grows and once at the end, not one line per process (30 new
//! processes a second would fill the terminal); `--verbose`: each
//! process's line as it happens, too.
use std::time::{Duration, Instant};

/// How often the kinds that grew are summed up.
const SUMMED_EVERY: Duration = Duration::from_secs(10);

/// A kind of event: what its summary says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A process gone before its mappings could be read.
    Unread,
    /// A process given no unwind table.
    NoTable,
    /// A process whose profile could not be made.
    NoProfile,
    /// A process whose tables could not be taken out of the kernel's.
    TablesStay,
    /// An allocator file probed after the first process mapped it.
    ProbedLate,
    /// A process the kernel's OOM killer ended.
    OomKilled,
}

impl Kind {
    /// The summary's words after the count.
    fn summary(self) -> &'static str {
        match self {
            Kind::Unread => "processes ended before memprof could read their mappings: their frames are addresses",
            Kind::NoTable => "processes got no unwind table: their stacks end at the allocator's caller",
            Kind::NoProfile => "processes' profiles could not be made",
            Kind::TablesStay => "processes' tables could not be taken out of the kernel's",
            Kind::ProbedLate => "allocator files probed after a process mapped them: what it allocated through them before is not seen",
            Kind::OomKilled => "processes were ended by the OOM killer: their profiles are marked so, with what they held live",
        }
    }
}

/// The counts said and not said yet.
pub struct Notes {
    verbose: bool,
    /// By kind: events in all, how many the last summary said, and the
    /// latest event's own line (the summary's example).
    kinds: std::collections::BTreeMap<Kind, (u64, u64, String)>,
    last: Instant,
}

impl Notes {
    /// `verbose`: each event's own line too, as it happens.
    pub fn new(verbose: bool) -> Notes {
        Notes {
            verbose,
            kinds: Default::default(),
            last: Instant::now(),
        }
    }

    /// An event of `kind`, which `line` says alone (without the
    /// `memprof: ` prefix).
    pub fn note(&mut self, kind: Kind, line: String) {
        if self.verbose {
            eprintln!("memprof: {line}");
        }
        let (count, _, example) = self.kinds.entry(kind).or_default();
        *count += 1;
        *example = line;
    }

    /// The kinds that grew summed up, every [`SUMMED_EVERY`].
    pub fn tick(&mut self) {
        if self.last.elapsed() >= SUMMED_EVERY {
            self.say();
        }
    }

    /// The kinds that grew since their last summary, one line each.
    pub fn say(&mut self) {
        self.last = Instant::now();
        for (kind, (count, said, example)) in &mut self.kinds {
            if *count == *said {
                continue;
            }
            *said = *count;
            let each = if self.verbose {
                String::new()
            } else {
                format!("; the latest: {example}; --verbose: each one")
            };
            eprintln!("memprof: {count} {} so far{each}", kind.summary());
        }
    }

    /// How many events of `kind` so far.
    #[cfg(test)]
    fn count(&self, kind: Kind) -> u64 {
        self.kinds.get(&kind).map_or(0, |k| k.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_counted_apart_and_said_once_per_growth() {
        let mut notes = Notes::new(false);
        notes.note(Kind::Unread, "pid 1 (a) ended".into());
        notes.note(Kind::Unread, "pid 2 (b) ended".into());
        notes.note(Kind::ProbedLate, "x probed now".into());
        assert_eq!(notes.count(Kind::Unread), 2);
        assert_eq!(notes.count(Kind::ProbedLate), 1);
        assert_eq!(notes.count(Kind::NoTable), 0);
        notes.say();
        let said: Vec<u64> = notes.kinds.values().map(|k| k.1).collect();
        assert_eq!(said, [2, 1]);
        assert_eq!(notes.kinds[&Kind::Unread].2, "pid 2 (b) ended");
    }
}
