//! Where libgc keeps a block's header and its mark bytes, derived from the
//! machine code of the target's own `GC_is_marked`, `GC_base` and `GC_size`.
//!
//! These three exported functions contain the whole lookup an outside
//! oracle must repeat (`HDR(p)` is a macro, inlined or a call to
//! `GC_find_header`, which is then followed):
//!
//! ```text
//! GC_is_marked(p):  bi  = top_index[(p >> 22) & 0x7ff]          // GC_arrays + 0x289f0
//!                   while bi->key != p >> 22 && bi != GC_all_nils // +0x2010, GC_arrays + 0xc0
//!                       bi = bi->hash_link                       // +0x2018
//!                   hdr = bi->index[(p >> 12) & 0x3ff]           // +0
//!                   return hdr->hb_marks[(p & 0xfff) >> 4]       // +0x40, one byte per granule
//! GC_base(p):       hdr <= 0xfff: a forwarding count; hdr->hb_flags & 4: a free block (+0x19)
//! GC_size(p):       return hdr->hb_sz                            // +0x20
//! ```
//!
//! (numbers: Debian's libgc 8.2.2). [`derive_layout`] runs each function
//! symbolically (see `gc/symbolic.rs`) and accepts the result only when every
//! piece was seen exactly once and the pieces agree with each other (the key
//! shift is the block shift plus the bottom index bits, the mark index covers
//! exactly one block, …). Anything else is `unsupported libgc layout: …`:
//! memprof never guesses a layout.
//!
//! Not derived: `hb_block` (+0x10). No exported function reads it in 8.2.2,
//! and a header found through `bi->index[]` for block `h` always has
//! `hb_block == h`, so it adds no check that `hb_flags`/`hb_sz` do not.
use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{anyhow, Result};

use super::symbolic::{self, Bits, Facts, ReturnValue};
use crate::modules::Module;

/// The layout of libgc's block-header lookup and mark bytes in one module.
///
/// Addresses are link-time addresses of the module (add the load bias for
/// run-time ones); offsets are bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkLayout {
    /// The address the code indexes from: `GC_arrays` (the `_GC_arrays`
    /// struct that holds `_top_index` and `_all_nils`), at link time.
    pub arrays: u64,
    /// The GOT slot the code reads that address from, when it does (a
    /// shared libgc). Read the slot at run time: an executable that refers
    /// to `GC_arrays` gets a copy of its own (a copy relocation), and the
    /// library then uses that one, not [`Self::arrays`].
    pub arrays_slot: Option<u64>,
    /// Offset of `top_index[]` (`bottom_index *[TOP_SZ]`) in `arrays`.
    pub top_index: u64,
    /// Offset of `GC_all_nils` (a `bottom_index *`, the end of every hash chain) in `arrays`.
    pub all_nils: u64,
    /// `p >> key_shift` is a bottom index's key (LOG_HBLKSIZE + LOG_BOTTOM_SZ, 22).
    pub key_shift: u32,
    /// `top_index[(p >> key_shift) & top_mask]` (TOP_SZ - 1, 0x7ff).
    pub top_mask: u64,
    /// Offset of `key` in a bottom index (0x2010).
    pub bi_key: u64,
    /// Offset of `hash_link` in a bottom index (0x2018).
    pub bi_hash_link: u64,
    /// Offset of `index[]` (`hdr *[BOTTOM_SZ]`) in a bottom index (0).
    pub bi_index: u64,
    /// LOG_HBLKSIZE (12): a block is `1 << log_hblksize` bytes.
    pub log_hblksize: u32,
    /// `index[(p >> log_hblksize) & bottom_mask]` (BOTTOM_SZ - 1, 0x3ff).
    pub bottom_mask: u64,
    /// Offset of the mark bytes `hb_marks[]` in a header (0x40).
    pub hb_marks: u64,
    /// One mark byte per `1 << granule_shift` bytes of block (4).
    pub granule_shift: u32,
    /// Offset of the `hb_flags` byte in a header (0x19).
    pub hb_flags: u64,
    /// The `FREE_BLK` bit of `hb_flags` (4).
    pub free_blk: u8,
    /// Offset of `hb_sz` (object size in bytes, or block size for a free block) (0x20).
    pub hb_sz: u64,
    /// Index entries at or below this are forwarding counts, not headers (HBLKSIZE - 1).
    pub max_forward: u64,
}

