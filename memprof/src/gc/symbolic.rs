//! libgc's header lookup, as the symbolic explorer ([`crate::x86::explore`])
//! sees it: the roles of the values `HDR(p)` and `GC_is_marked` load, and
//! the facts each read, comparison and return shows.
//!
//! | role | meaning |
//! |---|---|
//! | [`Gc::Bi`] | a `bottom_index *` read from `top_index[…]` |
//! | [`Gc::BiWord`] | a word of a bottom index (its `key` or its `hash_link`) |
//! | [`Gc::Hdr`] | an `hdr *` read from `bi->index[…]` |
//! | [`Gc::HdrField`], [`Gc::HdrBits`] | a header field, some bits of a header byte |
//! | [`Gc::Mark`] | the mark byte |
//!
//! Each memory read whose address combines these in the shape `HDR(p)` and
//! `GC_is_marked` use is recorded as a [`Facts`] entry: the top-level array
//! and its index bits, the bottom index fields, the mark byte. The callers
//! ([`super::layout`], [`super::heap_stats`]) then demand that every fact
//! has exactly one value; anything else means the code is not shaped as
//! expected.
use std::collections::BTreeSet;

use crate::modules::Module;
use crate::x86::explore::{self, Hooks, Read};
use crate::x86::value::{self, Role};

pub(crate) use crate::x86::value::{Bits, Word, WordSum};

type V = value::V<Gc>;
type Base = value::Base<Gc>;

/// What a value loaded by libgc's lookup code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Gc {
    /// A `bottom_index *` loaded from the top-level array.
    Bi,
    /// A word loaded from a `bottom_index` at this offset (its `key` or its `hash_link`).
    BiWord(u64),
    /// A block header pointer loaded from a bottom index.
    Hdr,
    /// A header field: offset and size in bytes.
    HdrField(u64, u32),
    /// Bits of a header byte: offset, mask (`hb_flags & FREE_BLK` computed apart from its test).
    HdrBits(u64, u64),
    /// The mark byte.
    Mark,
}

impl Role for Gc {
    // Small values survive truncation.
    fn width(self) -> Option<u32> {
        match self {
            Gc::Mark | Gc::HdrBits(..) => Some(1),
            Gc::HdrField(_, size) if size > 0 => Some(size),
            _ => None,
        }
    }

    fn and_small(self, k: u64) -> Option<Gc> {
        match self {
            Gc::HdrField(off, 1) => Some(Gc::HdrBits(off, k)),
            _ => None,
        }
    }
}

fn role(gc: Gc) -> V {
    V::of(Base::Role(gc))
}

/// What the explored paths showed. Sets, so that the caller can demand one value each.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Reads of `array[bits]` at `(slot's address or 0) + offset`:
    /// `(slot, offset, the base register's value when the code split a
    /// plain address off, index bits)`.
    pub top: BTreeSet<(Option<u64>, u64, Option<u64>, Bits)>,
    /// `bi->word[off]` compared with `bits`: the bottom index key.
    pub key: BTreeSet<(u64, Bits)>,
    /// Offsets of `bi` words followed as the next `bottom_index *`.
    pub link: BTreeSet<u64>,
    /// Globals a `bottom_index *` is compared with (the end of a hash chain),
    /// as `(slot, offset)` like [`Self::top`].
    pub nils: BTreeSet<(Option<u64>, u64)>,
    /// `bi->index[bits]` reads: offset of the array in the bottom index, index bits.
    pub bottom: BTreeSet<(u64, Bits)>,
    /// Byte reads `hdr[off + bits]`: where the mark bytes start, granule bits.
    pub marks: BTreeSet<(u64, Bits)>,
    /// `test` of a header byte: `(offset, bits tested)`.
    pub flag_tests: BTreeSet<(u64, u64)>,
    /// Constants an `hdr *` is compared with (the forwarding-count limit).
    pub hdr_limits: BTreeSet<u64>,
    /// What `%rax` held at each return from the function.
    pub returns: BTreeSet<ReturnValue>,
    /// Why some paths were cut short (for error messages).
    pub cut: BTreeSet<String>,
}

