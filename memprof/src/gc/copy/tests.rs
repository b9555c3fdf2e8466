use super::record::TICK_NS;
use super::*;
use memprof_common::AllocKind;

/// A 16-byte object allocated at tick `t` of `epoch`.
fn block(t: u64, epoch: u64) -> LiveBlock {
    LiveBlock {
        site: Site {
            caller: 0x10,
            stack: None,
            kind: AllocKind::Gc,
        },
        size: 16,
        timestamp_ns: t * TICK_NS,
        epoch,
    }
}

#[test]
fn tracks_says_which_addresses_were_seen_allocated() {
    let mut copy = GcCopy::default();
    copy.allocated(0x1000, &block(1, 0));
    copy.allocated(0x3000, &block(2, 0));
    copy.settle(None).unwrap();
    // Since the settle: one in a run, one freed, one just arrived.
    for a in (0..CHUNK as u64).map(|i| 0x10_0000 + 16 * i) {
        copy.allocated(a, &block(3, 0));
    }
    copy.sort_tail();
    copy.allocated(0x5000, &block(4, 0));
    copy.freed(0x6000, 5, None);
    let addrs = [0x800, 0x1000, 0x2000, 0x3000, 0x5000, 0x6000, 0x10_0010];
    assert_eq!(
        copy.tracks(&addrs),
        vec![false, true, false, true, true, false, true]
    );
}

#[test]
fn reuse_free_and_unknown_free() {
    let mut copy = GcCopy::default();
    copy.allocated(0x30, &block(1, 0));
    copy.allocated(0x10, &block(2, 0));
    copy.freed(0x50, 3 * TICK_NS, None); // unknown
    copy.allocated(0x30, &block(4, 0)); // reuse of 0x30
    copy.freed(0x10, 5 * TICK_NS, None);
    copy.allocated(0x10, &block(6, 0)); // after a free: not a reuse
    copy.settle(None).unwrap();
    let s = &copy.sites()[0].1;
    // Every allocation in the site's totals, dead or alive.
    assert_eq!((s.allocated_count, s.allocated_bytes), (4, 64));
    assert_eq!((s.tracked_count, s.tracked_bytes), (2, 32));
    assert_eq!((s.collected_count, s.lifetimes.died), (1, 2));
    assert_eq!(s.lifetimes.total_ns, (3 + 3) * TICK_NS);
    assert_eq!(copy.unknown_frees(), 1);
    assert_eq!(copy.len(), 2);
    assert!(copy.settled.windows(2).all(|w| w[0].addr() < w[1].addr()));
}

#[test]
fn a_realloc_in_place_or_followed_at_its_time_keeps_the_kind() {
    let atomic = |t: u64| LiveBlock {
        site: Site {
            kind: AllocKind::GcAtomic,
            ..block(0, 0).site
        },
        ..block(t, 0)
    };
    let moved = |t: u64| LiveBlock {
        site: Site {
            caller: 0x20,
            ..block(0, 0).site
        },
        ..block(t, 0)
    };
    // The same address back: the object replaced is the one before.
    let mut copy = GcCopy::default();
    copy.allocated(0x100, &atomic(1));
    copy.freed(0x100, 2 * TICK_NS, None);
    copy.allocated(0x100, &moved(3));
    copy.reallocated(0x100, 0x100, 3 * TICK_NS);
    copy.settle(None).unwrap();
    assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
    // The freed address taken at once by a `gc` object stamped with
    // the thread's clock as the realloc read it (the same tick).
    let mut copy = GcCopy::default();
    copy.allocated(0x100, &atomic(1));
    copy.freed(0x100, 2 * TICK_NS, None);
    copy.allocated(0x200, &moved(3));
    copy.reallocated(0x100, 0x200, 3 * TICK_NS);
    copy.allocated(0x100, &block(3, 0));
    copy.settle(None).unwrap();
    assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
    assert_eq!(copy.per_kind()[AllocKind::Gc as usize], [1, 16]);
}

#[test]
fn a_realloc_keeps_the_kind_of_the_block_it_replaces() {
    let mut copy = GcCopy::default();
    let atomic = LiveBlock {
        site: Site {
            kind: AllocKind::GcAtomic,
            ..block(0, 0).site
        },
        ..block(1, 0)
    };
    copy.allocated(0x100, &atomic);
    copy.settle(None).unwrap();
    copy.freed(0x100, 2 * TICK_NS, None);
    let moved = LiveBlock {
        site: Site {
            caller: 0x20,
            ..block(0, 0).site
        },
        ..block(3, 0)
    };
    copy.allocated(0x200, &moved);
    copy.reallocated(0x100, 0x200, 3 * TICK_NS);
    copy.settle(None).unwrap();
    let (site, s) = copy
        .sites()
        .iter()
        .find(|(_, s)| s.tracked_count == 1)
        .unwrap();
    assert_eq!((site.caller, site.kind), (0x20, AllocKind::GcAtomic));
    assert_eq!((s.retyped_count, s.retyped_bytes), (1, 16));
    assert_eq!(copy.per_kind()[AllocKind::GcAtomic as usize], [1, 16]);
}

