//! Mangled names made readable: Rust's with `rustc-demangle`, C++'s as the
//! GNU toolchain reads them.
//!
//! C++ names go to libstdc++'s `__cxa_demangle` (the demangler `c++filt`
//! and gdb share), loaded once with `dlopen`: the `cpp_demangle` crate
//! drops the parameters of some template functions
//! (`std::function<int (int)>::function<main::{lambda(int)#1}, void>()`
//! for `…(main::{lambda(int)#1}&&)`), leaves empty arguments
//! (`pair<std::string&&, >`) and gives up on others, on real g++ 12
//! symbols (`fixtures/cxx_symbols.txt`). It stays the fallback where
//! libstdc++ is not installed.
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

/// Rust (legacy `_ZN…E` and v0 `_R…`) and C++ (`_Z…`) names, demangled.
pub fn demangle(raw: &str) -> Option<String> {
    if raw.starts_with("_R") || raw.starts_with("_ZN") {
        if let Ok(name) = rustc_demangle::try_demangle(raw) {
            return Some(format!("{name:#}"));
        }
    }
    // Only `_Z` names: both demanglers also read bare type codes (`i` → `int`).
    if !raw.starts_with("_Z") {
        return None;
    }
    match gnu() {
        Some(cxa) => cxa.demangle(raw),
        None => cpp_demangle::Symbol::new(raw).ok()?.demangle().ok(),
    }
}

/// `char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status)`.
type CxaDemangle =
    unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;

/// libstdc++'s demangler, when the library is installed.
#[derive(Clone, Copy)]
pub(crate) struct Gnu(CxaDemangle);

/// Loaded on first use; the library stays loaded.
pub(crate) fn gnu() -> Option<Gnu> {
    static GNU: OnceLock<Option<Gnu>> = OnceLock::new();
    *GNU.get_or_init(|| {
        // SAFETY: plain dlopen/dlsym of a C library's exported function,
        // whose signature is the C++ ABI's (`cxxabi.h`).
        unsafe {
            let lib = libc::dlopen(
                c"libstdc++.so.6".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if lib.is_null() {
                return None;
            }
            let f = libc::dlsym(lib, c"__cxa_demangle".as_ptr());
            (!f.is_null()).then(|| Gnu(std::mem::transmute::<*mut libc::c_void, CxaDemangle>(f)))
        }
    })
}

impl Gnu {
    fn demangle(self, raw: &str) -> Option<String> {
        let mangled = CString::new(raw).ok()?;
        let mut status: c_int = 0;
        // SAFETY: a NUL-terminated name, no buffer given (the function
        // mallocs the result, freed here), a valid status pointer.
        unsafe {
            let out = (self.0)(
                mangled.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut status,
            );
            if out.is_null() {
                return None;
            }
            let name = (status == 0).then(|| CStr::from_ptr(out).to_string_lossy().into_owned());
            libc::free(out.cast());
            name
        }
    }
}
