//! The Boehm collector as memprof saw it: its collections and verdicts
//! ([`GcSummary`]), and censuses of its whole heap ([`Censuses`]).
use serde::{Deserialize, Serialize};

/// Censuses of the GC heap taken at held collections of a session
/// ([`crate::session::census`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Censuses {
    /// At the first held collection: in `attach`, the objects not seen
    /// allocated are those live before attach. `None` in `run` (every
    /// object is seen allocated: empty by construction) or when that
    /// census failed (`note` says why).
    pub start: Option<HeapCensus>,
    /// At the last collection censused (the end's census).
    pub end: Option<HeapCensus>,
    /// Why a census is missing, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One census: live objects by type, as the collector judged them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapCensus {
    /// The collection: `GC_gc_no` after it (what the program's
    /// `GC_get_gc_no()` says once it ran).
    pub collection: u64,
    /// Seconds since profiling started.
    pub t_s: f64,
    /// What the census added to the collector's hold (copying the heap's
    /// index, headers and object memory), and what it took after the
    /// target ran again (judging, naming, telling tracked objects apart).
    pub held_s: f64,
    pub census_s: f64,
    /// Naming the program's type ids from its code, once per session (in
    /// the first census's thread, after the hold).
    #[serde(default)]
    pub naming_s: f64,
    /// Most bytes first.
    pub types: Vec<CensusType>,
}

/// Live objects of one type and kind in a census.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CensusType {
    /// As `memprof heap` names them: `Foo`, `(type 28)`, `Array(Foo) buffer`, `(no type id)`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<u32>,
    /// `normal`, `atomic`, `uncollectable`, …
    pub kind: String,
    /// Objects memprof did not see allocated (in `attach`: live before
    /// attach), and their bytes as the collector counts them.
    pub unseen_count: u64,
    pub unseen_bytes: u64,
    /// Objects memprof tracks (seen allocated), and their bytes.
    pub tracked_count: u64,
    pub tracked_bytes: u64,
}

/// The Boehm GC as memprof saw it: collections, the mark-bit verdicts, the
/// heap at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GcSummary {
    /// How dead GC objects are recognized: `mark bits` (the collector's own
    /// verdict, read after each collection) or `address reuse only: <why>`.
    pub liveness: String,
    /// Collections whose end memprof saw and judged tracked objects at.
    pub collections: u64,
    /// Collections seen but not judged (the collecting thread could not be
    /// held, or its memory could not be read); their dead are found later.
    #[serde(default)]
    pub collections_not_judged: u64,
    /// GC allocations the kernel could not pass on for judging (its event
    /// buffer was full): those objects count as live until freed or reused.
    #[serde(default)]
    pub events_lost: u64,
    /// Judged by the kernel (`--gc-sampling refill`): GC objects its table
    /// had no room for, never judged (live until freed or reused).
    #[serde(default)]
    pub objects_not_judged: u64,
    /// Judged by the kernel: verdicts whose memory it could not read (the
    /// object stays live until a later collection).
    #[serde(default)]
    pub verdicts_failed: u64,
    /// The GC's collection number (`GC_gc_no`) of the last collection judged.
    pub last_collection: Option<u64>,
    /// At the last collection judged: tracked objects the collector had
    /// marked (reachable), and their bytes as the GC counts them (object
    /// sizes rounded up to its granules), comparable to its "in-use heap".
    pub marked_count: u64,
    pub marked_bytes: u64,
    /// Time spent judging, total and the longest single pass (the pause it
    /// added to one collection: the collector is held while it runs).
    pub pass_seconds: f64,
    pub longest_pass_seconds: f64,
    /// The collector's own figures at the end (`GC_get_heap_size`,
    /// `GC_get_free_bytes`, `GC_get_unmapped_bytes`), when readable.
    #[serde(default)]
    pub heap_size: Option<u64>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub unmapped_bytes: Option<u64>,
}

impl GcSummary {
    /// One collection judged (`GC_gc_no` `gc_no`), the collector paused
    /// `seconds` for it.
    pub(crate) fn count_pass(&mut self, gc_no: u64, seconds: f64) {
        self.collections += 1;
        self.last_collection = Some(gc_no);
        self.pass_seconds += seconds;
        self.longest_pass_seconds = self.longest_pass_seconds.max(seconds);
    }
}
