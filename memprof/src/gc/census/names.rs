//! An object's name in a census, from its first word: its class, or
//! the class of the object that holds it as a buffer.
use super::count::Word;
use super::heap_copy::is_atomic;
use crate::symbolize::type_ids::{TypeNames, TypeOf};

/// The name of an object whose first word says `word`, in memory of `kind`:
/// `Foo`, `(type 28)`, `Array(Foo) buffer`, `(type 28) buffer`, `(no type id)`.
pub fn object_name(names: &TypeNames, word: Word, kind: u8) -> String {
    match word {
        Word::Type(id) => match names.type_of(id, is_atomic(kind)) {
            TypeOf::Named(name) => name.to_string(),
            _ => format!("(type {id})"),
        },
        // A holder is in scanned memory.
        Word::HeldBy(id) => match names.type_of(id, false) {
            TypeOf::Named(name) => format!("{name} buffer"),
            _ => format!("(type {id}) buffer"),
        },
        Word::Untyped => "(no type id)".to_string(),
    }
}
