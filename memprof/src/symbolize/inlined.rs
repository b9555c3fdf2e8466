//! Inlined Crystal frames named with their class, as the developer writes
//! it: `Array(BasicBlock)#push`, `Array(UnionFindNode).new`,
//! `Hash(K, V)#upsert`, never a bare `push`.
//!
//! Release builds inline most methods, and the DWARF of an inlined copy
//! names it by its short name alone (Crystal 1.6 writes no scope, no
//! linkage name, no type for it: `DW_AT_name ("push")`). Its line is in
//! the body of the type that defines it, so the source gives that type as
//! declared (`Array(T)`, `Hash(K, V)`, a module: `Indexable(T)`) and whether
//! the method is `def self.…`. The type arguments come from the binary
//! where it says them: the frame that calls the inlined one, when it is a
//! method of the same generic type (the symbol `*Array(BasicBlock)@Array(T)#<<`
//! inlining `push`, `check_needs_resize`, …), for a `new` what the
//! caller's line constructs at the call's column (`[] of UnionFindNode`),
//! else what the caller's source declares the object it calls the method
//! on to be (`@hash : Hash(T, Nil)` in `Set(Int32)`: `Hash(Int32, Nil)#[]=`),
//! the caller's own arguments substituted. Where nothing says, the
//! parameters stay as the source names them (`Hash(K, V)#upsert`).
use crate::crystal;
use crate::crystal::generics::{has_parameter, same_generic, substitute};
use crate::crystal::source::Sources;
use crate::profile::Frame;

/// Names the inlined Crystal frames of one address (innermost first, the
/// symbol's frame last) `Type#name` or `Type.name`; `columns` are each
/// frame's column (of the call it makes, as DWARF gives it). `raw_name`
/// stays DWARF's.
pub fn name_inlined(frames: &mut [Frame], columns: &[Option<u16>], sources: &mut Sources) {
    // The type each frame is a method of, from the outermost in.
    let mut types: Vec<Option<String>> = vec![None; frames.len()];
    for i in (0..frames.len()).rev() {
        let f = &frames[i];
        if f.raw_name.starts_with(['*', '~']) {
            types[i] = crystal::parse_method(&f.raw_name)
                .and_then(|m| m.owner)
                .map(str::to_string);
            continue;
        }
        let (Some(file), Some(line)) = (f.file.clone(), f.line) else {
            continue;
        };
        if !file.ends_with(".cr") || f.raw_name.is_empty() || f.raw_name.starts_with("__") {
            continue;
        }
        // `new:initial_capacity`: named arguments are not part of the name.
        let name = f.raw_name.split(':').next().unwrap_or_default().to_string();
        if name.is_empty() {
            continue;
        }
        let caller = types.get(i + 1).cloned().flatten();
        let (ty, class_method) = if name == "new" {
            // What the caller wrote (`Widget.new`, `[] of Node`) names the
            // class even for a `new` the compiler generates (its line is
            // `Reference.new`'s in primitives.cr); else the class whose
            // `def initialize` the line is (a module's `def self.new`
            // makes no module).
            let made = constructed_by_caller(frames, columns, &types, i, sources);
            let declared = || sources.enclosing_type(&file, line);
            (made.or_else(declared), true)
        } else {
            // The type that defines the method, where its `def` is.
            match sources.definition(&file, line, &name) {
                Some((def, class_method)) => (sources.enclosing_scope(&file, def), class_method),
                None => (sources.enclosing_scope(&file, line), false),
            }
        };
        let Some(mut ty) = ty.map(|ty| with_arguments(&ty, caller.as_deref())) else {
            continue;
        };
        if has_parameter(&ty) {
            // Called on another object (`@hash[object] = nil` in `Set(Int32)#add`):
            // what the caller's code declares it to be.
            if let Some(receiver) =
                receiver_of(frames, columns, &types, i, sources).filter(|r| same_generic(r, &ty))
            {
                ty = receiver;
            }
        }
        let sep = if class_method { '.' } else { '#' };
        frames[i].function = format!("{ty}{sep}{name}");
        types[i] = Some(ty);
    }
}

/// `ty` with the type arguments of `caller` (the type of the frame that
/// calls it) when both are the same generic type and `ty` still names
/// parameters (`Array(T)` called from `Array(Node)`'s code: `Array(Node)`).
fn with_arguments(ty: &str, caller: Option<&str>) -> String {
    match caller {
        Some(caller) if has_parameter(ty) && same_generic(ty, caller) => substitute(ty, ty, caller),
        _ => ty.to_string(),
    }
}

/// The type the caller of the `new` at frame `i` constructs at the call's
/// column, when its line writes it (`Foo.new`, `Array(Foo).new`, `[] of
/// Foo`, a bare `new` in the class's own code), its parameters given by the caller's own type when that is an
/// instance of the generic code it is in (`Hash(T, Nil).new` in
/// `Set(Int32)#initialize`: `Hash(Int32, Nil)`); `None` while a parameter
/// is left.
fn constructed_by_caller(
    frames: &[Frame],
    columns: &[Option<u16>],
    types: &[Option<String>],
    i: usize,
    sources: &mut Sources,
) -> Option<String> {
    let (file, line, text) = caller_text(frames, columns, i, sources)?;
    // A constant's initializer points at the constant (`INSTANCE = new`).
    let text = match text.split_once(" = ") {
        Some((name, value)) if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
            value.trim_start()
        }
        _ => &text,
    };
    // A bare `new` (`INSTANCE = new`, `new(x)` in `def self.…`) makes the
    // caller's own class.
    let bare = text
        .strip_prefix("new")
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
    let made = if bare {
        sources.enclosing_type(&file, line)?
    } else {
        crystal::source::constructed(text)?
    };
    in_callers_terms(made, &file, line, types, i, sources)
}

/// The type of the object the caller of frame `i` calls it on, from the
/// caller's source at the call's column (an instance variable or a local,
/// [`crate::crystal::source::receiver_type`]), its parameters given by the
/// caller's own type; `None` while a parameter is left.
fn receiver_of(
    frames: &[Frame],
    columns: &[Option<u16>],
    types: &[Option<String>],
    i: usize,
    sources: &mut Sources,
) -> Option<String> {
    let (file, line, text) = caller_text(frames, columns, i, sources)?;
    let ty = sources.receiver_type(&file, line, &text)?;
    in_callers_terms(ty, &file, line, types, i, sources)
}

/// The caller of frame `i`: its file, line, and its source from the call's
/// column on.
fn caller_text(
    frames: &[Frame],
    columns: &[Option<u16>],
    i: usize,
    sources: &mut Sources,
) -> Option<(String, u32, String)> {
    let caller = frames.get(i + 1)?;
    let (file, line) = (caller.file.as_deref()?, caller.line?);
    let column = usize::from((*columns.get(i + 1)?)?);
    let text = sources.line(file, line)?.get(column.checked_sub(1)?..)?;
    Some((file.to_string(), line, text.to_string()))
}

/// `ty`, written in the caller's source (`file:line`), with the type
/// parameters of the caller's class given by the caller's own type;
/// `None` while a parameter is left.
fn in_callers_terms(
    mut ty: String,
    file: &str,
    line: u32,
    types: &[Option<String>],
    i: usize,
    sources: &mut Sources,
) -> Option<String> {
    if has_parameter(&ty) {
        let within = sources.enclosing_type(file, line)?;
        let instance = types.get(i + 1)?.as_deref()?;
        ty = substitute(&ty, &within, instance);
    }
    (!has_parameter(&ty)).then_some(ty)
}
