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
//! ```
//! use memprof::crystal::{is_runtime_frame, readable};
//! assert_eq!(readable("*Foo::new<Int32>:Foo").as_deref(), Some("Foo.new"));
//! assert_eq!(
//!     readable("*Array(Int32)@Array(T)#push<Int32>:Array(Int32)").as_deref(),
//!     Some("Array(Int32)#push")
//! );
//! assert_eq!(readable("make_foo"), None); // not Crystal: shown as is
//! assert!(is_runtime_frame("*GC::malloc<UInt64>:Pointer(Void)"));
//! assert!(!is_runtime_frame("*Foo::new<Int32>:Foo"));
//! ```
use crate::profile::Frame;

/// A Crystal method symbol, split into the parts reports use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method<'a> {
    /// The receiver's type (`Array(Int32)`, virtual `+` and `.class` removed);
    /// `None` for top-level methods.
    pub owner: Option<&'a str>,
    /// A class method (`Foo.new`), not an instance method (`Foo#bar`).
    pub class_method: bool,
    /// The method's name (`push`, `<<`, `[]?`, `size=`), without named arguments.
    pub name: &'a str,
}

/// Parses a Crystal method symbol (`*…`); `None` for anything else.
pub fn parse_method(raw: &str) -> Option<Method<'_>> {
    let body = raw.strip_prefix('*')?;
    let mut p = Cursor { s: body, i: 0 };
    p.file_prefix();
    let owner = if p.at_method_start() {
        None
    } else {
        let start = p.type_path()?;
        let owner = &body[start..p.i];
        if p.eat("@") {
            p.type_path()?;
        }
        Some(owner)
    };
    let class_method = match owner {
        None => false,
        Some(_) if p.eat("::") => true,
        Some(_) if p.eat("#") => false,
        Some(_) => return None,
    };
    let name = p.method_name()?;
    p.named_args();
    if !(p.rest().is_empty() || p.rest().starts_with(['<', ':'])) {
        return None;
    }
    // `Foo.class#bar` is a class method written as a metaclass instance method.
    let (owner, class_method) = match owner.map(|o| o.trim_end_matches('+')) {
        Some(o) => match o.strip_suffix(".class") {
            Some(o) => (Some(o.trim_end_matches('+')), true),
            None => (Some(o), class_method),
        },
        None => (None, false),
    };
    Some(Method {
        owner,
        class_method,
        name,
    })
}

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
        // Unparsed but still Crystal: drop the marker and the signature.
        let end = body
            .find(['<', ':'])
            .filter(|&e| e > 0)
            .unwrap_or(body.len());
        return Some(body[..end].to_string());
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
/// ```
/// use memprof::crystal::allocated_type;
/// use memprof::profile::Frame;
/// let frame = |raw: &str| Frame { raw_name: raw.into(), ..Frame::default() };
/// let stack = [
///     frame("*GC::malloc<UInt64>:Pointer(Void)"),
///     frame("__crystal_malloc64"),
///     frame("*Foo::new<Int64, Int64, Int32>:Foo"),
///     frame("*make_foos:Array(Foo)"),
/// ];
/// assert_eq!(allocated_type(&stack).as_deref(), Some("Foo"));
/// ```
pub fn allocated_type(frames: &[Frame]) -> Option<String> {
    let plumbing = frames.iter().take_while(|f| is_runtime(f)).count();
    let via = if frames[..plumbing].iter().any(is_pointer_frame) {
        Via::Pointer
    } else {
        Via::Gc
    };
    let m = parse_method(&frames.get(plumbing)?.raw_name)?;
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

/// A position in a symbol being parsed.
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

/// Operator method names, longest first so `<=>` wins over `<=` and `<`.
const OPERATORS: &[&str] = &[
    "&**", "<=>", "===", "[]?", "[]=", "[]", "**", "==", "!=", "=~", "!~", "<<", ">>", "<=", ">=",
    "&+", "&-", "&*", "//", "<", ">", "+", "-", "*", "/", "%", "&", "|", "^", "~", "!",
];

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.i += token.len();
            true
        } else {
            false
        }
    }

    /// A method name starts here (lowercase identifier or operator), not a type.
    fn at_method_start(&self) -> bool {
        if self.rest().starts_with("struct.") || self.rest().starts_with("union.") {
            return false;
        }
        match self.peek() {
            Some(b) => {
                b.is_ascii_lowercase() || b == b'_' || (!b.is_ascii_alphanumeric() && b != b'/')
            }
            None => false,
        }
    }

    fn ident(&mut self) -> &'a str {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    /// `(…)` with nested parentheses; the contents are not checked.
    fn parens(&mut self) -> Option<()> {
        let mut depth = 0usize;
        for (k, b) in self.rest().bytes().enumerate() {
            match b {
                b'(' => depth += 1,
                b')' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        self.i += k + 1;
                        return Some(());
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Skips the `/path/file.cr::` that qualifies file-private types and methods.
    fn file_prefix(&mut self) {
        if let Some(at) = self.rest().find(".cr::") {
            if !self.rest()[..at].contains(['<', '(', '#', '@', ':', ' ']) {
                self.i += at + ".cr::".len();
            }
        }
    }

    /// `A::B(T)::C+`, `Foo.class`, `struct.LibC::Timeval`, or a file-private
    /// `/path/file.cr::Type`; returns where the type's name starts (after the
    /// `struct.` or file prefix).
    fn type_path(&mut self) -> Option<usize> {
        for prefix in ["struct.", "union."] {
            self.eat(prefix);
        }
        self.file_prefix();
        let start = self.i;
        loop {
            if !self.peek().is_some_and(|b| b.is_ascii_uppercase()) {
                return None;
            }
            self.ident();
            if self.peek() == Some(b'(') {
                self.parens()?;
            }
            let next_is_type = self
                .rest()
                .strip_prefix("::")
                .is_some_and(|r| r.as_bytes().first().is_some_and(|b| b.is_ascii_uppercase()));
            if !next_is_type {
                break;
            }
            self.i += 2;
        }
        self.eat("+");
        while self.eat(".class") {}
        self.eat("+");
        Some(start)
    }

    /// `push`, `empty?`, `size=`, `<<`, `[]?`: an identifier with its suffix,
    /// or the longest operator after which a signature (`<`, `:`) or nothing follows.
    fn method_name(&mut self) -> Option<&'a str> {
        let start = self.i;
        if self
            .peek()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        {
            self.ident();
            if matches!(self.peek(), Some(b'?' | b'!' | b'=')) {
                self.i += 1;
            }
            return Some(&self.s[start..self.i]);
        }
        for op in OPERATORS {
            if let Some(after) = self.rest().strip_prefix(op) {
                if after.is_empty() || after.starts_with(['<', ':']) {
                    self.i += op.len();
                    return Some(op);
                }
            }
        }
        None
    }

    /// `:file:encoding`: the named arguments of an overload, skipped. A return
    /// type (`:String`, `:(A | B)`) starts otherwise.
    fn named_args(&mut self) {
        loop {
            let Some(after) = self.rest().strip_prefix(':') else {
                return;
            };
            if !after
                .as_bytes()
                .first()
                .is_some_and(|b| b.is_ascii_lowercase() || *b == b'_')
            {
                return;
            }
            let mut probe = Cursor {
                s: self.s,
                i: self.i + 1,
            };
            probe.ident();
            let next = probe.rest();
            if next.is_empty()
                || next.starts_with('<')
                || next.starts_with(':') && !next.starts_with("::")
            {
                self.i = probe.i;
            } else {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Symbols from `nm` of the test fixture (`crystal build`, Crystal 1.6.0) and its stdlib.
    const READABLE: &[(&str, &str)] = &[
        ("*Foo::new<Int64, Int64, Int32>:Foo", "Foo.new"),
        ("*Foo#initialize<Int64, Int64, Int32>:Int32", "Foo#initialize"),
        ("*Array(Int32)@Array(T)#push<Int32>:Array(Int32)", "Array(Int32)#push"),
        ("*Array(Foo)@Array(T)::new<Int32>:Array(Foo)", "Array(Foo).new"),
        ("*Array(Foo)@Array(T)#<<<Foo>:Array(Foo)", "Array(Foo)#<<"),
        ("*GC::malloc<UInt64>:Pointer(Void)", "GC.malloc"),
        ("*GC::realloc<Pointer(UInt8), Int32>:Pointer(UInt8)", "GC.realloc"),
        ("*Pointer(Foo)@Pointer(T)::malloc<Int32>:Pointer(Foo)", "Pointer(Foo).malloc"),
        ("*Pointer(Foo)@Pointer(T)#realloc<Int32>:Pointer(Foo)", "Pointer(Foo)#realloc"),
        ("*Pointer(Foo)@Object::==<Pointer(Foo).class>:Bool", "Pointer(Foo).=="),
        ("*Pointer(Foo)@Pointer(T)#[]=<Int32, Foo>:Foo", "Pointer(Foo)#[]="),
        ("*Pointer(Foo)@Pointer(T)#-<Int32>:Pointer(Foo)", "Pointer(Foo)#-"),
        ("*Int32@Int#~:Int32", "Int32#~"),
        ("*Char#<=><Char>:Int32", "Char#<=>"),
        ("*Char#<<Char>:Bool", "Char#<"),
        ("*String#starts_with?<Char>:Bool", "String#starts_with?"),
        ("*Array(UInt8)@Array(T)#size=<Int32>:Int32", "Array(UInt8)#size="),
        ("*Crystal::OnceState@Reference::new:Crystal::OnceState", "Crystal::OnceState.new"),
        ("*Crystal::main<Int32, Pointer(Pointer(UInt8))>:Int32", "Crystal.main"),
        ("*Crystal::main_user_code<Int32, Pointer(Pointer(UInt8))>:Nil", "Crystal.main_user_code"),
        ("*Crystal::System::Fiber::allocate_stack<Int32>:Pointer(Void)", "Crystal::System::Fiber.allocate_stack"),
        ("*Fiber::new<Nil, &Proc(Nil)>:Fiber", "Fiber.new"),
        ("*Fiber#run:(IO::FileDescriptor | Nil)", "Fiber#run"),
        ("*make_foos:Array(Foo)", "make_foos"),
        ("*spawn<&Proc(Nil)>:Fiber", "spawn"),
        ("*spawn:name<String, &Proc(Nil)>:Fiber", "spawn"),
        ("*_u128_div_rem<UInt128, UInt128>:Tuple(UInt128, UInt128)", "_u128_div_rem"),
        ("*String::interpolation<String, Int32>:String", "String.interpolation"),
        ("*String::Builder#to_s:String", "String::Builder#to_s"),
        (
            "*String::Builder@IO#<<<(Bool.class | Int32.class | Int64.class | Slice(UInt8).class | String.class)>:String::Builder",
            "String::Builder#<<",
        ),
        (
            "*Hash(Thread, Deque(Fiber))@Hash(K, V)#upsert<Thread, Deque(Fiber)>:(Hash::Entry(Thread, Deque(Fiber)) | Nil)",
            "Hash(Thread, Deque(Fiber))#upsert",
        ),
        (
            "*Hash::Entry(Thread, Crystal::Event)@Hash::Entry(K, V)#deleted?:Bool",
            "Hash::Entry(Thread, Crystal::Event)#deleted?",
        ),
        (
            "*IO::FileDescriptor+@IO::Evented#wait_writable<(Time::Span | Nil)>:Nil",
            "IO::FileDescriptor#wait_writable",
        ),
        (
            "*IO::FileDescriptor+@IO#read_bytes<UInt32.class, (IO::ByteFormat::BigEndian:Module | IO::ByteFormat::LittleEndian:Module)>:UInt32",
            "IO::FileDescriptor#read_bytes",
        ),
        ("*StaticArray(Int32, 2)@Indexable(T)#[]<Int32>:Int32", "StaticArray(Int32, 2)#[]"),
        (
            "*Array(Crystal::DWARF::Abbrev)@Indexable(T)#[]?<UInt32>:(Crystal::DWARF::Abbrev | Nil)",
            "Array(Crystal::DWARF::Abbrev)#[]?",
        ),
        (
            "*Pointer(Tuple(Crystal::DWARF::AT, Crystal::DWARF::FORM, Bool | Int32 | Slice(UInt8)))@Pointer(T)#copy_from_impl<Pointer(Tuple(Crystal::DWARF::AT, Crystal::DWARF::FORM, Bool | Int32 | Slice(UInt8))), Int32>:Pointer(Tuple(Crystal::DWARF::AT, Crystal::DWARF::FORM, Bool | Int32 | Slice(UInt8)))",
            "Pointer(Tuple(Crystal::DWARF::AT, Crystal::DWARF::FORM, Bool | Int32 | Slice(UInt8)))#copy_from_impl",
        ),
        ("*Math@Math::max<Int32, (UInt32 | UInt64)>:(Int32 | UInt32 | UInt64)", "Math.max"),
        ("*Char::Reader#initialize:at_end<String>:(Bool | Char)", "Char::Reader#initialize"),
        (
            "*Crystal::DWARF::LineNumbers::LNCTFormat::new:lnct:format<Crystal::DWARF::LineNumbers::LNCT, Crystal::DWARF::FORM>:Crystal::DWARF::LineNumbers::LNCTFormat",
            "Crystal::DWARF::LineNumbers::LNCTFormat.new",
        ),
        (
            "*File::Error.class@SystemError::ClassMethods#new_from_os_error:file<String, Errno, String>:File::Error",
            "File::Error.new_from_os_error",
        ),
        ("*File::new:blocking:encoding:invalid<String, Int32, Bool, Nil, Nil>:File", "File.new"),
        ("*ArgumentError@Exception#callstack=<Exception::CallStack>:Exception::CallStack", "ArgumentError#callstack="),
        (
            "*/usr/lib/crystal/lib/raise.cr::LEBReader::new<Pointer(UInt8)>:/usr/lib/crystal/lib/raise.cr::LEBReader",
            "LEBReader.new",
        ),
        ("*struct.LibC::Timeval::new:struct.LibC::Timeval", "LibC::Timeval.new"),
        ("*Bool@Object::to_s<String::Builder>:Nil", "Bool.to_s"),
        ("*Deque(Int32)@Deque(T)#increase_capacity:(Int32 | Nil)", "Deque(Int32)#increase_capacity"),
        ("*Int32#&+<Int32>:Int32", "Int32#&+"),
        ("*src/app.cr::Helper#run:Nil", "Helper#run"),
        ("*/src/app.cr::helper<Int32>:Nil", "helper"),
        ("~procProc(Nil)@src/gc/boehm.cr:148", "-> proc at src/gc/boehm.cr:148"),
        ("~procProc(Nil)@allocs.cr:33", "-> proc at allocs.cr:33"),
        (
            "~proc2Proc(Fiber, (IO::FileDescriptor | Nil))@/usr/lib/crystal/lib/fiber.cr:98",
            "-> proc at /usr/lib/crystal/lib/fiber.cr:98",
        ),
        (
            "~procProc(Int32, Pointer(LibC::SiginfoT), Pointer(Void), Nil)@/usr/lib/crystal/lib/signal.cr:127",
            "-> proc at /usr/lib/crystal/lib/signal.cr:127",
        ),
        ("~Crystal::ELF::MAGIC:init", "Crystal::ELF::MAGIC (init)"),
        ("~Exception::CallStack::skip:read", "Exception::CallStack::skip (read)"),
        ("~check_proc_is_not_closure", "check_proc_is_not_closure"),
    ];

    #[test]
    fn readable_names_of_real_symbols() {
        for (raw, want) in READABLE {
            assert_eq!(readable(raw).as_deref(), Some(*want), "readable({raw:?})");
        }
    }

    #[test]
    fn other_languages_pass_through() {
        for raw in [
            "__crystal_main",
            "main",
            "GC_malloc",
            "make_foo",
            "_ZN4llvm18ModuleSummaryIndexD2Ev",
            "new", // DWARF's short name of an inlined method
            "",
        ] {
            assert_eq!(readable(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn unparsable_crystal_names_lose_only_the_signature() {
        assert_eq!(readable("*weird name<X>:Y").as_deref(), Some("weird name"));
        assert_eq!(readable("*Foo#(").as_deref(), Some("Foo#("));
    }

    #[test]
    fn parses_owner_kind_and_name() {
        let m = parse_method("*Array(Foo)@Array(T)::new<Int32>:Array(Foo)").unwrap();
        assert_eq!(
            m,
            Method {
                owner: Some("Array(Foo)"),
                class_method: true,
                name: "new"
            }
        );
        let m = parse_method("*make_foos:Array(Foo)").unwrap();
        assert_eq!((m.owner, m.name), (None, "make_foos"));
        assert_eq!(parse_method("__crystal_main"), None);
        assert_eq!(parse_method("*Foo::(("), None);
    }

    #[test]
    fn runtime_frames() {
        for raw in [
            "GC_malloc",
            "GC_malloc_atomic",
            "GC_realloc",
            "GC_malloc_kind",
            "__crystal_malloc64",
            "__crystal_malloc_atomic64",
            "__crystal_realloc64",
            "__crystal_malloc",
            "*GC::malloc<UInt64>:Pointer(Void)",
            "*GC::malloc_atomic<UInt32>:Pointer(Void)",
            "*GC::realloc<Pointer(Void), UInt64>:Pointer(Void)",
            "*GC::free<Pointer(Void)>:Nil",
            "*Pointer(Foo)@Pointer(T)::malloc<Int32>:Pointer(Foo)",
            "*Pointer(UInt8)@Pointer(T)::malloc<Int32>:Pointer(UInt8)",
            "*Pointer(Foo)@Pointer(T)#realloc<Int32>:Pointer(Foo)",
        ] {
            assert!(is_runtime_frame(raw), "{raw} is plumbing");
        }
        for raw in [
            "*Foo::new<Int64, Int64, Int32>:Foo",
            "*Array(Foo)@Array(T)#initialize<Int32>:Pointer(Foo)",
            "*GC::collect:Nil",
            "*GC::add_finalizer<File>:Nil",
            "*Pointer(Foo)@Pointer(T)#[]<Int32>:Foo",
            "*make_foos:Array(Foo)",
            "__crystal_main",
            "malloc",
            "make_foo",
        ] {
            assert!(!is_runtime_frame(raw), "{raw} is not plumbing");
        }
    }

    fn frame(raw: &str, file: Option<&str>) -> Frame {
        Frame {
            function: readable(raw).unwrap_or_else(|| raw.to_string()),
            raw_name: raw.to_string(),
            file: file.map(str::to_string),
            ..Frame::default()
        }
    }

    fn syms(raws: &[&str]) -> Vec<Frame> {
        raws.iter().map(|r| frame(r, None)).collect()
    }

    #[test]
    fn inlined_plumbing_is_known_by_its_file() {
        // A release build's stack: everything inlined into __crystal_main.
        let lib = "/usr/lib/crystal/lib";
        assert!(is_runtime(&frame(
            "malloc",
            Some(&format!("{lib}/gc/boehm.cr"))
        )));
        assert!(is_runtime(&frame(
            "malloc_atomic",
            Some(&format!("{lib}/gc/boehm.cr"))
        )));
        assert!(is_runtime(&frame("realloc", Some(&format!("{lib}/gc.cr")))));
        assert!(is_runtime(&frame(
            "__crystal_malloc64",
            Some(&format!("{lib}/gc.cr"))
        )));
        assert!(is_runtime(&frame(
            "malloc",
            Some(&format!("{lib}/primitives.cr"))
        )));
        assert!(!is_runtime(&frame(
            "new",
            Some(&format!("{lib}/primitives.cr"))
        )));
        assert!(!is_runtime(&frame("malloc", Some("/src/app.c"))));
        assert!(!is_runtime(&frame("malloc", None)));
    }

    // Stacks as seen with gdb on the fixture's debug build (innermost first).
    #[test]
    fn object_types_from_new() {
        let foo = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Foo::new<Int64, Int64, Int32>:Foo",
            "*make_foos:Array(Foo)",
            "__crystal_main",
        ]);
        assert_eq!(allocated_type(&foo).as_deref(), Some("Foo"));
        let once = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Crystal::OnceState@Reference::new:Crystal::OnceState",
            "__crystal_once_init",
        ]);
        assert_eq!(allocated_type(&once).as_deref(), Some("Crystal::OnceState"));
        let array = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Array(Foo)@Array(T)::new<Int32>:Array(Foo)",
            "*make_foos:Array(Foo)",
        ]);
        assert_eq!(allocated_type(&array).as_deref(), Some("Array(Foo)"));
    }

    #[test]
    fn buffer_types() {
        let buffer = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Pointer(Foo)@Pointer(T)::malloc<Int32>:Pointer(Foo)",
            "*Array(Foo)@Array(T)#initialize<Int32>:Pointer(Foo)",
            "*Array(Foo)@Array(T)::new<Int32>:Array(Foo)",
            "*make_foos:Array(Foo)",
        ]);
        assert_eq!(
            allocated_type(&buffer).as_deref(),
            Some("Array(Foo) buffer")
        );
        let slice = syms(&[
            "*GC::malloc_atomic<UInt64>:Pointer(Void)",
            "__crystal_malloc_atomic64",
            "*Pointer(UInt8)@Pointer(T)::malloc<Int32>:Pointer(UInt8)",
            "*Slice(UInt8)::new<Int32>:Slice(UInt8)",
        ]);
        assert_eq!(
            allocated_type(&slice).as_deref(),
            Some("Slice(UInt8) buffer")
        );
        // A bare pointer from a top-level method has no type to name.
        let bare = syms(&[
            "*GC::malloc_atomic<UInt64>:Pointer(Void)",
            "__crystal_malloc_atomic64",
            "*Pointer(UInt8)@Pointer(T)::malloc<Int32>:Pointer(UInt8)",
            "*free_block:Nil",
        ]);
        assert_eq!(allocated_type(&bare), None);
    }

    #[test]
    fn string_types() {
        let builder_buffer = syms(&[
            "*GC::malloc_atomic<UInt64>:Pointer(Void)",
            "*GC::malloc_atomic<UInt32>:Pointer(Void)",
            "*String::Builder#initialize<Int32>:Bool",
            "*String::Builder::new<Int32>:String::Builder",
            "*String::interpolation<String, Int32>:String",
            "*build_strings:Array(String)",
        ]);
        assert_eq!(allocated_type(&builder_buffer).as_deref(), Some("String"));
        let shrink = syms(&[
            "*GC::realloc<Pointer(Void), UInt64>:Pointer(Void)",
            "*GC::realloc<Pointer(UInt8), Int32>:Pointer(UInt8)",
            "*String::Builder#resize_to_capacity<Int32>:Pointer(UInt8)",
            "*String::Builder#to_s:String",
        ]);
        assert_eq!(allocated_type(&shrink).as_deref(), Some("String"));
        let builder = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*String::Builder::new<Int32>:String::Builder",
            "*String::interpolation<String, Int32>:String",
        ]);
        assert_eq!(allocated_type(&builder).as_deref(), Some("String::Builder"));
        let string = syms(&[
            "*GC::malloc_atomic<UInt64>:Pointer(Void)",
            "*GC::malloc_atomic<UInt32>:Pointer(Void)",
            "*String::new<Pointer(UInt8), UInt64, Int32>:String",
        ]);
        assert_eq!(allocated_type(&string).as_deref(), Some("String"));
    }

    #[test]
    fn no_type_without_a_crystal_method() {
        // Release build: `Foo.new` inlined, only DWARF's short names.
        let lib = "/usr/lib/crystal/lib";
        let release = vec![
            frame("malloc", Some(&format!("{lib}/gc/boehm.cr"))),
            frame("__crystal_malloc64", Some(&format!("{lib}/gc.cr"))),
            frame("new", Some("/src/allocs.cr")),
            frame("make_foos", Some("/src/allocs.cr")),
        ];
        assert_eq!(allocated_type(&release), None);
        assert_eq!(allocated_type(&syms(&["make_foo", "main"])), None);
        assert_eq!(allocated_type(&[]), None);
        let in_proc = syms(&[
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "~procProc(Nil)@allocs.cr:33",
        ]);
        assert_eq!(allocated_type(&in_proc), None);
    }
}
