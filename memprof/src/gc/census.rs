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
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::heap_stats::{self, HeapStats, HeapStatsLayout};
use super::layout::{self, kind_offset};
use super::lookup::Block;
use super::{end_of_mark, EndOfMark, MarkLayout};
use crate::modules::Module;

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

/// What memprof needs to copy the heap of one libgc, derived from its code.
pub struct HeapReader {
    module: Arc<Module>,
    layout: MarkLayout,
    kind: u64,
    end: EndOfMark,
    stats: Option<HeapStatsLayout>,
}

/// Most bytes read from the target at once.
const MAX_READ: usize = 1 << 20;
/// Bytes copied from the start of a large object (its type id and more).
const LARGE_HEAD: u64 = 16;

impl HeapReader {
    /// Derives the layout from `module` (a shared libgc or an executable
    /// with libgc in it); `unsupported libgc layout: …` if its code is not
    /// shaped as memprof knows.
    pub fn new(module: Arc<Module>) -> Result<HeapReader> {
        let layout = layout::derive(&module)?;
        let kind = kind_offset(&module, &layout)?;
        let end = end_of_mark(&module)?;
        Ok(HeapReader {
            stats: heap_stats::derive(&module).ok(),
            module,
            layout,
            kind,
            end,
        })
    }

    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The `GC_gc_no++` instructions ([`EndOfMark::probe_points`]).
    pub fn collection_increments(&self) -> Vec<(u64, u64)> {
        self.end.probe_points()
    }

