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

/// Derives the [`MarkLayout`] of the libgc in `module` (a shared libgc or an
/// executable with libgc linked in, stripped or not: the `GC_*` functions
/// are looked up in `.dynsym` too).
///
/// ```no_run
/// # fn main() -> anyhow::Result<()> {
/// let layout = memprof::gc::derive_layout("/usr/lib/x86_64-linux-gnu/libgc.so.1".as_ref())?;
/// assert_eq!((layout.top_index, layout.all_nils), (0x289f0, 0xc0)); // Debian 8.2.2
/// # Ok(()) }
/// ```
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
    // Says which function did not show what was expected, and what the
    // explorer had to skip there.
    let fail = |func: &str, facts: &Facts, what: String| {
        let cut: Vec<&str> = facts.cut.iter().map(String::as_str).collect();
        let cut = if cut.is_empty() {
            String::new()
        } else {
            format!("; paths cut: {}", cut.join(", "))
        };
        unsupported(module, format!("{func}: {what}{cut}"))
    };
    let one = |func: &str, facts: &Facts, what: &str, count: usize| {
        (count != 1).then(|| {
            fail(
                func,
                facts,
                format!("expected one {what}, found {count}: {facts:?}"),
            )
        })
    };
    let m = &marked;
    for (what, count) in [
        ("top_index read", m.top.len()),
        ("bottom index key comparison", m.key.len()),
        ("hash_link", m.link.len()),
        ("all_nils comparison", m.nils.len()),
        ("bi->index[] read", m.bottom.len()),
        ("mark byte read", m.marks.len()),
    ] {
        if let Some(error) = one("GC_is_marked", m, what, count) {
            return Err(error);
        }
    }
    if m.returns != [ReturnValue::MarkByte].into() {
        return Err(fail(
            "GC_is_marked",
            m,
            format!(
                "does not return one mark byte on every path (returns {:?}): mark bits per object or not bytes?",
                m.returns
            ),
        ));
    }
    let (top_slot, top_off, top_base, top_bits): (Option<u64>, u64, Option<u64>, Bits) =
        first(&m.top);
    let (bi_key, key_bits): (u64, Bits) = first(&m.key);
    let bi_hash_link: u64 = first(&m.link);
    let (nils_slot, nils_off): (Option<u64>, u64) = first(&m.nils);
    let (bi_index, bottom_bits): (u64, Bits) = first(&m.bottom);
    let (hb_marks, mark_bits): (u64, Bits) = first(&m.marks);

    // GC_base must look blocks up the same way, and shows the header checks.
    let same = base
        .top
        .iter()
        .all(|t| (t.0, t.1, t.3) == (top_slot, top_off, top_bits))
        && base.key.iter().all(|&k| k == (bi_key, key_bits))
        && base.link.iter().all(|&l| l == bi_hash_link)
        && base.nils.iter().all(|&n| n == (nils_slot, nils_off))
        && base.bottom.iter().all(|&b| b == (bi_index, bottom_bits))
        && !base.bottom.is_empty();
    if !same {
        return Err(fail(
            "GC_base",
            &base,
            format!("does not look blocks up like GC_is_marked: {base:?}"),
        ));
    }
    if let Some(error) = one(
        "GC_base",
        &base,
        "test of a header flag",
        base.flag_tests.len(),
    )
    .or_else(|| {
        one(
            "GC_base",
            &base,
            "forwarding-count limit",
            base.hdr_limits.len(),
        )
    }) {
        return Err(error);
    }
    let (hb_flags, free_blk) = first(&base.flag_tests);
    let max_forward = first(&base.hdr_limits);
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
            "GC_size",
            &size,
            format!("does not return one header word: {:?}", size.returns),
        ));
    }
    let hb_sz = sizes[0].0;

    // The pieces must fit together the way HDR() and GC_is_marked define them.
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
            bi_key != bi_hash_link && bi_key >= bi_index + 8 * (bottom_bits.mask + 1),
            "bottom index key/hash_link overlap its index array",
        ),
    ];
    if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(unsupported(module, what));
    }

    // Through a GOT slot, offsets are as the code has them. From a plain
    // address: relative to the base the code split off
    // (`lea GC_arrays(%rip),%rax; mov 0x289f0(%rax,…)`), or else to the
    // exported `GC_arrays`.
    let (arrays, arrays_slot, top_index, all_nils) = match (top_slot, nils_slot) {
        (Some(slot), Some(same)) if slot == same => {
            let arrays = image
                .slot_value(slot)
                .ok_or_else(|| unsupported(module, "GOT slot of GC_arrays not resolved"))?;
            (arrays, Some(slot), top_off, nils_off)
        }
        (None, None) => {
            let arrays = top_base
                .or_else(|| image.symbol("GC_arrays").map(|s| s.address))
                .filter(|&a| a <= top_off && a <= nils_off)
                .ok_or_else(|| {
                    unsupported(
                        module,
                        "cannot tell the GC_arrays base of top_index and all_nils",
                    )
                })?;
            (arrays, None, top_off - arrays, nils_off - arrays)
        }
        _ => {
            return Err(unsupported(
                module,
                "top_index and all_nils are not reached the same way",
            ))
        }
    };
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
        log_hblksize,
        bottom_mask: bottom_bits.mask,
        hb_marks,
        granule_shift: mark_bits.shift,
        hb_flags,
        free_blk: free_blk as u8,
        hb_sz,
        max_forward,
    })
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
