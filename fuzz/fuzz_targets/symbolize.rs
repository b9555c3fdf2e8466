//! Addresses in an ELF file named as memprof names them
//! (`memprof::fuzzing::symbolize`): the symbol table and the DWARF read by
//! blazesym, through the file memprof hands it (`Module::debug_view`:
//! compressed sections checked first, debug links followed by memprof),
//! then Crystal's names and inlined `new`s. No process is needed: the
//! file is "mapped" at a made-up address.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memprof::fuzzing::symbolize(data, &[0, 0x10, 0x400, 0x1000, 0x1139]);
});