/// Many runs of different sizes, reuse and frees across them, settled
/// twice: the same survivors, deaths and unknown frees as replaying
/// the events one by one.
#[test]
fn runs_settle_as_a_replay_does() {
    let mut copy = GcCopy::default();
    let mut replay: HashMap<u64, u64> = HashMap::new();
    let (mut died, mut unknown) = (0u64, 0u64);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for round in 0..2 {
        for t in 0..(5 * CHUNK as u64 + 1234) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = 0x10_0000 + 16 * (x % 200_000);
            let time = round * (1 << 32) + t;
            if x.is_multiple_of(5) {
                copy.freed(addr, time * TICK_NS, None);
                match replay.remove(&addr) {
                    Some(_) => died += 1,
                    None => unknown += 1,
                }
            } else {
                copy.allocated(addr, &block(time, 0));
                died += replay.insert(addr, time).is_some() as u64;
            }
            copy.sort_tail();
        }
        assert!(copy.runs.len() > 1, "{} runs", copy.runs.len());
        assert!(copy.runs.windows(2).all(|w| w[0].len() >= 2 * w[1].len()));
        copy.settle(None).unwrap();
        let s = &copy.sites()[0].1;
        assert_eq!(s.tracked_count, replay.len() as u64);
        assert_eq!(s.lifetimes.died, died);
        assert_eq!(copy.unknown_frees(), unknown);
        assert_eq!(copy.len(), replay.len());
        assert!(copy.settled.windows(2).all(|w| w[0].addr() < w[1].addr()));
        assert!(copy.settled.iter().all(|r| replay[&r.addr()] == r.ticks()));
    }
}

/// Blocks listed at the settle, plus the newer records', are the
/// blocks of every record.
#[test]
fn tracked_blocks_are_every_records_blocks() {
    let mut copy = GcCopy::default();
    let mask = !0xfff;
    for i in 0..5000u64 {
        copy.allocated(0x10_0000 + 48 * i, &block(i, 0));
    }
    copy.track_blocks(mask);
    copy.settle(None).unwrap();
    copy.freed(0x10_0000, 6000 * TICK_NS, None);
    for i in 0..100u64 {
        copy.allocated(0x90_0000 + 4096 * i, &block(7000 + i, 0));
    }
    let blocks = copy.blocks(mask);
    let untracked = GcCopy {
        settled_blocks: (0, Vec::new()),
        ..std::mem::take(&mut copy)
    };
    assert_eq!(blocks, untracked.blocks(mask));
    assert_eq!(blocks.len(), 5000 * 48 / 4096 + 1 + 100);
}

#[test]
fn a_pass_judges_only_older_objects_and_keeps_order_across_chunks() {
    let mut copy = GcCopy::default();
    for i in 0..(CHUNK as u64 + 10) {
        copy.allocated(0x1000 + 16 * (i % 1000), &block(i, 0));
        copy.sort_tail();
    }
    // After the collection began: its epoch is the collection's.
    copy.allocated(0x9_0000, &block(CHUNK as u64 + 100, 1));
    let mut judge = |addr: u64| {
        Ok((
            if addr.is_multiple_of(32) {
                Verdict::Marked
            } else {
                Verdict::Unmarked
            },
            16,
        ))
    };
    let judged = copy
        .settle(Some(Judging {
            epoch: 1,
            gc_no: 7,
            now_ns: 1 << 40,
            sites: 1,
            judge: &mut judge,
            first_word: &mut |_| None,
        }))
        .unwrap();
    assert_eq!(judged.marked_count, 500);
    let s = &copy.sites()[0].1;
    // 1000 addresses: each's last allocation survives to be judged.
    assert_eq!(s.collected_count, CHUNK as u64 + 10 - 1000 + 500);
    assert_eq!(s.tracked_count, 501);
    assert_eq!(s.history, vec![[7, 500]], "what the collection found live");
}

#[test]
fn words_the_kernel_read_type_their_objects_wherever_the_records_are() {
    let mut copy = GcCopy::default();
    let atomic = |t| LiveBlock {
        site: Site {
            caller: 0x20,
            stack: None,
            kind: AllocKind::GcAtomic,
        },
        ..block(t, 0)
    };
    copy.allocated(0x1000, &block(1, 0));
    copy.allocated(0x2000, &atomic(2));
    copy.allocated(0x3000, &atomic(3));
    copy.allocated(0x4000, &block(3, 0));
    // Typed at the thread's next allocation: a class's id; a buffer's word
    // that is no id types a scanned object (none) but leaves an atomic one
    // unread, for the hold; an atomic one with an id is typed.
    copy.word_read(0x1000, 7);
    copy.word_read(0x2000, 0);
    copy.word_read(0x3000, 9);
    copy.word_read(0x4000, 0);
    assert_eq!(copy.unread_objects(), vec![0x2000]);
    // A chunk sorted into a run meanwhile: found there by address.
    for a in (0..CHUNK as u64).map(|i| 0x10_0000 + 16 * i) {
        copy.allocated(a, &block(4, 0));
    }
    copy.sort_tail();
    copy.word_read(0x10_0000, 7);
    let unread = copy.unread_objects();
    assert_eq!(unread.len(), CHUNK); // 0x2000 and the chunk but its first
    assert!(!unread.contains(&0x10_0000) && unread.contains(&0x2000));
    let typed = |word| {
        copy.slots()
            .iter()
            .filter(|s| matches!(s.word, ObjectWord::Word(w, _) if w == word))
            .map(|s| s.allocated[0])
            .sum::<u64>()
    };
    assert_eq!((typed(7), typed(9)), (2, 1));
}
