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
            name: "new",
            defining: Some("Array(T)"),
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

/// Crystal symbols from `nm` of real programs built by Crystal 1.6.0:
/// crystal-samples' havlak (debug and `--release`) and http_server, the
/// compiler's own parser (`require "compiler/crystal/syntax"`, the
/// compiler examples' visitor), and `fixtures/names.cr` (procs, unions,
/// tuples, named tuples, metaclasses, file-private types). Chosen for the
/// hard cases: parentheses in parentheses, commas, `|`, `.class`, `+`.
const SYMBOLS: &str = include_str!("fixtures/symbols.txt");

/// Whether every `(` of `text` is closed, in order.
fn balanced(text: &str) -> bool {
    let mut depth = 0i32;
    for b in text.bytes() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}

/// The place of `part`, a slice of `raw`, in it.
fn at(raw: &str, part: &str) -> usize {
    let offset = part.as_ptr() as usize - raw.as_ptr() as usize;
    assert!(
        offset + part.len() <= raw.len(),
        "{part:?} is not in {raw:?}"
    );
    offset
}

/// `raw` rebuilt from the parts [`parse_method`] found, with the syntax
/// between them checked: `*`, a `struct.` or file prefix, the owner, its
/// `+`/`.class`, `@` and the defining type, `#` or `::`, the name, named
/// arguments, `<Args>`, `:Return`. Panics when a piece is not that syntax.
fn rebuild(raw: &str, m: &Method<'_>) -> String {
    let name_at = at(raw, m.name);
    let mut out = String::new();
    let mut i;
    match m.owner {
        Some(owner) => {
            let o = at(raw, owner);
            let prefix = &raw[..o];
            assert!(
                prefix == "*"
                    || prefix == "*struct."
                    || prefix == "*union."
                    || prefix.ends_with(".cr::") && !prefix.contains('('),
                "prefix {prefix:?} of {raw:?}"
            );
            assert!(balanced(owner), "owner {owner:?} of {raw:?}");
            out.push_str(prefix);
            out.push_str(owner);
            i = o + owner.len();
            // `+` (virtual) and `.class` (metaclass) after the owner.
            let suffix_end = i + raw[i..]
                .find(['@', '#'])
                .into_iter()
                .chain(raw[i..].find("::"))
                .min()
                .unwrap();
            let suffix = &raw[i..suffix_end];
            assert!(
                suffix.replace(".class", "").replace('+', "").is_empty(),
                "suffix {suffix:?} of {raw:?}"
            );
            out.push_str(suffix);
            i = suffix_end;
            if let Some(def) = m.defining {
                assert_eq!(at(raw, def), i + 1, "defining type of {raw:?}");
                assert!(balanced(def), "defining {def:?} of {raw:?}");
                out.push('@');
                out.push_str(def);
                i += 1 + def.len();
            }
            let sep = &raw[i..name_at];
            assert!(sep == "#" || sep == "::", "separator {sep:?} of {raw:?}");
            assert_eq!(
                m.class_method,
                sep == "::" || suffix.contains(".class"),
                "kind of {raw:?}"
            );
            out.push_str(sep);
        }
        None => {
            let prefix = &raw[..name_at];
            assert!(
                prefix == "*" || prefix.ends_with(".cr::"),
                "prefix {prefix:?} of {raw:?}"
            );
            assert!(m.defining.is_none() && !m.class_method);
            out.push_str(prefix);
        }
    }
    out.push_str(m.name);
    i = name_at + m.name.len();
    // Named arguments (`:file:encoding`), then `<Args>`, then `:Return`.
    let tail = &raw[i..];
    let mut rest = tail;
    while let Some(after) = rest.strip_prefix(':') {
        let n = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if n == 0 || !after.as_bytes()[0].is_ascii_lowercase() && after.as_bytes()[0] != b'_' {
            break;
        }
        if !(after[n..].is_empty() || after[n..].starts_with(['<', ':'])) {
            break;
        }
        rest = &after[n..];
    }
    if let Some(args) = rest.strip_prefix('<') {
        // The `>` that closes the list is the first outside parentheses.
        let mut depth = 0;
        let close = args
            .bytes()
            .position(|b| {
                match b {
                    b'(' => depth += 1,
                    b')' => depth -= 1,
                    _ => {}
                }
                b == b'>' && depth == 0
            })
            .unwrap_or_else(|| panic!("arguments of {raw:?} not closed"));
        assert!(balanced(&args[..close]), "arguments of {raw:?}");
        rest = &args[close + 1..];
    }
    if let Some(ret) = rest.strip_prefix(':') {
        assert!(balanced(ret), "return type of {raw:?}");
        rest = "";
    }
    assert!(rest.is_empty(), "{rest:?} left of {raw:?}");
    out.push_str(tail);
    out
}

#[test]
fn real_symbols_parse_whole_and_read_balanced() {
    let mut methods = 0;
    for raw in SYMBOLS.lines() {
        let shown = readable(raw).unwrap_or_else(|| panic!("{raw:?} is Crystal's"));
        assert!(balanced(&shown), "{raw:?} shown as {shown:?}");
        if !raw.starts_with('*') {
            continue;
        }
        let m = parse_method(raw).unwrap_or_else(|| panic!("{raw:?} does not parse"));
        assert_eq!(rebuild(raw, &m), raw);
        let want = match m.owner {
            Some(owner) => format!(
                "{owner}{}{}",
                if m.class_method { "." } else { "#" },
                m.name
            ),
            None => m.name.to_string(),
        };
        assert_eq!(shown, want, "{raw:?}");
        methods += 1;
    }
    assert_eq!(
        methods,
        SYMBOLS.lines().filter(|l| l.starts_with('*')).count()
    );
    assert!(methods > 400, "{methods}");
}

#[test]
fn hard_symbols_of_the_corpus() {
    // One of each hard case, with what it must read.
    for (raw, want) in [
        (
            "*Hash(String, Array(Int32 | String))@Hash(K, V)#[]=<String, Array(Int32 | String)>:Array(Int32 | String)",
            "Hash(String, Array(Int32 | String))#[]=",
        ),
        (
            "*take_named<NamedTuple(a: Int32, b: Array(String))>:Int32",
            "take_named",
        ),
        (
            "*Hash(Tuple(Int32, String), NamedTuple(x: Int32))@Hash(K, V)#[]=<Tuple(Int32, String), NamedTuple(x: Int32)>:NamedTuple(x: Int32)",
            "Hash(Tuple(Int32, String), NamedTuple(x: Int32))#[]=",
        ),
        ("*take_proc<Proc(Int32, String)>:String", "take_proc"),
        (
            "*Shapes::Point(Int32)#+<Shapes::Point(Int32)>:Shapes::Point(Int32)",
            "Shapes::Point(Int32)#+",
        ),
        ("*Shapes::Circle::unit:Shapes::Circle", "Shapes::Circle.unit"),
        ("*take_class<Shapes::Circle.class>:String", "take_class"),
        // Unparsed: cut outside the parentheses only.
        ("*Foo(NamedTuple(a: Int32))?<X>", "Foo(NamedTuple(a: Int32))?"),
    ] {
        assert_eq!(readable(raw).as_deref(), Some(want), "{raw:?}");
    }
}
