use super::heap_copy::{BlockState, HeapBlock, NORMAL, PTRFREE};
use super::*;
use std::collections::BTreeMap;

fn copy(blocks: Vec<HeapBlock>, contents: Vec<(u64, Vec<u8>)>) -> HeapCopy {
    HeapCopy {
        gc_no: 7,
        hblksize: 4096,
        granule_shift: 4,
        blocks,
        contents,
        stats: None,
    }
}

fn marks(granules: &[usize]) -> Box<[u64]> {
    let mut m = vec![0u64; 5];
    for &g in granules {
        m[g / 64] |= 1 << (g % 64);
    }
    m.into_boxed_slice()
}

#[test]
fn marked_objects_are_live_free_list_entries_are_not() {
    // A block of 32-byte normal objects at 0x10000: objects 0 and 1
    // carry type ids 173 and 174; object 2 is a free-list entry linking
    // to object 3 (both marked), object 3 ends the list (0); object 4
    // is unmarked.
    let mut data = vec![0u8; 4096];
    data[0..4].copy_from_slice(&173u32.to_le_bytes());
    data[8..16].copy_from_slice(&0x10100u64.to_le_bytes()); // a field pointing elsewhere
    data[32..36].copy_from_slice(&174u32.to_le_bytes());
    data[64..72].copy_from_slice(&(0x10000u64 + 96).to_le_bytes());
    let block = HeapBlock {
        addr: 0x10000,
        state: BlockState::Objects {
            kind: NORMAL,
            size: 32,
            marks: marks(&[0, 2, 4, 6]),
        },
    };
    let free = HeapBlock {
        addr: 0x11000,
        state: BlockState::Free { bytes: 8192 },
    };
    let census = copy(vec![block, free], vec![(0x10000, data)]).census(&|w, _, _| w < 1000);
    let class = census.classes[&(NORMAL, 32)];
    assert_eq!(
        class.live,
        Tally {
            count: 2,
            bytes: 64
        }
    );
    assert_eq!(
        class.free_list,
        Tally {
            count: 2,
            bytes: 64
        }
    );
    assert_eq!(class.unmarked.count, 128 - 4);
    assert_eq!(class.block_bytes, 4096);
    assert_eq!(
        census.words[&(NORMAL, Word::Type(173))],
        Tally {
            count: 1,
            bytes: 32
        }
    );
    assert_eq!(
        census.words[&(NORMAL, Word::Type(174))],
        Tally {
            count: 1,
            bytes: 32
        }
    );
    assert_eq!(
        census.free_blocks,
        Tally {
            count: 1,
            bytes: 8192
        }
    );
    assert_eq!(census.object_blocks, vec![(0x10000, 4096, 64)]);
}

#[test]
fn a_buffer_is_named_after_the_typed_object_pointing_into_it() {
    // An Array-like object (type 28, 32 bytes) at 0x10000 whose word
    // at +16 points 16 bytes into a large untyped buffer at 0x20000;
    // another large untyped object at 0x30000 nobody points to.
    let mut small = vec![0u8; 4096];
    small[0..4].copy_from_slice(&28u32.to_le_bytes());
    small[16..24].copy_from_slice(&0x20010u64.to_le_bytes());
    let large = |addr| HeapBlock {
        addr,
        state: BlockState::Objects {
            kind: NORMAL,
            size: 8192,
            marks: marks(&[0]),
        },
    };
    let blocks = vec![
        HeapBlock {
            addr: 0x10000,
            state: BlockState::Objects {
                kind: NORMAL,
                size: 32,
                marks: marks(&[0]),
            },
        },
        large(0x20000),
        large(0x30000),
    ];
    let raw = vec![0xffu8; 16];
    let contents = vec![(0x10000, small), (0x20000, raw.clone()), (0x30000, raw)];
    let census = copy(blocks, contents).census(&|w, _, _| w == 28);
    assert_eq!(census.words[&(NORMAL, Word::Type(28))].count, 1);
    assert_eq!(
        census.words[&(NORMAL, Word::HeldBy(28))],
        Tally {
            count: 1,
            bytes: 8192
        }
    );
    assert_eq!(
        census.words[&(NORMAL, Word::Untyped)],
        Tally {
            count: 1,
            bytes: 8192
        }
    );
}

