//! `.eh_frame` flattened into the kernel's unwind rows
//! (`memprof::fuzzing::unwind_rows`, `ModuleTable::build` in
//! `memprof/src/unwind`): each input read as a whole ELF file, and as the
//! `.eh_frame` section of a small valid ELF (with `.text` and `.got`, the
//! bases of its pointer encodings), where mutations reach the CFI itself.
//! The rows must be sorted by address, each address once: the kernel's
//! unwinder binary-searches them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::fuzzing::UnwindRow;

fuzz_target!(|data: &[u8]| {
    check(memprof::fuzzing::unwind_rows(data));
    check(memprof::fuzzing::unwind_rows(&elf_with_eh_frame(data)));
});

fn check(rows: Result<Vec<UnwindRow>, String>) {
    if let Ok(rows) = rows {
        for pair in rows.windows(2) {
            assert!(
                pair[0].pc < pair[1].pc,
                "rows out of order: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// A 64-bit little-endian x86-64 shared object whose only bytes are its
/// `.eh_frame` (`eh_frame`, at address 0x2000); `.text` at 0x1000 and
/// `.got` at 0x3000 have none in the file.
fn elf_with_eh_frame(eh_frame: &[u8]) -> Vec<u8> {
    const EH_FRAME_AT: u64 = 0x2000;
    let names = b"\0.eh_frame\0.text\0.got\0.shstrtab\0";
    let data_at = 64u64;
    let names_at = data_at + eh_frame.len() as u64;
    let headers_at = (names_at + names.len() as u64).next_multiple_of(8);
    let mut elf = Vec::with_capacity(headers_at as usize + 5 * 64);
    // The ELF header.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    elf.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    elf.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    elf.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_phoff
    elf.extend_from_slice(&headers_at.to_le_bytes()); // e_shoff
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    for half in [64u16, 56, 0, 64, 5, 4] {
        // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
        elf.extend_from_slice(&half.to_le_bytes());
    }
    elf.extend_from_slice(eh_frame);
    elf.extend_from_slice(names);
    elf.resize(headers_at as usize, 0);
    // (name, type, flags, address, offset, size): SHT_PROGBITS 1,
    // SHT_NOBITS 8, SHT_STRTAB 3; SHF_ALLOC 2, SHF_EXECINSTR 4, SHF_WRITE 1.
    let sections: [(u32, u32, u64, u64, u64, u64); 5] = [
        (0, 0, 0, 0, 0, 0),
        (1, 1, 2, EH_FRAME_AT, data_at, eh_frame.len() as u64),
        (11, 8, 6, 0x1000, 0, 0x1000),
        (17, 8, 3, 0x3000, 0, 0x100),
        (22, 3, 0, 0, names_at, names.len() as u64),
    ];
    for (name, kind, flags, address, offset, size) in sections {
        elf.extend_from_slice(&name.to_le_bytes());
        elf.extend_from_slice(&kind.to_le_bytes());
        elf.extend_from_slice(&flags.to_le_bytes());
        elf.extend_from_slice(&address.to_le_bytes());
        elf.extend_from_slice(&offset.to_le_bytes());
        elf.extend_from_slice(&size.to_le_bytes());
        elf.extend_from_slice(&0u32.to_le_bytes()); // sh_link
        elf.extend_from_slice(&0u32.to_le_bytes()); // sh_info
        elf.extend_from_slice(&1u64.to_le_bytes()); // sh_addralign
        elf.extend_from_slice(&0u64.to_le_bytes()); // sh_entsize
    }
    elf
}
