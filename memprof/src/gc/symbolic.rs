//! A small symbolic executor for libgc's header lookup code.
//!
//! It runs a function from its entry with the first argument `p` in `%rdi`
//! and follows every path (both sides of each conditional branch, into
//! direct calls and tail jumps, through PLT stubs), tracking what each
//! register holds in terms of `p` and of the GC structures it points into:
//!
//! | value | meaning |
//! |---|---|
//! | [`Bits`] `{shift, mask}` | `(p >> shift) & mask` (also `p & ~0xfff`, `p - (p & ~0xfff)`) |
//! | `Ptr { base: Abs, off }` | a plain number: a constant or a link-time address |
//! | `Ptr { base: Slot(s), … }` | the address a GOT slot holds (`mov GC_arrays@GOTPCREL(%rip),%rcx`) |
//! | `Ptr { base: Stack, off }` | the entry `%rsp` + `off` (spills, pushes, return addresses) |
//! | `Ptr { base: Bi, … }` | a `bottom_index *` read from `top_index[…]` |
//! | `Ptr { base: Hdr, … }` | an `hdr *` read from `bi->index[…]` |
//! | [`WordSum`] | `±[word] ± [word] …`: global words read and added or subtracted (`GC_heapsize - GC_unmapped_bytes`) |
//!
//! Each memory read whose address combines these in the shape `HDR(p)` and
//! `GC_is_marked` use is recorded as a [`Facts`] entry: the top-level array
//! and its index bits, the bottom index fields, the mark byte. The caller
//! ([`super::layout`]) then demands that every fact has exactly one value;
//! anything else means the code is not shaped as expected.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpKind, Register,
};

use super::image::Image;

/// `(p >> shift) & mask`, with `p` the function's first argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Bits {
    pub shift: u32,
    pub mask: u64,
}

