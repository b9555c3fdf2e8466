//! The census proper ([`HeapCopy::census`]), once the target runs again:
//! each object of each block judged by its mark bit, live ones counted per
//! kind, size class and first word, free-list entries told apart.
use std::collections::BTreeMap;

use super::heap_copy::{cleared, is_atomic, marked, BlockState, HeapBlock, HeapCopy};

/// Live objects and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }
}

/// One size class of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeClass {
    /// Blocks of this class and the heap bytes they take.
    pub blocks: u64,
    pub block_bytes: u64,
    /// Marked objects (live).
    pub live: Tally,
    /// Marked objects on a free list (not live).
    pub free_list: Tally,
    /// Unmarked objects: dead since the last collection, or free.
    pub unmarked: Tally,
}

/// What a live object's first 32-bit word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Word {
    /// A type id (one the caller's `is_type` accepts).
    Type(u32),
    /// No type id, but an object with this type id points into it (the
    /// first such object in address order): its buffer.
    HeldBy(u32),
    /// No type id, and no typed object points into it.
    Untyped,
}

/// The collector's verdict on every object of the heap.
#[derive(Debug, Clone, Default)]
pub struct Census {
    /// Per (kind, object size).
    pub classes: BTreeMap<(u8, u64), SizeClass>,
    /// Live objects per (kind, what their first word says).
    pub words: BTreeMap<(u8, Word), Tally>,
    /// Free blocks and their bytes.
    pub free_blocks: Tally,
    /// Per object block: (address, heap bytes, live bytes), ascending.
    pub object_blocks: Vec<(u64, u64, u64)>,
    /// Every live object, ascending (for [`HeapCopy::retained`]).
    pub objects: Vec<LiveObject>,
}

/// One live object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveObject {
    pub start: u64,
    pub size: u64,
    pub kind: u8,
    pub word: Word,
}

impl Census {
    #[cfg(test)]
    pub fn live_count(&self) -> u64 {
        self.classes.values().map(|c| c.live.count).sum()
    }
}

impl HeapCopy {
    /// Whether `q` is the start of an object of `size` bytes and `kind`
    /// (where a free list of that class would link).
    fn is_object_start(&self, q: u64, kind: u8, size: u64) -> bool {
        // Most first words (type ids) are nowhere near the heap.
        let (Some(first), Some(last)) = (self.blocks.first(), self.blocks.last()) else {
            return false;
        };
        if q < first.addr || q >= last.addr + last.bytes(self.hblksize) {
            return false;
        }
        let i = self.blocks.partition_point(|b| b.addr <= q);
        let Some(block) = i.checked_sub(1).map(|i| &self.blocks[i]) else {
            return false;
        };
        match &block.state {
            BlockState::Objects {
                kind: k, size: s, ..
            } if *k == kind && *s == size => {
                let off = q - block.addr;
                size <= self.hblksize && off.is_multiple_of(size) && off + size <= self.hblksize
            }
            _ => false,
        }
    }

    /// Whether a marked object reads as a free-list entry (see the module docs).
    fn on_free_list(&self, bytes: &[u8], kind: u8, size: u64) -> bool {
        if size > self.hblksize || bytes.len() < 8 {
            return false;
        }
        let link = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let links = if link == 0 {
            cleared(kind)
        } else {
            self.is_object_start(link, kind, size)
        };
        links && (!cleared(kind) || bytes[8..].iter().all(|&b| b == 0))
    }

    /// Judges every object of every block by its mark bit. `is_type(word,
    /// kind, size)`: whether the first 32-bit word of a live object of
    /// `size` bytes (its size class) is a type id.
    /// Live objects without one are named after the first typed object
    /// (in address order) with a word pointing into them ([`Word::HeldBy`]):
    /// an `Array(Foo)`'s buffer is held by the `Array(Foo)`.
    pub fn census(&self, is_type: &dyn Fn(u32, u8, u64) -> bool) -> Census {
        let mut census = Census::default();
        let mut untyped = Untyped::default();
        for block in &self.blocks {
            match &block.state {
                BlockState::Free { bytes } => census.free_blocks.add(*bytes),
                BlockState::Objects { .. } => {
                    self.count_block(block, is_type, &mut census, &mut untyped)
                }
            }
        }
        let held_by = self.first_holders(&untyped);
        name_untyped(&mut census, &untyped, &held_by);
        census
    }