    /// The held part: copies what the census needs from process `pid`,
    /// whose collector must be held at the end of a collection's marking.
    /// `whole`: large scanned objects too, whole (for retained sizes: their
    /// words are edges of the object graph), not only their heads.
    pub fn copy(&self, pid: u32, whole: bool) -> Result<HeapCopy> {
        let bias = self.module.load_bias(pid)?;
        let mem = File::open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot read the memory of pid {pid}"))?;
        let mut read = |a: u64, buf: &mut [u8]| mem.read_exact_at(buf, a);
        let gc_no = self
            .end
            .read_gc_no(bias, &mut read)
            .context("reading GC_gc_no")?;
        let layout = &self.layout;
        let arrays = layout.arrays_at(bias, &mut read)?;
        let found = layout
            .every_block(arrays, &mut read)
            .context("walking the GC's block index")?;
        let hdrs = found.iter().map(|&(_, hdr)| hdr).collect();
        let headers = layout
            .read_header_pages(hdrs, Some(self.kind), &mut read)
            .context("reading the GC's block headers")?;
        let hblk = layout.hblksize();
        let mut blocks = Vec::with_capacity(found.len());
        for (i, &(addr, _)) in found.iter().enumerate() {
            let state = match layout.block_in(&headers, i)? {
                Block::Objects { size, marks } => BlockState::Objects {
                    kind: headers.field(i, self.kind, 1).unwrap_or(0) as u8,
                    size,
                    marks,
                },
                Block::Not(_) => BlockState::Free {
                    bytes: headers.field(i, layout.hb_sz, 8).unwrap_or(hblk),
                },
            };
            blocks.push(HeapBlock { addr, state });
        }
        // The bulk of the copy: process_vm_readv moves it several times
        // faster than reads of /proc/PID/mem.
        let mut bulk = |a: u64, buf: &mut [u8]| vm_read(pid, a, buf);
        let contents = copy_contents(&blocks, hblk, layout.granule_shift, whole, &mut bulk)?;
        let stats = self
            .stats
            .as_ref()
            .and_then(|s| s.read(bias, &mut read).ok());
        Ok(HeapCopy {
            gc_no,
            hblksize: hblk,
            granule_shift: layout.granule_shift,
            blocks,
            contents,
            stats,
        })
    }
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

/// Copies the memory of the blocks holding marked objects: small-object
/// blocks whole, in runs of neighbours; the head of each large object.
fn copy_contents(
    blocks: &[HeapBlock],
    hblk: u64,
    granule_shift: u32,
    whole: bool,
    read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut wanted: Vec<(u64, u64)> = Vec::new();
    for block in blocks {
        let BlockState::Objects { size, marks, kind } = &block.state else {
            continue;
        };
        if !block
            .starts(*size, hblk)
            .any(|p| marked(marks, p - block.addr, granule_shift))
        {
            continue;
        }
        let len = if *size <= hblk {
            hblk
        } else if whole && !is_atomic(*kind) {
            *size
        } else {
            LARGE_HEAD
        };
        match wanted.last_mut() {
            Some((start, end))
                if *end == block.addr && *end - *start < MAX_READ as u64 && len == hblk =>
            {
                *end += len
            }
            _ => wanted.push((block.addr, block.addr + len)),
        }
    }
    let mut runs = Vec::with_capacity(wanted.len());
    for (start, end) in wanted {
        let mut data = vec![0u8; (end - start) as usize];
        read(start, &mut data).with_context(|| format!("copying GC heap memory at {start:#x}"))?;
        runs.push((start, data));
    }
    Ok(runs)
}

/// Reads `buf.len()` bytes at `addr` of process `pid` (`process_vm_readv`).
pub(crate) fn vm_read(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: buf.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: `local` is our own writable buffer of that length; the
        // kernel checks the remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(if n == 0 {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            } else {
                io::Error::last_os_error()
            });
        }
        done += n as usize;
    }
    Ok(())
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
    pub fn live_count(&self) -> u64 {
        self.classes.values().map(|c| c.live.count).sum()
    }

    pub fn live_bytes(&self) -> u64 {
        self.classes.values().map(|c| c.live.bytes).sum()
    }
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
    /// kind)`: whether a live object's first 32-bit word is a type id.
    /// Live objects without one are named after the first typed object
    /// (in address order) with a word pointing into them ([`Word::HeldBy`]):
    /// an `Array(Foo)`'s buffer is held by the `Array(Foo)`.
    pub fn census(&self, is_type: &dyn Fn(u32, u8) -> bool) -> Census {
        let hblk = self.hblksize;
        let mut census = Census::default();
        // Marked objects without a type id, ascending: (start, size, kind,
        // the index of its block in `object_blocks` if it has a free-list
        // entry's shape: decided once it is known whether a typed object
        // points into it).
        let mut untyped: Vec<(u64, u64, u8, Option<usize>)> = Vec::new();
        // Where each of `untyped` is in `census.objects`.
        let mut untyped_at: Vec<usize> = Vec::new();
        // Typed objects whose words may point at them: (start, size, id).
        let mut holders: Vec<(u64, u64, u32)> = Vec::new();
        for block in &self.blocks {
            let (kind, size, marks) = match &block.state {
                BlockState::Free { bytes } => {
                    census.free_blocks.add(*bytes);
                    continue;
                }
                BlockState::Objects { kind, size, marks } => (*kind, *size, marks),
            };
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
                    untyped.push((p, size, kind, Some(census.object_blocks.len())));
                    untyped_at.push(census.objects.len());
                    census.objects.push(object);
                    continue;
                }
                class.live.add(size);
                live_bytes += size;
                let word = bytes
                    .and_then(|b| b.get(..4))
                    .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                    .filter(|&w| is_type(w, kind));
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
                        if !matches!(kind, PTRFREE | AUNCOLLECTABLE) && size <= hblk {
                            holders.push((p, size, id));
                        }
                    }
                    None => {
                        untyped.push((p, size, kind, None));
                        untyped_at.push(census.objects.len() - 1);
                    }
                }
            }
            census
                .object_blocks
                .push((block.addr, block.bytes(hblk), live_bytes));
        }
        // The first holder of each untyped object.
        let mut held_by: Vec<Option<u32>> = vec![None; untyped.len()];
        let (low, high) = match (untyped.first(), untyped.last()) {
            (Some(f), Some(l)) => (f.0, l.0 + l.1),
            _ => (0, 0),
        };
        for &(p, size, id) in &holders {
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
                let i = untyped.partition_point(|o| o.0 <= q);
                if let Some(i) = i
                    .checked_sub(1)
                    .filter(|&i| q < untyped[i].0 + untyped[i].1)
                {
                    held_by[i].get_or_insert(id);
                }
            }
        }
        // Free-list entries are left out of the objects.
        let mut free: Vec<bool> = vec![false; census.objects.len()];
        for ((&(_, size, kind, free_shaped), &id), &at) in
            untyped.iter().zip(&held_by).zip(&untyped_at)
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
        census
    }
}

