//! Mangled names made readable, within a budget: Rust's with
//! `rustc-demangle`, C++'s as the GNU toolchain reads them.
//!
//! C++ names go to libstdc++'s `__cxa_demangle` (the demangler `c++filt`
//! and gdb share), loaded once with `dlopen`: the `cpp_demangle` crate
//! drops the parameters of some template functions
//! (`std::function<int (int)>::function<main::{lambda(int)#1}, void>()`
//! for `…(main::{lambda(int)#1}&&)`), leaves empty arguments
//! (`pair<std::string&&, >`) and gives up on others, on real g++ 12
//! symbols (`fixtures/cxx_symbols.txt`). It stays the fallback where
//! libstdc++ is not installed.
//!
//! A name is input from a stranger (any user's program names its own
//! functions), and a short one can demangle to terabytes: each
//! back-reference (`S1_`) repeats what it names, so 40 levels of
//! `S0_IS1_S1_E` double the output 40 times in 451 bytes.
//! `__cxa_demangle` has no cap on its output, its time or its memory
//! (it walks on when `malloc` fails), so a name reaches it only when
//! its expansion is bounded: at most [`MAX_MANGLED`] bytes, and either
//! few enough back-references that even doubling at each stays under
//! [`GNU_WORK`] ([`expansion_bound`]), or read whole by `cpp_demangle`,
//! whose writer stops at [`MAX_DEMANGLED`] (both expand back-references
//! alike). Any other name is left mangled, cut to [`MAX_SHOWN`] bytes,
//! and counted.
use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt::Write as _;
use std::sync::OnceLock;

/// The longest mangled name demangled (libstdc++ refuses longer ones
/// too; g++'s longest in Debian's libstdc++ and LLVM are under 1 KiB).
pub const MAX_MANGLED: usize = 1024;
/// The longest demangled name kept: a frame's name, not a document
/// (the longest of 74,194 real C++ symbols of LLVM 15, clang 14, Boost
/// and libstdc++ reads 8,359 bytes).
pub const MAX_DEMANGLED: usize = 16 << 10;
/// A name left mangled is shown cut to this many bytes (and `…`).
pub const MAX_SHOWN: usize = 256;
/// The most output [`expansion_bound`] lets the GNU demangler write
/// unchecked (about a millisecond of its work).
const GNU_WORK: u64 = 1 << 20;

/// What became of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Demangled {
    /// Read: the readable name.
    Name(String),
    /// Not a mangled name (a C function, a Crystal name).
    NotMangled,
    /// Mangled, but beyond the budget (too long, or its expansion would
    /// be) or unreadable: shown as [`cut`] gives it, and counted.
    LeftMangled,
}

/// Rust (legacy `_ZN…E` and v0 `_R…`) and C++ (`_Z…`) names, demangled
/// within the budget.
pub fn demangle(raw: &str) -> Demangled {
    let mangled = raw.starts_with("_Z") || raw.starts_with("_R");
    if !mangled {
        return Demangled::NotMangled;
    }
    if raw.len() > MAX_MANGLED {
        return Demangled::LeftMangled;
    }
    if raw.starts_with("_R") || raw.starts_with("_ZN") {
        if let Ok(name) = rustc_demangle::try_demangle(raw) {
            return within_cap(|out| write!(out, "{name:#}"));
        }
    }
    // Only `_Z` names: both demanglers also read bare type codes (`i` → `int`).
    if !raw.starts_with("_Z") {
        return Demangled::NotMangled;
    }
    let cxa = gnu();
    if let Some(cxa) = cxa.filter(|_| expansion_bound(raw) <= GNU_WORK) {
        return match cxa.demangle(raw) {
            Some(name) => Demangled::Name(cut(&name, MAX_DEMANGLED)),
            None => Demangled::NotMangled,
        };
    }
    // Many back-references: read by the crate, within the cap, first.
    let checked = match cpp_demangle::Symbol::new(raw) {
        Ok(symbol) => within_cap(|out| symbol.structured_demangle(out, &Default::default())),
        Err(_) => return Demangled::LeftMangled,
    };
    match (cxa, checked) {
        // Its expansion fits the cap: the GNU text, cut to the cap all the same.
        (Some(cxa), Demangled::Name(name)) => match cxa.demangle(raw) {
            Some(gnu) => Demangled::Name(cut(&gnu, MAX_DEMANGLED)),
            None => Demangled::Name(name),
        },
        (_, checked) => checked,
    }
}

/// An upper bound of the demangled length of `raw`: each back-reference
/// (`S<id>_`, `T<id>_`, `fp…_`) repeats text written before it, so at
/// most doubles what is written; counted generously (a letter pair in
/// an identifier may count too).
fn expansion_bound(raw: &str) -> u64 {
    let b = raw.as_bytes();
    let reference = |rest: &[u8], digits: fn(u8) -> bool| {
        let n = rest.iter().take_while(|&&c| digits(c)).count();
        rest.get(n) == Some(&b'_')
    };
    let mut references: u32 = 0;
    for (i, &c) in b.iter().enumerate() {
        let rest = &b[i + 1..];
        let counted = match c {
            b'S' => reference(rest, |c| c.is_ascii_digit() || c.is_ascii_uppercase()),
            b'T' => reference(rest, |c| c.is_ascii_digit()),
            b'f' => rest.first() == Some(&b'p') || rest.first() == Some(&b'L'),
            _ => false,
        };
        references += u32::from(counted);
    }
    let doubled = 1u64.checked_shl(references).unwrap_or(u64::MAX);
    (b.len() as u64).saturating_mul(doubled)
}

