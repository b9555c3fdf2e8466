//! memprof's copy of the target's GC objects: the only record of them
//! while mark bits are read (the kernel streams every GC allocation and
//! `GC_free` through its ring buffer and keeps none in its live table, whose
//! size would otherwise bound how many objects can be tracked).
//!
//! Built for millions of objects and millions of events a second:
//!
//! - an event costs an append: allocations and frees go, in arrival order,
//!   to the end of a `Vec` of 28-byte records (sites numbered, sizes and
//!   epochs `u32`), a free as a marker record;
//! - the new records are sorted by address in chunks as they arrive
//!   (stably: one address's records stay in arrival order) into sorted
//!   runs, each at least twice the size of the next, merged as a binary
//!   counter carries ([`GcCopy::sort_tail`], by the feeding thread, off the
//!   hold): a record is moved about log2(records / chunk) times, not once
//!   per chunk, and a pass finds a handful of runs;
//! - [`GcCopy::settle`] (at each mark-bit pass, snapshot and the end)
//!   merges those runs into the settled objects in place, walking the
//!   addresses once: an allocation at an address still tracked proves the
//!   older object collected (address reuse), a free ends the object it
//!   follows (or is counted unknown), and the survivor is judged by the
//!   pass's mark bits when there is a pass. A pass's work is one merge,
//!   no sort, and no memory beyond the arrays: the runs give their memory
//!   back as the merge consumes them, while the settled array's new room
//!   is written only as the merge reaches it.
//!
//! ```
//! use memprof::gc::copy::GcCopy;
//! use memprof::probes::{LiveBlock, Site};
//! use memprof_common::AllocKind;
//! let site = Site { caller: 0x10, stack: None, kind: AllocKind::Gc };
//! let block = |t| LiveBlock { site, size: 32, timestamp_ns: t, epoch: 0 };
//! let mut copy = GcCopy::default();
//! copy.allocated(0x1000, &block(1));
//! copy.allocated(0x1000, &block(5)); // the first was collected: its address is reused
//! copy.allocated(0x2000, &block(6));
//! copy.freed(0x2000, 9);
//! copy.settle(None).unwrap();
//! let s = &copy.sites()[0].1;
//! assert_eq!((s.tracked_count, s.collected_count, s.lifetimes.died), (1, 1, 2));
//! ```
use std::collections::HashMap;

use anyhow::Result;

use super::pass::SiteGc;
use super::Verdict;
use crate::probes::{LiveBlock, Site};

/// Site number of a free's marker record.
const FREED: u32 = (1 << SITE_BITS) - 1;
/// Records sorted and merged at once by [`GcCopy::sort_tail`].
const CHUNK: usize = 1 << 16;
/// New records past which the feeder settles the copy itself, if they
/// outnumber the settled ones too.
const SETTLE_AFTER: usize = 1 << 22;

/// Merges `more` (sorted by address) into `into` (sorted), in place from
/// the end; on equal addresses `into`'s records come first (they are
/// older). Neither run is held twice: `into`'s new room becomes resident
/// only as the merge writes it, and `more` gives its memory back as it is
/// read.
fn merge_behind(into: &mut Vec<Record>, mut more: Vec<Record>) {
    let (s, t) = (into.len(), more.len());
    into.reserve_exact(t);
    let at = into.as_mut_ptr();
    let (mut i, mut j, mut w) = (s, t, s + t);
    // SAFETY: records are `Copy`; `into` has room for `s + t`; reads are
    // below `i` (initialized), writes at `w`, which stays at or above `i`
    // (it is `i + j`), so no unread record is overwritten.
    unsafe {
        while j > 0 {
            w -= 1;
            if i > 0 && at.add(i - 1).read().addr() > more[j - 1].addr() {
                i -= 1;
                at.add(w).write(at.add(i).read());
            } else {
                j -= 1;
                at.add(w).write(more[j]);
                if more.len() - j >= CHUNK {
                    more.truncate(j);
                    more.shrink_to(j);
                }
            }
        }
        // `[0, i)` never moved and `[w, s + t)` was written: `w == i`.
        into.set_len(s + t);
    }
}

/// One GC object (or a free's marker), 16 bytes: millions are held
/// between two collections, and they are most of memprof's memory. The
/// collection an object was allocated after (its epoch) is not stored:
/// [`Epochs`] gives it from the time.
#[derive(Clone, Copy, Debug)]
struct Record {
    /// The address over 16 (GC objects are granule-aligned and below
    /// 2^48) in the high 44 bits; the requested bytes in the low 20
    /// ([`BIG`]: see [`GcCopy::big`]).
    key: u64,
    /// The time of the allocation (of the free, for a marker) in
    /// [`TICK_NS`] ticks since [`GcCopy::base_ns`] in the high 40 bits
    /// (13 days; later times read as the last tick); the index into
    /// [`GcCopy::sites`], or [`FREED`], in the low 24.
    meta: u64,
}

