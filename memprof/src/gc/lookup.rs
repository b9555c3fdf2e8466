//! The collector's verdict on one object, read from the target's memory
//! with a [`MarkLayout`]: what `GC_base(p) == p && GC_is_marked(p)` says in
//! the process, and why.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use std::io;

use super::layout::MarkLayout;

/// The collector's view of an address that was an object's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Marked at the last collection: live.
    Marked,
    /// In a block of objects, at an object's start, not marked: collected.
    Unmarked,
    /// No heap block there (never was, or its header is gone): collected.
    NoBlock,
    /// Inside a larger object's later blocks (a forwarding count): the
    /// object that started here is gone.
    Forwarded,
    /// The block is free.
    FreeBlock,
    /// Not an object start for the block's current object size: the block
    /// was reused for another size.
    NotAnObject,
}

impl Verdict {
    /// What `GC_base(p) == p && GC_is_marked(p)` says.
    pub fn is_live(self) -> bool {
        self == Verdict::Marked
    }
}

/// Longest bottom-index hash chain followed (they are a few entries long).
const MAX_CHAIN: usize = 1 << 16;

impl MarkLayout {
    #[cfg(test)]
    /// The verdict on `p` (an address `GC_malloc` returned), reading the
    /// target through `read(address, buffer)`; `bias` is the module's
    /// run-time minus link-time address. Follows `GC_base` and
    /// `GC_is_marked`: block index, header checks, mark byte.
    pub fn verdict(
        &self,
        p: u64,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Verdict> {
        Ok(self.judge(p, bias, read)?.0)
    }

    #[cfg(test)]
    /// [`Self::verdict`], and the object's size as the GC counts it (its
    /// block's object size, `hb_sz`) when it is [`Verdict::Marked`] or
    /// [`Verdict::Unmarked`], else 0.
    pub fn judge(
        &self,
        p: u64,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<(Verdict, u64)> {
        let arrays = self.arrays_at(bias, read)?;
        let block = self.block(p & !(self.hblksize() - 1), arrays, read)?;
        Ok(self.verdict_in(p, &block))
    }

    /// Where `GC_arrays` is in the target (through its GOT slot when the
    /// library has one: the executable may hold a copy-relocated one).
    pub fn arrays_at(
        &self,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<u64> {
        Ok(match self.arrays_slot {
            Some(slot) => load(read, slot.wrapping_add(bias), 8)?,
            None => self.arrays.wrapping_add(bias),
        })
    }

    /// The bottom index of region `hi` (`block >> key_shift`): through
    /// `top_index` and its hash chain, else `GC_all_nils` (`nils`).
    fn bottom_index(
        &self,
        hi: u64,
        arrays: u64,
        nils: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<u64> {
        let mut bi = load(read, arrays + self.top_index + (hi & self.top_mask) * 8, 8)?;
        let mut steps = 0;
        while bi != nils && load(read, bi + self.bi_key, 8)? != hi {
            bi = load(read, bi + self.bi_hash_link, 8)?;
            steps += 1;
            if steps > MAX_CHAIN {
                return Err(io::Error::other("bottom index chain does not end"));
            }
        }
        Ok(bi)
    }

    /// Every entry of the collector's block index that is a header: the
    /// heap blocks it knows (objects or free), as `(block address, header
    /// address)` ascending. Walks `top_index` and each slot's hash chain to
    /// `GC_all_nils`, reading each bottom index's entries once; entries
    /// that are 0 or a forwarding count (the later blocks of a large
    /// object) are left out.
    pub fn every_block(
        &self,
        arrays: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Vec<(u64, u64)>> {
        let nils = load(read, arrays + self.all_nils, 8)?;
        let slots = (self.top_mask + 1) as usize;
        let mut top = vec![0u8; slots * 8];
        read(arrays + self.top_index, &mut top)?;
        let word = |bytes: &[u8], i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let mut entries = vec![0u8; (self.bottom_mask + 1) as usize * 8];
        let mut seen = std::collections::HashSet::new();
        let mut blocks = Vec::new();
        for slot in 0..slots {
            let mut bi = word(&top, slot * 8);
            let mut steps = 0;
            while bi != nils && bi != 0 && seen.insert(bi) {
                let hi = load(read, bi + self.bi_key, 8)?;
                read(bi + self.bi_index, &mut entries)?;
                for j in 0..=self.bottom_mask as usize {
                    let hdr = word(&entries, j * 8);
                    if hdr > self.max_forward {
                        let block = (hi << self.key_shift) | ((j as u64) << self.log_hblksize);
                        blocks.push((block, hdr));
                    }
                }
                bi = load(read, bi + self.bi_hash_link, 8)?;
                steps += 1;
                if steps > MAX_CHAIN {
                    return Err(io::Error::other("bottom index chain does not end"));
                }
            }
        }
        blocks.sort_unstable();
        Ok(blocks)
    }

    #[cfg(test)]
    /// What the GC's block index and header say about the heap block at
    /// `block` (a multiple of the block size); `arrays` from [`Self::arrays_at`].
    /// Objects in one block share it: a pass reads it once per block.
    pub fn block(
        &self,
        block: u64,
        arrays: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Block> {
        let hi = block >> self.key_shift;
        let nils = load(read, arrays + self.all_nils, 8)?;
        let bi = self.bottom_index(hi, arrays, nils, read)?;
        let hdr = load(
            read,
            bi + self.bi_index + ((block >> self.log_hblksize) & self.bottom_mask) * 8,
            8,
        )?;
        if hdr == 0 {
            return Ok(Block::Not(Verdict::NoBlock));
        }
        if hdr <= self.max_forward {
            return Ok(Block::Not(Verdict::Forwarded));
        }
        if load(read, hdr + self.hb_flags, 1)? as u8 & self.free_blk != 0 {
            return Ok(Block::Not(Verdict::FreeBlock));
        }
        let size = load(read, hdr + self.hb_sz, 8)?;
        // One mark byte per granule of the block (and the GC's end
        // marker), kept as one bit each.
        let mut bytes = [0u8; 4097];
        let n = (self.hblksize() >> self.granule_shift) as usize + 1;
        let bytes = bytes
            .get_mut(..n)
            .ok_or_else(|| io::Error::other("more granules per block than memprof reads"))?;
        read(hdr + self.hb_marks, bytes)?;
        Ok(Block::Objects {
            size,
            marks: mark_bits(bytes),
        })
    }

    /// The headers of every block of `starts` (ascending), as raw memory:
    /// each bottom index's entries are read once per region, and the pages
    /// holding the headers in as few reads as they have contiguous runs.
    /// What the headers say is decoded later ([`Self::block_in`]): this is
    /// the part of a pass the collector is held for.
    pub fn read_headers(
        &self,
        starts: &[u64],
        arrays: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Headers> {
        let nils = load(read, arrays + self.all_nils, 8)?;
        let mut entries = vec![0u8; (self.bottom_mask + 1) as usize * 8];
        // The region (`block >> key_shift`) whose entries are in `entries`.
        let mut region = None;
        let mut hdrs = Vec::with_capacity(starts.len());
        for &block in starts {
            let hi = block >> self.key_shift;
            if region != Some(hi) {
                let bi = self.bottom_index(hi, arrays, nils, read)?;
                // GC_all_nils's entries are all 0 (no block).
                read(bi + self.bi_index, &mut entries)?;
                region = Some(hi);
            }
            let i = ((block >> self.log_hblksize) & self.bottom_mask) as usize;
            hdrs.push(u64::from_le_bytes(
                entries[i * 8..i * 8 + 8].try_into().unwrap(),
            ));
        }
        self.read_header_pages(hdrs, None, read)
    }

    /// The memory of the headers at `hdrs` (entries of bottom indices:
    /// 0 and forwarding counts are kept, not read), in as few reads as
    /// the pages holding them have contiguous runs; `also`: one more
    /// header byte to read (the census's `hb_obj_kind`).
    pub fn read_header_pages(
        &self,
        hdrs: Vec<u64>,
        also: Option<u64>,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Headers> {
        // The pages the headers' fields are in, then runs of neighbours.
        let (first, end) = self.header_span();
        let (first, end) = match also {
            Some(off) => (first.min(off), end.max(off + 1)),
            None => (first, end),
        };
        let mut pages: Vec<u64> = hdrs
            .iter()
            .filter(|&&h| h > self.max_forward)
            .flat_map(|&h| ((h + first) / PAGE)..=((h + end - 1) / PAGE))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        // One buffer for all the runs: a mapping of its own, given back
        // whole when the pass ends (runs of their own would come from the
        // heap, which keeps the most a pass ever read).
        let page = PAGE as usize;
        let mut data = vec![0u8; pages.len() * page];
        let mut runs: Vec<(u64, usize)> = Vec::new();
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 && j - i < MAX_RUN_PAGES {
                j += 1;
            }
            read(pages[i] * PAGE, &mut data[i * page..j * page])?;
            runs.push((pages[i] * PAGE, i * page));
            i = j;
        }
        Ok(Headers { hdrs, runs, data })
    }

    /// Where in a header its fields are: `[first, end)` from its start.
    fn header_span(&self) -> (u64, u64) {
        let granules = (self.hblksize() >> self.granule_shift) + 1;
        let first = self.hb_flags.min(self.hb_sz).min(self.hb_marks);
        let end = (self.hb_flags + 1)
            .max(self.hb_sz + 8)
            .max(self.hb_marks + granules);
        (first, end)
    }

    /// What the `i`-th header of `headers` says ([`Self::block`]).
    pub fn block_in(&self, headers: &Headers, i: usize) -> io::Result<Block> {
        let hdr = headers.hdrs[i];
        if hdr == 0 {
            return Ok(Block::Not(Verdict::NoBlock));
        }
        if hdr <= self.max_forward {
            return Ok(Block::Not(Verdict::Forwarded));
        }
        let (first, end) = self.header_span();
        let bytes = headers
            .bytes(hdr + first, (end - first) as usize)
            .ok_or_else(|| io::Error::other(format!("header {hdr:#x} was not read")))?;
        let field = |off: u64| (off - first) as usize;
        if bytes[field(self.hb_flags)] & self.free_blk != 0 {
            return Ok(Block::Not(Verdict::FreeBlock));
        }
        let sz = field(self.hb_sz);
        let size = u64::from_le_bytes(bytes[sz..sz + 8].try_into().unwrap());
        Ok(Block::Objects {
            size,
            marks: mark_bits(&bytes[field(self.hb_marks)..]),
        })
    }

    /// The verdict on object `p` in its block (see [`Self::block`]), and
    /// its size as the GC counts it when it is an object.
    pub fn verdict_in(&self, p: u64, block: &Block) -> (Verdict, u64) {
        let (size, marks) = match block {
            Block::Not(verdict) => return (*verdict, 0),
            Block::Objects { size, marks } => (*size, marks),
        };
        let in_block = p & (self.hblksize() - 1);
        // GC_base: objects are laid out from the block start, `size` apart;
        // one larger than a block starts at the block.
        if size == 0 || !p.is_multiple_of(8) || !in_block.is_multiple_of(size) {
            return (Verdict::NotAnObject, 0);
        }
        if size <= self.hblksize() && in_block + size > self.hblksize() {
            return (Verdict::NotAnObject, 0);
        }
        let granule = (in_block >> self.granule_shift) as usize;
        match marks.get(granule / 64) {
            Some(&word) if word >> (granule % 64) & 1 != 0 => (Verdict::Marked, size),
            _ => (Verdict::Unmarked, size),
        }
    }
}

/// Block headers as read at a hold ([`MarkLayout::read_headers`]).
pub struct Headers {
    /// Per block: its header's address (0: no block; up to the layout's
    /// `max_forward`: a forwarding count).
    hdrs: Vec<u64>,
    /// Runs of pages read: (address, offset in `data`), ascending in both.
    runs: Vec<(u64, usize)>,
    /// The runs' bytes, back to back.
    data: Vec<u8>,
}

impl Headers {
    /// The little-endian field of `len` bytes (1 to 8) at offset `off` of
    /// the `i`-th header, if it was read.
    pub fn field(&self, i: usize, off: u64, len: usize) -> Option<u64> {
        let hdr = *self.hdrs.get(i)?;
        let mut word = [0u8; 8];
        word.get_mut(..len)?
            .copy_from_slice(self.bytes(hdr + off, len)?);
        Some(u64::from_le_bytes(word))
    }

    /// The `len` bytes read at `addr`, if read: in one run, or going on
    /// into the next when that one starts where it ends (their bytes are
    /// neighbours in `data` too).
    fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let run = self
            .runs
            .partition_point(|(at, _)| *at <= addr)
            .checked_sub(1)?;
        let (mut at, start) = self.runs[run];
        let from = start + (addr - at) as usize;
        // The address each following run must start at to be contiguous.
        let mut next = run + 1;
        let mut end_of_run = self.runs.get(next).map_or(self.data.len(), |r| r.1);
        at += (end_of_run - start) as u64;
        while end_of_run < from + len {
            let &(next_at, _) = self.runs.get(next)?;
            if next_at != at {
                return None;
            }
            next += 1;
            let next_end = self.runs.get(next).map_or(self.data.len(), |r| r.1);
            at += (next_end - end_of_run) as u64;
            end_of_run = next_end;
        }
        self.data.get(from..from + len)
    }
}

/// Bytes of the target's pages.
const PAGE: u64 = 4096;
/// Longest run of pages read at once.
const MAX_RUN_PAGES: usize = 256;

/// A heap block as its header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// No live block of objects there: every object that was in it is dead.
    Not(Verdict),
    /// A block of objects of `size` bytes, and its mark bits (one per granule).
    Objects { size: u64, marks: Box<[u64]> },
}

/// One bit per mark byte.
fn mark_bits(bytes: &[u8]) -> Box<[u64]> {
    let mut marks = vec![0u64; bytes.len().div_ceil(64)];
    for (i, &b) in bytes.iter().enumerate() {
        marks[i / 64] |= ((b != 0) as u64) << (i % 64);
    }
    marks.into_boxed_slice()
}

/// Little-endian unsigned of `len` bytes (8 or 1) at `addr`.
fn load(
    read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    addr: u64,
    len: usize,
) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    read(addr, &mut buf[..len])?;
    Ok(u64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::Headers;

    #[test]
    fn a_header_straddling_two_runs_is_joined() {
        let data = [[1u8; 0x1000], [2; 0x1000], [3; 0x1000]].concat();
        let headers = Headers {
            hdrs: Vec::new(),
            runs: vec![(0x1000, 0), (0x2000, 0x1000), (0x4000, 0x2000)],
            data,
        };
        assert_eq!(headers.bytes(0x1ffe, 4).unwrap(), &[1, 1, 2, 2]);
        assert_eq!(headers.bytes(0x2000, 2).unwrap(), &[2, 2]);
        assert_eq!(headers.bytes(0x4ffe, 2).unwrap(), &[3, 3]);
        assert!(headers.bytes(0x4fff, 2).is_none());
        // Not contiguous: 0x3000.. was not read.
        assert!(headers.bytes(0x2ffe, 4).is_none());
        assert!(headers.bytes(0x800, 4).is_none());
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::gc::Verdict;
        // Debian 8.2.2's layout (the tests' own).
        let layout = crate::gc::tests::debian_layout(0x2d920, None);
        // Memory of zeros: top_index[…] is GC_all_nils (0), whose index[] entries are 0: no block.
        let mut zeros = |_addr: u64, buf: &mut [u8]| {
            buf.fill(0);
            Ok(())
        };
        assert_eq!(
            layout.verdict(0x7f00_0000_1000, 0, &mut zeros).unwrap(),
            Verdict::NoBlock
        );
    }
}
