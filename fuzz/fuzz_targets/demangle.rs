//! A symbol's name as memprof shows it (`memprof::fuzzing::display_name`:
//! Crystal's readable form, else the demangled C++ or Rust name, else the
//! symbol): any name a program gives its functions. The name shown stays
//! a frame's name, not a document, and comes back at once (libFuzzer's
//! `-timeout` catches a hang, `-rss_limit_mb` a blow-up).
#![no_main]
use libfuzzer_sys::fuzz_target;

/// The longest name shown, whatever the symbol: memprof's budget for a
/// demangled name (`MAX_DEMANGLED` in `memprof/src/symbolize/demangle.rs`,
/// 16 KiB); other names are shown as long as they are (run with
/// `-max_len` below it).
const MAX_SHOWN: usize = 16 << 10;

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    let shown = memprof::fuzzing::display_name(&raw);
    assert!(
        shown.len() <= MAX_SHOWN,
        "{} bytes shown for a name of {} bytes",
        shown.len(),
        raw.len()
    );
});
