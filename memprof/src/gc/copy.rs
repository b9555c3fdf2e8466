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
//!   (stably: one address's records stay in arrival order) and merged into
//!   one sorted run ([`GcCopy::sort_tail`], by the feeding thread, off the
//!   hold);
//! - [`GcCopy::settle`] (at each mark-bit pass, snapshot and the end)
//!   merges that run into the settled objects in place, walking the
//!   addresses once: an allocation at an address still tracked proves the
//!   older object collected (address reuse), a free ends the object it
//!   follows (or is counted unknown), and the survivor is judged by the
//!   pass's mark bits when there is a pass. A pass's work is one merge,
//!   no sort, and no memory beyond the arrays.
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
const FREED: u32 = u32::MAX;
/// Records sorted and merged at once by [`GcCopy::sort_tail`].
const CHUNK: usize = 1 << 16;

/// A record no address has (the room a settle writes into).
const EMPTY: Record = Record {
    addr: 0,
    time_ns: 0,
    size: 0,
    site: 0,
    epoch: 0,
};

/// Merges `more` (sorted by address) into `into` (sorted), in place from
/// the end; on equal addresses `into`'s records come first (they are older).
fn merge_behind(into: &mut Vec<Record>, more: &[Record]) {
    let (s, t) = (into.len(), more.len());
    into.resize(s + t, EMPTY);
    let (mut i, mut j, mut w) = (s, t, s + t);
    while j > 0 {
        w -= 1;
        if i > 0 && into[i - 1].addr > more[j - 1].addr {
            i -= 1;
            into[w] = into[i];
        } else {
            j -= 1;
            into[w] = more[j];
        }
    }
}

/// One GC object (or a free's marker), 28 bytes.
#[repr(C, packed(4))]
#[derive(Clone, Copy, Debug)]
struct Record {
    addr: u64,
    /// `bpf_ktime_get_ns()` of the allocation (of the free, for a marker).
    time_ns: u64,
    /// Requested bytes (`u32::MAX`: see [`GcCopy::big`]).
    size: u32,
    /// Index into [`GcCopy::sites`], or [`FREED`].
    site: u32,
    /// Collections seen when it was allocated.
    epoch: u32,
}

/// The mark-bit pass a settle judges for: the survivors allocated before
/// collection `epoch` are judged by `judge(addr)`.
pub struct Judging<'a> {
    pub epoch: u64,
    /// `GC_gc_no` of the collection (the history's x axis).
    pub gc_no: u64,
    pub now_ns: u64,
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
    /// At the last settle, in address order, one record per address.
    settled: Vec<Record>,
    /// Since, in address order (a stable sort: one address's records in
    /// arrival order), merged chunk by chunk off the hold.
    recent: Vec<Record>,
    /// Since, in arrival order (less than a chunk).
    incoming: Vec<Record>,
    site_numbers: HashMap<Site, u32>,
    sites: Vec<(Site, SiteGc)>,
    /// Sizes of objects of 4 GiB or more, by address.
    big: HashMap<u64, u64>,
    /// `GC_free`s of addresses the copy did not track.
    unknown_frees: u64,
    /// `GC_realloc`s since the last settle: (replaced address, new
    /// address, time of the new allocation).
    reallocs: Vec<(u64, u64, u64)>,
    /// Objects and bytes tracked per kind: exact after a settle, plus the
    /// allocations since (frees and reuse are applied at the next settle).
    per_kind: [[u64; 2]; 4],
}

impl GcCopy {
    /// A GC object allocated at `addr`.
    pub fn allocated(&mut self, addr: u64, block: &LiveBlock) {
        let site = self.site_number(block.site);
        let size = match u32::try_from(block.size) {
            Ok(s) if s != u32::MAX => s,
            _ => {
                self.big.insert(addr, block.size);
                u32::MAX
            }
        };
        self.incoming.push(Record {
            addr,
            time_ns: block.timestamp_ns,
            size,
            site,
            epoch: block.epoch as u32,
        });
        let k = &mut self.per_kind[block.site.kind as usize & 3];
        k[0] += 1;
        k[1] += block.size;
    }

