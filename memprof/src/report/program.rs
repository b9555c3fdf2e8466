//! The program's own frame of a stack: where in its source an allocation
//! comes from, however deep in the standard library it was made.
//!
//! A row's frames start at the allocation (`Array(T)#resize_to_capacity`,
//! `Hash(K, V)#upsert`), and `--depth` may show nothing but the library's
//! code; the first frame that is none of these is the line the developer
//! can change: the allocator plumbing ([`super::plumbing`]), Crystal's
//! standard library (its sources: `/usr/lib/crystal/` as Debian installs
//! it, `…/share/crystal/src/` as Crystal's own packages do), C and C++
//! headers (`/usr/include/`: the STL's templates), C++'s `std::` and
//! `__gnu_cxx::` functions, the system's libraries (`/lib/`, `/usr/lib/`:
//! libc, libstdc++, libgc), and frames without a source line.
use crate::crystal;
use crate::profile::{Frame, Group, Profile};

use super::plumbing;

/// The first frame of `group`'s stack, innermost first, that is the
/// program's own; `None` when every frame is the library's or the runtime's.
pub fn frame<'a>(profile: &'a Profile, group: &Group) -> Option<&'a Frame> {
    profile.frames(group).find(|f| is_program(f))
}

/// Whether `frame` is the program's own code, with a source line.
pub fn is_program(frame: &Frame) -> bool {
    let Some(file) = frame.file.as_deref() else {
        return false;
    };
    frame.line.is_some()
        && !crystal::is_runtime(frame)
        && !plumbing::is_operator_new(&frame.raw_name)
        && !plumbing::is_std_library(&frame.raw_name)
        && !is_library_source(file)
        && !is_system_module(&frame.module)
}

/// Sources of a language's library: Crystal's standard library, the
/// system's headers.
fn is_library_source(file: &str) -> bool {
    if file.starts_with("/usr/include/") || file.contains("/include/c++/") {
        return true;
    }
    file.ends_with(".cr")
        && (file.contains("/lib/crystal/") || file.contains("/share/crystal/src/"))
}

/// Libraries the system installs (libc, libstdc++, libgc, …).
fn is_system_module(module: &str) -> bool {
    ["/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/"]
        .iter()
        .any(|dir| module.starts_with(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(raw: &str, file: &str, module: &str) -> Frame {
        Frame {
            function: crate::symbolize::display_name(raw),
            raw_name: raw.into(),
            file: (!file.is_empty()).then(|| file.to_string()),
            line: (!file.is_empty()).then_some(7),
            module: module.into(),
            ..Frame::default()
        }
    }

    #[test]
    fn the_first_frame_of_the_programs_own_source() {
        let exe = "/tmp/havlak";
        let lib = "/usr/lib/crystal/lib";
        let mut p = Profile::default();
        // havlak --release: `Set(Int32)#add` inlined down to `Hash#upsert`.
        let stack = vec![
            frame("malloc", &format!("{lib}/gc/boehm.cr"), exe),
            frame("malloc_entries", &format!("{lib}/hash.cr"), exe),
            frame("upsert", &format!("{lib}/hash.cr"), exe),
            frame(
                "*Set(Int32)@Set(T)#add<Int32>:Nil",
                &format!("{lib}/set.cr"),
                exe,
            ),
            frame("find_loops", "/tmp/havlak.cr", exe),
            frame("__crystal_main", "/tmp/havlak.cr", exe),
        ];
        p.push(Group::default(), stack);
        let g = p.groups[0].clone();
        assert_eq!(frame_of(&p, &g), Some(("/tmp/havlak.cr", "find_loops")));
        // The official packages' layout, and C++ through the STL.
        assert!(!is_program(&frame(
            "push",
            "/usr/share/crystal/src/array.cr",
            exe
        )));
        assert!(!is_program(&frame(
            "_ZNSt6vectorIiSaIiEE9push_backERKi",
            "/usr/include/c++/12/bits/stl_vector.h",
            exe
        )));
        assert!(!is_program(&frame(
            "__libc_start_call_main",
            "../sysdeps/nptl/libc_start_call_main.h",
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        )));
        assert!(!is_program(&frame("main", "", exe)));
        assert!(is_program(&frame(
            "_Z11index_wordsi",
            "/src/records.cc",
            exe
        )));
        // Nothing of the program's: none.
        let mut q = Profile::default();
        q.push(
            Group::default(),
            vec![frame("main", &format!("{lib}/crystal/main.cr"), exe)],
        );
        let g = q.groups[0].clone();
        assert_eq!(frame_of(&q, &g), None);
    }

    fn frame_of<'a>(p: &'a Profile, g: &Group) -> Option<(&'a str, &'a str)> {
        super::frame(p, g).map(|f| (f.file.as_deref().unwrap(), f.raw_name.as_str()))
    }
}
