//! Decoding x86-64 machine code with iced-x86: one instruction at an
//! address of a module, a function's bytes, or every executable section of
//! a module from its start; and instructions as text for messages.
use std::collections::HashSet;

use iced_x86::{Code, Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, OpKind};

use crate::modules::Module;

/// The longest x86 instruction.
const MAX_LENGTH: usize = 15;

/// The valid instructions at the start of `code` (a function at `address`),
/// up to the first byte sequence that does not decode.
pub(crate) fn function(code: &[u8], address: u64) -> Vec<Instruction> {
    Decoder::with_ip(64, code, address, DecoderOptions::NONE)
        .into_iter()
        .take_while(|i| i.code() != Code::INVALID)
        .collect()
}

/// The instruction at `bytes` (at address `ip`); `Code::INVALID` if none.
pub(crate) fn one(bytes: &[u8], ip: u64) -> Instruction {
    let bytes = &bytes[..bytes.len().min(MAX_LENGTH + 1)];
    Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode()
}

/// The instruction at link-time address `ip` of `module`, if `ip` is in an
/// executable segment and decodes.
pub(crate) fn at(module: &Module, ip: u64) -> Option<Instruction> {
    if !module.is_code(ip) {
        return None;
    }
    let insn = one(module.bytes_at(ip)?, ip);
    (insn.code() != Code::INVALID).then_some(insn)
}

/// Decodes every executable section of `module` from its start, in order
/// (a linear sweep: data inside code decodes as whatever it looks like).
pub(crate) fn sweep(module: &Module, mut each: impl FnMut(&Instruction)) {
    for (start, end) in module.code_ranges() {
        let Some(bytes) = module.bytes_at(start) else {
            continue;
        };
        let bytes = &bytes[..bytes.len().min((end - start) as usize)];
        for insn in Decoder::with_ip(64, bytes, start, DecoderOptions::NONE).iter() {
            each(&insn);
        }
    }
}

/// Whether `insn` is a direct (relative) jump, call or conditional branch.
pub(crate) fn is_direct_branch(insn: &Instruction) -> bool {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
}

/// Every target of a direct jump or call in `module`.
pub(crate) fn branch_targets(module: &Module) -> HashSet<u64> {
    let mut targets = HashSet::new();
    sweep(module, |insn| {
        if is_direct_branch(insn) {
            targets.insert(insn.near_branch_target());
        }
    });
    targets
}

/// The instruction in Intel syntax (`add qword ptr [rax],1`).
pub(crate) fn text(insn: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(insn, &mut out);
    out
}
