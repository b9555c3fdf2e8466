//! A program's Crystal source as memprof reads it for the class an inlined
//! `new` makes (`memprof::fuzzing::crystal_source`, `crystal/source.rs`):
//! the files a target's DWARF names are its user's.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memprof::fuzzing::crystal_source(&String::from_utf8_lossy(data));
});