/// Bits of [`Record::key`] holding the size.
const SIZE_BITS: u32 = 20;
/// The size of an object of this size or more is in [`GcCopy::big`].
const BIG: u64 = (1 << SIZE_BITS) - 1;
/// Bits of [`Record::meta`] holding the site.
const SITE_BITS: u32 = 24;
/// Sites the copy numbers; a site past them is counted under its kind's
/// overflow site (the kernel's stack table is far smaller).
const MAX_SITES: usize = FREED as usize - 8;
/// Nanoseconds per tick of [`Record::meta`]'s time (lifetimes are
/// reported from 100 µs up).
const TICK_NS: u64 = 1024;
const LAST_TICK: u64 = (1 << (64 - SITE_BITS)) - 1;

/// `time_ns` in ticks since `base_ns`.
fn ticks(time_ns: u64, base_ns: u64) -> u64 {
    (time_ns.saturating_sub(base_ns) / TICK_NS).min(LAST_TICK)
}

impl Record {
    fn new(addr: u64, size: u64, ticks: u64, site: u32) -> Record {
        Record {
            key: (addr >> 4) << SIZE_BITS | size.min(BIG),
            meta: ticks << SITE_BITS | site as u64,
        }
    }

    #[inline]
    fn addr(&self) -> u64 {
        (self.key >> SIZE_BITS) << 4
    }

    #[inline]
    fn site(&self) -> u32 {
        (self.meta & ((1 << SITE_BITS) - 1)) as u32
    }

    #[inline]
    fn ticks(&self) -> u64 {
        self.meta >> SITE_BITS
    }

    fn set_site(&mut self, site: u32) {
        self.meta = self.meta & !((1 << SITE_BITS) - 1) | site as u64;
    }

    /// Requested bytes, or [`BIG`].
    #[inline]
    fn small_size(&self) -> u64 {
        self.key & BIG
    }

    /// Whether a record can hold `addr`.
    fn holds(addr: u64) -> bool {
        addr.is_multiple_of(16) && addr >> 48 == 0
    }
}

/// The mark-bit pass a settle judges for: the survivors allocated before
/// collection `epoch` are judged by `judge(addr)`.
pub struct Judging<'a> {
    pub epoch: u64,
    /// `GC_gc_no` of the collection (the history's x axis).
    pub gc_no: u64,
    pub now_ns: u64,
    /// Sites the copy had at the collection ([`GcCopy::site_count`]).
    pub sites: usize,
    pub judge: &'a mut dyn FnMut(u64) -> Result<(Verdict, u64)>,
}

/// What a judging settle found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Judged {
    pub marked_count: u64,
    pub marked_bytes: u64,
}

/// The tracked GC objects and what was learned per site.
#[derive(Default)]
pub struct GcCopy {
    /// Record times count from here ([`GcCopy::starting_at`]).
    base_ns: u64,
    /// The epoch of each record, from its time.
    epochs: Epochs,
    /// Allocations counted under their kind's overflow site: the copy
    /// had [`MAX_SITES`] sites already.
    sites_overflowed: u64,
    /// At the last settle, in address order, one record per address.
    settled: Vec<Record>,
    /// Since, in sorted runs, oldest first, each at least twice as long as
    /// the next (stable sorts and merges: one address's records stay in
    /// arrival order within a run, and older runs hold older records).
    runs: Vec<Vec<Record>>,
    /// Since, in arrival order (less than a chunk).
    incoming: Vec<Record>,
    /// Per event: a fast hasher, and the last site (the next event's usually).
    site_numbers: foldhash::HashMap<Site, u32>,
    last_site: Option<(Site, u32)>,
    sites: Vec<(Site, SiteGc)>,
    /// Sizes of objects of [`BIG`] bytes or more, by address.
    big: HashMap<u64, u64>,
    /// `GC_free`s of addresses the copy did not track.
    unknown_frees: u64,
    /// Events for addresses a record cannot hold (never, for libgc's
    /// objects): counted with the events lost.
    unrepresentable: u64,
    /// `GC_realloc`s since the last settle: (replaced address, new
    /// address, time of the new allocation in ticks).
    reallocs: Vec<(u64, u64, u64)>,
    /// Objects and bytes tracked per kind: exact after a settle, plus the
    /// allocations since (frees and reuse are applied at the next settle).
    per_kind: [[u64; 2]; 4],
    /// A block mask (0: none) and the blocks of the settled objects under
    /// it, as of the last settle ([`Self::track_blocks`]).
    settled_blocks: (u64, Vec<u64>),
}

/// The blocks (under `block_mask`) of `records` (sorted by address) that
/// hold objects, ascending, each once.
fn block_list(records: &[Record], block_mask: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> = Vec::new();
    for r in records.iter().filter(|r| r.site() != FREED) {
        let block = r.addr() & block_mask;
        if blocks.last() != Some(&block) {
            blocks.push(block);
        }
    }
    blocks
}

/// When each epoch began, as the allocations tell it: an allocation
/// carries the number of collections before it (its epoch), and every
/// allocation of an epoch is later than every one of the epoch before
/// (a collection stops the world between them). So the first allocation
/// time seen per epoch gives any allocation's epoch from its time alone.
#[derive(Default)]
struct Epochs {
    /// (epoch, its earliest allocation in ticks), ascending in both.
    starts: Vec<(u64, u64)>,
}

