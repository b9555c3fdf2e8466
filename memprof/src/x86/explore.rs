//! A small symbolic executor for x86-64 functions, with hooks.
//!
//! [`explore`] runs a function from its entry with the first argument `p`
//! in `%rdi` and follows every path (both sides of each conditional branch,
//! into direct calls and tail jumps, through PLT stubs), tracking what each
//! register and stack slot holds as a [`V`] (see [`super::value`]). Loops
//! end when a state repeats; counters are widened so that they do.
//!
//! The explorer knows registers, the stack, constants, GOT slots and global
//! words. What the memory reads, comparisons and returns *mean* belongs to
//! the caller's [`Hooks`]: it gives the values it recognizes a role (a
//! loaded structure pointer, a header field) and records what it learns.
//! libgc's layout recognition ([`crate::gc`]) is such a caller.
//!
//! ```text
//! struct Returns(Vec<V<NoRole>>);
//! impl Hooks for Returns {
//!     type Role = NoRole;
//!     fn returned(&mut self, rax: V<NoRole>) { self.0.push(rax) }
//! }
//! let mut seen = Returns(Vec::new());
//! let cut = explore(&module, module.symbol("GC_get_heap_size").unwrap().address, &mut seen);
//! ```
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpKind, Register};

use super::regs::{gpr_index, CALLER_SAVED};
use super::value::{and, canonical, compose, shl, shr, sub, Base, Bits, Role, WordSum, V};
use crate::modules::Module;

/// A memory read the explorer leaves to its [`Hooks`]: `size` bytes at
/// `base + off + bits * scale` (the index scale taken out of its mask).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read<R> {
    pub base: Base<R>,
    pub off: u64,
    pub idx: Option<(Bits, u64)>,
    pub size: u32,
    /// The value of the base register when it was a plain number and a
    /// displacement was added (how code splits a structure's address from
    /// a field offset: `lea GC_arrays(%rip),%rax; mov 0x289f0(%rax,…)`).
    pub base_value: Option<u64>,
}

/// What a caller makes of the explored code.
pub(crate) trait Hooks {
    /// The kinds of values it recognizes.
    type Role: Role;

    /// The value read from memory, for reads the explorer does not model
    /// (it models 8-byte reads of globals, GOT slots and the stack).
    fn load(&mut self, _read: Read<Self::Role>) -> Option<V<Self::Role>> {
        None
    }

    /// A `cmp a,b` (`test` false) or `test a,b` (`test` true).
    fn compare(&mut self, _a: V<Self::Role>, _b: V<Self::Role>, _test: bool) {}

    /// A return from the explored function, with what `%rax` holds.
    fn returned(&mut self, _rax: V<Self::Role>) {}

    /// A call to `target` (known), with what the registers hold (by
    /// [`gpr_index`]); whether to follow it (else it is opaque: the
    /// caller-saved registers are lost).
    fn call(&mut self, _target: u64, _regs: &[V<Self::Role>; 16]) -> bool {
        true
    }

    /// An unconditional jump to `target` (known): whether to follow it
    /// (else the path ends there, as a tail call out of interest).
    fn jump(&mut self, _target: u64) -> bool {
        true
    }
}

/// Calls followed into at most this depth.
const MAX_DEPTH: u32 = 4;
/// Instructions executed over all paths before giving up.
const MAX_STEPS: usize = 200_000;
/// Visits of one instruction after which plain numbers that changed since
/// its last visit are forgotten, so that counting loops (a spin lock's
/// `for (i = 0;; i++)`) reach a state seen before and end.
const WIDEN_AFTER: u32 = 64;

#[derive(Clone, PartialEq, Eq, Hash)]
struct State<R> {
    ip: u64,
    regs: [V<R>; 16],
    /// Stack words by offset from the entry `%rsp`.
    stack: BTreeMap<u64, V<R>>,
    depth: u32,
}

