//! Addresses in an ELF file named as memprof names them
//! (`memprof::fuzzing::symbolize`): the symbol table and the DWARF read by
//! blazesym, through the file memprof hands it (`Module::debug_view`:
//! compressed sections checked first, debug links followed by memprof),
//! then Crystal's names and inlined `new`s. No process is needed: the
//! file is "mapped" at a made-up address.
//!
//! Naming runs on memprof's naming thread, which catches a panic in the
//! libraries that read the file (blazesym, gimli: a file that makes one
//! panic names nothing more, `symbolize/worker.rs`). libFuzzer's panic
//! hook would abort on it all the same; here such a panic is let through
//! to memprof's guard, and said once per place (in the target's log:
//! `caught as memprof catches it`). A panic in memprof's own code, or on
//! any other thread, still fails.
#![no_main]
use std::collections::HashSet;
use std::sync::{Mutex, Once};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static HOOK: Once = Once::new();
    HOOK.call_once(catch_library_panics_as_memprof_does);
    let _ = memprof::fuzzing::symbolize(data, &[0, 0x10, 0x400, 0x1000, 0x1139]);
});

fn catch_library_panics_as_memprof_does() {
    let libfuzzer = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let naming = std::thread::current().name() == Some("memprof-names");
        let place = info
            .location()
            .map(|l| (l.file().to_string(), l.line()))
            .unwrap_or_default();
        // A dependency's source, as cargo unpacks it.
        let library = place.0.contains("/.cargo/registry/");
        if !(naming && library) {
            return libfuzzer(info);
        }
        static SAID: Mutex<Option<HashSet<(String, u32)>>> = Mutex::new(None);
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.get_or_insert_with(HashSet::new).insert(place.clone()) {
            eprintln!("symbolize: a panic caught as memprof catches it: {info}");
        }
    }));
}
