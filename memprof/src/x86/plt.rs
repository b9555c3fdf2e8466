//! A module's PLT stubs: where its calls to another module's function go
//! first (`call GC_malloc@plt`).
use iced_x86::Mnemonic;

use super::decode;
use crate::modules::Module;

/// The PLT stubs of `module` that jump to `name` in another module: the
/// address of each stub's `jmp *slot(%rip)` and of the start of its entry
/// (after an `endbr64`, entries are 16 bytes).
pub(crate) fn stubs(module: &Module, name: &str) -> Vec<u64> {
    let mut stubs = Vec::new();
    for plt in [".plt", ".plt.sec", ".plt.got"] {
        let Some((start, bytes)) = module.section(plt) else {
            continue;
        };
        for insn in decode::function(bytes, start) {
            let jumps_through = insn.mnemonic() == Mnemonic::Jmp
                && insn.is_ip_rel_memory_operand()
                && module.external_name(insn.ip_rel_memory_address()) == Some(name);
            if jumps_through {
                stubs.extend([insn.ip(), insn.ip() & !0xf]);
            }
        }
    }
    stubs
}