impl Epochs {
    /// An allocation of `epoch` at `ticks` (nearly always of the latest
    /// epoch: one comparison).
    #[inline]
    fn note(&mut self, epoch: u64, ticks: u64) {
        if let Some(last) = self.starts.last_mut().filter(|(e, _)| *e == epoch) {
            last.1 = last.1.min(ticks);
            return;
        }
        match self.starts.binary_search_by_key(&epoch, |&(e, _)| e) {
            Ok(i) => self.starts[i].1 = self.starts[i].1.min(ticks),
            Err(i) => self.starts.insert(i, (epoch, ticks)),
        }
    }

    /// The epoch of an allocation at `ticks`.
    fn of(&self, ticks: u64) -> u64 {
        match self.starts.partition_point(|&(_, t)| t <= ticks) {
            0 => 0,
            n => self.starts[n - 1].0,
        }
    }
}

impl GcCopy {
    /// An empty copy whose record times count from `base_ns` (the
    /// kernel's clock, `CLOCK_MONOTONIC`): a record holds 13 days from it.
    pub fn starting_at(base_ns: u64) -> GcCopy {
        GcCopy {
            base_ns,
            ..GcCopy::default()
        }
    }

    /// A GC object allocated at `addr`.
    pub fn allocated(&mut self, addr: u64, block: &LiveBlock) {
        self.allocated_as(addr, block, 1);
    }

    /// [`Self::allocated`] of a sample standing for `objects` objects of
    /// its size (`--gc-sampling refill`): the site's allocated totals count
    /// them all; the object itself is tracked and judged like any other.
    pub fn allocated_as(&mut self, addr: u64, block: &LiveBlock, objects: u64) {
        let site = self.site_number(block.site);
        let totals = &mut self.sites[site as usize].1;
        let objects = objects.max(1);
        totals.allocated_count += objects;
        totals.allocated_bytes += block.size * objects;
        totals.records += 1;
        totals.record_bytes += block.size;
        if !Record::holds(addr) {
            self.unrepresentable += 1;
            return;
        }
        if block.size >= BIG {
            self.big.insert(addr, block.size);
        }
        let ticks = ticks(block.timestamp_ns, self.base_ns);
        self.epochs.note(block.epoch, ticks);
        self.incoming
            .push(Record::new(addr, block.size, ticks, site));
        let k = &mut self.per_kind[block.site.kind as usize & 3];
        k[0] += objects;
        k[1] += block.size * objects;
    }

    /// The GC object allocated at `addr` at `time_ns` (just given to
    /// [`Self::allocated`]) came from `GC_realloc` of `replaced`: it takes
    /// the replaced object's kind (the kernel counted it as `gc`).
    pub fn reallocated(&mut self, replaced: u64, addr: u64, time_ns: u64) {
        let ticks = ticks(time_ns, self.base_ns);
        self.reallocs.push((replaced, addr, ticks));
    }

    /// The GC object at `addr` was freed (`GC_free`, `GC_realloc`) at `time_ns`.
    pub fn freed(&mut self, addr: u64, time_ns: u64) {
        if !Record::holds(addr) {
            self.unrepresentable += 1;
            return;
        }
        let ticks = ticks(time_ns, self.base_ns);
        self.incoming.push(Record::new(addr, 0, ticks, FREED));
    }

    /// Sorts the records that came in into runs, a chunk at a time (off
    /// the hold), so that a settle only merges.
    pub fn sort_tail(&mut self) {
        if self.incoming.len() >= CHUNK {
            self.absorb_incoming();
            // Passes settle the copy at every collection. Without them
            // (mark bits not readable), it is settled when the new records
            // outgrow the objects: address reuse and frees bound it then.
            let new: usize = self.runs.iter().map(Vec::len).sum();
            if new > self.settled.len().max(SETTLE_AFTER) {
                let _ = self.settle(None);
            }
        }
    }

    /// The arrivals so far become the newest run; runs not at least twice
    /// its size are merged into it.
    fn absorb_incoming(&mut self) {
        let mut run = std::mem::take(&mut self.incoming);
        // Stable: one address's records stay in arrival order.
        run.sort_by_key(|r| r.addr());
        while let Some(older) = self.runs.pop_if(|older| older.len() < 2 * run.len()) {
            let mut older = older;
            merge_behind(&mut older, run);
            run = older;
        }
        self.runs.push(run);
    }

    /// From now on, each settle also lists the blocks (addresses under
    /// `block_mask`) of the settled objects, for [`Self::blocks`].
    pub fn track_blocks(&mut self, block_mask: u64) {
        if self.settled_blocks.0 != block_mask {
            self.settled_blocks = (block_mask, block_list(&self.settled, block_mask));
        }
    }

