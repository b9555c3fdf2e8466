//! The values the symbolic explorer ([`super::explore`]) tracks, and their
//! arithmetic: what a register holds in terms of the explored function's
//! first argument `p`, of constants and link-time addresses, of the stack,
//! of GOT slots and of global words; plus the roles a caller's
//! [`super::explore::Hooks`] gives to values it recognizes.
//!
//! | value | meaning |
//! |---|---|
//! | [`Bits`] `{shift, mask}` | `(p >> shift) & mask` (also `p & ~0xfff`, `p - (p & ~0xfff)`) |
//! | `Ptr { base: Abs, off }` | a plain number: a constant or a link-time address |
//! | `Ptr { base: Slot(s), … }` | the address a GOT slot holds (`mov GC_arrays@GOTPCREL(%rip),%rcx`) |
//! | `Ptr { base: Stack, off }` | the entry `%rsp` + `off` (spills, pushes, return addresses) |
//! | `Ptr { base: Global(s, off), … }` | a global word read from memory |
//! | `Ptr { base: Role(r), … }` | a value the caller's hooks recognized (a loaded structure pointer, a field) |
//! | [`WordSum`] | `±[word] ± [word] …`: global words read and added or subtracted (`GC_heapsize - GC_unmapped_bytes`) |
//!
//! ```text
//! // p - (p & ~0xfff) >> 4 == (p >> 4) & 0xff: the granule of p in its 4 KiB block.
//! let block = and(p, V::imm(!0xfff));
//! assert_eq!(shr(sub(p, block), 4), V::Bits(Bits { shift: 4, mask: 0xff }));
//! ```
use std::fmt::Debug;
use std::hash::Hash;

/// A caller's kind of value (what its [`super::explore::Hooks`] make of
/// memory reads): a pointer to one of its structures, a field, a flag.
pub(crate) trait Role: Copy + Eq + Hash + Debug {
    /// The value fits in this many bytes (survives a 32- or 8-bit write).
    fn width(self) -> Option<u32> {
        None
    }

    /// `value & k` for a constant `k <= 0xff`, if that is a role too.
    fn and_small(self, _k: u64) -> Option<Self> {
        None
    }
}

/// `(p >> shift) & mask`, with `p` the function's first argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Bits {
    pub shift: u32,
    pub mask: u64,
}

/// What a pointer-like value points into (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Base<R> {
    /// No base: the value is `off` itself.
    Abs,
    /// The stack pointer at the function's entry.
    Stack,
    /// The address stored in this GOT slot (filled at run time: an
    /// executable may interpose its own copy of the variable).
    Slot(u64),
    /// The word stored at `(slot's address or 0) + offset` (for example `GC_all_nils`).
    Global(Option<u64>, u64),
    /// The return address pushed by a followed call; `off` is where it returns.
    RetAddr,
    /// A value the caller's hooks recognized.
    Role(R),
}

/// A global word read from memory, as in [`Base::Global`]: `(GOT slot its
/// address came from, offset)`, and whether it is subtracted.
pub(crate) type Word = (Option<u64>, u64, bool);

/// Most words a [`WordSum`] holds.
const SUM_WORDS: usize = 4;

/// `Σ ±word`: the value of global words read and added or subtracted
/// (`GC_get_free_bytes` returns `GC_large_free_bytes - GC_unmapped_bytes`).
/// Terms in order, unused ones `None`; a word and its negation cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct WordSum(pub [Option<Word>; SUM_WORDS]);

