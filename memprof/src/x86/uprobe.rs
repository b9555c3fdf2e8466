//! Which instructions the kernel's x86 uprobe code emulates (≈0.8 µs a
//! hit) instead of single-stepping out of line (10–11 µs): pushes of a
//! general-purpose register, `nop`, direct `jmp`/`call`/`jcc`
//! (`arch/x86/kernel/uprobes.c`; docs/ARCHITECTURE.md, "Probe cost").
use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind};

use super::decode::is_direct_branch;

/// Whether a uprobe on `insn` is emulated rather than single-stepped.
pub(crate) fn emulated(insn: &Instruction) -> bool {
    match insn.mnemonic() {
        // push of a general-purpose register (push %rbp, push %r12, …)
        Mnemonic::Push => insn.op0_kind() == OpKind::Register && insn.op0_register().is_gpr64(),
        Mnemonic::Nop => true,
        Mnemonic::Jmp | Mnemonic::Call => is_direct_branch(insn),
        _ => insn.flow_control() == FlowControl::ConditionalBranch && insn.is_jcc_short_or_near(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86::decode;

    #[test]
    fn test_is_stepped_branch_and_push_are_emulated() {
        // glibc's free: test %rdi,%rdi ; je … ; push %rbp
        let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        let insns = decode::function(&code, 0x98ef0);
        let emulated: Vec<bool> = insns.iter().map(emulated).collect();
        assert_eq!(emulated, [false, true, true]);
    }
}
