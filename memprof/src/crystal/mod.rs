//! Crystal symbol names: readable forms, the allocator plumbing reports
//! hide, and the class an allocation creates.
//!
//! Crystal does not mangle: a method's ELF symbol is its full signature,
//! `*Owner[@DefiningType](#|::)name[:named_arg…][<Arg, …>][:ReturnType]`,
//! where `#` marks an instance method, `::` a class method, and
//! `@DefiningType` the module or generic class the code comes from. Procs are
//! `~procProc(Args)@file.cr:line`, constant and class-variable initializers
//! `~NAME:init`. DWARF names are short (`new`), so [`crate::symbolize`] takes
//! names from the symbol table and calls [`readable`] on them.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use crate::profile::Frame;

pub mod fields;
pub mod generics;
pub mod source;
pub(crate) mod symbol;
#[cfg(test)]
mod tests;

pub use symbol::{parse_method, Method};

/// The readable form of a Crystal symbol: `Foo.new`, `Array(Int32)#push`,
/// `make_foos`, `-> proc at src/gc/boehm.cr:148`. `None` for names that are
/// not Crystal's (C, C++, Rust, `__crystal_main`): callers show those as they are.
pub fn readable(raw: &str) -> Option<String> {
    if let Some(m) = parse_method(raw) {
        return Some(match m.owner {
            Some(owner) => {
                let sep = if m.class_method { '.' } else { '#' };
                format!("{owner}{sep}{}", m.name)
            }
            None => m.name.to_string(),
        });
    }
    if let Some(body) = raw.strip_prefix('*') {
        // Unparsed but still Crystal: drop the marker and the signature,
        // which starts outside any parentheses (a `:` or `<` inside
        // `NamedTuple(a: Int32)` is part of a type, `::` of a path).
        return Some(body[..signature_start(body)].to_string());
    }
    let body = raw.strip_prefix('~')?;
    if let Some(proc) = body.strip_prefix("proc") {
        // `~proc2Proc(Int32, Nil)@file.cr:12`: the numbering tells copies apart.
        if let Some(at) = proc.rfind(")@") {
            let digits = &proc[..proc.find("Proc(").unwrap_or(0)];
            if digits.bytes().all(|b| b.is_ascii_digit()) {
                return Some(format!("-> proc at {}", &proc[at + 2..]));
            }
        }
    }
    for (suffix, what) in [(":init", "init"), (":read", "read")] {
        if let Some(name) = body.strip_suffix(suffix) {
            return Some(format!("{name} ({what})"));
        }
    }
    Some(body.to_string())
}

/// Where the signature (`<Args>`, `:Return`) of an unparsed method symbol
/// starts: the first `<` or lone `:` outside parentheses, not at the start.
fn signature_start(body: &str) -> usize {
    let bytes = body.as_bytes();
    let mut k = 0;
    while k < bytes.len() {
        match bytes[k] {
            b'(' => match symbol::balanced_end(&body[k..]) {
                Some(n) => {
                    k += n;
                    continue;
                }
                // Not closed: nothing to cut safely.
                None => return body.len(),
            },
            b':' if bytes.get(k + 1) == Some(&b':') => k += 1,
            b'<' | b':' if k > 0 => return k,
            _ => {}
        }
        k += 1;
    }
    body.len()
}

/// Whether a symbol is allocator plumbing between the program and the probed
/// allocator: Boehm's `GC_*` functions, `__crystal_malloc64` & co, `GC.malloc`
/// & co, `Pointer(T).malloc` and `Pointer(T)#realloc`. Reports hide the
/// innermost run of these so the first frame shown is the allocation site
/// (`Foo.new`, `Array(Foo)#initialize`, the user's own method).
pub fn is_runtime_frame(raw: &str) -> bool {
    if raw.starts_with("GC_") || is_crystal_malloc_fun(raw) {
        return true;
    }
    match parse_method(raw) {
        Some(m) => is_runtime_method(&m),
        None => false,
    }
}

/// [`is_runtime_frame`] for a whole frame: frames of functions inlined into
/// others (release builds) carry only DWARF's short name (`malloc`), so the
/// source file tells `GC.malloc` (`gc/boehm.cr`) and `Pointer.malloc`
/// (`primitives.cr`) from a program's own `malloc`.
pub fn is_runtime(frame: &Frame) -> bool {
    is_runtime_frame(&frame.raw_name) || is_inlined_runtime(&frame.raw_name, frame.file.as_deref())
}

/// `__crystal_malloc64`, `__crystal_malloc_atomic64`, `__crystal_realloc64`
/// and their 32-bit forms: the functions the compiler calls to allocate.
fn is_crystal_malloc_fun(raw: &str) -> bool {
    raw.strip_prefix("__crystal_")
        .is_some_and(|rest| rest.starts_with("malloc") || rest.starts_with("realloc"))
}

fn is_runtime_method(m: &Method<'_>) -> bool {
    match m.owner {
        Some("GC") => {
            m.class_method
                && (m.name.starts_with("malloc") || m.name == "realloc" || m.name == "free")
        }
        Some(owner) if owner.starts_with("Pointer(") => {
            (m.class_method && m.name == "malloc") || (!m.class_method && m.name == "realloc")
        }
        _ => false,
    }
}

