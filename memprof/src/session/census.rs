//! Censuses inside `attach` and `run`: the whole GC heap by type at held
//! collections, the objects memprof saw allocated (tracked) apart from
//! those it did not — in `attach`, the objects live before it attached.
//!
//! The mark-bit passes already hold the collector at each collection
//! ([`crate::session`]'s `gc_watch`). At the first held collection, at
//! the first one after the session is asked to end (the session waits
//! for it, `--census-wait`), and (`--census periodic`) at ones in between
//! as the budget allows, the hold also copies the heap as
//! `memprof heap` does ([`HeapReader::copy`], large objects by their head
//! only); once the collector runs again, a thread of its own judges every
//! object ([`HeapCopy::census`]), names the types
//! ([`crate::symbolize::type_ids`]) and asks memprof's copy of the GC
//! objects which it tracks ([`crate::gc::copy::GcCopy::tracks`]). The
//! profile keeps the first (`start`, in `attach` only) and the last
//! (`end`) as rows per type ([`HeapCensus`]).
//!
//! Budget: a census is copied at a hold only if the time since the last
//! one is at least [`BUDGET`] times what that one cost (held and after;
//! naming the types, once, is not counted), and none is being computed:
//! at most about 1/[`BUDGET`] of the time.
//! So `end` is the last collection censused, which may be earlier than
//! the last collection; its `t_s` says when.
//!
//! ```text
//! attach: first hold  -> start = end = census at collection 12
//!         later holds -> end = census at collection 40 (periodic, budget allowing)
//!         Ctrl-C      -> wait for a hold: end = census at collection 43
//!                        (none within --census-wait: end stays 40, a note says so)
//! run:    none by default; with --census: no start (nothing was live
//!         before memprof), end as in attach
//! ```
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{anyhow, Result};

use crate::gc::census::is_atomic;
use crate::gc::census::names::object_name;
use crate::gc::census::{kind_name, HeapCopy, HeapReader, Word};
use crate::modules::{Module, ModuleCache};
use crate::options::CensusWhen;
use crate::profile::{CensusType, Censuses, HeapCensus};
use crate::symbolize::type_ids::{type_names, TypeNames, TypeOf};

/// A census is taken only when the time since the last one is at least
/// this many times its cost.
pub const BUDGET: f64 = 20.0;

/// What a census thread brings back: the census (or why not) and the
/// type names it used (made once, by the first).
type Done = (Result<HeapCensus>, Arc<TypeNames>);

/// The censuses of one session.
pub struct SessionCensus {
    pid: u32,
    reader: HeapReader,
    exe: Arc<Module>,
    attach: bool,
    when: CensusWhen,
    started: Instant,
    names: Option<Arc<TypeNames>>,
    start: Option<HeapCensus>,
    end: Option<HeapCensus>,
    note: Option<String>,
    /// Copied at a hold: the copy, seconds held for it, seconds since start.
    pending: Option<(HeapCopy, f64, f64)>,
    working: Option<JoinHandle<Done>>,
    /// When the last census was copied, and its cost so far (seconds).
    last: Option<(Instant, f64)>,
    /// Censuses stop after a failure (the note says it).
    failed: bool,
    /// The session is ending: census the next held collection.
    end_wanted: bool,
    /// The end census is copied (its collector held, then let go).
    end_copied: bool,
}

impl SessionCensus {
    /// For a session of process `pid`, whose libgc is `gc_module` and program `exe`.
    /// `attach`: objects not seen allocated were live before memprof.
    pub fn new(
        modules: &ModuleCache,
        pid: u32,
        gc_module: &Path,
        exe: &Path,
        attach: bool,
        when: CensusWhen,
    ) -> Result<SessionCensus> {
        Ok(SessionCensus {
            pid,
            reader: HeapReader::new(modules.get(gc_module)?)?,
            exe: modules.get(exe)?,
            attach,
            when,
            started: Instant::now(),
            names: None,
            start: None,
            end: None,
            note: None,
            pending: None,
            working: None,
            last: None,
            failed: false,
            end_wanted: false,
            end_copied: false,
        })
    }

    /// Whether to census at this hold ([`BUDGET`]).
    fn due(&mut self) -> bool {
        if self.failed || self.pending.is_some() || self.end_copied {
            return false;
        }
        if self.working.as_ref().is_some_and(|w| !w.is_finished()) {
            return false;
        }
        self.join();
        if self.end_wanted {
            return true;
        }
        match self.last {
            None => self.when.at_first(),
            Some(_) if self.when != CensusWhen::Periodic => false,
            Some((at, cost)) => at.elapsed().as_secs_f64() >= BUDGET * cost,
        }
    }

    /// Whether a census may be due at a later collection (so that
    /// collections are held for it): the first, the end one asked for, or
    /// periodic ones.
    pub fn could_be_due(&self) -> bool {
        if self.failed || self.end_copied {
            return false;
        }
        self.end_wanted
            || (self.last.is_none() && self.when.at_first())
            || self.when == CensusWhen::Periodic
    }

    /// At a held collection (the collector is held at the end of its
    /// marking): copies the heap, when due.
    pub fn at_hold(&mut self) {
        if !self.due() {
            return;
        }
        let at = Instant::now();
        match self.reader.copy(self.pid, false) {
            Ok(copy) => {
                let held = at.elapsed().as_secs_f64();
                let t_s = at.duration_since(self.started).as_secs_f64();
                self.pending = Some((copy, held, t_s));
                self.last = Some((at, held));
                self.end_copied = self.end_wanted;
            }
            Err(e) => self.fail(format!("copying the GC heap failed: {e:#}")),
        }
    }