/// The live objects' references, as compressed rows: object `i` points
/// into `targets[offsets[i]..offsets[i + 1]]`, from the word at `fields[…]`
/// bytes into it ([`HeapCopy::graph`]).
pub struct Graph {
    offsets: Vec<usize>,
    targets: Vec<u32>,
    fields: Vec<u32>,
}

impl Graph {
    /// What object `i` points into: (object, offset of the word in `i`).
    pub fn edges(&self, i: usize) -> impl Iterator<Item = (usize, u32)> + '_ {
        let range = self.offsets[i]..self.offsets[i + 1];
        self.targets[range.clone()]
            .iter()
            .zip(&self.fields[range])
            .map(|(&t, &f)| (t as usize, f))
    }

    /// The reverse graph: who points into each object, and from where.
    pub fn referrers(&self) -> Graph {
        let n = self.offsets.len() - 1;
        let mut counts = vec![0usize; n + 1];
        for &t in &self.targets {
            counts[t as usize + 1] += 1;
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut next = counts.clone();
        let mut targets = vec![0u32; self.targets.len()];
        let mut fields = vec![0u32; self.targets.len()];
        for i in 0..n {
            for (t, f) in self.edges(i) {
                targets[next[t]] = i as u32;
                fields[next[t]] = f;
                next[t] += 1;
            }
        }
        Graph {
            offsets: counts,
            targets,
            fields,
        }
    }
}

impl HeapCopy {
    /// The object graph by the collector's own conservative rule: every
    /// word of a scanned (not atomic) live object that points into a live
    /// object, interior pointers included; a typed object's first word is
    /// its id, not an edge. Large scanned objects have edges only when
    /// copied whole ([`HeapReader::copy`]).
    pub fn graph(&self, objects: &[LiveObject]) -> Graph {
        let n = objects.len();
        let (low, high) = match (objects.first(), objects.last()) {
            (Some(f), Some(l)) => (f.start, l.start + l.size),
            _ => (0, 0),
        };
        let mut offsets: Vec<usize> = Vec::with_capacity(n + 1);
        let mut targets: Vec<u32> = Vec::new();
        let mut fields: Vec<u32> = Vec::new();
        offsets.push(0);
        for (i, o) in objects.iter().enumerate() {
            let bytes = self
                .bytes_at(o.start, o.size)
                .filter(|b| !is_atomic(o.kind) && b.len() as u64 == o.size);
            let skip = usize::from(matches!(o.word, Word::Type(_)));
            let words = bytes
                .into_iter()
                .flat_map(|b| b.chunks_exact(8).enumerate().skip(skip));
            for (k, word) in words {
                let q = u64::from_le_bytes(word.try_into().unwrap());
                if q < low || q >= high {
                    continue;
                }
                let j = objects.partition_point(|x| x.start <= q);
                if let Some(j) = j
                    .checked_sub(1)
                    .filter(|&j| j != i && q < objects[j].start + objects[j].size)
                {
                    targets.push(j as u32);
                    fields.push(k as u32 * 8);
                }
            }
            offsets.push(targets.len());
        }
        Graph {
            offsets,
            targets,
            fields,
        }
    }

