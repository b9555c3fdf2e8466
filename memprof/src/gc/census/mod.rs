//! The whole GC heap as the collector judged it at one collection: every
//! heap block its block index knows, every object in it, live when the
//! collector marked it (`memprof heap`).
//!
//! Two parts, like a mark-bit pass ([`super::pass`]):
//!
//! - held ([`HeapReader::copy`], at the end of a collection's marking, the
//!   world stopped and the collector held): the block index is walked
//!   ([`MarkLayout::every_block`]), the headers read in page runs
//!   ([`MarkLayout::read_header_pages`]) with each block's kind
//!   (`hb_obj_kind`, [`super::layout::kind_offset`]), and the memory of the
//!   blocks holding marked objects copied (a small-object block whole, the
//!   first bytes of a large object). Nothing is decoded yet;
//! - after the target runs again ([`HeapCopy::census`]): each object of
//!   each block is judged by its mark bit, live ones counted per kind, size
//!   class and first 32-bit word (a Crystal object's type id).
//!
//! Marked is the collector's verdict, with one exception the census tells
//! apart: objects on a thread's free list are marked too (libgc marks them
//! so that the sweep leaves them on the list), though nothing uses them.
//! They are recognized by their shape — the first word links to the next
//! free object of the same size and kind (or is 0), the rest is cleared
//! (kinds libgc clears) — and by nothing typed pointing into them (an
//! empty buffer has the same zeros, but its array points to it), and
//! counted apart, never as live.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use memprof::gc::census::HeapReader;
//! use memprof::modules::Module;
//! let libgc = Module::open("/usr/lib/x86_64-linux-gnu/libgc.so.1".as_ref())?;
//! let reader = HeapReader::new(std::sync::Arc::new(libgc))?;
//! // With the collector of pid 1234 held at `GC_gc_no++`:
//! let copy = reader.copy(1234, false)?; // false: large objects by their head only
//! let census = copy.census(&|word, _kind| (1..1000).contains(&word)); // type ids
//! println!("{} live objects at collection {}", census.live_count(), copy.gc_no);
//! # Ok(()) }
//! ```
use super::heap_stats::HeapStats;

mod count;
mod graph;
mod read;

pub use self::count::{Census, LiveObject, SizeClass, Tally, Word};
pub use self::graph::Graph;
pub(crate) use self::read::vm_read;
pub use self::read::HeapReader;

/// The object kinds libgc predefines (`hb_obj_kind`).
pub const PTRFREE: u8 = 0;
pub const NORMAL: u8 = 1;
pub const UNCOLLECTABLE: u8 = 2;
pub const AUNCOLLECTABLE: u8 = 3;

/// A kind's name in reports.
pub fn kind_name(kind: u8) -> String {
    match kind {
        PTRFREE => "atomic".into(),
        NORMAL => "normal".into(),
        UNCOLLECTABLE => "uncollectable".into(),
        AUNCOLLECTABLE => "atomic uncollectable".into(),
        k => format!("kind {k}"),
    }
}

/// Whether objects of `kind` are pointer-free (never scanned).
pub fn is_atomic(kind: u8) -> bool {
    matches!(kind, PTRFREE | AUNCOLLECTABLE)
}

/// Whether libgc clears a free object of this kind (all but the
/// pointer-free ones): a free object then reads as a link and zeros.
fn cleared(kind: u8) -> bool {
    kind != PTRFREE && kind != AUNCOLLECTABLE
}

/// One heap block as its header said at the hold.
#[derive(Debug, Clone)]
pub struct HeapBlock {
    pub addr: u64,
    pub state: BlockState,
}

#[derive(Debug, Clone)]
pub enum BlockState {
    /// A free block of `bytes` (it may be unmapped).
    Free { bytes: u64 },
    /// Objects of `size` bytes of `kind`, and their mark bits (one per granule).
    Objects {
        kind: u8,
        size: u64,
        marks: Box<[u64]>,
    },
}

impl HeapBlock {
    /// Bytes of heap the block takes.
    pub fn bytes(&self, hblk: u64) -> u64 {
        match &self.state {
            BlockState::Free { bytes } => *bytes,
            BlockState::Objects { size, .. } => (*size).max(hblk).div_ceil(hblk) * hblk,
        }
    }

    /// The object starts of a block of `size`-byte objects.
    fn starts(&self, size: u64, hblk: u64) -> impl Iterator<Item = u64> + '_ {
        let n = if size == 0 {
            0
        } else if size <= hblk {
            hblk / size
        } else {
            1
        };
        (0..n).map(move |i| self.addr + i * size)
    }
}

/// Whether the object at `offset` in a block is marked.
fn marked(marks: &[u64], offset: u64, granule_shift: u32) -> bool {
    let g = (offset >> granule_shift) as usize;
    marks.get(g / 64).is_some_and(|w| w >> (g % 64) & 1 != 0)
}

/// What was copied at the hold ([`HeapReader::copy`]).
pub struct HeapCopy {
    /// `GC_gc_no` at the hold: the collection just marked (the hold
    /// signal is taken after the probed `GC_gc_no++` has run; the
    /// program's own `GC_get_gc_no()` after that collection agrees).
    pub gc_no: u64,
    pub hblksize: u64,
    granule_shift: u32,
    /// Every heap block, ascending.
    pub blocks: Vec<HeapBlock>,
    /// Memory of the blocks with marked objects: (address, bytes), ascending.
    contents: Vec<(u64, Vec<u8>)>,
    /// The collector's own heap figures, where derivable.
    pub stats: Option<HeapStats>,
}

impl HeapCopy {
    /// The bytes copied at `addr`, up to `len`.
    fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let run = self
            .contents
            .partition_point(|(at, _)| *at <= addr)
            .checked_sub(1)?;
        let (at, data) = &self.contents[run];
        let from = (addr - at) as usize;
        let end = (from + len as usize).min(data.len());
        data.get(from..end).filter(|b| !b.is_empty())
    }

    /// Bytes of memory copied at the hold.
    pub fn copied_bytes(&self) -> u64 {
        self.contents.iter().map(|(_, d)| d.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests;