/// `write` into a string that stops at [`MAX_DEMANGLED`] bytes: the
/// name, or [`Demangled::LeftMangled`] if it would be longer (the writer
/// errs, and the demangler stops there).
fn within_cap(write: impl FnOnce(&mut Capped) -> std::fmt::Result) -> Demangled {
    let mut out = Capped(String::new());
    match write(&mut out) {
        Ok(()) if !out.0.is_empty() => Demangled::Name(out.0),
        Ok(()) => Demangled::NotMangled,
        Err(_) => Demangled::LeftMangled,
    }
}

/// A string that refuses to grow past [`MAX_DEMANGLED`].
struct Capped(String);

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

/// `name` cut to at most `max` bytes at a character's boundary, `…`
/// after the cut.
pub fn cut(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
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
    /// Only for names [`demangle`] checked: this one has no cap.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// `_Z1f1A1BIS_S_E` then `levels` times `S0_I` + two references to
    /// the level before + `E`: each level doubles the demangled text.
    pub(crate) fn doubling(levels: usize) -> String {
        let mut name = String::from("_Z1f1A1BIS_S_E");
        for level in 1..=levels {
            let id = seq_id(level);
            name += &format!("S0_IS{id}_S{id}_E");
        }
        name
    }

    /// `n` in base 36: `S<n>_` is the substitution n + 1 (`S_` the first,
    /// `S0_` the second: here `B`; level n's argument is `S<n>_`).
    fn seq_id(n: usize) -> String {
        const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut n = n;
        let mut out = vec![DIGITS[n % 36]];
        n /= 36;
        while n > 0 {
            out.push(DIGITS[n % 36]);
            n /= 36;
        }
        out.reverse();
        String::from_utf8(out).unwrap()
    }

    /// A Rust v0 name (`a::f::<…>`) whose generic arguments are tuples
    /// of two back-references (`B…_`) to the argument before.
    fn rust_doubling(levels: usize) -> String {
        let mut body = String::from("INvC1a1f");
        let mut before = body.len();
        body += "ThhE";
        for _ in 0..levels {
            let here = body.len();
            let back = base62(before);
            body += &format!("TB{back}B{back}E");
            before = here;
        }
        format!("_R{body}E")
    }

    /// v0's `<base-62-number>`: `_` for 0, else n - 1 in base 62 and `_`.
    fn base62(n: usize) -> String {
        const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        if n == 0 {
            return "_".into();
        }
        let mut n = n - 1;
        let mut out = vec![DIGITS[n % 62]];
        n /= 62;
        while n > 0 {
            out.push(DIGITS[n % 62]);
            n /= 62;
        }
        out.reverse();
        String::from_utf8(out).unwrap() + "_"
    }

    #[test]
    fn a_rust_doubling_name_reads_while_small() {
        assert_eq!(
            demangle(&rust_doubling(1)),
            Demangled::Name("a::f::<(u8, u8), ((u8, u8), (u8, u8))>".into())
        );
    }

    #[test]
    fn a_doubling_name_is_left_mangled_within_milliseconds() {
        // The 451 bytes (39 levels); 26 gave 872 MB in 7.3 s before.
        let name = doubling(39);
        assert_eq!(name.len(), 451);
        for levels in [12, 20, 26, 39, 80] {
            let name = doubling(levels);
            let start = Instant::now();
            let got = demangle(&name);
            let took = start.elapsed();
            assert!(
                took < Duration::from_millis(200),
                "{levels} levels: {took:?}"
            );
            // 12 levels: each argument twice the one before, the last
            // over 2^12 × 7 bytes: past the cap.
            assert_eq!(got, Demangled::LeftMangled, "{levels} levels");
        }
        // A few levels read, as c++filt reads them.
        assert_eq!(
            demangle(&doubling(1)),
            Demangled::Name("f(A, B<A, A>, B<B<A, A>, B<A, A> >)".into())
        );
    }

    #[test]
    fn back_references_bound_the_expansion() {
        assert_eq!(expansion_bound("_Z3fooi"), 7);
        // `S_`, `S0_` and `T_`: three references.
        assert_eq!(expansion_bound("_Z1fIiEvT_S_S0_"), 15 * 8);
        assert_eq!(expansion_bound(&doubling(39)), u64::MAX);
    }

    #[test]
    fn over_long_names_are_left_mangled() {
        let name = format!("_ZN{}E", "3abc".repeat(300));
        assert_eq!(demangle(&name), Demangled::LeftMangled);
        assert_eq!(demangle("malloc"), Demangled::NotMangled);
        assert_eq!(demangle("_Zgarbage"), Demangled::NotMangled);
    }

    #[test]
    fn rust_names_have_the_same_cap() {
        assert_eq!(demangle(&rust_doubling(20)), Demangled::LeftMangled);
        assert_eq!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE"),
            Demangled::Name("std::rt::lang_start".into())
        );
    }

    #[test]
    fn cut_keeps_characters_whole() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc…");
        assert_eq!(cut("aé", 2), "a…");
    }
}