    /// Retained bytes per type id, as MemProf's `log_object_sizes` counts
    /// them: for each type, the bytes of every live object reachable from
    /// its objects (theirs included) in `graph`, each once.
    pub fn retained(&self, objects: &[LiveObject], graph: &Graph) -> BTreeMap<u32, u64> {
        let n = objects.len();
        let mut instances: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, o) in objects.iter().enumerate() {
            if let Word::Type(id) = o.word {
                instances.entry(id).or_default().push(i as u32);
            }
        }
        // Each walk stamps what it reached with its own number: nothing to clear.
        let mut stamp: Vec<u32> = vec![0; n];
        let mut stack: Vec<u32> = Vec::new();
        let mut retained = BTreeMap::new();
        for (walk, (id, from)) in instances.into_iter().enumerate() {
            let walk = walk as u32 + 1;
            let mut bytes = 0;
            for &i in &from {
                stamp[i as usize] = walk;
            }
            stack.extend(from);
            while let Some(i) = stack.pop() {
                let i = i as usize;
                bytes += objects[i].size;
                for (t, _) in graph.edges(i) {
                    if stamp[t] != walk {
                        stamp[t] = walk;
                        stack.push(t as u32);
                    }
                }
            }
            retained.insert(id, bytes);
        }
        retained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(blocks: Vec<HeapBlock>, contents: Vec<(u64, Vec<u8>)>) -> HeapCopy {
        HeapCopy {
            gc_no: 7,
            hblksize: 4096,
            granule_shift: 4,
            blocks,
            contents,
            stats: None,
        }
    }

    fn marks(granules: &[usize]) -> Box<[u64]> {
        let mut m = vec![0u64; 5];
        for &g in granules {
            m[g / 64] |= 1 << (g % 64);
        }
        m.into_boxed_slice()
    }

    #[test]
    fn marked_objects_are_live_free_list_entries_are_not() {
        // A block of 32-byte normal objects at 0x10000: objects 0 and 1
        // carry type ids 173 and 174; object 2 is a free-list entry linking
        // to object 3 (both marked), object 3 ends the list (0); object 4
        // is unmarked.
        let mut data = vec![0u8; 4096];
        data[0..4].copy_from_slice(&173u32.to_le_bytes());
        data[8..16].copy_from_slice(&0x10100u64.to_le_bytes()); // a field pointing elsewhere
        data[32..36].copy_from_slice(&174u32.to_le_bytes());
        data[64..72].copy_from_slice(&(0x10000u64 + 96).to_le_bytes());
        let block = HeapBlock {
            addr: 0x10000,
            state: BlockState::Objects {
                kind: NORMAL,
                size: 32,
                marks: marks(&[0, 2, 4, 6]),
            },
        };
        let free = HeapBlock {
            addr: 0x11000,
            state: BlockState::Free { bytes: 8192 },
        };
        let census = copy(vec![block, free], vec![(0x10000, data)]).census(&|w, _| w < 1000);
        let class = census.classes[&(NORMAL, 32)];
        assert_eq!(
            class.live,
            Tally {
                count: 2,
                bytes: 64
            }
        );
        assert_eq!(
            class.free_list,
            Tally {
                count: 2,
                bytes: 64
            }
        );
        assert_eq!(class.unmarked.count, 128 - 4);
        assert_eq!(class.block_bytes, 4096);
        assert_eq!(
            census.words[&(NORMAL, Word::Type(173))],
            Tally {
                count: 1,
                bytes: 32
            }
        );
        assert_eq!(
            census.words[&(NORMAL, Word::Type(174))],
            Tally {
                count: 1,
                bytes: 32
            }
        );
        assert_eq!(
            census.free_blocks,
            Tally {
                count: 1,
                bytes: 8192
            }
        );
        assert_eq!(census.object_blocks, vec![(0x10000, 4096, 64)]);
    }

    #[test]
    fn a_buffer_is_named_after_the_typed_object_pointing_into_it() {
        // An Array-like object (type 28, 32 bytes) at 0x10000 whose word
        // at +16 points 16 bytes into a large untyped buffer at 0x20000;
        // another large untyped object at 0x30000 nobody points to.
        let mut small = vec![0u8; 4096];
        small[0..4].copy_from_slice(&28u32.to_le_bytes());
        small[16..24].copy_from_slice(&0x20010u64.to_le_bytes());
        let large = |addr| HeapBlock {
            addr,
            state: BlockState::Objects {
                kind: NORMAL,
                size: 8192,
                marks: marks(&[0]),
            },
        };
        let blocks = vec![
            HeapBlock {
                addr: 0x10000,
                state: BlockState::Objects {
                    kind: NORMAL,
                    size: 32,
                    marks: marks(&[0]),
                },
            },
            large(0x20000),
            large(0x30000),
        ];
        let raw = vec![0xffu8; 16];
        let contents = vec![(0x10000, small), (0x20000, raw.clone()), (0x30000, raw)];
        let census = copy(blocks, contents).census(&|w, _| w == 28);
        assert_eq!(census.words[&(NORMAL, Word::Type(28))].count, 1);
        assert_eq!(
            census.words[&(NORMAL, Word::HeldBy(28))],
            Tally {
                count: 1,
                bytes: 8192
            }
        );
        assert_eq!(
            census.words[&(NORMAL, Word::Untyped)],
            Tally {
                count: 1,
                bytes: 8192
            }
        );
    }