    /// The heap blocks (addresses under `block_mask`) holding the objects
    /// of the copy, ascending, each once. The settled objects' are listed
    /// by the settle, off the hold this is called in, when tracked.
    pub fn blocks(&self, block_mask: u64) -> Vec<u64> {
        let (settled, mut blocks) = match &self.settled_blocks {
            (mask, blocks) if *mask == block_mask => (None, blocks.clone()),
            _ => (Some(&self.settled), Vec::new()),
        };
        for records in settled
            .into_iter()
            .chain(&self.runs)
            .chain([&self.incoming])
        {
            let mut last = None;
            for r in records.iter().filter(|r| r.site() != FREED) {
                let block = r.addr() & block_mask;
                if last != Some(block) {
                    blocks.push(block);
                    last = Some(block);
                }
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Records (objects, frees not yet applied) held.
    pub fn len(&self) -> usize {
        self.settled.len() + self.runs.iter().map(Vec::len).sum::<usize>() + self.incoming.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the copy holds (its record arrays and site table).
    pub fn memory_bytes(&self) -> usize {
        let runs: usize = self.runs.iter().map(Vec::capacity).sum();
        (self.settled.capacity() + runs + self.incoming.capacity()) * std::mem::size_of::<Record>()
            + self.sites.capacity() * std::mem::size_of::<(Site, SiteGc)>()
    }

    /// Applies address reuse and frees, and with `judging` the pass's
    /// mark bits: afterwards the copy holds one record per tracked object,
    /// and each site's tracked count and bytes are current.
    ///
    /// One walk over the addresses, from the highest down, merging the
    /// runs into the settled records in place: the settled array gets room
    /// for every run's records and is written from its end, so nothing is
    /// copied elsewhere (the write position never passes the read one: it
    /// is behind by the records dropped so far). That room is not filled
    /// beforehand, so its pages become resident only as the merge writes
    /// them, while the runs give theirs back as they are read.
    pub fn settle(&mut self, mut judging: Option<Judging>) -> Result<Judged> {
        if !self.incoming.is_empty() {
            let mut run = std::mem::take(&mut self.incoming);
            // Stable: one address's records stay in arrival order.
            run.sort_by_key(|r| r.addr());
            self.runs.push(run);
        }
        // One run: the walk below then compares two arrays per address,
        // and merging runs of decreasing sizes moves each record about twice.
        while self.runs.len() > 1 {
            let newer = self.runs.pop().unwrap_or_default();
            if let Some(older) = self.runs.last_mut() {
                merge_behind(older, newer);
            }
        }
        self.retype_reallocs();
        for (_, s) in &mut self.sites {
            (s.tracked_count, s.tracked_bytes) = (0, 0);
        }
        let mut per_site_marked = match judging {
            Some(_) => vec![(0u64, 0u64); self.sites.len()],
            None => Vec::new(),
        };
        let mut judged = Judged::default();
        let mut failure = None;
        let mut runs = std::mem::take(&mut self.runs);
        let mut settled = std::mem::take(&mut self.settled);
        let s = settled.len();
        let t: usize = runs.iter().map(Vec::len).sum();
        settled.reserve_exact(t);
        // Records are `Copy`: reads and writes go through the pointer,
        // `[0, s)` is initialized and `[s, s + t)` is written before it is
        // read (at `w`, never below the read position `i`).
        let at = settled.as_mut_ptr();
        let read = |n: usize| unsafe { at.add(n).read() };
        // Per run: the end of its unread records; the end before this address.
        let mut ends: Vec<usize> = runs.iter().map(Vec::len).collect();
        let mut before = ends.clone();
        let (mut i, mut w) = (s, s + t);
        loop {
            let mut top = if i > 0 {
                Some(read(i - 1).addr())
            } else {
                None
            };
            for (run, &end) in runs.iter().zip(&ends) {
                if end > 0 {
                    top = top.max(Some(run[end - 1].addr()));
                }
            }
            let Some(addr) = top else { break };
            // The address's records, oldest first: settled `[i..si]`, then
            // each run's `[ends[r]..before[r]]` (nearly always one in all).
            let si = i;
            while i > 0 && read(i - 1).addr() == addr {
                i -= 1;
            }
            before.copy_from_slice(&ends);
            for ((run, end), &was) in runs.iter_mut().zip(&mut ends).zip(&before) {
                while *end > 0 && run[*end - 1].addr() == addr {
                    *end -= 1;
                }
                // Runs are read from the end: give their memory back as
                // they are, so the merge needs little more than the
                // records themselves.
                if run.len() - was >= CHUNK {
                    run.truncate(was);
                    run.shrink_to(was);
                }
            }
            // The survivor is the object of the last allocation not
            // followed by a free.
            let mut current: Option<Record> = None;
            for x in i..si {
                self.step(&mut current, read(x));
            }
            for ((run, &end), &was) in runs.iter().zip(&ends).zip(&before) {
                for &r in &run[end..was] {
                    self.step(&mut current, r);
                }
            }
            let Some(object) = current else { continue };
            if let (Some(jd), None) = (&mut judging, &failure) {
                if self.epochs.of(object.ticks()) < jd.epoch {
                    match (jd.judge)(addr) {
                        Ok((Verdict::Marked, gc_size)) => {
                            // 0: the collector's size is not known.
                            let gc_size = match gc_size {
                                0 => self.size(&object),
                                n => n,
                            };
                            let m = &mut per_site_marked[object.site() as usize];
                            m.0 += 1;
                            m.1 += gc_size;
                            judged.marked_count += 1;
                            judged.marked_bytes += gc_size;
                        }
                        Ok(_) => {
                            self.collected(&object, jd.now_ns, jd.epoch);
                            continue;
                        }
                        // Kept, unjudged; the error ends the passes.
                        Err(e) => failure = Some(e),
                    }
                }
            }
            let size = self.size(&object);
            let site = &mut self.sites[object.site() as usize].1;
            site.tracked_count += 1;
            site.tracked_bytes += size;
            w -= 1;
            // SAFETY: `w < s + t <= capacity`, and `w >= i`: no unread record is there.
            unsafe { at.add(w).write(object) };
        }
        let kept = s + t - w;
        // SAFETY: `[w, s + t)` was written above; moved to the front, they
        // are the initialized `[0, kept)`.
        unsafe {
            std::ptr::copy(at.add(w), at, kept);
            settled.set_len(kept);
        }
        drop(runs);
        self.settled = settled;
        self.settled.shrink_to(kept + CHUNK);
        if self.settled_blocks.0 != 0 {
            self.settled_blocks.1 = block_list(&self.settled, self.settled_blocks.0);
        }
        if !self.big.is_empty() {
            let big: std::collections::HashSet<u64> = self
                .settled
                .iter()
                .filter(|r| r.small_size() == BIG)
                .map(|r| r.addr())
                .collect();
            self.big.retain(|addr, _| big.contains(addr));
        }
        self.per_kind = [[0; 2]; 4];
        for (site, s) in &self.sites {
            let k = &mut self.per_kind[site.kind as usize & 3];
            k[0] += (s.tracked_count as f64 * s.objects_per_record()).round() as u64;
            k[1] += (s.tracked_bytes as f64 * s.bytes_per_record_byte()).round() as u64;
        }
        if let Some(j) = &judging {
            // Marked counts are "as of the last pass"; every site gets a
            // point, so shrinking stacks show it. The point is what the
            // collection found live: the copy may already hold objects
            // allocated since (judging runs after the collector does).
            // Sites first seen after it get their first point at the next.
            let sites = self.sites.iter_mut().zip(&per_site_marked);
            let (mut count, mut bytes_all) = (0.0, 0.0);
            for (n, ((_, s), &(marked, bytes))) in sites.enumerate() {
                // What the collector's marks stand for (sampled refills).
                count += marked as f64 * s.objects_per_record();
                bytes_all += bytes as f64 * s.bytes_per_record_byte();
                (s.marked_count, s.marked_bytes) = (marked, bytes);
                if n < j.sites {
                    super::pass::push_point(&mut s.history, [j.gc_no, marked]);
                }
            }
            judged.marked_count = count.round() as u64;
            judged.marked_bytes = bytes_all.round() as u64;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(judged),
        }
    }

    /// Gives each object `GC_realloc` made since the last settle the kind
    /// of the object it replaced (the latest allocation at that address
    /// before it), and notes the move for the kernel's site totals. The
    /// records since are in sorted runs by now (binary searches).
    fn retype_reallocs(&mut self) {
        for (replaced, addr, time) in std::mem::take(&mut self.reallocs) {
            let Some(kind) = self.replaced_kind(replaced, time) else {
                continue;
            };
            let Some((run, at)) = self.new_record(addr, time) else {
                continue;
            };
            let rec = self.runs[run][at];
            let site = self.sites[rec.site() as usize].0;
            if site.kind == kind {
                continue;
            }
            let to = self.site_number(Site { kind, ..site });
            self.runs[run][at].set_site(to);
            let size = self.size(&rec);
            let s = &mut self.sites[to as usize].1;
            s.retyped_count += 1;
            s.retyped_bytes += size;
            let k = &mut self.per_kind;
            k[site.kind as usize & 3][0] -= 1;
            k[site.kind as usize & 3][1] -= size;
            k[kind as usize & 3][0] += 1;
            k[kind as usize & 3][1] += size;
        }
    }

    /// The kind of the object a `GC_realloc` at `time` (ticks) replaced
    /// at `addr`: the last one allocated there before the realloc's free
    /// of it, in the order the events came. Times cannot tell: the next
    /// object at `addr` may carry the thread's clock as the realloc read
    /// it (one string in 1,000 of the Crystal fixture, under load), and in
    /// place the new object is at `addr` too. Without that free, the
    /// latest allocated there by `time`.
    fn replaced_kind(&self, addr: u64, time: u64) -> Option<memprof_common::AllocKind> {
        // Oldest first: the settled records, then the runs (oldest first);
        // one address's records keep their order of arrival.
        let mut there: Vec<&Record> = Vec::new();
        for records in std::iter::once(&self.settled).chain(&self.runs) {
            let start = records.partition_point(|r| r.addr() < addr);
            let end = records.partition_point(|r| r.addr() <= addr);
            there.extend(&records[start..end]);
        }
        let Some(freed) = there
            .iter()
            .rposition(|r| r.site() == FREED && r.ticks() <= time)
        else {
            return self.kind_at(addr, time);
        };
        there[..freed]
            .iter()
            .rev()
            .find(|r| r.site() != FREED)
            .map(|r| self.sites[r.site() as usize].0.kind)
    }

    /// The kind of the latest object allocated at `addr` at or before
    /// `time` (ticks; the newest run that has one, else the settled records).
    fn kind_at(&self, addr: u64, time: u64) -> Option<memprof_common::AllocKind> {
        self.runs
            .iter()
            .rev()
            .chain([&self.settled])
            .find_map(|records| {
                let start = records.partition_point(|r| r.addr() < addr);
                let end = records.partition_point(|r| r.addr() <= addr);
                records[start..end]
                    .iter()
                    .rev()
                    .find(|r| r.site() != FREED && r.ticks() <= time)
                    .map(|r| self.sites[r.site() as usize].0.kind)
            })
    }

    /// Where the record of the allocation at `addr` at `time` (ticks) is: (run, index).
    fn new_record(&self, addr: u64, time: u64) -> Option<(usize, usize)> {
        self.runs
            .iter()
            .enumerate()
            .rev()
            .find_map(|(run, records)| {
                let start = records.partition_point(|r| r.addr() < addr);
                let end = records.partition_point(|r| r.addr() <= addr);
                (start..end)
                    .find(|&i| records[i].site() != FREED && records[i].ticks() == time)
                    .map(|i| (run, i))
            })
    }

    fn site_number(&mut self, site: Site) -> u32 {
        if let Some((last, number)) = self.last_site {
            if last == site {
                return number;
            }
        }
        let overflowed = self.sites_overflowed;
        let number = self.new_site_number(site);
        // An overflowing site is counted at each of its events: not kept.
        if self.sites_overflowed == overflowed {
            self.last_site = Some((site, number));
        }
        number
    }

    fn new_site_number(&mut self, site: Site) -> u32 {
        let site = if self.sites.len() < MAX_SITES || self.site_numbers.contains_key(&site) {
            site
        } else {
            self.sites_overflowed += 1;
            Site {
                caller: 0,
                stack: Some(memprof_common::SITES_OVERFLOW),
                kind: site.kind,
            }
        };
        let sites = &mut self.sites;
        *self.site_numbers.entry(site).or_insert_with(|| {
            sites.push((site, SiteGc::default()));
            sites.len() as u32 - 1
        })
    }

    /// The next record `r` of an address whose surviving object so far is
    /// `current`.
    #[inline]
    fn step(&mut self, current: &mut Option<Record>, r: Record) {
        match (r.site(), *current) {
            (FREED, Some(old)) => {
                self.died(&old, r.ticks(), false);
                *current = None;
            }
            (FREED, None) => self.unknown_frees += 1,
            (_, Some(old)) => {
                self.died(&old, r.ticks(), true);
                *current = Some(r);
            }
            (_, None) => *current = Some(r),
        }
    }

    fn size(&self, r: &Record) -> u64 {
        match r.small_size() {
            BIG => self.big.get(&r.addr()).copied().unwrap_or(BIG),
            s => s,
        }
    }

    /// `old` died at `ticks`: freed, or collected (its address reused).
    fn died(&mut self, old: &Record, ticks: u64, reused: bool) {
        let size = self.size(old);
        let s = &mut self.sites[old.site() as usize].1;
        s.lifetimes
            .record(ticks.saturating_sub(old.ticks()) * TICK_NS);
        if reused {
            s.collected_count += 1;
            s.collected_bytes += size;
        }
    }

    /// `old` was found unmarked at the end of collection `epoch`.
    fn collected(&mut self, old: &Record, now_ns: u64, epoch: u64) {
        let size = self.size(old);
        let born = self.epochs.of(old.ticks());
        let now = ticks(now_ns, self.base_ns);
        let s = &mut self.sites[old.site() as usize].1;
        s.collected_count += 1;
        s.collected_bytes += size;
        s.lifetimes
            .record(now.saturating_sub(old.ticks()) * TICK_NS);
        let survived = epoch.saturating_sub(1 + born);
        s.lifetimes.collections_survived += survived;
        if survived == 0 {
            s.lifetimes.within_first_collection += 1;
        }
    }

    /// What was learned per site.
    pub fn sites(&self) -> &[(Site, SiteGc)] {
        &self.sites
    }

    /// What was learned per site, the objects dropped.
    pub fn into_sites(self) -> Vec<(Site, SiteGc)> {
        self.sites
    }

    /// Sites seen so far (numbered in that order).
    pub fn site_count(&self) -> usize {
        self.sites.len()
    }

    /// Allocations counted under their kind's overflow site (the copy's
    /// site numbers ran out).
    pub fn sites_overflowed(&self) -> u64 {
        self.sites_overflowed
    }

    /// Events dropped: their address was not an object's.
    pub fn unrepresentable(&self) -> u64 {
        self.unrepresentable
    }

    /// `GC_free`s of untracked addresses (applied at settles).
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// For each of `addrs` (ascending): whether memprof saw an object
    /// allocated there (a census's live objects: one it did not see was
    /// allocated before memprof watched). A live object's address cannot
    /// be allocated again while it lives, so any allocation record at it,
    /// settled or not, is this object's (or an older one's whose death
    /// left it to be allocated again, seen).
    pub fn tracks(&self, addrs: &[u64]) -> Vec<bool> {
        let mut seen = vec![false; addrs.len()];
        let mut incoming: Vec<Record> = self.incoming.clone();
        incoming.sort_unstable_by_key(|r| r.addr());
        let lists = std::iter::once(&self.settled)
            .chain(&self.runs)
            .chain([&incoming]);
        for records in lists {
            // Both ascending: one merge walk.
            let mut i = 0;
            for r in records.iter().filter(|r| r.site() != FREED) {
                let a = r.addr();
                while i < addrs.len() && addrs[i] < a {
                    i += 1;
                }
                if i == addrs.len() {
                    break;
                }
                if addrs[i] == a {
                    seen[i] = true;
                }
            }
        }
        seen
    }

    /// Tracked objects and bytes per kind (indexed by `AllocKind`), cheap:
    /// exact at the last settle, plus the allocations since.
    pub fn per_kind(&self) -> [[u64; 2]; 4] {
        self.per_kind
    }

    /// GC objects allocated so far (estimated with refill sampling), and
    /// the allocations recorded for them (a refill sample is one): the
    /// sites' sums, O(sites).
    pub fn allocated_so_far(&self) -> (u64, u64) {
        self.sites
            .iter()
            .fold((0, 0), |(objects, records), (_, s)| {
                (objects + s.allocated_count, records + s.records)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_common::AllocKind;

    /// A 16-byte object allocated at tick `t` of `epoch`.
    fn block(t: u64, epoch: u64) -> LiveBlock {
        LiveBlock {
            site: Site {
                caller: 0x10,
                stack: None,
                kind: AllocKind::Gc,
            },
            size: 16,
            timestamp_ns: t * TICK_NS,
            epoch,
        }
    }

    #[test]
    fn tracks_says_which_addresses_were_seen_allocated() {
        let mut copy = GcCopy::default();
        copy.allocated(0x1000, &block(1, 0));
        copy.allocated(0x3000, &block(2, 0));
        copy.settle(None).unwrap();
        // Since the settle: one in a run, one freed, one just arrived.
        for a in (0..CHUNK as u64).map(|i| 0x10_0000 + 16 * i) {
            copy.allocated(a, &block(3, 0));
        }
        copy.sort_tail();
        copy.allocated(0x5000, &block(4, 0));
        copy.freed(0x6000, 5);
        let addrs = [0x800, 0x1000, 0x2000, 0x3000, 0x5000, 0x6000, 0x10_0010];
        assert_eq!(
            copy.tracks(&addrs),
            vec![false, true, false, true, true, false, true]
        );
    }

    #[test]
    fn reuse_free_and_unknown_free() {
        let mut copy = GcCopy::default();
        copy.allocated(0x30, &block(1, 0));
        copy.allocated(0x10, &block(2, 0));
        copy.freed(0x50, 3 * TICK_NS); // unknown
        copy.allocated(0x30, &block(4, 0)); // reuse of 0x30
        copy.freed(0x10, 5 * TICK_NS);
        copy.allocated(0x10, &block(6, 0)); // after a free: not a reuse
        copy.settle(None).unwrap();
        let s = &copy.sites()[0].1;
        // Every allocation in the site's totals, dead or alive.
        assert_eq!((s.allocated_count, s.allocated_bytes), (4, 64));
        assert_eq!((s.tracked_count, s.tracked_bytes), (2, 32));
        assert_eq!((s.collected_count, s.lifetimes.died), (1, 2));
        assert_eq!(s.lifetimes.total_ns, (3 + 3) * TICK_NS);
        assert_eq!(copy.unknown_frees(), 1);
        assert_eq!(copy.len(), 2);
        assert!(copy.settled.windows(2).all(|w| w[0].addr() < w[1].addr()));
    }

    #[test]
    fn a_realloc_in_place_or_followed_at_its_time_keeps_the_kind() {
        let atomic = |t: u64| LiveBlock {
            site: Site {
                kind: AllocKind::GcAtomic,
                ..block(0, 0).site
            },
            ..block(t, 0)
        };
        let moved = |t: u64| LiveBlock {
            site: Site {
                caller: 0x20,
                ..block(0, 0).site
            },
            ..block(t, 0)
        };
        // The same address back: the object replaced is the one before.
        let mut copy = GcCopy::default();
        copy.allocated(0x100, &atomic(1));
        copy.freed(0x100, 2 * TICK_NS);
        copy.allocated(0x100, &moved(3));
        copy.reallocated(0x100, 0x100, 3 * TICK_NS);
        copy.settle(None).unwrap();
        assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
        // The freed address taken at once by a `gc` object stamped with
        // the thread's clock as the realloc read it (the same tick).
        let mut copy = GcCopy::default();
        copy.allocated(0x100, &atomic(1));
        copy.freed(0x100, 2 * TICK_NS);
        copy.allocated(0x200, &moved(3));
        copy.reallocated(0x100, 0x200, 3 * TICK_NS);
        copy.allocated(0x100, &block(3, 0));
        copy.settle(None).unwrap();
        assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
        assert_eq!(copy.per_kind()[AllocKind::Gc as usize], [1, 16]);
    }

    #[test]
    fn a_realloc_keeps_the_kind_of_the_block_it_replaces() {
        let mut copy = GcCopy::default();
        let atomic = LiveBlock {
            site: Site {
                kind: AllocKind::GcAtomic,
                ..block(0, 0).site
            },
            ..block(1, 0)
        };
        copy.allocated(0x100, &atomic);
        copy.settle(None).unwrap();
        copy.freed(0x100, 2 * TICK_NS);
        let moved = LiveBlock {
            site: Site {
                caller: 0x20,
                ..block(0, 0).site
            },
            ..block(3, 0)
        };
        copy.allocated(0x200, &moved);
        copy.reallocated(0x100, 0x200, 3 * TICK_NS);
        copy.settle(None).unwrap();
        let (site, s) = copy
            .sites()
            .iter()
            .find(|(_, s)| s.tracked_count == 1)
            .unwrap();
        assert_eq!((site.caller, site.kind), (0x20, AllocKind::GcAtomic));
        assert_eq!((s.retyped_count, s.retyped_bytes), (1, 16));
        assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
    }

    /// Many runs of different sizes, reuse and frees across them, settled
    /// twice: the same survivors, deaths and unknown frees as replaying
    /// the events one by one.
    #[test]
    fn runs_settle_as_a_replay_does() {
        let mut copy = GcCopy::default();
        let mut replay: HashMap<u64, u64> = HashMap::new();
        let (mut died, mut unknown) = (0u64, 0u64);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..2 {
            for t in 0..(5 * CHUNK as u64 + 1234) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let addr = 0x10_0000 + 16 * (x % 200_000);
                let time = round * (1 << 32) + t;
                if x.is_multiple_of(5) {
                    copy.freed(addr, time * TICK_NS);
                    match replay.remove(&addr) {
                        Some(_) => died += 1,
                        None => unknown += 1,
                    }
                } else {
                    copy.allocated(addr, &block(time, 0));
                    died += replay.insert(addr, time).is_some() as u64;
                }
                copy.sort_tail();
            }
            assert!(copy.runs.len() > 1, "{} runs", copy.runs.len());
            assert!(copy.runs.windows(2).all(|w| w[0].len() >= 2 * w[1].len()));
            copy.settle(None).unwrap();
            let s = &copy.sites()[0].1;
            assert_eq!(s.tracked_count, replay.len() as u64);
            assert_eq!(s.lifetimes.died, died);
            assert_eq!(copy.unknown_frees(), unknown);
            assert_eq!(copy.len(), replay.len());
            assert!(copy.settled.windows(2).all(|w| w[0].addr() < w[1].addr()));
            assert!(copy.settled.iter().all(|r| replay[&r.addr()] == r.ticks()));
        }
    }

    /// Blocks listed at the settle, plus the newer records', are the
    /// blocks of every record.
    #[test]
    fn tracked_blocks_are_every_records_blocks() {
        let mut copy = GcCopy::default();
        let mask = !0xfff;
        for i in 0..5000u64 {
            copy.allocated(0x10_0000 + 48 * i, &block(i, 0));
        }
        copy.track_blocks(mask);
        copy.settle(None).unwrap();
        copy.freed(0x10_0000, 6000 * TICK_NS);
        for i in 0..100u64 {
            copy.allocated(0x90_0000 + 4096 * i, &block(7000 + i, 0));
        }
        let blocks = copy.blocks(mask);
        let untracked = GcCopy {
            settled_blocks: (0, Vec::new()),
            ..std::mem::take(&mut copy)
        };
        assert_eq!(blocks, untracked.blocks(mask));
        assert_eq!(blocks.len(), 5000 * 48 / 4096 + 1 + 100);
    }

    #[test]
    fn a_pass_judges_only_older_objects_and_keeps_order_across_chunks() {
        let mut copy = GcCopy::default();
        for i in 0..(CHUNK as u64 + 10) {
            copy.allocated(0x1000 + 16 * (i % 1000), &block(i, 0));
            copy.sort_tail();
        }
        // After the collection began: its epoch is the collection's.
        copy.allocated(0x9_0000, &block(CHUNK as u64 + 100, 1));
        let mut judge = |addr: u64| {
            Ok((
                if addr.is_multiple_of(32) {
                    Verdict::Marked
                } else {
                    Verdict::Unmarked
                },
                16,
            ))
        };
        let judged = copy
            .settle(Some(Judging {
                epoch: 1,
                gc_no: 7,
                now_ns: 1 << 40,
                sites: 1,
                judge: &mut judge,
            }))
            .unwrap();
        assert_eq!(judged.marked_count, 500);
        let s = &copy.sites()[0].1;
        // 1000 addresses: each's last allocation survives to be judged.
        assert_eq!(s.collected_count, CHUNK as u64 + 10 - 1000 + 500);
        assert_eq!(s.tracked_count, 501);
        assert_eq!(s.history, vec![[7, 500]], "what the collection found live");
    }
}