impl MarkLayout {
    pub fn hblksize(&self) -> u64 {
        1 << self.log_hblksize
    }
}

fn unsupported(module: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("unsupported libgc layout: {what} (in {})", module.display())
}

#[cfg(test)]
/// Derives the [`MarkLayout`] of the libgc in `module` (a shared libgc or an
/// executable with libgc linked in, stripped or not: the `GC_*` functions
/// are looked up in `.dynsym` too).
///
/// (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
pub fn derive_layout(module: &Path) -> Result<MarkLayout> {
    derive(&Module::open(module)?)
}

/// [`derive_layout`] of a module already open.
pub(crate) fn derive(image: &Module) -> Result<MarkLayout> {
    image.require_x86_64()?;
    let module = image.path();
    let explore = |name: &str| -> Result<Facts> {
        let entry = image
            .symbol(name)
            .map(|s| s.address)
            .ok_or_else(|| unsupported(module, format!("{name} is not defined")))?;
        Ok(symbolic::explore(image, entry))
    };
    let marked = explore("GC_is_marked")?;
    let base = explore("GC_base")?;
    let size = explore("GC_size")?;
    let lookup = lookup_of_is_marked(module, &marked)?;
    let (hb_flags, free_blk, max_forward) = header_checks_of_base(module, &base, &lookup)?;
    let hb_sz = size_field_of_size(module, &size)?;
    let Lookup {
        top_bits,
        bi_key,
        bi_hash_link,
        bi_index,
        bottom_bits,
        hb_marks,
        mark_bits,
        ..
    } = lookup;
    check_fit(module, &lookup, free_blk, max_forward)?;
    let (arrays, arrays_slot, top_index, all_nils) = arrays_base(image, &lookup)?;
    Ok(MarkLayout {
        arrays,
        arrays_slot,
        top_index,
        all_nils,
        key_shift: top_bits.shift,
        top_mask: top_bits.mask,
        bi_key,
        bi_hash_link,
        bi_index,
        log_hblksize: bottom_bits.shift,
        bottom_mask: bottom_bits.mask,
        hb_marks,
        granule_shift: mark_bits.shift,
        hb_flags,
        free_blk: free_blk as u8,
        hb_sz,
        max_forward,
    })
}

/// The block lookup and mark byte read as `GC_is_marked` shows them.
struct Lookup {
    /// `top_index[]`: the GOT slot of the base, the offset (from the base,
    /// or the whole address), the base the code split off, and `p`'s bits.
    top_slot: Option<u64>,
    top_off: u64,
    top_base: Option<u64>,
    top_bits: Bits,
    bi_key: u64,
    key_bits: Bits,
    bi_hash_link: u64,
    /// `GC_all_nils`: as `top_index[]`, without a base.
    nils_slot: Option<u64>,
    nils_off: u64,
    bi_index: u64,
    bottom_bits: Bits,
    hb_marks: u64,
    mark_bits: Bits,
}

/// Says which function did not show what was expected, and what the
/// explorer had to skip there.
fn fail(module: &Path, func: &str, facts: &Facts, what: String) -> anyhow::Error {
    let cut: Vec<&str> = facts.cut.iter().map(String::as_str).collect();
    let cut = if cut.is_empty() {
        String::new()
    } else {
        format!("; paths cut: {}", cut.join(", "))
    };
    unsupported(module, format!("{func}: {what}{cut}"))
}

/// An error unless `count` (of `what` seen in `func`) is one.
fn expect_one(module: &Path, func: &str, facts: &Facts, what: &str, count: usize) -> Result<()> {
    if count == 1 {
        return Ok(());
    }
    Err(fail(
        module,
        func,
        facts,
        format!("expected one {what}, found {count}: {facts:?}"),
    ))
}