    /// Counts the objects of one object block by their mark bits: the
    /// typed live ones per type, the others set aside in `untyped`.
    fn count_block(
        &self,
        block: &HeapBlock,
        is_type: &dyn Fn(u32, u8, u64) -> bool,
        census: &mut Census,
        untyped: &mut Untyped,
    ) {
        let BlockState::Objects { kind, size, marks } = &block.state else {
            return;
        };
        let (kind, size, hblk) = (*kind, *size, self.hblksize);
        let class = census.classes.entry((kind, size)).or_default();
        class.blocks += 1;
        class.block_bytes += block.bytes(hblk);
        let mut live_bytes = 0;
        // The block's copy, found once (a large object's: its head).
        let copied = self.bytes_at(block.addr, hblk);
        for p in block.starts(size, hblk) {
            if !marked(marks, p - block.addr, self.granule_shift) {
                class.unmarked.add(size);
                continue;
            }
            let from = (p - block.addr) as usize;
            let bytes = copied
                .and_then(|c| c.get(from..(from + size.min(hblk) as usize).min(c.len())))
                .filter(|b| !b.is_empty());
            let object = LiveObject {
                start: p,
                size,
                kind,
                word: Word::Untyped,
            };
            if bytes.is_some_and(|b| self.on_free_list(b, kind, size)) {
                untyped
                    .objects
                    .push((p, size, kind, Some(census.object_blocks.len())));
                untyped.at.push(census.objects.len());
                census.objects.push(object);
                continue;
            }
            class.live.add(size);
            live_bytes += size;
            let word = bytes
                .and_then(|b| b.get(..4))
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .filter(|&w| is_type(w, kind, size));
            census.objects.push(LiveObject {
                word: word.map_or(Word::Untyped, Word::Type),
                ..object
            });
            match word {
                Some(id) => {
                    census
                        .words
                        .entry((kind, Word::Type(id)))
                        .or_default()
                        .add(size);
                    // Only scanned memory holds pointers; only small
                    // objects were copied whole.
                    if !is_atomic(kind) && size <= hblk {
                        untyped.holders.push((p, size, id));
                    }
                }
                None => {
                    untyped.objects.push((p, size, kind, None));
                    untyped.at.push(census.objects.len() - 1);
                }
            }
        }
        census
            .object_blocks
            .push((block.addr, block.bytes(hblk), live_bytes));
    }

    /// The first holder of each untyped object: the type id of the first
    /// typed object (in address order) with a word pointing into it.
    fn first_holders(&self, untyped: &Untyped) -> Vec<Option<u32>> {
        let objects = &untyped.objects;
        let mut held_by: Vec<Option<u32>> = vec![None; objects.len()];
        let (low, high) = match (objects.first(), objects.last()) {
            (Some(f), Some(l)) => (f.0, l.0 + l.1),
            _ => (0, 0),
        };
        for &(p, size, id) in &untyped.holders {
            let Some(bytes) = self.bytes_at(p, size) else {
                continue;
            };
            // The first word is the type id (and a field after it).
            for word in bytes.chunks_exact(8).skip(1) {
                let q = u64::from_le_bytes(word.try_into().unwrap());
                if q < low || q >= high {
                    continue;
                }
                // The untyped object q points into: an interior pointer
                // counts, as for the collector with all interior pointers
                // on (Crystal's setting).
                let i = objects.partition_point(|o| o.0 <= q);
                if let Some(i) = i
                    .checked_sub(1)
                    .filter(|&i| q < objects[i].0 + objects[i].1)
                {
                    held_by[i].get_or_insert(id);
                }
            }
        }
        held_by
    }
}

/// What the block walk of a census set aside for the holders to decide.
#[derive(Default)]
struct Untyped {
    /// Marked objects without a type id, ascending: (start, size, kind,
    /// the index of its block in `object_blocks` if it has a free-list
    /// entry's shape: decided once it is known whether a typed object
    /// points into it).
    objects: Vec<(u64, u64, u8, Option<usize>)>,
    /// Where each of `objects` is in `census.objects`.
    at: Vec<usize>,
    /// Typed objects whose words may point at them: (start, size, id).
    holders: Vec<(u64, u64, u32)>,
}

/// Names each untyped object after its first holder ([`Word::HeldBy`]),
/// or counts it as a free-list entry (free-list shaped, held by nothing)
/// and leaves it out of the objects.
fn name_untyped(census: &mut Census, untyped: &Untyped, held_by: &[Option<u32>]) {
    let mut free: Vec<bool> = vec![false; census.objects.len()];
    for ((&(_, size, kind, free_shaped), &id), &at) in
        untyped.objects.iter().zip(held_by).zip(&untyped.at)
    {
        if let Some(block) = free_shaped {
            let class = census.classes.entry((kind, size)).or_default();
            // Zeros, or a link to an object of its size: an empty
            // buffer looks the same, but a typed object points to it.
            if id.is_none() {
                class.free_list.add(size);
                free[at] = true;
                continue;
            }
            class.live.add(size);
            census.object_blocks[block].2 += size;
        }
        let word = id.map_or(Word::Untyped, Word::HeldBy);
        census.objects[at].word = word;
        census.words.entry((kind, word)).or_default().add(size);
    }
    let mut i = 0;
    census.objects.retain(|_| {
        i += 1;
        !free[i - 1]
    });
}
