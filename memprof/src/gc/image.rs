//! The parts of a libgc ELF file that decoding its code needs: the bytes at
//! a virtual address, virtual address → file offset (what uprobes attach
//! to), and what a GOT slot points to once the dynamic linker has filled it.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationFlags,
    RelocationTarget, SectionFlags, SectionKind,
};

/// One ELF module (shared library or executable), read once.
pub(crate) struct Image {
    pub path: PathBuf,
    data: Vec<u8>,
    /// `(virtual address, file offset, file size, executable)` of each loadable segment.
    segments: Vec<(u64, u64, u64, bool)>,
    /// Virtual address ranges of the executable sections (`.text`, …).
    pub code: Vec<(u64, u64)>,
    /// GOT slots (and other words) the dynamic linker fills: slot → value.
    slots: HashMap<u64, u64>,
    /// Slots the dynamic linker fills with a symbol of another module
    /// (`pthread_mutex_lock`): their file contents (a lazy PLT stub's
    /// address) are not their run-time value.
    external: HashSet<u64>,
    /// `.got` / `.got.plt` ranges, whose file contents are already final in a
    /// module linked without dynamic relocations for them.
    got: Vec<(u64, u64)>,
    /// Defined `GC_*` symbols, dynamic table first.
    symbols: HashMap<String, u64>,
}

impl Image {
    pub fn open(path: &Path) -> Result<Image> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file = object::File::parse(&*data)
            .with_context(|| format!("{} is not an ELF file", path.display()))?;
        if file.architecture() != object::Architecture::X86_64 {
            anyhow::bail!("{}: only x86-64 is supported", path.display());
        }
        let segments = file
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                let exec = matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                (s.address(), offset, size, exec)
            })
            .collect();
        let code = file
            .sections()
            .filter(|s| {
                s.kind() == SectionKind::Text
                    && matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
            })
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        let got = file
            .sections()
            .filter(|s| matches!(s.name(), Ok(".got" | ".got.plt")))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        // Not `allocators::symbol_in`: it wants the symbol's bytes in the file,
        // which `.bss` data such as `GC_gc_no` and `GC_arrays` have none of.
        let mut symbols = HashMap::new();
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            if let Ok(name) = symbol.name() {
                if name.starts_with("GC_") && symbol.is_definition() && symbol.address() != 0 {
                    symbols.entry(name.to_string()).or_insert(symbol.address());
                }
            }
        }
        let (slots, external) = slots(&file);
        Ok(Image {
            path: path.to_path_buf(),
            symbols,
            slots,
            external,
            data,
            segments,
            code,
            got,
        })
    }

    /// The link-time address of a `GC_*` symbol the module defines.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// The loadable segment whose file part holds `vaddr`.
    fn segment(&self, vaddr: u64) -> Option<&(u64, u64, u64, bool)> {
        self.segments
            .iter()
            .find(|&&(addr, _, size, _)| vaddr >= addr && vaddr < addr + size)
    }

    /// The file offset of a virtual address inside a loadable segment's file part.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segment(vaddr)
            .map(|&(addr, offset, _, _)| vaddr - addr + offset)
    }

    /// The file bytes from `vaddr` to the end of its segment's file part.
    pub fn bytes_at(&self, vaddr: u64) -> Option<&[u8]> {
        let &(addr, offset, size, _) = self.segment(vaddr)?;
        let end = (offset + size).min(self.data.len() as u64);
        self.data
            .get((offset + vaddr - addr) as usize..end as usize)
    }

    /// Whether `vaddr` is in an executable segment (where calls may be followed).
    pub fn is_code(&self, vaddr: u64) -> bool {
        self.segment(vaddr).is_some_and(|&(_, _, _, exec)| exec)
    }

    /// Whether the dynamic linker fills `slot` with another module's symbol
    /// (a call through it leaves the module).
    pub fn is_external(&self, slot: u64) -> bool {
        self.external.contains(&slot)
    }

    /// The value the word at `slot` holds at run time, as a link-time
    /// address, when the module's relocations (or, without them, its GOT's
    /// file contents) say so: how `mov GC_arrays@GOTPCREL(%rip),%rcx` is
    /// followed. `None` for ordinary data.
    pub fn slot_value(&self, slot: u64) -> Option<u64> {
        if let Some(&value) = self.slots.get(&slot) {
            return Some(value);
        }
        if self.external.contains(&slot) {
            return None;
        }
        if self
            .got
            .iter()
            .any(|&(start, end)| slot >= start && slot + 8 <= end)
        {
            let bytes = self.bytes_at(slot)?.get(..8)?;
            let value = u64::from_le_bytes(bytes.try_into().ok()?);
            return (value != 0).then_some(value);
        }
        None
    }
}

/// Dynamic relocations that put a link-time address into a word: GOT slots
/// (`GLOB_DAT`, `JUMP_SLOT`), position-independent pointers (`RELATIVE`),
/// plain `R_X86_64_64`. Symbols the module does not define are left out,
/// and returned apart: the slots of other modules' symbols.
fn slots(file: &object::File) -> (HashMap<u64, u64>, HashSet<u64>) {
    use object::elf::{R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE};
    let mut slots = HashMap::new();
    let mut external = HashSet::new();
    let (Some(relocations), symbols) = (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return (slots, external);
    };
    for (slot, relocation) in relocations {
        let RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        let addend = relocation.addend() as u64;
        let value = match (r_type, relocation.target()) {
            (R_X86_64_RELATIVE, _) => Some(addend),
            (R_X86_64_GLOB_DAT | R_X86_64_JUMP_SLOT | R_X86_64_64, RelocationTarget::Symbol(i)) => {
                let symbol = symbols.as_ref().and_then(|t| t.symbol_by_index(i).ok());
                symbol
                    .filter(|s| s.is_definition() && s.address() != 0)
                    .map(|s| s.address().wrapping_add(addend))
            }
            _ => None,
        };
        match value {
            Some(value) => {
                slots.insert(slot, value);
            }
            None if r_type != R_X86_64_RELATIVE => {
                external.insert(slot);
            }
            None => {}
        }
    }
    (slots, external)
}