/// The lookup `GC_is_marked` does: each piece seen exactly once, and one
/// mark byte returned on every path.
fn lookup_of_is_marked(module: &Path, m: &Facts) -> Result<Lookup> {
    for (what, count) in [
        ("top_index read", m.top.len()),
        ("bottom index key comparison", m.key.len()),
        ("hash_link", m.link.len()),
        ("all_nils comparison", m.nils.len()),
        ("bi->index[] read", m.bottom.len()),
        ("mark byte read", m.marks.len()),
    ] {
        expect_one(module, "GC_is_marked", m, what, count)?;
    }
    if m.returns != [ReturnValue::MarkByte].into() {
        return Err(fail(
            module,
            "GC_is_marked",
            m,
            format!(
                "does not return one mark byte on every path (returns {:?}): mark bits per object or not bytes?",
                m.returns
            ),
        ));
    }
    let (top_slot, top_off, top_base, top_bits) = first(&m.top);
    let (bi_key, key_bits) = first(&m.key);
    let (nils_slot, nils_off) = first(&m.nils);
    let (bi_index, bottom_bits) = first(&m.bottom);
    let (hb_marks, mark_bits) = first(&m.marks);
    Ok(Lookup {
        top_slot,
        top_off,
        top_base,
        top_bits,
        bi_key,
        key_bits,
        bi_hash_link: first(&m.link),
        nils_slot,
        nils_off,
        bi_index,
        bottom_bits,
        hb_marks,
        mark_bits,
    })
}

/// `GC_base` must look blocks up the same way, and shows the header
/// checks: (`hb_flags` offset, the free-block bit, the forwarding-count limit).
fn header_checks_of_base(module: &Path, base: &Facts, l: &Lookup) -> Result<(u64, u64, u64)> {
    let same = base
        .top
        .iter()
        .all(|t| (t.0, t.1, t.3) == (l.top_slot, l.top_off, l.top_bits))
        && base.key.iter().all(|&k| k == (l.bi_key, l.key_bits))
        && base.link.iter().all(|&link| link == l.bi_hash_link)
        && base.nils.iter().all(|&n| n == (l.nils_slot, l.nils_off))
        && base
            .bottom
            .iter()
            .all(|&b| b == (l.bi_index, l.bottom_bits))
        && !base.bottom.is_empty();
    if !same {
        return Err(fail(
            module,
            "GC_base",
            base,
            format!("does not look blocks up like GC_is_marked: {base:?}"),
        ));
    }
    expect_one(
        module,
        "GC_base",
        base,
        "test of a header flag",
        base.flag_tests.len(),
    )?;
    expect_one(
        module,
        "GC_base",
        base,
        "forwarding-count limit",
        base.hdr_limits.len(),
    )?;
    let (hb_flags, free_blk) = first(&base.flag_tests);
    Ok((hb_flags, free_blk, first(&base.hdr_limits)))
}

/// The header word `GC_size` returns (`hb_sz`).
fn size_field_of_size(module: &Path, size: &Facts) -> Result<u64> {
    let sizes: Vec<(u64, u32)> = size
        .returns
        .iter()
        .filter_map(|r| match *r {
            ReturnValue::HdrField(off, 8) => Some((off, 8)),
            _ => None,
        })
        .collect();
    // Newer versions return 0 for NULL first.
    let other = size
        .returns
        .iter()
        .any(|r| !matches!(r, ReturnValue::Zero) && !matches!(r, ReturnValue::HdrField(_, 8)));
    if sizes.len() != 1 || other {
        return Err(fail(
            module,
            "GC_size",
            size,
            format!("does not return one header word: {:?}", size.returns),
        ));
    }
    Ok(sizes[0].0)
}

/// The pieces must fit together the way HDR() and GC_is_marked define them.
fn check_fit(module: &Path, l: &Lookup, free_blk: u64, max_forward: u64) -> Result<()> {
    let Lookup {
        top_bits,
        key_bits,
        bottom_bits,
        mark_bits,
        ..
    } = *l;
    let log_hblksize = bottom_bits.shift;
    let bottom_log = bottom_bits.mask.trailing_ones();
    let checks = [
        (
            low_ones(bottom_bits.mask) && (1..=20).contains(&bottom_log),
            "bottom index mask is not 2^n - 1",
        ),
        (
            (9..=16).contains(&log_hblksize),
            "block shift is not between 9 and 16",
        ),
        (
            top_bits.shift == log_hblksize + bottom_log,
            "top index shift is not block shift + bottom index bits",
        ),
        (
            low_ones(top_bits.mask) && top_bits.mask != 0,
            "top index mask is not 2^n - 1",
        ),
        (
            key_bits.shift == top_bits.shift && key_bits.mask == u64::MAX >> key_bits.shift,
            "key is not p >> (top index shift)",
        ),
        (
            mark_bits.shift < log_hblksize
                && mark_bits.mask == ((1u64 << log_hblksize) - 1) >> mark_bits.shift,
            "mark index is not (offset in block) >> granule shift",
        ),
        (
            max_forward == (1u64 << log_hblksize) - 1,
            "forwarding-count limit is not HBLKSIZE - 1",
        ),
        (
            free_blk.count_ones() == 1 && free_blk <= 0x80,
            "free-block flag test is not one bit of a byte",
        ),
        (
            l.bi_key != l.bi_hash_link && l.bi_key >= l.bi_index + 8 * (bottom_bits.mask + 1),
            "bottom index key/hash_link overlap its index array",
        ),
    ];
    if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(unsupported(module, what));
    }
    Ok(())
}