impl WordSum {
    /// The words, in order.
    pub fn terms(&self) -> impl Iterator<Item = Word> + '_ {
        self.0.iter().flatten().copied()
    }

    /// `a + b`, or `a - b` when `negate`; `None` when it does not fit.
    pub fn combine(a: WordSum, b: WordSum, negate: bool) -> Option<WordSum> {
        let mut terms: Vec<Word> = a.terms().collect();
        for (slot, off, neg) in b.terms() {
            let neg = neg != negate;
            match terms
                .iter()
                .position(|&(s, o, n)| (s, o) == (slot, off) && n != neg)
            {
                Some(i) => {
                    terms.remove(i);
                }
                None => terms.push((slot, off, neg)),
            }
        }
        if terms.len() > SUM_WORDS {
            return None;
        }
        let mut sum = [None; SUM_WORDS];
        for (i, term) in terms.into_iter().enumerate() {
            sum[i] = Some(term);
        }
        Some(WordSum(sum))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum V<R> {
    Unknown,
    Bits(Bits),
    /// Global words added and subtracted.
    Words(WordSum),
    /// `base + off + bits * scale`.
    Ptr {
        base: Base<R>,
        off: u64,
        idx: Option<(Bits, u64)>,
    },
}

impl<R: Role> V<R> {
    pub fn imm(value: u64) -> V<R> {
        V::Ptr {
            base: Base::Abs,
            off: value,
            idx: None,
        }
    }

    pub fn of(base: Base<R>) -> V<R> {
        V::Ptr {
            base,
            off: 0,
            idx: None,
        }
    }

    pub fn as_imm(self) -> Option<u64> {
        match self {
            V::Ptr {
                base: Base::Abs,
                off,
                idx: None,
            } => Some(off),
            _ => None,
        }
    }

    /// The role of a value that is exactly a loaded GC word (no offset added).
    pub fn role(self) -> Option<Base<R>> {
        match self {
            V::Ptr {
                base,
                off: 0,
                idx: None,
            } if base != Base::Abs => Some(base),
            _ => None,
        }
    }

    /// The value as a sum of global words: one word read, or several combined.
    pub fn words(self) -> Option<WordSum> {
        match self {
            V::Words(sum) => Some(sum),
            _ => match self.role() {
                Some(Base::Global(slot, off)) => {
                    let mut sum = [None; SUM_WORDS];
                    sum[0] = Some((slot, off, false));
                    Some(WordSum(sum))
                }
                _ => None,
            },
        }
    }

    /// The value as the low 32 bits (a write to a 32-bit register).
    pub fn low32(self) -> V<R> {
        match self {
            V::Bits(b) => V::Bits(Bits {
                mask: b.mask & 0xffff_ffff,
                ..b
            }),
            _ => match (self.as_imm(), self.role()) {
                (Some(k), _) => V::imm(k & 0xffff_ffff),
                // Small values survive truncation.
                (_, Some(Base::Role(r))) if r.width().is_some_and(|w| w <= 4) => self,
                _ => V::Unknown,
            },
        }
    }

    /// The value as the low 8 bits.
    pub fn low8(self) -> V<R> {
        match self {
            V::Bits(b) => V::Bits(Bits {
                mask: b.mask & 0xff,
                ..b
            }),
            _ => match (self.as_imm(), self.role()) {
                (Some(k), _) => V::imm(k & 0xff),
                (_, Some(Base::Role(r))) if r.width() == Some(1) => self,
                _ => V::Unknown,
            },
        }
    }
}

/// `Σ value × scale + disp`, or `Unknown` when the sum has no meaning here
/// (two GC pointers, two indices, a scaled pointer).
pub(crate) fn compose<R: Role>(terms: &[(V<R>, u64)], disp: u64) -> V<R> {
    let (mut base, mut off, mut idx) = (Base::Abs, disp, None);
    for &(value, scale) in terms {
        match value {
            V::Unknown => return V::Unknown,
            V::Bits(b) => {
                if idx.is_some() {
                    return V::Unknown;
                }
                idx = Some((b, scale));
            }
            V::Words(_) => return V::Unknown,
            V::Ptr {
                base: b,
                off: o,
                idx: i,
            } => {
                if scale != 1 && b != Base::Abs {
                    return V::Unknown; // a scaled pointer
                }
                off = off.wrapping_add(o.wrapping_mul(scale));
                if b != Base::Abs {
                    if base != Base::Abs {
                        return V::Unknown;
                    }
                    base = b;
                }
                if let Some((bits, k)) = i {
                    if idx.is_some() {
                        return V::Unknown;
                    }
                    idx = Some((bits, k * scale));
                }
            }
        }
    }
    match (base, off, idx) {
        (Base::Abs, 0, Some((b, 1))) => V::Bits(b),
        _ => V::Ptr { base, off, idx },
    }
}

/// An index with the scale taken out of its mask: `((p >> 9) & 0x1ff8) * 1`
/// (what `shl $3` before an add leaves) is `((p >> 12) & 0x3ff) * 8`.
pub(crate) fn canonical((bits, scale): (Bits, u64)) -> (Bits, u64) {
    let zeros = bits.mask.trailing_zeros().min(63 - bits.shift);
    if bits.mask == 0 || zeros == 0 {
        return (bits, scale);
    }
    let bits = Bits {
        shift: bits.shift + zeros,
        mask: bits.mask >> zeros,
    };
    (bits, scale << zeros)
}

pub(crate) fn shr<R: Role>(value: V<R>, by: u32) -> V<R> {
    match value {
        V::Bits(b) if b.shift + by < 64 => V::Bits(Bits {
            shift: b.shift + by,
            mask: b.mask >> by,
        }),
        _ => match value.as_imm() {
            Some(k) => V::imm(k >> by),
            None => V::Unknown,
        },
    }
}

pub(crate) fn shl<R: Role>(value: V<R>, by: u32) -> V<R> {
    match value {
        // ((p >> s) & m) << t == (p >> (s - t)) & (m << t) while t <= s.
        V::Bits(b) if by <= b.shift => V::Bits(Bits {
            shift: b.shift - by,
            mask: b.mask << by,
        }),
        _ => match value.as_imm() {
            Some(k) if by < 64 => V::imm(k << by),
            _ => V::Unknown,
        },
    }
}

pub(crate) fn and<R: Role>(a: V<R>, b: V<R>) -> V<R> {
    match (a, b, a.as_imm(), b.as_imm()) {
        (_, _, Some(x), Some(y)) => V::imm(x & y),
        (field, _, _, Some(k)) | (_, field, Some(k), _) if k <= 0xff => match field.role() {
            Some(Base::Role(r)) => r.and_small(k).map_or(V::Unknown, |r| V::of(Base::Role(r))),
            _ => V::Unknown,
        },
        (V::Bits(bits), _, _, Some(k)) | (_, V::Bits(bits), Some(k), _) => V::Bits(Bits {
            mask: bits.mask & k,
            ..bits
        }),
        _ => V::Unknown,
    }
}

pub(crate) fn sub<R: Role>(a: V<R>, b: V<R>) -> V<R> {
    match (a, b) {
        // p - (p & m) == p & ~m
        (V::Bits(x), V::Bits(y)) if x.shift == y.shift && y.mask & !x.mask == 0 => V::Bits(Bits {
            shift: x.shift,
            mask: x.mask & !y.mask,
        }),
        _ => match b.as_imm() {
            Some(k) => compose(&[(a, 1)], k.wrapping_neg()),
            None => V::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No roles: the arithmetic alone.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum NoRole {}
    impl Role for NoRole {}
    type V = super::V<NoRole>;
    type Base = super::Base<NoRole>;

    fn p() -> V {
        V::Bits(Bits {
            shift: 0,
            mask: u64::MAX,
        })
    }

    #[test]
    fn block_offset_in_granules() {
        // p - (p & ~0xfff) >> 4 == (p >> 4) & 0xff
        let block = and(p(), V::imm(!0xfff));
        let granule = shr(sub(p(), block), 4);
        assert_eq!(
            granule,
            V::Bits(Bits {
                shift: 4,
                mask: 0xff
            })
        );
    }

    #[test]
    fn key_of_block_address() {
        // (p & ~0xfff) >> 22 == p >> 22
        let key = shr(and(p(), V::imm(!0xfff)), 22);
        assert_eq!(
            key,
            V::Bits(Bits {
                shift: 22,
                mask: u64::MAX >> 22
            })
        );
    }

    #[test]
    fn shift_left_restores_block() {
        // (p >> 12) << 12 == p & ~0xfff
        assert_eq!(
            shl(shr(p(), 12), 12),
            V::Bits(Bits {
                shift: 0,
                mask: !0xfff
            })
        );
    }

    #[test]
    fn scale_comes_out_of_the_mask() {
        // (p >> 12) & 0x3ff, shifted left by 3 before an add: an index scaled by 8.
        let shifted = shl(and(shr(p(), 12), V::imm(0x3ff)), 3);
        let V::Bits(bits) = shifted else {
            panic!("{shifted:?}")
        };
        assert_eq!(
            canonical((bits, 1)),
            (
                Bits {
                    shift: 12,
                    mask: 0x3ff
                },
                8
            )
        );
    }

    #[test]
    fn words_subtract_and_cancel() {
        let word = |off| V::of(Base::Global(Some(0x2cf08), off)).words().unwrap();
        // GC_heapsize - GC_unmapped_bytes
        let diff = WordSum::combine(word(0), word(0xb8), true).unwrap();
        let terms: Vec<Word> = diff.terms().collect();
        assert_eq!(
            terms,
            [(Some(0x2cf08), 0, false), (Some(0x2cf08), 0xb8, true)]
        );
        // (a - b) + b == a
        let back = WordSum::combine(diff, word(0xb8), false).unwrap();
        assert_eq!(back, word(0));
    }
}
