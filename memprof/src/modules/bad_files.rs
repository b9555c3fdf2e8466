//! Module files as a user may make them, not as a linker does: what the
//! fuzz targets `elf_module` and `symbolize` found, each read again here.
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;

use super::maps::Mapping;
use super::Module;

/// A section header: name, type, flags, address, file offset, size.
pub(super) struct Section {
    pub name: &'static str,
    pub kind: u32,
    pub flags: u64,
    pub address: u64,
    pub offset: u64,
    pub size: u64,
}

/// A program header: type, flags, address, file offset, file size, memory size.
pub(super) struct Segment {
    pub kind: u32,
    pub flags: u32,
    pub address: u64,
    pub offset: u64,
    pub file_size: u64,
    pub mem_size: u64,
}

const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;

/// A 64-bit little-endian x86-64 shared object with these headers (and
/// `.shstrtab`), `data` at file offset 0x1000.
pub(super) fn elf(sections: &[Section], segments: &[Segment], data: &[u8]) -> Vec<u8> {
    let mut names = vec![0u8];
    let mut name_at = Vec::new();
    for s in sections.iter().map(|s| s.name).chain([".shstrtab"]) {
        name_at.push(names.len() as u32);
        names.extend_from_slice(s.as_bytes());
        names.push(0);
    }
    let phoff = 64u64;
    let names_at = phoff + 56 * segments.len() as u64;
    let shoff = (names_at + names.len() as u64).next_multiple_of(8);
    let shnum = sections.len() as u16 + 2;
    let mut out = Vec::new();
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&phoff.to_le_bytes());
    out.extend_from_slice(&shoff.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, segments.len() as u16, 64, shnum, shnum - 1] {
        out.extend_from_slice(&half.to_le_bytes());
    }
    for s in segments {
        out.extend_from_slice(&s.kind.to_le_bytes());
        out.extend_from_slice(&s.flags.to_le_bytes());
        for word in [
            s.offset,
            s.address,
            s.address,
            s.file_size,
            s.mem_size,
            0x1000,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out.extend_from_slice(&names);
    out.resize(shoff as usize, 0);
    let header = |out: &mut Vec<u8>, name: u32, kind: u32, flags: u64, words: [u64; 3]| {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        for word in words {
            out.extend_from_slice(&word.to_le_bytes()); // address, offset, size
        }
        out.extend_from_slice(&[0; 8]); // link, info
        out.extend_from_slice(&1u64.to_le_bytes()); // alignment
        out.extend_from_slice(&0u64.to_le_bytes()); // entry size
    };
    header(&mut out, 0, 0, 0, [0; 3]);
    for (s, &name) in sections.iter().zip(&name_at) {
        header(
            &mut out,
            name,
            s.kind,
            s.flags,
            [s.address, s.offset, s.size],
        );
    }
    let names_name = *name_at.last().unwrap();
    header(
        &mut out,
        names_name,
        SHT_STRTAB,
        0,
        [0, names_at, names.len() as u64],
    );
    out.resize(out.len().max(0x1000), 0);
    out.extend_from_slice(data);
    out
}

/// `bytes` opened as the module of a user's file (a memory file).
pub(super) fn module(bytes: &[u8]) -> Module {
    // SAFETY: memfd_create with a NUL-terminated name; the File owns it.
    let mut file = unsafe {
        std::fs::File::from_raw_fd(libc::memfd_create(c"bad-file".as_ptr(), libc::MFD_CLOEXEC))
    };
    file.write_all(bytes).unwrap();
    Module::from_file(Path::new("/nonexistent/bad-file"), file).unwrap()
}

/// Found by the elf_module fuzz target: a section or segment whose
/// addresses or file range run past 2^64 overflowed the arithmetic on it
/// (`code_ranges`: a panic with overflow checks, wrapped ranges without).
/// Such headers are left out; the others are read as ever.
#[test]
fn headers_past_the_end_of_the_address_space_are_left_out() {
    let top = u64::MAX - 0xf;
    let code = SHF_ALLOC | SHF_EXECINSTR;
    let sections = [
        Section {
            name: ".text",
            kind: SHT_PROGBITS,
            flags: code,
            address: 0x1000,
            offset: 0x1000,
            size: 0x10,
        },
        Section {
            name: ".init",
            kind: SHT_PROGBITS,
            flags: code,
            address: top,
            offset: 0x1000,
            size: 0x100,
        },
        Section {
            name: ".got",
            kind: SHT_PROGBITS,
            flags: SHF_ALLOC,
            address: top,
            offset: 0x1000,
            size: 0x100,
        },
        Section {
            name: ".eh_frame",
            kind: SHT_PROGBITS,
            flags: SHF_ALLOC,
            address: 0x2000,
            offset: u64::MAX - 1,
            size: 0x10,
        },
    ];
    let segment = |address, offset| Segment {
        kind: PT_LOAD,
        flags: PF_X,
        address,
        offset,
        file_size: 0x1000,
        mem_size: 0x1000,
    };
    let segments = [
        segment(0x1000, 0x1000),
        segment(top, 0),
        segment(0x8000, u64::MAX - 0x10),
    ];
    let module = module(&elf(&sections, &segments, &[0x90; 0x10]));
    assert_eq!(module.code_ranges().collect::<Vec<_>>(), [(0x1000, 0x1010)]);
    assert_eq!(module.segments().len(), 1);
    assert!(module.section(".eh_frame").is_none() && module.section(".got").is_none());
    assert_eq!(
        module.section(".text").map(|(a, d)| (a, d.len())),
        Some((0x1000, 0x10))
    );
    assert_eq!(module.file_offset(0x1008), Some(0x1008));
    for vaddr in [top, u64::MAX, 0x8000] {
        assert!(!module.is_code(vaddr) && !module.is_read_only(vaddr));
        assert_eq!(module.file_offset(vaddr), None);
        assert_eq!(module.slot_value(vaddr), None);
    }
    let mapping = Mapping {
        start: 0x7f00_0000_0000,
        end: 0x7f00_0000_1000,
        file_offset: u64::MAX & !0xfff,
        executable: true,
        path: "/nonexistent/bad-file".into(),
        file_id: ("00:00".to_string(), 1),
    };
    assert_eq!(module.bias(&mapping), None);
}