/// Where `top_index[]` and `GC_all_nils` are: (`GC_arrays` at link time,
/// its GOT slot, their offsets in it).
fn arrays_base(image: &Module, l: &Lookup) -> Result<(u64, Option<u64>, u64, u64)> {
    let module = image.path();
    // Through a GOT slot, offsets are as the code has them. From a plain
    // address: relative to the base the code split off
    // (`lea GC_arrays(%rip),%rax; mov 0x289f0(%rax,…)`), or else to the
    // exported `GC_arrays`.
    match (l.top_slot, l.nils_slot) {
        (Some(slot), Some(same)) if slot == same => {
            let arrays = image
                .slot_value(slot)
                .ok_or_else(|| unsupported(module, "GOT slot of GC_arrays not resolved"))?;
            Ok((arrays, Some(slot), l.top_off, l.nils_off))
        }
        (None, None) => {
            let arrays = l
                .top_base
                .or_else(|| image.symbol("GC_arrays").map(|s| s.address))
                .filter(|&a| a <= l.top_off && a <= l.nils_off)
                .ok_or_else(|| {
                    unsupported(
                        module,
                        "cannot tell the GC_arrays base of top_index and all_nils",
                    )
                })?;
            Ok((arrays, None, l.top_off - arrays, l.nils_off - arrays))
        }
        _ => Err(unsupported(
            module,
            "top_index and all_nils are not reached the same way",
        )),
    }
}

/// The element of a set checked to hold exactly one.
fn first<T: Copy>(set: &BTreeSet<T>) -> T {
    *set.iter().next().expect("checked: one element")
}

/// `mask` is `2^n - 1`.
fn low_ones(mask: u64) -> bool {
    mask & mask.wrapping_add(1) == 0
}

/// Offset of `hb_obj_kind` in a block header (0x18 in 8.2.2): the kind of
/// the block's objects (0 pointer-free, 1 normal, 2 uncollectable, 3
/// atomic uncollectable, then kinds a program adds). Derived from the
/// exported `GC_get_kind_and_size(p, &size)`, which looks the block up as
/// `GC_is_marked` does and returns that byte (libgc 7.2 and later).
pub(crate) fn kind_offset(image: &Module, layout: &MarkLayout) -> Result<u64> {
    let module = image.path();
    let entry = image
        .symbol("GC_get_kind_and_size")
        .map(|s| s.address)
        .ok_or_else(|| unsupported(module, "GC_get_kind_and_size is not defined"))?;
    let facts = symbolic::explore(image, entry);
    let same_lookup = !facts.bottom.is_empty()
        && facts
            .bottom
            .iter()
            .all(|&(off, bits)| off == layout.bi_index && bits.shift == layout.log_hblksize);
    let kinds: Vec<u64> = facts
        .returns
        .iter()
        .filter_map(|r| match *r {
            ReturnValue::HdrField(off, 1) => Some(off),
            _ => None,
        })
        .collect();
    match kinds[..] {
        [off] if same_lookup && facts.returns.len() == 1 && off != layout.hb_flags => Ok(off),
        _ => Err(unsupported(
            module,
            format!(
                "GC_get_kind_and_size does not return one header byte: {:?}",
                facts.returns
            ),
        )),
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        let layout = crate::gc::derive_layout("/usr/lib/x86_64-linux-gnu/libgc.so.1".as_ref())?;
        assert_eq!((layout.top_index, layout.all_nils), (0x289f0, 0xc0)); // Debian 8.2.2
        Ok(())
    }
}
