//! The class of each GC object memprof tracks, read from the object
//! itself: a Crystal object's first word is its class's type id, which
//! [`crate::symbolize::type_ids`] names from the program's code (debug,
//! release and stripped builds alike). Read once per object, while it
//! still holds it (see [`crate::gc::copy`]'s `classes`).
use std::collections::BTreeMap;

use crate::crystal::generics::has_parameter;
use crate::gc::copy::{ObjectWord, Slot};
use crate::gc::site::ClassGc;
use crate::symbolize::type_ids::{TypeNames, TypeOf};
use crate::tracee::memory::vm_read;

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

/// One site's objects by class, from its slots of the copy (`slots`:
/// what each's first word said, and its objects allocated, collected and
/// tracked) of memory `atomic` or not; objects whose word names no class
/// (buffers, ids not named, unread) are left out. Sorted by allocated
/// bytes, biggest first.
pub fn classes<'a>(
    names: &TypeNames,
    atomic: bool,
    slots: impl Iterator<Item = &'a Slot>,
) -> Vec<ClassGc> {
    let mut classes: BTreeMap<String, ClassGc> = BTreeMap::new();
    for slot in slots {
        let ObjectWord::Word(word, bytes) = slot.word else {
            continue;
        };
        // Only classes named outright: an id no code names, or a generic
        // left with its parameter (`Array(T)`), says less than the stack.
        let name = match names.type_of_sized(word, atomic, bytes) {
            TypeOf::Named(name) if !has_parameter(name) => name,
            _ => continue,
        };
        let c = classes.entry(name.to_string()).or_default();
        c.add(&ClassGc {
            name: String::new(),
            allocated_count: slot.allocated[0],
            allocated_bytes: slot.allocated[1],
            collected_count: slot.collected[0],
            collected_bytes: slot.collected[1],
            live_count: slot.tracked[0],
            live_bytes: slot.tracked[1],
        });
    }
    let mut classes: Vec<ClassGc> = classes
        .into_iter()
        .map(|(name, c)| ClassGc { name, ..c })
        .collect();
    classes.sort_by(|a, b| {
        (b.allocated_bytes.cmp(&a.allocated_bytes))
            .then(b.allocated_count.cmp(&a.allocated_count))
            .then(a.name.cmp(&b.name))
    });
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
        let slot = |word, allocated: u64, collected: u64| Slot {
            site: 0,
            word,
            allocated: [allocated, allocated * 16],
            collected: [collected, collected * 16],
            tracked: [allocated - collected, (allocated - collected) * 16],
        };
        let slots = [
            slot(ObjectWord::Word(7, 16), 5, 3),
            slot(ObjectWord::Word(9, 24), 1, 0), // not named: the stack says more
            slot(ObjectWord::Word(11, 24), 1, 0), // a generic's parameter left
            slot(ObjectWord::Word(7, 400), 1, 1), // Widget's id in a buffer of another size
            slot(ObjectWord::NoType, 4, 2),      // text, 0: no type id
            slot(ObjectWord::Unread, 2, 0),
        ];
        let widget = ClassGc {
            name: "Widget".into(),
            allocated_count: 5,
            allocated_bytes: 80,
            collected_count: 3,
            collected_bytes: 48,
            live_count: 2,
            live_bytes: 32,
        };
        assert_eq!(classes(&names, false, slots.iter()), vec![widget]);
        // Stored only into scanned memory: in atomic memory it is data.
        assert_eq!(classes(&names, true, slots[..1].iter()), vec![]);
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