/// Short DWARF names of inlined plumbing, recognized by their source file.
fn is_inlined_runtime(name: &str, file: Option<&str>) -> bool {
    let Some(file) = file else { return false };
    let in_gc = file.ends_with("/gc.cr") || (file.contains("/gc/") && file.ends_with(".cr"));
    let in_pointer = file.ends_with("/primitives.cr") || file.ends_with("/pointer.cr");
    match name {
        "malloc" | "realloc" => in_gc || in_pointer,
        "malloc_atomic" | "free" => in_gc,
        _ => false,
    }
}

/// What the pointer-allocating plumbing right below the first shown frame was.
enum Via {
    /// `GC.malloc` & co or `__crystal_malloc64` only: an object or a raw buffer.
    Gc,
    /// `Pointer(T).malloc` / `#realloc`: a buffer.
    Pointer,
}

/// The Crystal class an allocation creates, where the stack says so:
/// `Type.new` / `Type.allocate` right above the allocator plumbing (debug
/// builds; release builds inline `new`) gives `Type`; a buffer allocated by a
/// method of `Type` (`Array(Foo)#initialize` through `Pointer(Foo).malloc`)
/// gives `Type buffer`; the buffers of `String` and `String::Builder` give
/// `String`. `None` when the first frame shown is not a Crystal method.
///
/// (Example: `doc_examples::example_2` below, run by the tests.)
pub fn allocated_type(frames: &[Frame]) -> Option<String> {
    let plumbing = frames.iter().take_while(|f| is_runtime(f)).count();
    let via = if frames[..plumbing].iter().any(is_pointer_frame) {
        Via::Pointer
    } else {
        Via::Gc
    };
    let first = frames.get(plumbing)?;
    if let Some(owner) = inlined_new_owner(first) {
        // Release builds: `new` inlined, its class found by symbolize in the
        // source. A generic class's source says `Array(T)`, not which T:
        // no type rather than a wrong one (the caller's `[] of Foo` or its
        // own type give `Array(Foo)`).
        if crate::crystal::generics::has_parameter(owner) {
            return None;
        }
        return Some(match via {
            Via::Gc => owner.to_string(),
            Via::Pointer => format!("{owner} buffer"),
        });
    }
    let m = parse_method(&first.raw_name)?;
    let owner = m.owner?;
    if owner == "String" || owner == "String::Builder" && !(m.class_method && m.name == "new") {
        // String allocates only its own bytes; a builder's buffer becomes the String.
        return Some("String".to_string());
    }
    match via {
        Via::Gc if m.class_method && (m.name == "new" || m.name == "allocate") => {
            Some(owner.to_string())
        }
        _ => Some(format!("{owner} buffer")),
    }
}

/// The class of an inlined `new` that [`crate::symbolize`] named
/// `Class.new` from the source ([`source`]): DWARF's short name `new`.
fn inlined_new_owner(frame: &Frame) -> Option<&str> {
    let raw = frame.raw_name.as_str();
    if raw != "new" && !raw.starts_with("new:") {
        return None;
    }
    // Named as `Class.new`, named arguments (`new:initial_capacity`) left out.
    frame
        .function
        .strip_suffix(".new")
        .filter(|o| !o.is_empty())
}

fn is_pointer_frame(frame: &Frame) -> bool {
    match parse_method(&frame.raw_name) {
        Some(m) => m.owner.is_some_and(|o| o.starts_with("Pointer(")) && is_runtime_method(&m),
        None => {
            matches!(frame.raw_name.as_str(), "malloc" | "realloc")
                && frame
                    .file
                    .as_deref()
                    .is_some_and(|f| f.ends_with("/primitives.cr") || f.ends_with("/pointer.cr"))
        }
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::crystal::{is_runtime_frame, readable};
        assert_eq!(readable("*Foo::new<Int32>:Foo").as_deref(), Some("Foo.new"));
        assert_eq!(
            readable("*Array(Int32)@Array(T)#push<Int32>:Array(Int32)").as_deref(),
            Some("Array(Int32)#push")
        );
        assert_eq!(readable("make_foo"), None); // not Crystal: shown as is
        assert!(is_runtime_frame("*GC::malloc<UInt64>:Pointer(Void)"));
        assert!(!is_runtime_frame("*Foo::new<Int32>:Foo"));
    }
    #[test]
    fn example_2() {
        use crate::crystal::allocated_type;
        use crate::profile::Frame;
        let frame = |raw: &str| Frame {
            raw_name: raw.into(),
            ..Frame::default()
        };
        let stack = [
            frame("*GC::malloc<UInt64>:Pointer(Void)"),
            frame("__crystal_malloc64"),
            frame("*Foo::new<Int64, Int64, Int32>:Foo"),
            frame("*make_foos:Array(Foo)"),
        ];
        assert_eq!(allocated_type(&stack).as_deref(), Some("Foo"));
    }
}
