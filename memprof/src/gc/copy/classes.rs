//! What the copy's objects are, from their first word (a Crystal object's
//! type id, written by the program right after the allocation): each
//! record's slot is its site and what its first word said, read once
//! while the object still held it: by the kernel at its thread's next GC
//! allocation ([`GcCopy::word_read`]: almost every object, at no cost to
//! the pauses), else at the first collection after its allocation
//! (memprof's hold reads each thread's last objects; the kernel's
//! verdict), at its `GC_free`, or at the end. A collected object's memory
//! is reused and cleared by the sweep, so waiting for its death would be
//! too late.
//!
//! Each slot counts its objects allocated, collected and tracked, so the
//! figures per site and class are exact; the words are named at the end
//! ([`crate::gc::live_types::classes`]), when the program's type ids are.
use super::record::{Record, FREED, MAX_SITES};
use super::GcCopy;
use memprof_common::AllocKind;

use crate::symbolize::type_ids::MAX_TYPE_ID;

/// What an object's first word said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectWord {
    /// Not read (yet).
    Unread,
    /// This word, in an object of this many requested bytes (the code
    /// allocates a class's objects with known sizes).
    Word(u32, u64),
    /// No type id: 0, above any id, or a word past its site's
    /// [`WORDS_PER_SITE`] (a buffer's data).
    NoType,
}

/// Whether `word` may be a type id (the names come at the end).
fn is_type_id(word: u32) -> bool {
    word != 0 && word <= MAX_TYPE_ID
}

/// Records looked through, newest first, for the one a kernel-read word
/// is of ([`GcCopy::word_read`]): threads allocating at once interleave.
const RECENT: usize = 64;

/// Distinct words a site's slots keep: a site allocates objects of a
/// few classes; more words are a buffer's data.
const WORDS_PER_SITE: u16 = 16;

/// A record's site and what its first word said, and their objects.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// Index into [`GcCopy::sites`].
    pub site: u32,
    pub word: ObjectWord,
    /// Objects and requested bytes: allocated (counted once the word is
    /// read), collected, and tracked at the last settle.
    pub allocated: [u64; 2],
    pub collected: [u64; 2],
    pub tracked: [u64; 2],
}

impl GcCopy {
    /// The slot of `site`'s objects whose first word is `word`, made if
    /// new; past the slots a record can number, or the words a site
    /// keeps, [`ObjectWord::NoType`]'s (`None`: not even that one).
    pub(super) fn slot_number(&mut self, site: u32, word: ObjectWord) -> Option<u32> {
        if let Some(&n) = self.slot_numbers.get(&(site, word)) {
            return Some(n);
        }
        let words = &mut self.words_per_site[site as usize];
        let word = match word {
            ObjectWord::Word(..) if *words >= WORDS_PER_SITE => ObjectWord::NoType,
            w => w,
        };
        if let Some(&n) = self.slot_numbers.get(&(site, word)) {
            return Some(n);
        }
        if self.slots.len() >= MAX_SITES {
            return None;
        }
        if let ObjectWord::Word(..) = word {
            *words += 1;
        }
        self.slots.push(Slot {
            site,
            word,
            allocated: [0; 2],
            collected: [0; 2],
            tracked: [0; 2],
        });
        let n = self.slots.len() as u32 - 1;
        self.slot_numbers.insert((site, word), n);
        Some(n)
    }

    /// The site number of record `r` (an object's).
    #[inline]
    pub(super) fn site_of(&self, r: &Record) -> usize {
        self.slots[r.slot() as usize].site as usize
    }

    /// Whether the first word of `r`'s object was not read yet.
    #[inline]
    pub(super) fn unread(&self, r: &Record) -> bool {
        r.slot() != FREED && self.slots[r.slot() as usize].word == ObjectWord::Unread
    }

