//! The words of a module the dynamic linker fills (GOT slots, relocated
//! pointers), and what it fills them with: how code that reads a global
//! through `sym@GOTPCREL(%rip)` is followed without running it.
use std::collections::{HashMap, HashSet};

use object::{Object, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget};

#[derive(Debug, Default)]
pub(super) struct Slots {
    /// Slot → the link-time address the dynamic linker puts there.
    values: HashMap<u64, u64>,
    /// Slots filled with a symbol of another module (`pthread_mutex_lock`):
    /// their file contents (a lazy PLT stub's address) are not their
    /// run-time value.
    external: HashSet<u64>,
    /// The names of the symbols those slots are filled with.
    external_names: HashMap<u64, String>,
    /// `.got` / `.got.plt` ranges, whose file contents are already final in
    /// a module linked without dynamic relocations for them.
    got: Vec<(u64, u64)>,
    /// A slot the dynamic linker fills with this module's own TLS module
    /// id (`R_X86_64_DTPMOD64` of the module's own TLS: local-dynamic
    /// access, or a symbol it defines).
    pub(super) tls_module: Option<u64>,
    /// Slots the dynamic linker fills with the thread-pointer offset of a
    /// TLS variable of this module (`R_X86_64_TPOFF64`: initial-exec access).
    pub(super) tls_offsets: HashSet<u64>,
}

impl Slots {
    /// Dynamic relocations that put a link-time address into a word: GOT
    /// slots (`GLOB_DAT`, `JUMP_SLOT`), position-independent pointers
    /// (`RELATIVE`), plain `R_X86_64_64`. Symbols the module does not define
    /// are left out, and kept apart: the slots of other modules' symbols.
    pub fn read(file: &object::File, got: Vec<(u64, u64)>) -> Slots {
        use object::elf::{
            R_X86_64_64, R_X86_64_DTPMOD64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT,
            R_X86_64_RELATIVE, R_X86_64_TPOFF64,
        };
        let mut slots = Slots {
            got,
            ..Slots::default()
        };
        let (Some(relocations), symbols) =
            (file.dynamic_relocations(), file.dynamic_symbol_table())
        else {
            return slots;
        };
        for (slot, relocation) in relocations {
            let RelocationFlags::Elf { r_type } = relocation.flags() else {
                continue;
            };
            if r_type == R_X86_64_TPOFF64 {
                if relocation.target() == RelocationTarget::Absolute {
                    slots.tls_offsets.insert(slot);
                }
                continue;
            }
            if r_type == R_X86_64_DTPMOD64 {
                let own = match relocation.target() {
                    RelocationTarget::Absolute => true,
                    RelocationTarget::Symbol(i) => symbols
                        .as_ref()
                        .and_then(|t| t.symbol_by_index(i).ok())
                        .is_some_and(|s| s.is_definition()),
                    _ => false,
                };
                if own {
                    slots.tls_module.get_or_insert(slot);
                }
                continue;
            }
            let addend = relocation.addend() as u64;
            let value = match (r_type, relocation.target()) {
                (R_X86_64_RELATIVE, _) => Some(addend),
                (
                    R_X86_64_GLOB_DAT | R_X86_64_JUMP_SLOT | R_X86_64_64,
                    RelocationTarget::Symbol(i),
                ) => {
                    let symbol = symbols.as_ref().and_then(|t| t.symbol_by_index(i).ok());
                    symbol
                        .filter(|s| s.is_definition() && s.address() != 0)
                        .map(|s| s.address().wrapping_add(addend))
                }
                _ => None,
            };
            match value {
                Some(value) => {
                    slots.values.insert(slot, value);
                }
                None if r_type != R_X86_64_RELATIVE => {
                    slots.external.insert(slot);
                    if let RelocationTarget::Symbol(i) = relocation.target() {
                        let symbol = symbols.as_ref().and_then(|t| t.symbol_by_index(i).ok());
                        if let Some(name) = symbol.and_then(|s| s.name().ok()) {
                            slots.external_names.insert(slot, name.to_string());
                        }
                    }
                }
                None => {}
            }
        }
        slots
    }

    pub fn is_external(&self, slot: u64) -> bool {
        self.external.contains(&slot)
    }

    /// The name of the other module's symbol `slot` is filled with.
    pub fn external_name(&self, slot: u64) -> Option<&str> {
        self.external_names.get(&slot).map(String::as_str)
    }

    /// The run-time value of the word at `slot`; `word` reads the file's
    /// word at an address (for a GOT without relocations).
    pub fn value(&self, slot: u64, word: impl FnOnce(u64) -> Option<u64>) -> Option<u64> {
        if let Some(&value) = self.values.get(&slot) {
            return Some(value);
        }
        if self.external.contains(&slot) {
            return None;
        }
        if self
            .got
            .iter()
            .any(|&(start, end)| slot >= start && slot.checked_add(8).is_some_and(|e| e <= end))
        {
            return word(slot).filter(|&value| value != 0);
        }
        None
    }
}
