//! Registers: which ones an instruction writes, the general-purpose ones in
//! encoding order, and the ones a call may change (System V).
use iced_x86::{Instruction, InstructionInfoFactory, OpAccess, Register};

/// The 64-bit general-purpose registers, in encoding order.
pub(crate) const GPRS: [Register; 16] = [
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
pub(crate) const CALLER_SAVED: [Register; 9] = [
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

/// The position of `reg`'s full register in [`GPRS`] (`%esi` → `%rsi`'s).
pub(crate) fn gpr_index(reg: Register) -> Option<usize> {
    let full = reg.full_register();
    GPRS.iter().position(|&r| r == full)
}

/// The full registers `insn` writes (a write to `%esi` counts as `%rsi`).
pub(crate) fn written<'a>(
    info: &'a mut InstructionInfoFactory,
    insn: &Instruction,
) -> impl Iterator<Item = Register> + 'a {
    info.info(insn)
        .used_registers()
        .iter()
        .filter(|used| {
            !matches!(
                used.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::None | OpAccess::NoMemAccess
            )
        })
        .map(|used| used.register().full_register())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    #[test]
    fn a_32_bit_write_is_a_write_of_the_full_register() {
        // mov %edi,%esi
        let insn = Decoder::with_ip(64, &[0x89, 0xfe], 0, DecoderOptions::NONE).decode();
        let mut info = InstructionInfoFactory::new();
        assert_eq!(
            written(&mut info, &insn).collect::<Vec<_>>(),
            [Register::RSI]
        );
        assert_eq!(gpr_index(Register::ESI), Some(6));
    }
}