    #[test]
    fn an_empty_buffer_is_live_a_free_list_entry_is_not() {
        // 32-byte normal objects at 0x10000: object 0 typed (id 28) points
        // to object 2, all zeros (an empty buffer); object 3, all zeros
        // too, is pointed to by nothing (a free list's last entry).
        let mut data = vec![0u8; 4096];
        data[0..4].copy_from_slice(&28u32.to_le_bytes());
        data[8..16].copy_from_slice(&0x10040u64.to_le_bytes());
        let block = HeapBlock {
            addr: 0x10000,
            state: BlockState::Objects {
                kind: NORMAL,
                size: 32,
                marks: marks(&[0, 4, 6]),
            },
        };
        let census = copy(vec![block], vec![(0x10000, data)]).census(&|w, _| w == 28);
        let class = census.classes[&(NORMAL, 32)];
        assert_eq!(
            class.live,
            Tally {
                count: 2,
                bytes: 64
            }
        );
        assert_eq!(
            class.free_list,
            Tally {
                count: 1,
                bytes: 32
            }
        );
        assert_eq!(census.words[&(NORMAL, Word::HeldBy(28))].count, 1);
        assert_eq!(census.object_blocks, vec![(0x10000, 4096, 64)]);
    }

    #[test]
    fn retained_bytes_count_each_reachable_byte_once() {
        // 32-byte normal objects at 0x10000: A (id 1) at 0 points to B (id
        // 2) at 32 and to C (id 3) at 64; B points to C too; C points back
        // to A through an interior pointer. D (id 2) at 96 points to nothing.
        let mut data = vec![0u8; 4096];
        let mut object = |at: usize, id: u32, refs: &[u64]| {
            data[at..at + 4].copy_from_slice(&id.to_le_bytes());
            for (k, r) in refs.iter().enumerate() {
                data[at + 8 + 8 * k..at + 16 + 8 * k].copy_from_slice(&r.to_le_bytes());
            }
        };
        object(0, 1, &[0x10020, 0x10040]);
        object(32, 2, &[0x10040]);
        object(64, 3, &[0x10008]);
        object(96, 2, &[]);
        let block = HeapBlock {
            addr: 0x10000,
            state: BlockState::Objects {
                kind: NORMAL,
                size: 32,
                marks: marks(&[0, 2, 4, 6]),
            },
        };
        let copy = copy(vec![block], vec![(0x10000, data)]);
        let census = copy.census(&|w, _| (1..=3).contains(&w));
        let retained = copy.retained(&census.objects, &copy.graph(&census.objects));
        // A reaches A, B, C; type 2 (B and D) reaches B, C, A, D; C reaches C, A, B.
        assert_eq!(retained, BTreeMap::from([(1, 96), (2, 128), (3, 96)]));
    }

    #[test]
    fn a_large_object_takes_whole_blocks() {
        let block = HeapBlock {
            addr: 0x20000,
            state: BlockState::Objects {
                kind: PTRFREE,
                size: 10000,
                marks: marks(&[0]),
            },
        };
        let mut head = vec![0u8; 16];
        head[0..4].copy_from_slice(&1u32.to_le_bytes());
        let census = copy(vec![block], vec![(0x20000, head)]).census(&|w, _| w < 1000);
        let class = census.classes[&(PTRFREE, 10000)];
        assert_eq!((class.live.count, class.block_bytes), (1, 12288));
        assert_eq!(census.words[&(PTRFREE, Word::Type(1))].bytes, 10000);
    }
}
