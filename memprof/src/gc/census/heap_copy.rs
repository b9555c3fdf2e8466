//! The heap as the hold left it ([`HeapCopy`]): every block with its
//! objects' kind, size and mark bits, and the memory copied of the blocks
//! holding marked objects.
use crate::gc::heap_stats::HeapStats;

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
pub(super) fn cleared(kind: u8) -> bool {
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
    pub(super) fn starts(&self, size: u64, hblk: u64) -> impl Iterator<Item = u64> + '_ {
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
pub(super) fn marked(marks: &[u64], offset: u64, granule_shift: u32) -> bool {
    let g = (offset >> granule_shift) as usize;
    marks.get(g / 64).is_some_and(|w| w >> (g % 64) & 1 != 0)
}

/// What was copied at the hold ([`super::HeapReader::copy`]).
pub struct HeapCopy {
    /// `GC_gc_no` at the hold: the collection just marked (the hold
    /// signal is taken after the probed `GC_gc_no++` has run; the
    /// program's own `GC_get_gc_no()` after that collection agrees).
    pub gc_no: u64,
    pub hblksize: u64,
    pub(super) granule_shift: u32,
    /// Every heap block, ascending.
    pub blocks: Vec<HeapBlock>,
    /// Memory of the blocks with marked objects: (address, bytes), ascending.
    pub(super) contents: Vec<(u64, Vec<u8>)>,
    /// The collector's own heap figures, where derivable.
    pub stats: Option<HeapStats>,
}

impl HeapCopy {
    /// The bytes copied at `addr`, up to `len`.
    pub(super) fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
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