    /// The GC object allocated at `addr` at `time_ns` (just given to
    /// [`Self::allocated`]) came from `GC_realloc` of `replaced`: it takes
    /// the replaced object's kind (the kernel counted it as `gc`).
    pub fn reallocated(&mut self, replaced: u64, addr: u64, time_ns: u64) {
        self.reallocs.push((replaced, addr, time_ns));
    }

    /// The GC object at `addr` was freed (`GC_free`, `GC_realloc`) at `time_ns`.
    pub fn freed(&mut self, addr: u64, time_ns: u64) {
        self.incoming.push(Record {
            addr,
            time_ns,
            size: 0,
            site: FREED,
            epoch: 0,
        });
    }

    /// Sorts the records that came in and merges them into the recent
    /// ones, a chunk at a time (off the hold), so that a settle only merges.
    pub fn sort_tail(&mut self) {
        if self.incoming.len() >= CHUNK {
            self.absorb_incoming();
        }
    }

    fn absorb_incoming(&mut self) {
        // Stable: one address's records stay in arrival order.
        self.incoming.sort_by_key(|r| r.addr);
        merge_behind(&mut self.recent, &self.incoming);
        self.incoming.clear();
    }

    /// Records (objects, frees not yet applied) held.
    pub fn len(&self) -> usize {
        self.settled.len() + self.recent.len() + self.incoming.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the copy holds (its record arrays and site table).
    pub fn memory_bytes(&self) -> usize {
        (self.settled.capacity() + self.recent.capacity() + self.incoming.capacity())
            * std::mem::size_of::<Record>()
            + self.sites.capacity() * std::mem::size_of::<(Site, SiteGc)>()
    }

    /// Applies address reuse and frees, and with `judging` the pass's
    /// mark bits: afterwards the copy holds one record per tracked object,
    /// and each site's tracked count and bytes are current.
    ///
    /// One walk over the addresses, from the highest down, merging the
    /// recent records into the settled ones in place: the settled array
    /// is extended by the number of recent records and written from its
    /// end, so nothing is copied elsewhere (the write position never
    /// passes the read one: it is behind by the records dropped so far).
    pub fn settle(&mut self, mut judging: Option<Judging>) -> Result<Judged> {
        // Stable: one address's records stay in arrival order.
        self.incoming.sort_by_key(|r| r.addr);
        self.retype_reallocs();
        let incoming = std::mem::take(&mut self.incoming);
        for (_, s) in &mut self.sites {
            (s.tracked_count, s.tracked_bytes) = (0, 0);
        }
        let mut per_site_marked = match judging {
            Some(_) => vec![(0u64, 0u64); self.sites.len()],
            None => Vec::new(),
        };
        let mut judged = Judged::default();
        let mut failure = None;
        let mut recent = std::mem::take(&mut self.recent);
        let (s, t) = (self.settled.len(), recent.len() + incoming.len());
        self.settled.resize(s + t, EMPTY);
        let (mut i, mut j, mut k, mut w) = (s, recent.len(), incoming.len(), s + t);
        let top = |v: &[Record], n: usize| if n > 0 { Some(v[n - 1].addr) } else { None };
        while let Some(addr) = top(&self.settled, i)
            .max(top(&recent, j))
            .max(top(&incoming, k))
        {
            // The address's records, oldest first: settled `[i..si]`,
            // recent `[j..rj]`, incoming `[k..ik]` (nearly always one in all).
            let (si, rj, ik) = (i, j, k);
            while i > 0 && self.settled[i - 1].addr == addr {
                i -= 1;
            }
            while j > 0 && recent[j - 1].addr == addr {
                j -= 1;
            }
            // The recent records are read from the end: give their memory
            // back as they are, so the merge needs little more than the
            // records themselves.
            if recent.len() - rj >= CHUNK {
                recent.truncate(rj);
                recent.shrink_to(rj);
            }
            while k > 0 && incoming[k - 1].addr == addr {
                k -= 1;
            }
            // The survivor is the object of the last allocation not
            // followed by a free.
            let mut current: Option<Record> = None;
            for x in i..si {
                let r = self.settled[x];
                self.step(&mut current, r);
            }
            for &r in &recent[j..rj] {
                self.step(&mut current, r);
            }
            for &r in &incoming[k..ik] {
                self.step(&mut current, r);
            }
            let Some(object) = current else { continue };
            if let (Some(jd), None) = (&mut judging, &failure) {
                if (object.epoch as u64) < jd.epoch {
                    match (jd.judge)(addr) {
                        Ok((Verdict::Marked, gc_size)) => {
                            let m = &mut per_site_marked[object.site as usize];
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
            let site = &mut self.sites[object.site as usize].1;
            site.tracked_count += 1;
            site.tracked_bytes += size;
            w -= 1;
            self.settled[w] = object;
        }
        self.settled.copy_within(w.., 0);
        self.settled.truncate(s + t - w);
        recent.clear();
        self.recent = recent;
        self.incoming = incoming;
        self.incoming.clear();
        let kept = self.settled.len();
        self.settled.shrink_to(kept + CHUNK);
        if !self.big.is_empty() {
            let big: std::collections::HashSet<u64> = self
                .settled
                .iter()
                .filter(|r| r.size == u32::MAX)
                .map(|r| r.addr)
                .collect();
            self.big.retain(|addr, _| big.contains(addr));
        }
        self.per_kind = [[0; 2]; 4];
        for (site, s) in &self.sites {
            let k = &mut self.per_kind[site.kind as usize & 3];
            k[0] += s.tracked_count;
            k[1] += s.tracked_bytes;
        }
        if let Some(j) = &judging {
            // Marked counts are "as of the last pass"; every site gets a
            // point, so shrinking stacks show it.
            for ((_, s), &(marked, bytes)) in self.sites.iter_mut().zip(&per_site_marked) {
                (s.marked_count, s.marked_bytes) = (marked, bytes);
                super::pass::push_point(&mut s.history, [j.gc_no, s.tracked_count]);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(judged),
        }
    }

    /// Gives each object `GC_realloc` made since the last settle the kind
    /// of the object it replaced (the latest allocation at that address
    /// before it), and notes the move for the kernel's site totals. The
    /// records since are sorted by now (binary searches).
    fn retype_reallocs(&mut self) {
        for (replaced, addr, time) in std::mem::take(&mut self.reallocs) {
            let Some(kind) = self.kind_at(replaced, time) else {
                continue;
            };
            let Some((in_recent, at)) = self.new_record(addr, time) else {
                continue;
            };
            let rec = if in_recent {
                self.recent[at]
            } else {
                self.incoming[at]
            };
            let from = rec.site;
            let site = self.sites[from as usize].0;
            if site.kind == kind {
                continue;
            }
            let to = self.site_number(Site { kind, ..site });
            if in_recent {
                self.recent[at].site = to;
            } else {
                self.incoming[at].site = to;
            }
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

    /// The kind of the latest object allocated at `addr` at or before `time`.
    fn kind_at(&self, addr: u64, time: u64) -> Option<memprof_common::AllocKind> {
        [&self.incoming, &self.recent, &self.settled]
            .into_iter()
            .find_map(|records| {
                let start = records.partition_point(|r| r.addr < addr);
                let end = records.partition_point(|r| r.addr <= addr);
                records[start..end]
                    .iter()
                    .rev()
                    .find(|r| r.site != FREED && { r.time_ns } <= time)
                    .map(|r| self.sites[r.site as usize].0.kind)
            })
    }

    /// Where the record of the allocation at `addr` at `time` is: (in
    /// `recent`, else `incoming`; index).
    fn new_record(&self, addr: u64, time: u64) -> Option<(bool, usize)> {
        [(false, &self.incoming), (true, &self.recent)]
            .into_iter()
            .find_map(|(in_recent, records)| {
                let start = records.partition_point(|r| r.addr < addr);
                let end = records.partition_point(|r| r.addr <= addr);
                (start..end)
                    .find(|&i| records[i].site != FREED && { records[i].time_ns } == time)
                    .map(|i| (in_recent, i))
            })
    }

    fn site_number(&mut self, site: Site) -> u32 {
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
        match (r.site, *current) {
            (FREED, Some(old)) => {
                self.died(&old, r.time_ns, false);
                *current = None;
            }
            (FREED, None) => self.unknown_frees += 1,
            (_, Some(old)) => {
                self.died(&old, r.time_ns, true);
                *current = Some(r);
            }
            (_, None) => *current = Some(r),
        }
    }

    fn size(&self, r: &Record) -> u64 {
        match r.size {
            u32::MAX => self
                .big
                .get(&{ r.addr })
                .copied()
                .unwrap_or(u32::MAX as u64),
            s => s as u64,
        }
    }

    /// `old` died at `time_ns`: freed, or collected (its address reused).
    fn died(&mut self, old: &Record, time_ns: u64, reused: bool) {
        let size = self.size(old);
        let s = &mut self.sites[old.site as usize].1;
        s.lifetimes.record(time_ns.saturating_sub(old.time_ns));
        if reused {
            s.collected_count += 1;
            s.collected_bytes += size;
        }
    }

    /// `old` was found unmarked at the end of collection `epoch`.
    fn collected(&mut self, old: &Record, now_ns: u64, epoch: u64) {
        let size = self.size(old);
        let s = &mut self.sites[old.site as usize].1;
        s.collected_count += 1;
        s.collected_bytes += size;
        s.lifetimes.record(now_ns.saturating_sub(old.time_ns));
        let survived = epoch.saturating_sub(1 + old.epoch as u64);
        s.lifetimes.collections_survived += survived;
        if survived == 0 {
            s.lifetimes.within_first_collection += 1;
        }
    }

    /// What was learned per site.
    pub fn sites(&self) -> &[(Site, SiteGc)] {
        &self.sites
    }

    /// `GC_free`s of untracked addresses (applied at settles).
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// Tracked objects and bytes per kind (indexed by `AllocKind`), cheap:
    /// exact at the last settle, plus the allocations since.
    pub fn per_kind(&self) -> [[u64; 2]; 4] {
        self.per_kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_common::AllocKind;

    fn block(t: u64, epoch: u64) -> LiveBlock {
        LiveBlock {
            site: Site {
                caller: 0x10,
                stack: None,
                kind: AllocKind::Gc,
            },
            size: 16,
            timestamp_ns: t,
            epoch,
        }
    }

    #[test]
    fn reuse_free_and_unknown_free() {
        let mut copy = GcCopy::default();
        copy.allocated(0x30, &block(1, 0));
        copy.allocated(0x10, &block(2, 0));
        copy.freed(0x50, 3); // unknown
        copy.allocated(0x30, &block(4, 0)); // reuse of 0x30
        copy.freed(0x10, 5);
        copy.allocated(0x10, &block(6, 0)); // after a free: not a reuse
        copy.settle(None).unwrap();
        let s = &copy.sites()[0].1;
        assert_eq!((s.tracked_count, s.tracked_bytes), (2, 32));
        assert_eq!((s.collected_count, s.lifetimes.died), (1, 2));
        assert_eq!(s.lifetimes.total_ns, 3 + 3);
        assert_eq!(copy.unknown_frees(), 1);
        assert_eq!(copy.len(), 2);
        assert!(copy.settled.windows(2).all(|w| w[0].addr < w[1].addr));
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
        copy.freed(0x100, 2);
        let moved = LiveBlock {
            site: Site {
                caller: 0x20,
                ..block(0, 0).site
            },
            ..block(3, 0)
        };
        copy.allocated(0x200, &moved);
        copy.reallocated(0x100, 0x200, 3);
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

    #[test]
    fn a_pass_judges_only_older_objects_and_keeps_order_across_chunks() {
        let mut copy = GcCopy::default();
        for i in 0..(CHUNK as u64 + 10) {
            copy.allocated(0x1000 + 16 * (i % 1000), &block(i, 0));
            copy.sort_tail();
        }
        copy.allocated(0x9_0000, &block(1, 1)); // after the collection began
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
                judge: &mut judge,
            }))
            .unwrap();
        assert_eq!(judged.marked_count, 500);
        let s = &copy.sites()[0].1;
        // 1000 addresses: each's last allocation survives to be judged.
        assert_eq!(s.collected_count, CHUNK as u64 + 10 - 1000 + 500);
        assert_eq!(s.tracked_count, 501);
        assert_eq!(s.history, vec![[7, 501]]);
    }
}