#[test]
fn an_empty_buffer_is_live_a_free_list_entry_is_not() {
    // 32-byte normal objects at 0x10000: object 0 typed (id 28) points
    // to object 2, all zeros (an empty buffer); object 3, all zeros
    // too, is pointed to by nothing (a free list's last entry).
    let mut data = vec![0u8; 4096];
    data[0..4].copy_from_slice(&28u32.to_le_bytes());
    data[8..16].copy_from_slice(&0x10040u64.to_le_bytes());
    let block = HeapBlock {
        addr: 0x10000,
        state: BlockState::Objects {
            kind: NORMAL,
            size: 32,
            marks: marks(&[0, 4, 6]),
        },
    };
    let census = copy(vec![block], vec![(0x10000, data)]).census(&|w, _, _| w == 28);
    let class = census.classes[&(NORMAL, 32)];
    assert_eq!(
        class.live,
        Tally {
            count: 2,
            bytes: 64
        }
    );
    assert_eq!(
        class.free_list,
        Tally {
            count: 1,
            bytes: 32
        }
    );
    assert_eq!(census.words[&(NORMAL, Word::HeldBy(28))].count, 1);
    assert_eq!(census.object_blocks, vec![(0x10000, 4096, 64)]);
}

#[test]
fn retained_bytes_count_each_reachable_byte_once() {
    // 32-byte normal objects at 0x10000: A (id 1) at 0 points to B (id
    // 2) at 32 and to C (id 3) at 64; B points to C too; C points back
    // to A through an interior pointer. D (id 2) at 96 points to nothing.
    let mut data = vec![0u8; 4096];
    let mut object = |at: usize, id: u32, refs: &[u64]| {
        data[at..at + 4].copy_from_slice(&id.to_le_bytes());
        for (k, r) in refs.iter().enumerate() {
            data[at + 8 + 8 * k..at + 16 + 8 * k].copy_from_slice(&r.to_le_bytes());
        }
    };
    object(0, 1, &[0x10020, 0x10040]);
    object(32, 2, &[0x10040]);
    object(64, 3, &[0x10008]);
    object(96, 2, &[]);
    let block = HeapBlock {
        addr: 0x10000,
        state: BlockState::Objects {
            kind: NORMAL,
            size: 32,
            marks: marks(&[0, 2, 4, 6]),
        },
    };
    let copy = copy(vec![block], vec![(0x10000, data)]);
    let census = copy.census(&|w, _, _| (1..=3).contains(&w));
    let retained = copy.retained(&census.objects, &copy.graph(&census.objects));
    // A reaches A, B, C; type 2 (B and D) reaches B, C, A, D; C reaches C, A, B.
    assert_eq!(retained, BTreeMap::from([(1, 96), (2, 128), (3, 96)]));
}

#[test]
fn a_large_object_takes_whole_blocks() {
    let block = HeapBlock {
        addr: 0x20000,
        state: BlockState::Objects {
            kind: PTRFREE,
            size: 10000,
            marks: marks(&[0]),
        },
    };
    let mut head = vec![0u8; 16];
    head[0..4].copy_from_slice(&1u32.to_le_bytes());
    let census = copy(vec![block], vec![(0x20000, head)]).census(&|w, _, _| w < 1000);
    let class = census.classes[&(PTRFREE, 10000)];
    assert_eq!((class.live.count, class.block_bytes), (1, 12288));
    assert_eq!(census.words[&(PTRFREE, Word::Type(1))].bytes, 10000);
}
