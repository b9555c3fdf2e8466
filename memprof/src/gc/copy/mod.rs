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
//! The events are fed in here; `record.rs` holds the record, its runs and
//! the epochs, `settle.rs` the settle.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use std::collections::HashMap;

use anyhow::Result;

use self::record::{block_list, merge_behind, ticks, Epochs, Record, BIG, CHUNK, FREED, MAX_SITES};
use super::site::SiteGc;
use super::Verdict;
use crate::probes::{LiveBlock, Site};

mod classes;
mod record;
mod settle;

pub use classes::{ObjectWord, Slot};

/// New records past which the feeder settles the copy itself, if they
/// outnumber the settled ones too.
const SETTLE_AFTER: usize = 1 << 22;

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
    /// The first word of the object at an address then, if it was read.
    pub first_word: &'a mut dyn FnMut(u64) -> Option<u32>,
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
    /// Per event: a fast hasher, and the last site (the next event's
    /// usually) with its slot of unread objects.
    site_numbers: foldhash::HashMap<Site, u32>,
    last_site: Option<(Site, u32)>,
    sites: Vec<(Site, SiteGc)>,
    /// What records number: a site and what its objects' first word said.
    slots: Vec<Slot>,
    slot_numbers: foldhash::HashMap<(u32, ObjectWord), u32>,
    /// Per site: its slot of unread objects, and the words its slots keep.
    unread_slot: Vec<u32>,
    words_per_site: Vec<u16>,
    /// The settled objects whose first word was not read, ascending (as
    /// of the last settle).
    unread_settled: Vec<u64>,
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
    per_kind: [[u64; 2]; memprof_common::AllocKind::COUNT],
    /// A block mask (0: none) and the blocks of the settled objects under
    /// it, as of the last settle ([`Self::track_blocks`]).
    settled_blocks: (u64, Vec<u64>),
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

    #[cfg(test)]
    /// A GC object allocated at `addr`.
    pub fn allocated(&mut self, addr: u64, block: &LiveBlock) {
        self.allocated_as(addr, block, 1);
    }

    /// [`Self::allocated`] of a sample standing for `objects` objects of
    /// its size (`--gc-sampling refill`): the site's allocated totals count
    /// them all; the object itself is tracked and judged like any other.
    pub fn allocated_as(&mut self, addr: u64, block: &LiveBlock, objects: u64) {
        let slot = self.site_number(block.site);
        let site = self.slots[slot as usize].site;
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
            .push(Record::new(addr, block.size, ticks, slot));
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

    /// The GC object at `addr` was freed (`GC_free`, `GC_realloc`) at
    /// `time_ns`; `first_word`: its first word then, if read.
    pub fn freed(&mut self, addr: u64, time_ns: u64, first_word: Option<u32>) {
        if !Record::holds(addr) {
            self.unrepresentable += 1;
            return;
        }
        let ticks = ticks(time_ns, self.base_ns);
        self.incoming.push(Record::freed(addr, ticks, first_word));
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
            for r in records.iter().filter(|r| r.slot() != FREED) {
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

    #[cfg(test)]
    /// Records (objects, frees not yet applied) held.
    pub fn len(&self) -> usize {
        self.settled.len() + self.runs.iter().map(Vec::len).sum::<usize>() + self.incoming.len()
    }

    /// The slot of `site`'s unread objects (the site numbered if new).
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
        let site = if self.slots.len() < MAX_SITES || self.site_numbers.contains_key(&site) {
            site
        } else {
            self.sites_overflowed += 1;
            Site {
                caller: 0,
                stack: Some(memprof_common::SITES_OVERFLOW),
                kind: site.kind,
            }
        };
        if let Some(&n) = self.site_numbers.get(&site) {
            return self.unread_slot[n as usize];
        }
        self.sites.push((site, SiteGc::default()));
        let n = self.sites.len() as u32 - 1;
        self.site_numbers.insert(site, n);
        self.words_per_site.push(0);
        // An overflow site past MAX_SITES slots still gets its one slot.
        let slot = self.slots.len() as u32;
        self.slots.push(Slot {
            site: n,
            word: ObjectWord::Unread,
            allocated: [0; 2],
            collected: [0; 2],
            tracked: [0; 2],
        });
        self.slot_numbers.insert((n, ObjectWord::Unread), slot);
        self.unread_slot.push(slot);
        slot
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
            for r in records.iter().filter(|r| r.slot() != FREED) {
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

    /// The objects tracked at the last settle whose first word was not
    /// read, in address order.
    pub fn settled_unread(&self) -> impl Iterator<Item = u64> + '_ {
        self.settled
            .iter()
            .filter(|r| self.unread(r))
            .map(|r| r.addr())
    }

    /// The site numbered `n` ([`Self::settled_objects`]), to note what
    /// its objects were.
    pub fn site_mut(&mut self, n: u32) -> Option<&mut (Site, SiteGc)> {
        self.sites.get_mut(n as usize)
    }

    /// Tracked objects and bytes per kind (indexed by `AllocKind`), cheap:
    /// exact at the last settle, plus the allocations since.
    pub fn per_kind(&self) -> [[u64; 2]; memprof_common::AllocKind::COUNT] {
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
mod tests;

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::gc::copy::GcCopy;
        use crate::probes::{LiveBlock, Site};
        use memprof_common::AllocKind;
        let site = Site {
            caller: 0x10,
            stack: None,
            kind: AllocKind::Gc,
        };
        let block = |t| LiveBlock {
            site,
            size: 32,
            timestamp_ns: t,
            epoch: 0,
        };
        let mut copy = GcCopy::default();
        copy.allocated(0x1000, &block(1));
        copy.allocated(0x1000, &block(5)); // the first was collected: its address is reused
        copy.allocated(0x2000, &block(6));
        copy.freed(0x2000, 9, None);
        copy.settle(None).unwrap();
        let s = &copy.sites()[0].1;
        assert_eq!(
            (s.tracked_count, s.collected_count, s.lifetimes.died),
            (1, 1, 2)
        );
    }
}
