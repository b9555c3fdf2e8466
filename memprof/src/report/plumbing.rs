//! The allocator plumbing reports hide at the top of a stack, so the first
//! frame shown is the program's: Crystal's runtime (`GC.malloc`,
//! `__crystal_malloc64`, `Pointer(T).malloc`, see [`crate::crystal`]) and
//! C++'s `operator new`/`new[]` with the standard library frames between it
//! and the program (`std::__new_allocator<T>::allocate`,
//! `std::vector<T>::_M_realloc_insert`, `std::string::_M_construct`, …).
use crate::crystal;
use crate::profile::Frame;

/// `operator new` and `operator new[]` in all their overloads (nothrow,
/// aligned): mangled `_Znw…` and `_Zna…`.
pub fn is_operator_new(raw: &str) -> bool {
    raw.starts_with("_Znw") || raw.starts_with("_Zna")
}

/// A C++ standard library function (mangled name in `std::` or
/// `__gnu_cxx::`): the containers and allocators a program's `new` goes
/// through. Itanium substitutions `St` (std::), `Sa` (std::allocator), `Sb`
/// (std::basic_string), `Ss`, `Si`, `So`, `Sd` (the string and stream
/// typedefs) all name the standard library.
pub fn is_std_library(raw: &str) -> bool {
    let Some(rest) = raw.strip_prefix("_Z") else {
        return false;
    };
    // A nested name (`N`, `NK` for const methods) or a plain one (`St…`).
    let rest = rest
        .strip_prefix("NK")
        .or_else(|| rest.strip_prefix('N'))
        .unwrap_or(rest);
    let bytes = rest.as_bytes();
    (bytes.len() >= 2 && bytes[0] == b'S' && b"tabsiod".contains(&bytes[1]))
        || rest.starts_with("9__gnu_cxx")
}

/// How many innermost frames of `frames` are plumbing: the innermost run of
/// Crystal runtime frames and `operator new`s, and, once an `operator new`
/// was seen, the standard library frames right after it (the container
/// method that called it is the library's, its caller the program's).
pub fn count<'a>(frames: impl Iterator<Item = &'a Frame>) -> usize {
    let mut seen_new = false;
    let mut n = 0;
    for f in frames {
        if is_operator_new(&f.raw_name) {
            seen_new = true;
        } else if !(crystal::is_runtime(f) || seen_new && is_std_library(&f.raw_name)) {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_new_and_the_standard_library() {
        assert!(is_operator_new("_Znwm") && is_operator_new("_ZnamRKSt9nothrow_t"));
        assert!(is_std_library("_ZNSt15__new_allocatorIiE8allocateEmPKv"));
        assert!(!is_std_library("_Z11index_wordsi"));
    }

    fn frame(raw: &str) -> Frame {
        Frame {
            raw_name: raw.into(),
            function: crate::symbolize::display_name(raw),
            ..Frame::default()
        }
    }

    /// cpp.cc's `m[…].push_back(i)` at -O2, as symbolized.
    #[test]
    fn cxx_vector_push_back_is_plumbing_up_to_the_program() {
        let stack = [
            "_Znwm",
            "_ZNSt15__new_allocatorIiE8allocateEmPKv",
            "_ZNSt16allocator_traitsISaIiEE8allocateERS0_m",
            "_ZNSt12_Vector_baseIiSaIiEE11_M_allocateEm",
            "_ZNSt6vectorIiSaIiEE17_M_realloc_insertIJRKiEEEvN9__gnu_cxx17__normal_iteratorIPiS1_EEDpOT_",
            "_ZNSt6vectorIiSaIiEE9push_backERKi",
            "index_words",
            "main",
        ]
        .map(frame);
        assert_eq!(count(stack.iter()), 6);
        assert_eq!(stack[6].function, "index_words");
        // A library frame is plumbing only after `operator new`.
        let plain = ["_ZNSt6vectorIiSaIiEE9push_backERKi", "main"].map(frame);
        assert_eq!(count(plain.iter()), 0);
        assert!(!is_std_library("_ZN4llvm6Module4dumpEv"));
        assert!(is_std_library(
            "_ZNKSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE4findEPKc"
        ));
        assert!(is_std_library(
            "_ZN9__gnu_cxx13new_allocatorIiE8allocateEmPKv"
        ));
    }
}
