//! The copy's record of one GC object or free (16 bytes: millions are
//! held), the sorted runs they are merged in, and the epochs their times
//! give back.
/// Slot number of a free's marker record.
pub(super) const FREED: u32 = (1 << SITE_BITS) - 1;
/// Records sorted and merged at once by [`super::GcCopy::sort_tail`].
pub(super) const CHUNK: usize = 1 << 16;

/// Merges `more` (sorted by address) into `into` (sorted), in place from
/// the end; on equal addresses `into`'s records come first (they are
/// older). Neither run is held twice: `into`'s new room becomes resident
/// only as the merge writes it, and `more` gives its memory back as it is
/// read.
pub(super) fn merge_behind(into: &mut Vec<Record>, mut more: Vec<Record>) {
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
pub(super) struct Record {
    /// The address over 16 (GC objects are granule-aligned and below
    /// 2^48) in the high 44 bits; the requested bytes in the low 20
    /// ([`BIG`]: see [`super::GcCopy::big`]).
    key: u64,
    /// The time of the allocation (of the free, for a marker) in
    /// [`TICK_NS`] ticks since [`super::GcCopy::base_ns`] in the high 40 bits
    /// (13 days; later times read as the last tick); the index into
    /// [`super::GcCopy::slots`] (its site and what its first word said),
    /// or [`FREED`], in the low 24. A free's marker holds the freed
    /// object's first word in its size bits ([`Record::freed`]).
    meta: u64,
}

/// Bits of [`Record::key`] holding the size.
pub(super) const SIZE_BITS: u32 = 20;
/// The size of an object of this size or more is in [`super::GcCopy::big`].
pub(super) const BIG: u64 = (1 << SIZE_BITS) - 1;
/// Bits of [`Record::meta`] holding the site.
pub(super) const SITE_BITS: u32 = 24;
/// Sites the copy numbers; a site past them is counted under its kind's
/// overflow site (the kernel's stack table is far smaller).
pub(super) const MAX_SITES: usize = FREED as usize - 8;
/// Nanoseconds per tick of [`Record::meta`]'s time (lifetimes are
/// reported from 100 µs up).
pub(super) const TICK_NS: u64 = 1024;
pub(super) const LAST_TICK: u64 = (1 << (64 - SITE_BITS)) - 1;

/// `time_ns` in ticks since `base_ns`.
pub(super) fn ticks(time_ns: u64, base_ns: u64) -> u64 {
    (time_ns.saturating_sub(base_ns) / TICK_NS).min(LAST_TICK)
}

impl Record {
    pub(super) fn new(addr: u64, size: u64, ticks: u64, site: u32) -> Record {
        Record {
            key: (addr >> 4) << SIZE_BITS | size.min(BIG),
            meta: ticks << SITE_BITS | site as u64,
        }
    }

    #[inline]
    pub(super) fn addr(&self) -> u64 {
        (self.key >> SIZE_BITS) << 4
    }

    #[inline]
    pub(super) fn slot(&self) -> u32 {
        (self.meta & ((1 << SITE_BITS) - 1)) as u32
    }

    #[inline]
    pub(super) fn ticks(&self) -> u64 {
        self.meta >> SITE_BITS
    }

    pub(super) fn set_slot(&mut self, slot: u32) {
        self.meta = self.meta & !((1 << SITE_BITS) - 1) | slot as u64;
    }

    /// A free's marker: the freed object's first word, if read, in the
    /// size bits (+1; [`BIG`]: a word too big to be a type id).
    pub(super) fn freed(addr: u64, ticks: u64, first_word: Option<u32>) -> Record {
        let word = first_word.map_or(0, |w| (u64::from(w) + 1).min(BIG));
        Record::new(addr, word, ticks, FREED)
    }

    /// What [`Record::freed`] holds: the freed object's first word, if
    /// read (`u32::MAX` for one too big to be a type id).
    pub(super) fn freed_word(&self) -> Option<u32> {
        match self.small_size() {
            0 => None,
            BIG => Some(u32::MAX),
            w => Some(w as u32 - 1),
        }
    }

    /// Requested bytes, or [`BIG`].
    #[inline]
    pub(super) fn small_size(&self) -> u64 {
        self.key & BIG
    }

    /// Whether a record can hold `addr`.
    pub(super) fn holds(addr: u64) -> bool {
        addr.is_multiple_of(16) && addr >> 48 == 0
    }
}

/// The blocks (under `block_mask`) of `records` (sorted by address) that
/// hold objects, ascending, each once.
pub(super) fn block_list(records: &[Record], block_mask: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> = Vec::new();
    for r in records.iter().filter(|r| r.slot() != FREED) {
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
pub(super) struct Epochs {
    /// (epoch, its earliest allocation in ticks), ascending in both.
    starts: Vec<(u64, u64)>,
}

impl Epochs {
    /// An allocation of `epoch` at `ticks` (nearly always of the latest
    /// epoch: one comparison).
    #[inline]
    pub(super) fn note(&mut self, epoch: u64, ticks: u64) {
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
    pub(super) fn of(&self, ticks: u64) -> u64 {
        match self.starts.partition_point(|&(_, t)| t <= ticks) {
            0 => 0,
            n => self.starts[n - 1].0,
        }
    }
}