/// A return value, reduced to what matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ReturnValue {
    MarkByte,
    HdrField(u64, u32),
    /// Global words added and subtracted (one word read: a sum of one).
    Words(WordSum),
    Zero,
    Other,
}

/// Explores the function at `entry` with `p` in `%rdi` and returns what it saw.
pub(crate) fn explore(module: &Module, entry: u64) -> Facts {
    let mut facts = Facts::default();
    facts.cut = explore::explore(module, entry, &mut facts);
    facts
}

impl Hooks for Facts {
    type Role = Gc;

    fn load(&mut self, read: Read<Gc>) -> Option<V> {
        let Read {
            base,
            off,
            idx,
            size,
            base_value,
        } = read;
        Some(match (base, idx, size) {
            (Base::Abs, Some((bits, 8)), 8) => {
                self.top.insert((None, off, base_value, bits));
                role(Gc::Bi)
            }
            (Base::Slot(slot), Some((bits, 8)), 8) => {
                self.top.insert((Some(slot), off, None, bits));
                role(Gc::Bi)
            }
            (Base::Role(Gc::Bi | Gc::BiWord(_)), _, 8) | (Base::Global(..), Some(_), 8) => {
                if let Base::Role(Gc::BiWord(link)) = base {
                    self.link.insert(link);
                }
                match idx {
                    None => role(Gc::BiWord(off)),
                    Some((bits, 8)) => {
                        self.bottom.insert((off, bits));
                        role(Gc::Hdr)
                    }
                    Some(_) => V::Unknown,
                }
            }
            (Base::Role(Gc::Hdr), None, _) => role(Gc::HdrField(off, size)),
            (Base::Role(Gc::Hdr), Some((bits, 1)), 1) => {
                self.marks.insert((off, bits));
                role(Gc::Mark)
            }
            _ => return None,
        })
    }

    fn compare(&mut self, a: V, b: V, test: bool) {
        for (x, y) in [(a, b), (b, a)] {
            match (x.role(), y, y.as_imm()) {
                (Some(Base::Role(Gc::BiWord(off))), V::Bits(bits), _) if !test => {
                    self.key.insert((off, bits));
                }
                (Some(Base::Role(bi @ (Gc::Bi | Gc::BiWord(_)))), _, _) if !test => {
                    if let Some(Base::Global(slot, off)) = y.role() {
                        self.nils.insert((slot, off));
                        if let Gc::BiWord(link) = bi {
                            self.link.insert(link);
                        }
                    }
                }
                // (Comparing with 0 is the null check.)
                (Some(Base::Role(Gc::Hdr)), _, Some(limit)) if !test && limit != 0 => {
                    self.hdr_limits.insert(limit);
                }
                (Some(Base::Role(Gc::HdrField(off, 1))), _, Some(bits)) if test => {
                    self.flag_tests.insert((off, bits));
                }
                // `and $4,%eax` first, then `test %eax,%eax` or `cmp $0,%eax`.
                (Some(Base::Role(Gc::HdrBits(off, bits))), _, _)
                    if (test && y == x) || (!test && y.as_imm() == Some(0)) =>
                {
                    self.flag_tests.insert((off, bits));
                }
                _ => {}
            }
        }
    }

    fn returned(&mut self, rax: V) {
        let value = match rax.role() {
            Some(Base::Role(Gc::Mark)) => ReturnValue::MarkByte,
            Some(Base::Role(Gc::HdrField(off, size))) => ReturnValue::HdrField(off, size),
            _ if rax.as_imm() == Some(0) => ReturnValue::Zero,
            _ => match rax.words() {
                Some(sum) => ReturnValue::Words(sum),
                None => ReturnValue::Other,
            },
        };
        self.returns.insert(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_gc_pointers_do_not_add() {
        let sum = value::compose(&[(role(Gc::Hdr), 1), (role(Gc::Bi), 1)], 0);
        assert_eq!(sum, V::Unknown);
    }
}