    /// The session is ending: the next held collection is censused (the
    /// end census), whatever the budget. Waits for a census still being
    /// computed first (the collector is not held meanwhile), so that the
    /// hold does not. Whether there is an end census to wait for.
    pub fn want_end(&mut self) -> bool {
        if !self.when.at_end() || self.failed {
            return false;
        }
        self.join();
        self.end_wanted = !self.failed;
        self.end_wanted
    }

    /// Whether the end census asked for is copied, or will not be (a failure).
    pub fn end_copied(&self) -> bool {
        self.end_copied || self.failed
    }

    fn fail(&mut self, why: String) {
        self.failed = true;
        self.note.get_or_insert(why);
    }

    /// Once the collector runs again: the census of the copy, on a thread
    /// of its own. `tracks`: for addresses (ascending), whether memprof's
    /// copy of the GC objects tracks them.
    pub fn after_hold(&mut self, tracks: impl FnOnce(&[u64]) -> Vec<bool> + Send + 'static) {
        let Some((copy, held_s, t_s)) = self.pending.take() else {
            return;
        };
        let (names, exe) = (self.names.clone(), self.exe.clone());
        let spawned = std::thread::Builder::new()
            .name("gc-census".into())
            .spawn(move || {
                let naming = Instant::now();
                let names = names.unwrap_or_else(|| Arc::new(type_names(&exe)));
                let naming_s = naming.elapsed().as_secs_f64();
                let started = Instant::now();
                let census = census(&copy, &names, tracks).map(|types| HeapCensus {
                    // Read at the hold, the increment done: the
                    // program's own `GC_get_gc_no()` after this collection.
                    collection: copy.gc_no,
                    t_s,
                    held_s,
                    census_s: started.elapsed().as_secs_f64(),
                    naming_s,
                    types,
                });
                (census, names)
            });
        match spawned {
            Ok(handle) => self.working = Some(handle),
            Err(e) => self.fail(format!("cannot start the census thread: {e}")),
        }
    }

    /// Takes the result of a census thread, waiting for it.
    fn join(&mut self) {
        let Some(handle) = self.working.take() else {
            return;
        };
        let (census, names) = match handle.join() {
            Ok(done) => done,
            Err(_) => return self.fail("the heap census panicked".into()),
        };
        self.names = Some(names);
        match census {
            Ok(census) => {
                if let Some(last) = &mut self.last {
                    last.1 += census.census_s;
                }
                // The end census is not a start, even if it is the first.
                if self.attach && self.start.is_none() && !self.end_copied {
                    self.start = Some(census.clone());
                }
                self.end = Some(census);
            }
            Err(e) => self.fail(format!("{e:#}")),
        }
    }

    /// The censuses, at the end of the session.
    pub fn finish(mut self) -> Censuses {
        // A copy whose collector was never let go is not censused.
        self.pending = None;
        self.join();
        let mut notes: Vec<String> = self.note.take().into_iter().collect();
        if !self.attach {
            notes.push("run: memprof saw every allocation from the program's first instruction, so nothing was live before it (no start census)".into());
        }
        match &self.end {
            None if !self.failed && self.end_wanted => notes.push(
                "no collection was held while profiled, nor while memprof waited for one at the end".into(),
            ),
            None if !self.failed => notes.push("no collection was held while profiled".into()),
            Some(end) if self.end_wanted && !self.end_copied && !self.failed => notes.push(format!(
                "no collection came while memprof waited for the end census: the last census, at collection {}, stands for the end",
                end.collection
            )),
            _ => {}
        }
        Censuses {
            start: self.start,
            end: self.end,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        }
    }
}

/// The rows of a census of `copy`: live objects per type and kind, those
/// `tracks` knows apart from the rest, most bytes first.
fn census(
    copy: &HeapCopy,
    names: &TypeNames,
    tracks: impl FnOnce(&[u64]) -> Vec<bool>,
) -> Result<Vec<CensusType>> {
    let census = copy.census(&|word, kind, size| {
        names.type_of_given(word, is_atomic(kind), size) != TypeOf::NotAType
    });
    let addrs: Vec<u64> = census.objects.iter().map(|o| o.start).collect();
    let seen = tracks(&addrs);
    if seen.len() != addrs.len() {
        return Err(anyhow!("the census lost track of its objects"));
    }
    // Per (kind, first word) first: naming each object would cost a
    // string each (millions).
    let mut tallies: BTreeMap<(u8, Word), [u64; 4]> = BTreeMap::new();
    for (o, seen) in census.objects.iter().zip(seen) {
        let t = tallies.entry((o.kind, o.word)).or_default();
        let at = if seen { 2 } else { 0 };
        t[at] += 1;
        t[at + 1] += o.size;
    }
    // Named, several words may make one row (`Foo buffer` held by two ids).
    let mut rows: BTreeMap<(String, Option<u32>, u8), CensusType> = BTreeMap::new();
    for ((kind, word), [uc, ub, tc, tb]) in tallies {
        let name = object_name(names, word, kind);
        let type_id = match word {
            Word::Type(id) => Some(id),
            _ => None,
        };
        let row = rows
            .entry((name.clone(), type_id, kind))
            .or_insert_with(|| CensusType {
                name,
                type_id,
                kind: kind_name(kind),
                ..CensusType::default()
            });
        row.unseen_count += uc;
        row.unseen_bytes += ub;
        row.tracked_count += tc;
        row.tracked_bytes += tb;
    }
    let mut rows: Vec<CensusType> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        (b.unseen_bytes + b.tracked_bytes)
            .cmp(&(a.unseen_bytes + a.tracked_bytes))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(rows)
}
