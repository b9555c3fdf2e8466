//! The collector's verdict on one object, read from the target's memory
//! with a [`MarkLayout`]: what `GC_base(p) == p && GC_is_marked(p)` says in
//! the process, and why.
//!
//! ```
//! use memprof::gc::{MarkLayout, Verdict};
//! let layout = MarkLayout {
//!     arrays: 0x2d920, arrays_slot: None, top_index: 0x289f0, all_nils: 0xc0, key_shift: 22, top_mask: 0x7ff,
//!     bi_key: 0x2010, bi_hash_link: 0x2018, bi_index: 0, log_hblksize: 12, bottom_mask: 0x3ff,
//!     hb_marks: 0x40, granule_shift: 4, hb_flags: 0x19, free_blk: 4, hb_sz: 0x20,
//!     max_forward: 0xfff,
//! };
//! // Memory of zeros: top_index[…] is GC_all_nils (0), whose index[] entries are 0: no block.
//! let mut zeros = |_addr: u64, buf: &mut [u8]| {
//!     buf.fill(0);
//!     Ok(())
//! };
//! assert_eq!(layout.verdict(0x7f00_0000_1000, 0, &mut zeros).unwrap(), Verdict::NoBlock);
//! ```
use std::io;

use super::MarkLayout;

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

    /// [`Self::verdict`], and the object's size as the GC counts it (its
    /// block's object size, `hb_sz`) when it is [`Verdict::Marked`] or
    /// [`Verdict::Unmarked`], else 0.
    pub fn judge(
        &self,
        p: u64,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<(Verdict, u64)> {
        // Little-endian unsigned of `len` bytes (8 or 1).
        let mut load = |addr: u64, len: usize| -> io::Result<u64> {
            let mut buf = [0u8; 8];
            read(addr, &mut buf[..len])?;
            Ok(u64::from_le_bytes(buf))
        };
        let arrays = match self.arrays_slot {
            Some(slot) => load(slot.wrapping_add(bias), 8)?,
            None => self.arrays.wrapping_add(bias),
        };
        let hi = p >> self.key_shift;
        let nils = load(arrays + self.all_nils, 8)?;
        let mut bi = load(arrays + self.top_index + (hi & self.top_mask) * 8, 8)?;
        let mut steps = 0;
        while bi != nils && load(bi + self.bi_key, 8)? != hi {
            bi = load(bi + self.bi_hash_link, 8)?;
            steps += 1;
            if steps > MAX_CHAIN {
                return Err(io::Error::other("bottom index chain does not end"));
            }
        }
        let hdr = load(
            bi + self.bi_index + ((p >> self.log_hblksize) & self.bottom_mask) * 8,
            8,
        )?;
        if hdr == 0 {
            return Ok((Verdict::NoBlock, 0));
        }
        if hdr <= self.max_forward {
            return Ok((Verdict::Forwarded, 0));
        }
        if load(hdr + self.hb_flags, 1)? as u8 & self.free_blk != 0 {
            return Ok((Verdict::FreeBlock, 0));
        }
        let size = load(hdr + self.hb_sz, 8)?;
        let in_block = p & (self.hblksize() - 1);
        // GC_base: objects are laid out from the block start, `size` apart;
        // one larger than a block starts at the block.
        if size == 0 || !p.is_multiple_of(8) || !in_block.is_multiple_of(size) {
            return Ok((Verdict::NotAnObject, 0));
        }
        if size <= self.hblksize() && in_block + size > self.hblksize() {
            return Ok((Verdict::NotAnObject, 0));
        }
        let mark = load(hdr + self.hb_marks + (in_block >> self.granule_shift), 1)?;
        let verdict = if mark != 0 {
            Verdict::Marked
        } else {
            Verdict::Unmarked
        };
        Ok((verdict, size))
    }
}
