//! An ELF file as a session reads a target's module
//! (`memprof::fuzzing::elf_module`: segments, sections, symbols, GOT
//! slots and their relocations, thread-local storage, versioned Crystal
//! names, load bias, where its DWARF is read): the target's files are its
//! user's. Bad input gets an error, never a panic or a hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memprof::fuzzing::elf_module(data);
});