/// What a pointer-like value points into (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Base {
    /// No base: the value is `off` itself.
    Abs,
    /// The stack pointer at the function's entry.
    Stack,
    /// A `bottom_index *` loaded from the top-level array.
    Bi,
    /// A word loaded from a `bottom_index` at this offset (its `key` or its `hash_link`).
    BiWord(u64),
    /// The address stored in this GOT slot (filled at run time: an
    /// executable may interpose its own copy of the variable).
    Slot(u64),
    /// The word stored at `(slot's address or 0) + offset` (for example `GC_all_nils`).
    Global(Option<u64>, u64),
    /// A block header pointer loaded from a bottom index.
    Hdr,
    /// A header field: offset and size in bytes.
    HdrField(u64, u32),
    /// Bits of a header byte: offset, mask (`hb_flags & FREE_BLK` computed apart from its test).
    HdrBits(u64, u64),
    /// The mark byte.
    Mark,
    /// The return address pushed by a followed call; `off` is where it returns.
    RetAddr,
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
    fn combine(a: WordSum, b: WordSum, negate: bool) -> Option<WordSum> {
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
pub(crate) enum V {
    Unknown,
    Bits(Bits),
    /// Global words added and subtracted.
    Words(WordSum),
    /// `base + off + bits * scale`.
    Ptr {
        base: Base,
        off: u64,
        idx: Option<(Bits, u64)>,
    },
}

impl V {
    fn imm(value: u64) -> V {
        V::Ptr {
            base: Base::Abs,
            off: value,
            idx: None,
        }
    }

    fn of(base: Base) -> V {
        V::Ptr {
            base,
            off: 0,
            idx: None,
        }
    }

    fn as_imm(self) -> Option<u64> {
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
    fn role(self) -> Option<Base> {
        match self {
            V::Ptr {
                base,
                off: 0,
                idx: None,
            } if base != Base::Abs => Some(base),
            _ => None,
        }
    }

    /// The value as the low 32 bits (a write to a 32-bit register).
    /// The value as a sum of global words: one word read, or several combined.
    fn words(self) -> Option<WordSum> {
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

    fn low32(self) -> V {
        match self {
            V::Bits(b) => V::Bits(Bits {
                mask: b.mask & 0xffff_ffff,
                ..b
            }),
            _ => match (self.as_imm(), self.role()) {
                (Some(k), _) => V::imm(k & 0xffff_ffff),
                // Small values survive truncation.
                (_, Some(Base::Mark | Base::HdrField(_, 1..=4) | Base::HdrBits(..))) => self,
                _ => V::Unknown,
            },
        }
    }

    fn low8(self) -> V {
        match self {
            V::Bits(b) => V::Bits(Bits {
                mask: b.mask & 0xff,
                ..b
            }),
            _ => match (self.as_imm(), self.role()) {
                (Some(k), _) => V::imm(k & 0xff),
                (_, Some(Base::Mark | Base::HdrField(_, 1) | Base::HdrBits(..))) => self,
                _ => V::Unknown,
            },
        }
    }
}

/// `Σ value × scale + disp`, or `Unknown` when the sum has no meaning here
/// (two GC pointers, two indices, a scaled pointer).
fn compose(terms: &[(V, u64)], disp: u64) -> V {
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
fn canonical((bits, scale): (Bits, u64)) -> (Bits, u64) {
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

fn shr(value: V, by: u32) -> V {
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

fn shl(value: V, by: u32) -> V {
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

fn and(a: V, b: V) -> V {
    match (a, b, a.as_imm(), b.as_imm()) {
        (_, _, Some(x), Some(y)) => V::imm(x & y),
        (field, _, _, Some(k)) | (_, field, Some(k), _) if k <= 0xff => match field.role() {
            Some(Base::HdrField(off, 1)) => V::of(Base::HdrBits(off, k)),
            _ => V::Unknown,
        },
        (V::Bits(bits), _, _, Some(k)) | (_, V::Bits(bits), Some(k), _) => V::Bits(Bits {
            mask: bits.mask & k,
            ..bits
        }),
        _ => V::Unknown,
    }
}

fn sub(a: V, b: V) -> V {
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

const GPRS: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// Registers a call may change (System V).
const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

/// Calls followed into at most this depth.
const MAX_DEPTH: u32 = 4;
/// Instructions executed over all paths before giving up.
const MAX_STEPS: usize = 200_000;
/// Visits of one instruction after which plain numbers that changed since
/// its last visit are forgotten, so that counting loops (a spin lock's
/// `for (i = 0;; i++)`) reach a state seen before and end.
const WIDEN_AFTER: u32 = 64;

#[derive(Clone, PartialEq, Eq, Hash)]
struct State {
    ip: u64,
    regs: [V; 16],
    /// Stack words by offset from the entry `%rsp`.
    stack: BTreeMap<u64, V>,
    depth: u32,
}

impl State {
    fn reg(&self, reg: Register) -> V {
        let full = reg.full_register();
        let Some(i) = GPRS.iter().position(|&r| r == full) else {
            return V::Unknown;
        };
        let value = self.regs[i];
        match reg.size() {
            8 => value,
            4 => value.low32(),
            1 => value.low8(),
            _ => V::Unknown,
        }
    }

    fn set(&mut self, reg: Register, value: V) {
        let full = reg.full_register();
        if let Some(i) = GPRS.iter().position(|&r| r == full) {
            self.regs[i] = match reg.size() {
                8 => value,
                // 32-bit writes zero the upper half; 8/16-bit ones merge.
                4 => value.low32(),
                _ => V::Unknown,
            };
        }
    }
}

/// Explores `entry` with `p` in `%rdi` and returns what it saw.
pub(crate) fn explore(image: &Image, entry: u64) -> Facts {
    let mut run = Run {
        image,
        facts: Facts::default(),
        info: InstructionInfoFactory::new(),
    };
    let mut regs = [V::Unknown; 16];
    regs[4] = V::of(Base::Stack); // rsp
    regs[7] = V::Bits(Bits {
        shift: 0,
        mask: u64::MAX,
    }); // rdi = p
    let mut pending = vec![State {
        ip: entry,
        regs,
        stack: BTreeMap::new(),
        depth: 0,
    }];
    let mut seen: HashSet<State> = HashSet::new();
    let mut visits: HashMap<u64, (u32, State)> = HashMap::new();
    let mut steps = 0;
    while let Some(mut state) = pending.pop() {
        loop {
            steps += 1;
            if steps > MAX_STEPS {
                run.facts.cut.insert(format!("more than {MAX_STEPS} steps"));
                return run.facts;
            }
            match visits.get_mut(&state.ip) {
                Some((count, last)) => {
                    *count += 1;
                    if *count > WIDEN_AFTER {
                        widen(&mut state, last);
                    }
                    last.clone_from(&state);
                }
                None => {
                    visits.insert(state.ip, (1, state.clone()));
                }
            }
            if !seen.insert(state.clone()) {
                break; // this exact state was explored already (loops end here)
            }
            match run.step(&mut state) {
                Next::Continue => {}
                Next::Fork(other) => pending.push(*other),
                Next::End => break,
            }
        }
    }
    run.facts
}

/// Forgets the plain numbers of `state` that differ from `last` (an
/// earlier state at the same instruction): loop counters.
fn widen(state: &mut State, last: &State) {
    for (value, before) in state.regs.iter_mut().zip(last.regs.iter()) {
        if value != before && value.as_imm().is_some() {
            *value = V::Unknown;
        }
    }
    for (off, value) in state.stack.iter_mut() {
        if last.stack.get(off) != Some(value) && value.as_imm().is_some() {
            *value = V::Unknown;
        }
    }
}

enum Next {
    Continue,
    Fork(Box<State>),
    End,
}

struct Run<'a> {
    image: &'a Image,
    facts: Facts,
    info: InstructionInfoFactory,
}

impl Run<'_> {
    fn decode(&self, ip: u64) -> Option<Instruction> {
        if !self.image.is_code(ip) {
            return None;
        }
        let bytes = self.image.bytes_at(ip)?;
        let bytes = &bytes[..bytes.len().min(16)];
        let insn = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
        (insn.code() != Code::INVALID).then_some(insn)
    }

    fn step(&mut self, state: &mut State) -> Next {
        let Some(insn) = self.decode(state.ip) else {
            self.facts
                .cut
                .insert(format!("no code to decode at {:#x}", state.ip));
            return Next::End;
        };
        let next = insn.next_ip();
        match insn.flow_control() {
            FlowControl::Next => {
                self.execute(state, &insn);
                state.ip = next;
                Next::Continue
            }
            FlowControl::ConditionalBranch => {
                let mut taken = state.clone();
                taken.ip = insn.near_branch_target();
                state.ip = next;
                Next::Fork(Box::new(taken))
            }
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
                match self.branch_target(state, &insn) {
                    Some(target) => {
                        state.ip = target;
                        Next::Continue
                    }
                    // A jump through another module's GOT slot (a PLT stub,
                    // a tail call) inside a followed call: that function
                    // returns to the followed call's return address.
                    None if state.depth > 0
                        && insn.op0_kind() == OpKind::Memory
                        && insn.is_ip_rel_memory_operand()
                        && self.image.is_external(insn.ip_rel_memory_address())
                        && matches!(
                            self.top(state),
                            Some(V::Ptr {
                                base: Base::RetAddr,
                                idx: None,
                                ..
                            })
                        ) =>
                    {
                        for reg in CALLER_SAVED {
                            state.set(reg, V::Unknown);
                        }
                        match self.pop(state) {
                            Some(V::Ptr { off, .. }) => {
                                state.depth -= 1;
                                state.ip = off;
                                Next::Continue
                            }
                            _ => Next::End,
                        }
                    }
                    None => {
                        self.facts
                            .cut
                            .insert(format!("unknown jump target at {:#x}", insn.ip()));
                        Next::End
                    }
                }
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                match self.branch_target(state, &insn) {
                    Some(target)
                        if state.depth < MAX_DEPTH
                            && self.push(
                                state,
                                V::Ptr {
                                    base: Base::RetAddr,
                                    off: next,
                                    idx: None,
                                },
                            ) =>
                    {
                        state.depth += 1;
                        state.ip = target;
                    }
                    _ => {
                        for reg in CALLER_SAVED {
                            state.set(reg, V::Unknown);
                        }
                        state.ip = next;
                    }
                }
                Next::Continue
            }
            FlowControl::Return => {
                let back = self.pop(state);
                match back {
                    Some(V::Ptr {
                        base: Base::RetAddr,
                        off,
                        idx: None,
                    }) => {
                        state.depth -= 1;
                        state.ip = off;
                        Next::Continue
                    }
                    _ => {
                        let rax = state.reg(Register::RAX);
                        let value = match rax.role() {
                            Some(Base::Mark) => ReturnValue::MarkByte,
                            Some(Base::HdrField(off, size)) => ReturnValue::HdrField(off, size),
                            _ if rax.as_imm() == Some(0) => ReturnValue::Zero,
                            _ => match rax.words() {
                                Some(sum) => ReturnValue::Words(sum),
                                None => ReturnValue::Other,
                            },
                        };
                        self.facts.returns.insert(value);
                        Next::End
                    }
                }
            }
            // int3, ud2, hlt, syscall, …: nothing of interest follows.
            _ => Next::End,
        }
    }

    /// Where a jmp or call goes, if it can be known: direct targets, and
    /// indirect ones through a GOT slot the module fills itself (PLT stubs).
    fn branch_target(&mut self, state: &mut State, insn: &Instruction) -> Option<u64> {
        let target = match insn.op0_kind() {
            OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16 => {
                insn.near_branch_target()
            }
            OpKind::Register => self.code_address(state.reg(insn.op0_register()))?,
            OpKind::Memory => {
                let value = self.read_memory(state, insn, 8);
                self.code_address(value)?
            }
            _ => return None,
        };
        self.image.is_code(target).then_some(target)
    }

    /// A value as a code address: a plain number, or what a GOT slot holds
    /// at link time (calls through the PLT).
    fn code_address(&self, value: V) -> Option<u64> {
        match value.role() {
            Some(Base::Slot(slot)) => self.image.slot_value(slot),
            _ => value.as_imm(),
        }
    }

    fn push(&mut self, state: &mut State, value: V) -> bool {
        let rsp = sub(state.reg(Register::RSP), V::imm(8));
        state.set(Register::RSP, rsp);
        match rsp {
            V::Ptr {
                base: Base::Stack,
                off,
                idx: None,
            } => {
                state.stack.insert(off, value);
                true
            }
            _ => false,
        }
    }

    /// The word at the top of the stack.
    fn top(&self, state: &State) -> Option<V> {
        match state.reg(Register::RSP) {
            V::Ptr {
                base: Base::Stack,
                off,
                idx: None,
            } => state.stack.get(&off).copied(),
            _ => None,
        }
    }

    fn pop(&mut self, state: &mut State) -> Option<V> {
        let rsp = state.reg(Register::RSP);
        state.set(Register::RSP, compose(&[(rsp, 1)], 8));
        match rsp {
            V::Ptr {
                base: Base::Stack,
                off,
                idx: None,
            } => state.stack.get(&off).copied(),
            _ => None,
        }
    }

    /// The address of the instruction's memory operand, and the value of its
    /// base register when that was a plain number (how the code splits a
    /// structure's address from a field offset).
    fn address(&self, state: &State, insn: &Instruction) -> (V, Option<u64>) {
        if insn.segment_prefix() == Register::FS || insn.segment_prefix() == Register::GS {
            return (V::Unknown, None); // thread-local
        }
        if insn.is_ip_rel_memory_operand() {
            return (V::imm(insn.ip_rel_memory_address()), None);
        }
        let mut terms = Vec::new();
        let mut base_value = None;
        if insn.memory_base() != Register::None {
            let base = state.reg(insn.memory_base());
            base_value = base.as_imm();
            terms.push((base, 1));
        }
        if insn.memory_index() != Register::None {
            terms.push((
                state.reg(insn.memory_index()),
                u64::from(insn.memory_index_scale()),
            ));
        }
        (
            compose(&terms, insn.memory_displacement64()),
            base_value.filter(|_| insn.memory_displacement64() != 0),
        )
    }

    fn read_memory(&mut self, state: &State, insn: &Instruction, size: u32) -> V {
        let (addr, base_value) = self.address(state, insn);
        self.load(state, addr, size, base_value)
    }

    /// A read of `size` bytes at `addr`: where the facts are recorded.
    fn load(&mut self, state: &State, addr: V, size: u32, base_value: Option<u64>) -> V {
        let V::Ptr { base, off, idx } = addr else {
            return V::Unknown;
        };
        let idx = idx.map(canonical);
        match (base, idx, size) {
            (Base::Abs, None, 8) => match self.image.slot_value(off) {
                Some(_) => V::of(Base::Slot(off)), // a GOT slot: the address it holds
                None => V::of(Base::Global(None, off)),
            },
            (Base::Slot(slot), None, 8) => V::of(Base::Global(Some(slot), off)),
            (Base::Abs, Some((bits, 8)), 8) => {
                self.facts.top.insert((None, off, base_value, bits));
                V::of(Base::Bi)
            }
            (Base::Slot(slot), Some((bits, 8)), 8) => {
                self.facts.top.insert((Some(slot), off, None, bits));
                V::of(Base::Bi)
            }
            (Base::Bi | Base::BiWord(_), _, 8) | (Base::Global(..), Some(_), 8) => {
                if let Base::BiWord(link) = base {
                    self.facts.link.insert(link);
                }
                match idx {
                    None => V::of(Base::BiWord(off)),
                    Some((bits, 8)) => {
                        self.facts.bottom.insert((off, bits));
                        V::of(Base::Hdr)
                    }
                    Some(_) => V::Unknown,
                }
            }
            (Base::Hdr, None, _) => V::of(Base::HdrField(off, size)),
            (Base::Hdr, Some((bits, 1)), 1) => {
                self.facts.marks.insert((off, bits));
                V::of(Base::Mark)
            }
            (Base::Stack, None, 8) => state.stack.get(&off).copied().unwrap_or(V::Unknown),
            _ => V::Unknown,
        }
    }

    fn operand(&mut self, state: &State, insn: &Instruction, i: u32) -> V {
        match insn.op_kind(i) {
            OpKind::Register => state.reg(insn.op_register(i)),
            OpKind::Memory => {
                let size = insn.memory_size().size() as u32;
                self.read_memory(state, insn, size)
            }
            OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => V::imm(insn.immediate(i)),
            _ => V::Unknown,
        }
    }

    /// Writes operand 0 (a register, or a stack slot).
    fn write(&mut self, state: &mut State, insn: &Instruction, value: V) {
        match insn.op0_kind() {
            OpKind::Register => state.set(insn.op0_register(), value),
            OpKind::Memory => {
                if let (
                    V::Ptr {
                        base: Base::Stack,
                        off,
                        idx: None,
                    },
                    _,
                ) = self.address(state, insn)
                {
                    let size = insn.memory_size().size();
                    state
                        .stack
                        .insert(off, if size == 8 { value } else { V::Unknown });
                }
            }
            _ => {}
        }
    }

    fn compare(&mut self, a: V, b: V, test: bool) {
        for (x, y) in [(a, b), (b, a)] {
            match (x.role(), y, y.as_imm()) {
                (Some(Base::BiWord(off)), V::Bits(bits), _) if !test => {
                    self.facts.key.insert((off, bits));
                }
                (Some(bi @ (Base::Bi | Base::BiWord(_))), _, _) if !test => {
                    if let Some(Base::Global(slot, off)) = y.role() {
                        self.facts.nils.insert((slot, off));
                        if let Base::BiWord(link) = bi {
                            self.facts.link.insert(link);
                        }
                    }
                }
                // (Comparing with 0 is the null check.)
                (Some(Base::Hdr), _, Some(limit)) if !test && limit != 0 => {
                    self.facts.hdr_limits.insert(limit);
                }
                (Some(Base::HdrField(off, 1)), _, Some(bits)) if test => {
                    self.facts.flag_tests.insert((off, bits));
                }
                // `and $4,%eax` first, then `test %eax,%eax` or `cmp $0,%eax`.
                (Some(Base::HdrBits(off, bits)), _, _)
                    if (test && y == x) || (!test && y.as_imm() == Some(0)) =>
                {
                    self.facts.flag_tests.insert((off, bits));
                }
                _ => {}
            }
        }
    }

    /// The effect of a straight-line instruction on the state.
    fn execute(&mut self, state: &mut State, insn: &Instruction) {
        let shift_count = |this: &mut Self, state: &State| {
            this.operand(state, insn, 1).as_imm().map(|k| k as u32 & 63)
        };
        match insn.mnemonic() {
            Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd => {
                let value = self.operand(state, insn, 1);
                self.write(state, insn, value);
            }
            Mnemonic::Lea => {
                let (addr, _) = self.address(state, insn);
                self.write(state, insn, addr);
            }
            Mnemonic::Add | Mnemonic::Sub | Mnemonic::And | Mnemonic::Xor | Mnemonic::Or => {
                let a = self.operand(state, insn, 0);
                let b = self.operand(state, insn, 1);
                let same_register = insn.op0_kind() == OpKind::Register
                    && insn.op1_kind() == OpKind::Register
                    && insn.op0_register() == insn.op1_register();
                let sum = match (insn.mnemonic(), a.words(), b.words()) {
                    (Mnemonic::Add | Mnemonic::Sub, Some(x), Some(y)) if !same_register => {
                        Some(WordSum::combine(x, y, insn.mnemonic() == Mnemonic::Sub))
                    }
                    _ => None,
                };
                let value = match insn.mnemonic() {
                    _ if sum.is_some() => match sum.flatten() {
                        None => V::Unknown,
                        Some(WordSum([None, ..])) => V::imm(0), // x - x
                        Some(sum) => V::Words(sum),
                    },
                    Mnemonic::Add => compose(&[(a, 1), (b, 1)], 0),
                    Mnemonic::Sub if same_register => V::imm(0),
                    Mnemonic::Sub => sub(a, b),
                    Mnemonic::And => and(a, b),
                    Mnemonic::Xor if same_register => V::imm(0),
                    _ => match (a.as_imm(), b.as_imm()) {
                        (Some(x), Some(y)) if insn.mnemonic() == Mnemonic::Or => V::imm(x | y),
                        (Some(x), Some(y)) => V::imm(x ^ y),
                        _ => V::Unknown,
                    },
                };
                self.write(state, insn, value);
            }
            Mnemonic::Shr | Mnemonic::Shl => {
                let a = self.operand(state, insn, 0);
                let value = match shift_count(self, state) {
                    Some(by) if insn.mnemonic() == Mnemonic::Shr => shr(a, by),
                    Some(by) => shl(a, by),
                    None => V::Unknown,
                };
                self.write(state, insn, value);
            }
            Mnemonic::Inc | Mnemonic::Dec => {
                let a = self.operand(state, insn, 0);
                let delta = if insn.mnemonic() == Mnemonic::Inc {
                    1
                } else {
                    u64::MAX
                };
                self.write(state, insn, compose(&[(a, 1)], delta));
            }
            Mnemonic::Cmp | Mnemonic::Test => {
                let a = self.operand(state, insn, 0);
                let b = self.operand(state, insn, 1);
                self.compare(a, b, insn.mnemonic() == Mnemonic::Test);
            }
            Mnemonic::Push => {
                let value = self.operand(state, insn, 0);
                self.push(state, value);
            }
            Mnemonic::Pop => {
                let value = self.pop(state).unwrap_or(V::Unknown);
                self.write(state, insn, value);
            }
            Mnemonic::Leave => {
                state.set(Register::RSP, state.reg(Register::RBP));
                let value = self.pop(state).unwrap_or(V::Unknown);
                state.set(Register::RBP, value);
            }
            Mnemonic::Nop
            | Mnemonic::Endbr64
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Prefetchw => {}
            _ => {
                // Anything else: every register it writes becomes unknown.
                let written: Vec<Register> =
                    crate::placement::written_registers(&mut self.info, insn).collect();
                for reg in written {
                    state.set(reg, V::Unknown);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn two_gc_pointers_do_not_add() {
        let sum = compose(&[(V::of(Base::Hdr), 1), (V::of(Base::Bi), 1)], 0);
        assert_eq!(sum, V::Unknown);
    }
}