    /// Notes the first word of `r`'s object (`None`: its memory could not
    /// be read), if not noted yet: `r` moves to its slot, which counts it
    /// allocated.
    pub(super) fn note_word(&mut self, r: &mut Record, word: Option<u32>) {
        if !self.unread(r) {
            return;
        }
        let size = self.size(r);
        let site = self.site_of(r) as u32;
        let word = match word {
            Some(w) if is_type_id(w) => ObjectWord::Word(w, size),
            _ => ObjectWord::NoType,
        };
        let Some(to) = self.slot_number(site, word) else {
            return;
        };
        r.set_slot(to);
        let slot = &mut self.slots[to as usize];
        slot.allocated[0] += 1;
        slot.allocated[1] += size;
    }

    /// Notes `word`, the first word of the object at `addr` as the kernel
    /// read it at its thread's next GC allocation (the same epoch: the
    /// object is not settled yet). Its record came in shortly before
    /// (other threads' between): looked for among the last [`RECENT`],
    /// then, past a chunk's sorting, in the runs by address. One not found
    /// stays unread, for the next hold to read.
    pub fn word_read(&mut self, addr: u64, word: u32) {
        let n = self.incoming.len();
        if let Some(i) = (n.saturating_sub(RECENT)..n)
            .rev()
            .find(|&i| self.incoming[i].addr() == addr)
        {
            let mut r = self.incoming[i];
            self.note_early_word(&mut r, word);
            self.incoming[i] = r;
            return;
        }
        for k in (0..self.runs.len()).rev() {
            // A run keeps one address's records in arrival order: the last is the latest.
            let end = self.runs[k].partition_point(|r| r.addr() <= addr);
            if end > 0 && self.runs[k][end - 1].addr() == addr {
                let mut r = self.runs[k][end - 1];
                self.note_early_word(&mut r, word);
                self.runs[k][end - 1] = r;
                return;
            }
        }
    }

    /// [`Self::note_word`] for a word read at the thread's next allocation.
    /// One that is no type id leaves an atomic object unread: a
    /// `String::Builder`'s buffer becomes its `String` (the header written
    /// into it) when `to_s` finds it the right size, allocations after it
    /// was made; the hold reads it again. A scanned object is typed by
    /// `allocate`, at once: its zeros are a buffer's.
    fn note_early_word(&mut self, r: &mut Record, word: u32) {
        if !is_type_id(word)
            && r.slot() != FREED
            && self.sites[self.site_of(r)].0.kind == AllocKind::GcAtomic
        {
            return;
        }
        self.note_word(r, Some(word));
    }

    /// The objects whose first word was not read, ascending: the settled
    /// ones (listed by the last settle) and those allocated since, for a
    /// hold to read.
    pub fn unread_objects(&self) -> Vec<u64> {
        let mut addrs = self.unread_settled.clone();
        for records in self.runs.iter().chain([&self.incoming]) {
            addrs.extend(records.iter().filter(|r| self.unread(r)).map(|r| r.addr()));
        }
        addrs.sort_unstable();
        addrs.dedup();
        addrs
    }

    /// Notes the first words read at the end (`words`: by address,
    /// ascending) of the settled objects not read before, and counts the
    /// tracked objects per slot again.
    pub fn note_last_words(&mut self, words: &[(u64, Option<u32>)]) {
        let mut settled = std::mem::take(&mut self.settled);
        let mut at = 0;
        for r in settled.iter_mut().filter(|r| r.slot() != FREED) {
            while at < words.len() && words[at].0 < r.addr() {
                at += 1;
            }
            if at < words.len() && words[at].0 == r.addr() {
                self.note_word(r, words[at].1);
            }
        }
        for slot in &mut self.slots {
            slot.tracked = [0; 2];
        }
        for r in settled.iter().filter(|r| r.slot() != FREED) {
            let size = self.size(r);
            let t = &mut self.slots[r.slot() as usize].tracked;
            t[0] += 1;
            t[1] += size;
        }
        self.settled = settled;
        self.unread_settled.clear();
    }

    /// Every slot: its site's number, what its objects' first word said,
    /// and their figures.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }
}