impl<R: Role> State<R> {
    fn reg(&self, reg: Register) -> V<R> {
        let Some(i) = gpr_index(reg) else {
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

    fn set(&mut self, reg: Register, value: V<R>) {
        if let Some(i) = gpr_index(reg) {
            self.regs[i] = match reg.size() {
                8 => value,
                // 32-bit writes zero the upper half; 8/16-bit ones merge.
                4 => value.low32(),
                _ => V::Unknown,
            };
        }
    }
}

/// Explores the function at `entry` of `module` with `p` in `%rdi`,
/// calling `hooks` on the way. Returns why paths were cut short, if any
/// were (for error messages: an empty set means every path was followed).
pub(crate) fn explore<H: Hooks>(module: &Module, entry: u64, hooks: &mut H) -> BTreeSet<String> {
    let mut run = Run {
        module,
        hooks,
        cut: BTreeSet::new(),
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
    let mut seen: HashSet<State<H::Role>> = HashSet::new();
    let mut visits: HashMap<u64, (u32, State<H::Role>)> = HashMap::new();
    let mut steps = 0;
    while let Some(mut state) = pending.pop() {
        loop {
            steps += 1;
            if steps > MAX_STEPS {
                run.cut.insert(format!("more than {MAX_STEPS} steps"));
                return run.cut;
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
    run.cut
}

/// Forgets the plain numbers of `state` that differ from `last` (an
/// earlier state at the same instruction): loop counters.
fn widen<R: Role>(state: &mut State<R>, last: &State<R>) {
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

enum Next<R> {
    Continue,
    Fork(Box<State<R>>),
    End,
}

struct Run<'a, H: Hooks> {
    module: &'a Module,
    hooks: &'a mut H,
    /// Why paths were cut short.
    cut: BTreeSet<String>,
    info: InstructionInfoFactory,
}

impl<H: Hooks> Run<'_, H> {
    fn step(&mut self, state: &mut State<H::Role>) -> Next<H::Role> {
        let Some(insn) = super::decode::at(self.module, state.ip) else {
            self.cut
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
                self.jump(state, &insn)
            }
            FlowControl::Call | FlowControl::IndirectCall => self.call(state, &insn),
            FlowControl::Return => self.ret(state),
            // int3, ud2, hlt, syscall, …: nothing of interest follows.
            _ => Next::End,
        }
    }

    /// A jump: followed where the hooks allow and its target is known.
    fn jump(&mut self, state: &mut State<H::Role>, insn: &Instruction) -> Next<H::Role> {
        match self.branch_target(state, insn) {
            Some(target) if !self.hooks.jump(target) => Next::End,
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
                && self.module.is_external(insn.ip_rel_memory_address())
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
                self.cut
                    .insert(format!("unknown jump target at {:#x}", insn.ip()));
                Next::End
            }
        }
    }

    /// A call: followed into the callee where the hooks ask for it (and
    /// the depth allows), else stepped over with the caller-saved
    /// registers unknown.
    fn call(&mut self, state: &mut State<H::Role>, insn: &Instruction) -> Next<H::Role> {
        let next = insn.next_ip();
        let target = self.branch_target(state, insn);
        let follow = match target {
            Some(target) => self.hooks.call(target, &state.regs),
            None => false,
        };
        match target {
            Some(target)
                if follow
                    && state.depth < MAX_DEPTH
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

    /// A return: to the followed call's return address, or out of the
    /// explored function (the hooks see what it returns).
    fn ret(&mut self, state: &mut State<H::Role>) -> Next<H::Role> {
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
                self.hooks.returned(state.reg(Register::RAX));
                Next::End
            }
        }
    }

    /// Where a jmp or call goes, if it can be known: direct targets, and
    /// indirect ones through a GOT slot the module fills itself (PLT stubs).
    fn branch_target(&mut self, state: &mut State<H::Role>, insn: &Instruction) -> Option<u64> {
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
        self.module.is_code(target).then_some(target)
    }

    /// A value as a code address: a plain number, or what a GOT slot holds
    /// at link time (calls through the PLT).
    fn code_address(&self, value: V<H::Role>) -> Option<u64> {
        match value.role() {
            Some(Base::Slot(slot)) => self.module.slot_value(slot),
            _ => value.as_imm(),
        }
    }

    fn push(&mut self, state: &mut State<H::Role>, value: V<H::Role>) -> bool {
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
    fn top(&self, state: &State<H::Role>) -> Option<V<H::Role>> {
        match state.reg(Register::RSP) {
            V::Ptr {
                base: Base::Stack,
                off,
                idx: None,
            } => state.stack.get(&off).copied(),
            _ => None,
        }
    }

    fn pop(&mut self, state: &mut State<H::Role>) -> Option<V<H::Role>> {
        let top = self.top(state);
        let rsp = state.reg(Register::RSP);
        state.set(Register::RSP, compose(&[(rsp, 1)], 8));
        top
    }

    /// The address of the instruction's memory operand, and the value of its
    /// base register when that was a plain number (how the code splits a
    /// structure's address from a field offset).
    fn address(&self, state: &State<H::Role>, insn: &Instruction) -> (V<H::Role>, Option<u64>) {
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

    fn read_memory(&mut self, state: &State<H::Role>, insn: &Instruction, size: u32) -> V<H::Role> {
        let (addr, base_value) = self.address(state, insn);
        self.load(state, addr, size, base_value)
    }

    /// A read of `size` bytes at `addr`: globals, GOT slots and the stack
    /// here, anything else by the hooks.
    fn load(
        &mut self,
        state: &State<H::Role>,
        addr: V<H::Role>,
        size: u32,
        base_value: Option<u64>,
    ) -> V<H::Role> {
        let V::Ptr { base, off, idx } = addr else {
            return V::Unknown;
        };
        let idx = idx.map(canonical);
        match (base, idx, size) {
            (Base::Abs, None, 8) => match self.module.slot_value(off) {
                Some(_) => V::of(Base::Slot(off)), // a GOT slot: the address it holds
                None => V::of(Base::Global(None, off)),
            },
            (Base::Slot(slot), None, 8) => V::of(Base::Global(Some(slot), off)),
            (Base::Stack, None, 8) => state.stack.get(&off).copied().unwrap_or(V::Unknown),
            _ => self
                .hooks
                .load(Read {
                    base,
                    off,
                    idx,
                    size,
                    base_value,
                })
                .unwrap_or(V::Unknown),
        }
    }

    fn operand(&mut self, state: &State<H::Role>, insn: &Instruction, i: u32) -> V<H::Role> {
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
    fn write(&mut self, state: &mut State<H::Role>, insn: &Instruction, value: V<H::Role>) {
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

    /// The effect of a straight-line instruction on the state.
    fn execute(&mut self, state: &mut State<H::Role>, insn: &Instruction) {
        let shift_count = |this: &mut Self, state: &State<H::Role>| {
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
                let value = self.arithmetic(state, insn);
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
                self.hooks.compare(a, b, insn.mnemonic() == Mnemonic::Test);
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
                let written: Vec<Register> = super::regs::written(&mut self.info, insn).collect();
                for reg in written {
                    state.set(reg, V::Unknown);
                }
            }
        }
    }

    /// The value `add`, `sub`, `and`, `xor` or `or` leaves in its destination.
    fn arithmetic(&mut self, state: &State<H::Role>, insn: &Instruction) -> V<H::Role> {
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
        match insn.mnemonic() {
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
        }
    }
}
