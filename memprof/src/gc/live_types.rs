//! The class of each GC object memprof tracks, read from the object
//! itself: a Crystal object's first word is its class's type id, which
//! [`crate::crystal::type_ids`] names from the program's code (debug,
//! release and stripped builds alike). Read once, while the program is
//! still there (its exit stop under `run`, before memprof lets it go under
//! `attach`), for the objects live at the end.
use std::collections::BTreeMap;

use crate::crystal::type_ids::{TypeNames, TypeOf};
use crate::gc::census::read::vm_read;
use crate::symbolize::inlined_new::has_parameter;

/// Most bytes read at once.
const SPAN: u64 = 1 << 20;
/// Objects closer than this share a read (the bytes between are read too).
const GAP: u64 = 4096;

/// The first 32-bit word of each object at `addrs` (ascending) in process
/// `pid`; `None` where its memory could not be read.
pub fn first_words(pid: u32, addrs: &[u64]) -> Vec<Option<u32>> {
    let mut words = Vec::with_capacity(addrs.len());
    let mut buf: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < addrs.len() {
        let start = addrs[i];
        let mut j = i + 1;
        while j < addrs.len() && addrs[j] < addrs[j - 1] + 4 + GAP && addrs[j] + 4 - start <= SPAN {
            j += 1;
        }
        let end = addrs[j - 1] + 4;
        buf.resize((end - start) as usize, 0);
        let read = vm_read(pid, start, &mut buf).is_ok();
        for &a in &addrs[i..j] {
            let at = (a - start) as usize;
            words.push(read.then(|| u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())));
        }
        i = j;
    }
    words
}

/// One site's objects by class: `objects` are its (first word, requested
/// bytes) of memory `atomic` or not; those whose word names no class
/// (buffers, ids not named, unread) are left out. Sorted by bytes,
/// biggest first.
pub fn by_class(
    names: &TypeNames,
    atomic: bool,
    objects: impl Iterator<Item = (Option<u32>, u64)>,
) -> Vec<(String, u64, u64)> {
    let mut classes: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (word, bytes) in objects {
        // Only classes named outright: an id no code names, or a generic
        // left with its parameter (`Array(T)`), says less than the stack.
        let name = match word.map(|w| names.type_of_sized(w, atomic, bytes)) {
            Some(TypeOf::Named(name)) if !has_parameter(name) => name.to_string(),
            _ => continue,
        };
        let c = classes.entry(name).or_default();
        c.0 += 1;
        c.1 += bytes;
    }
    let mut classes: Vec<(String, u64, u64)> =
        classes.into_iter().map(|(n, (c, b))| (n, c, b)).collect();
    classes.sort_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
    classes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_counted_by_the_class_their_word_names() {
        let mut names = TypeNames::default();
        names.names.insert(7, "Widget".into());
        names.stored.insert(7, 1); // stored into scanned memory
        names.stored.insert(9, 1); // stored, never named
        names.names.insert(11, "Array(T)".into());
        names.stored.insert(11, 1);
        names.sizes.insert(7, vec![16]);
        let objects = [
            (Some(7), 16),
            (Some(9), 24),  // not named: the stack says more
            (Some(11), 24), // a generic's parameter left
            (Some(7), 16),
            (Some(7), 400),          // Widget's id in a buffer of another size
            (Some(0x2e2e_2e2e), 64), // text: no type id
            (None, 8),               // unread
        ];
        let classes = by_class(&names, false, objects.into_iter());
        assert_eq!(classes, vec![("Widget".to_string(), 2, 32)]);
        // Stored only into scanned memory: in atomic memory it is data.
        assert_eq!(by_class(&names, true, [(Some(7), 16)].into_iter()), vec![]);
    }

    #[test]
    fn first_words_of_this_process() {
        let objects: Vec<Box<[u32; 4]>> = (0..3u32).map(|i| Box::new([i + 1, 0, 0, 0])).collect();
        let mut addrs: Vec<(u64, u32)> =
            objects.iter().map(|o| (o.as_ptr() as u64, o[0])).collect();
        addrs.sort();
        let words = first_words(
            std::process::id(),
            &addrs.iter().map(|a| a.0).collect::<Vec<_>>(),
        );
        let want: Vec<Option<u32>> = addrs.iter().map(|a| Some(a.1)).collect();
        assert_eq!(words, want);
        assert_eq!(first_words(std::process::id(), &[8]), vec![None]);
    }
}
