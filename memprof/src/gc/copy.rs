//! memprof's copy of the target's GC objects: the only record of them
//! while mark bits are read (the kernel streams every GC allocation and
//! `GC_free` through its ring buffer and keeps none in its live table, whose
//! size would otherwise bound how many objects can be tracked).
//!
//! Built for millions of objects and millions of events a second:
//!
//! - an event costs an append: allocations and frees go, in arrival order,
//!   to the end of one `Vec` of 28-byte records (sites numbered, sizes and
//!   epochs `u32`), a free as a marker record;
//! - [`GcCopy::settle`] (at each mark-bit pass, snapshot and the end) sorts
//!   by address — stably, so the records of one address stay in arrival
//!   order — and walks the addresses once, in place: an allocation at an
//!   address still tracked proves the older object collected (address
//!   reuse), a free ends the object it follows (or is counted unknown), and
//!   the survivor is judged by the pass's mark bits when there is a pass;
//! - the tail is sorted in chunks as it arrives ([`GcCopy::sort_tail`], off
//!   the hold), so a pass merges sorted runs instead of sorting.
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
/// Unsorted records sorted at once by [`GcCopy::sort_tail`].
const CHUNK: usize = 1 << 18;

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
    /// `[..sorted]` in address order (one record per address); then the
    /// records since, in arrival order (`[sorted..runs]` sorted in chunks).
    records: Vec<Record>,
    sorted: usize,
    runs: usize,
    site_numbers: HashMap<Site, u32>,
    sites: Vec<(Site, SiteGc)>,
    /// Sizes of objects of 4 GiB or more, by address.
    big: HashMap<u64, u64>,
    /// `GC_free`s of addresses the copy did not track.
    unknown_frees: u64,
    /// Objects and bytes tracked per kind: exact after a settle, plus the
    /// allocations since (frees and reuse are applied at the next settle).
    per_kind: [[u64; 2]; 4],
}

impl GcCopy {
    /// A GC object allocated at `addr`.
    pub fn allocated(&mut self, addr: u64, block: &LiveBlock) {
        let sites = &mut self.sites;
        let site = *self.site_numbers.entry(block.site).or_insert_with(|| {
            sites.push((block.site, SiteGc::default()));
            sites.len() as u32 - 1
        });
        let size = match u32::try_from(block.size) {
            Ok(s) if s != u32::MAX => s,
            _ => {
                self.big.insert(addr, block.size);
                u32::MAX
            }
        };
        self.records.push(Record {
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

    /// The GC object at `addr` was freed (`GC_free`, `GC_realloc`) at `time_ns`.
    pub fn freed(&mut self, addr: u64, time_ns: u64) {
        self.records.push(Record {
            addr,
            time_ns,
            size: 0,
            site: FREED,
            epoch: 0,
        });
    }

    /// Sorts the unsorted tail chunk by chunk, so that a settle only merges.
    pub fn sort_tail(&mut self) {
        if self.records.len() - self.runs >= CHUNK {
            self.records[self.runs..].sort_by_key(|r| r.addr);
            self.runs = self.records.len();
        }
    }

    /// Records (objects, frees not yet applied) held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes the copy holds (its record array and site table).
    pub fn memory_bytes(&self) -> usize {
        self.records.capacity() * std::mem::size_of::<Record>()
            + self.sites.capacity() * std::mem::size_of::<(Site, SiteGc)>()
    }

    /// Applies address reuse and frees, and with `judging` the pass's
    /// mark bits: afterwards the copy holds one record per tracked object,
    /// and each site's tracked count and bytes are current.
    pub fn settle(&mut self, mut judging: Option<Judging>) -> Result<Judged> {
        // Stable: the records of one address stay in arrival order. The
        // sorted prefix and the sorted chunks are runs: this merges them.
        self.records.sort_by_key(|r| r.addr);
        for (_, s) in &mut self.sites {
            (s.tracked_count, s.tracked_bytes) = (0, 0);
        }
        let mut per_site_marked = match judging {
            Some(_) => vec![(0u64, 0u64); self.sites.len()],
            None => Vec::new(),
        };
        let mut judged = Judged::default();
        let mut failure = None;
        let mut write = 0;
        let mut read = 0;
        let n = self.records.len();
        while read < n {
            let addr = self.records[read].addr;
            // The address's records, oldest first: the survivor is the
            // object of the last allocation not followed by a free.
            let mut current: Option<Record> = None;
            while read < n && self.records[read].addr == addr {
                let r = self.records[read];
                read += 1;
                match (r.site, current) {
                    (FREED, Some(old)) => {
                        self.died(&old, r.time_ns, false);
                        current = None;
                    }
                    (FREED, None) => self.unknown_frees += 1,
                    (_, Some(old)) => {
                        self.died(&old, r.time_ns, true);
                        current = Some(r);
                    }
                    (_, None) => current = Some(r),
                }
            }
            let Some(object) = current else { continue };
            if let (Some(j), None) = (&mut judging, &failure) {
                if (object.epoch as u64) < j.epoch {
                    match (j.judge)(addr) {
                        Ok((Verdict::Marked, gc_size)) => {
                            let m = &mut per_site_marked[object.site as usize];
                            m.0 += 1;
                            m.1 += gc_size;
                            judged.marked_count += 1;
                            judged.marked_bytes += gc_size;
                        }
                        Ok(_) => {
                            self.collected(&object, j.now_ns, j.epoch);
                            continue;
                        }
                        // Kept, unjudged; the error ends the passes.
                        Err(e) => failure = Some(e),
                    }
                }
            }
            let size = self.size(&object);
            let s = &mut self.sites[object.site as usize].1;
            s.tracked_count += 1;
            s.tracked_bytes += size;
            self.records[write] = object;
            write += 1;
        }
        self.records.truncate(write);
        self.sorted = write;
        self.runs = write;
        // Keep the spare room for the allocations until the next pass, but
        // give back what a burst left.
        if self.records.capacity() > 2 * write + 2 * CHUNK {
            self.records.shrink_to(write + write / 2 + CHUNK);
        }
        if !self.big.is_empty() {
            let big: std::collections::HashSet<u64> = self.records.iter().filter(|r| r.size == u32::MAX).map(|r| r.addr).collect();
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

    fn size(&self, r: &Record) -> u64 {
        match r.size {
            u32::MAX => self.big.get(&{ r.addr }).copied().unwrap_or(u32::MAX as u64),
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
    }

    #[test]
    fn a_pass_judges_only_older_objects_and_keeps_order_across_chunks() {
        let mut copy = GcCopy::default();
        for i in 0..(CHUNK as u64 + 10) {
            copy.allocated(0x1000 + 16 * (i % 1000), &block(i, 0));
            copy.sort_tail();
        }
        copy.allocated(0x9_0000, &block(1, 1)); // after the collection began
        let mut judge = |addr: u64| Ok((if addr % 32 == 0 { Verdict::Marked } else { Verdict::Unmarked }, 16));
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
