//! The registers that hold an object just allocated, and the constants
//! registers hold, followed through a linear sweep of the code
//! ([`Held`]): where [`super::type_names`] finds the type id stored into
//! an object far after its allocator call.
use std::collections::HashMap;

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::modules::Module;

/// The registers holding an object just allocated, in a linear sweep of
/// the code: (address of the allocator call, atomic), per 64-bit register.
/// A call clobbers the caller-saved ones (an allocator's leaves its object
/// in `rax`), a `mov` copies, any other write forgets; a return or a
/// call far behind ends all (the sweep crosses functions).
///
/// Also the constants registers hold (`mov $ID,%ecx`, or a vector
/// register loaded from read-only data: release builds initialize a small
/// object's first 16 bytes, its type id first, with one `movups`).
#[derive(Default)]
pub(super) struct Held {
    regs: [Option<(u64, bool)>; 16],
    pub(super) constants: HashMap<Register, u64>,
}

/// Bytes of code after an allocator call within which its object is
/// followed (a constructor's initializers run in between).
const HELD_SPAN: u64 = 4096;

/// `reg`'s 64-bit register's number (0 = rax … 15 = r15).
fn gpr(reg: Register) -> Option<usize> {
    let full = reg.full_register();
    let n = (full as u32).checked_sub(Register::RAX as u32)? as usize;
    (n < 16 && full.is_gpr64()).then_some(n)
}

impl Held {
    pub(super) fn get(&self, reg: Register) -> Option<(u64, bool)> {
        self.regs[gpr(reg)?]
    }

    pub(super) fn forget(&mut self, reg: Register) {
        if let Some(n) = gpr(reg) {
            self.regs[n] = None;
        }
    }

    /// The constant `insn` stores at offset 0 of a register's memory,
    /// from a register known to hold one (its low 32 bits).
    pub(super) fn stored_constant(&self, insn: &Instruction) -> Option<u32> {
        let stores = insn.op0_kind() == OpKind::Memory
            && insn.op1_kind() == OpKind::Register
            && insn.memory_displacement64() == 0
            && insn.memory_index() == Register::None
            && is_move(insn.mnemonic());
        let from = insn.op1_register();
        let wide = from.is_xmm() || from.is_gpr64() || from.is_gpr32();
        if !stores || !wide {
            return None;
        }
        let key = if from.is_xmm() {
            from
        } else {
            from.full_register()
        };
        self.constants.get(&key).map(|&v| v as u32)
    }

    /// After `insn` (`allocator`: it calls one, atomic or not; `read`:
    /// the program's read-only data, 8 bytes at an address).
    pub(super) fn step(
        &mut self,
        insn: &Instruction,
        allocator: Option<bool>,
        read: &dyn Fn(u64) -> Option<u64>,
    ) {
        self.note_constant(insn, read);
        let ip = insn.ip();
        for r in &mut self.regs {
            if r.is_some_and(|(call, _)| ip.saturating_sub(call) > HELD_SPAN) {
                *r = None;
            }
        }
        match insn.flow_control() {
            FlowControl::Return => {
                self.regs = Default::default();
                self.constants.clear();
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                // rax, rcx, rdx, rsi, rdi, r8-r11: the System V caller-saved.
                for n in [0, 1, 2, 6, 7, 8, 9, 10, 11] {
                    self.regs[n] = None;
                }
                if let Some(atomic) = allocator {
                    self.regs[0] = Some((ip, atomic));
                }
            }
            _ if insn.op0_kind() == OpKind::Register
                && !matches!(
                    insn.mnemonic(),
                    Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
                ) =>
            {
                let copied = (insn.mnemonic() == Mnemonic::Mov
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register().is_gpr64())
                .then(|| self.get(insn.op1_register()))
                .flatten();
                if let Some(n) = gpr(insn.op0_register()) {
                    self.regs[n] = copied;
                }
            }
            _ => {}
        }
    }
}

impl Held {
    /// Follows the constants of registers: set by `mov $imm,%reg` or a
    /// vector load of read-only data, forgotten at any other write.
    fn note_constant(&mut self, insn: &Instruction, read: &dyn Fn(u64) -> Option<u64>) {
        if insn.op0_kind() != OpKind::Register {
            match insn.flow_control() {
                FlowControl::Return => self.constants.clear(),
                // A call keeps the callee-saved registers (`rbx`, `rbp`,
                // `r12`-`r15`): release builds hoist an object's first
                // word out of the loop that allocates it
                // (`movabs $0x1000000af,%r15` … `call GC_malloc` …
                // `mov %r15,(%rax)`). Vector registers are all
                // caller-saved.
                FlowControl::Call | FlowControl::IndirectCall => {
                    self.constants.retain(|r, _| is_callee_saved(*r))
                }
                _ => {}
            }
            return;
        }
        let to = insn.op0_register();
        let key = if to.is_xmm() { to } else { to.full_register() };
        let value = match insn.op1_kind() {
            OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
                if insn.mnemonic() == Mnemonic::Mov =>
            {
                Some(insn.immediate(1))
            }
            OpKind::Memory
                if to.is_xmm() && insn.is_ip_rel_memory_operand() && is_move(insn.mnemonic()) =>
            {
                read(insn.ip_rel_memory_address())
            }
            // Debug builds compute an allocation's size in its argument
            // register: `xor %eax,%eax; mov %eax,%edi; add $0x8,%rdi`.
            OpKind::Register if insn.mnemonic() == Mnemonic::Xor && insn.op1_register() == to => {
                Some(0)
            }
            OpKind::Register if insn.mnemonic() == Mnemonic::Mov && to.is_gpr() => {
                let from = insn.op1_register();
                let v = self.constants.get(&from.full_register()).copied();
                if from.is_gpr64() {
                    v
                } else if from.is_gpr32() {
                    v.map(|v| v & 0xffff_ffff)
                } else {
                    None
                }
            }
            OpKind::Immediate8to64 | OpKind::Immediate32to64
                if insn.mnemonic() == Mnemonic::Add && to.is_gpr64() =>
            {
                self.constants
                    .get(&key)
                    .map(|v| v.wrapping_add(insn.immediate(1)))
            }
            _ => None,
        };
        if matches!(
            insn.mnemonic(),
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
        ) {
            return;
        }
        match value {
            Some(v) => self.constants.insert(key, v),
            None => self.constants.remove(&key),
        };
    }
}

/// Whether a call leaves 64-bit register `r` as it was (System V).
fn is_callee_saved(r: Register) -> bool {
    matches!(
        r,
        Register::RBX
            | Register::RBP
            | Register::R12
            | Register::R13
            | Register::R14
            | Register::R15
    )
}

/// The 8 bytes at `at` in `exe`'s read-only data.
pub(super) fn read_only_word(exe: &Module, at: u64) -> Option<u64> {
    exe.bytes_at(at)
        .filter(|_| exe.is_read_only(at))
        .and_then(|b| b.get(..8))
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
}

/// Moves that copy a whole operand (a store of a constant's first bytes).
fn is_move(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Mov
            | Mnemonic::Movaps
            | Mnemonic::Movups
            | Mnemonic::Movdqa
            | Mnemonic::Movdqu
            | Mnemonic::Movapd
            | Mnemonic::Movupd
            | Mnemonic::Movq
            | Mnemonic::Vmovaps
            | Mnemonic::Vmovups
            | Mnemonic::Vmovdqa
            | Mnemonic::Vmovdqu
    )
}
