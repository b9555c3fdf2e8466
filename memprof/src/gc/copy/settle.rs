//! Settling the copy ([`GcCopy::settle`]): the sorted runs merged into the
//! settled objects in one walk over the addresses, address reuse and frees
//! applied, each survivor judged by the pass's mark bits when there is a
//! pass; and the per-site deaths, collections and retyped reallocs it counts.
use anyhow::Result;

use super::record::{block_list, merge_behind, ticks, Record, BIG, CHUNK, FREED, TICK_NS};
use super::{GcCopy, Judged, Judging, ObjectWord};
use crate::gc::site::push_point;
use crate::gc::Verdict;
use crate::probes::Site;

/// What a judging settle has found so far.
struct Tally {
    /// Per site: objects found marked, and the collector's bytes of them.
    per_site_marked: Vec<(u64, u64)>,
    judged: Judged,
    /// The first error of the judge: it ends the judging (the objects after
    /// it are kept unjudged).
    failure: Option<anyhow::Error>,
}

impl GcCopy {
    /// Applies address reuse and frees, and with `judging` the pass's
    /// mark bits: afterwards the copy holds one record per tracked object,
    /// and each site's tracked count and bytes are current.
    ///
    /// One walk over the addresses, from the highest down, merging the
    /// runs into the settled records in place: the settled array gets room
    /// for every run's records and is written from its end, so nothing is
    /// copied elsewhere (the write position never passes the read one: it
    /// is behind by the records dropped so far). That room is not filled
    /// beforehand, so its pages become resident only as the merge writes
    /// them, while the runs give theirs back as they are read.
    pub fn settle(&mut self, mut judging: Option<Judging>) -> Result<Judged> {
        self.runs_into_one();
        self.retype_reallocs();
        for (_, s) in &mut self.sites {
            (s.tracked_count, s.tracked_bytes) = (0, 0);
        }
        for slot in &mut self.slots {
            slot.tracked = [0; 2];
        }
        self.unread_settled.clear();
        let mut tally = Tally {
            per_site_marked: match judging {
                Some(_) => vec![(0u64, 0u64); self.sites.len()],
                None => Vec::new(),
            },
            judged: Judged::default(),
            failure: None,
        };
        self.merge_and_judge(&mut judging, &mut tally);
        self.settled.shrink_to(self.settled.len() + CHUNK);
        self.refresh_settled_indexes();
        if let Some(j) = &judging {
            self.record_marks(j, &mut tally);
        }
        match tally.failure {
            Some(e) => Err(e),
            None => Ok(tally.judged),
        }
    }

    /// The arrivals become a run, and the runs one: the walk then compares
    /// two arrays per address, and merging runs of decreasing sizes moves
    /// each record about twice.
    fn runs_into_one(&mut self) {
        if !self.incoming.is_empty() {
            let mut run = std::mem::take(&mut self.incoming);
            // Stable: one address's records stay in arrival order.
            run.sort_by_key(|r| r.addr());
            self.runs.push(run);
        }
        while self.runs.len() > 1 {
            let newer = self.runs.pop().unwrap_or_default();
            if let Some(older) = self.runs.last_mut() {
                merge_behind(older, newer);
            }
        }
    }

    /// The walk of [`Self::settle`]: from the highest address down, each
    /// address's records (settled, then each run's) give its survivor,
    /// which is judged, counted and written at the end of the settled array.
    fn merge_and_judge(&mut self, judging: &mut Option<Judging>, tally: &mut Tally) {
        let mut runs = std::mem::take(&mut self.runs);
        let mut settled = std::mem::take(&mut self.settled);
        let s = settled.len();
        let t: usize = runs.iter().map(Vec::len).sum();
        settled.reserve_exact(t);
        // Records are `Copy`: reads and writes go through the pointer,
        // `[0, s)` is initialized and `[s, s + t)` is written before it is
        // read (at `w`, never below the read position `i`).
        let at = settled.as_mut_ptr();
        let read = |n: usize| unsafe { at.add(n).read() };
        // Per run: the end of its unread records; the end before this address.
        let mut ends: Vec<usize> = runs.iter().map(Vec::len).collect();
        let mut before = ends.clone();
        let (mut i, mut w) = (s, s + t);
        // One address's records, oldest first (nearly always one).
        let mut records: Vec<Record> = Vec::new();
        loop {
            let settled_top = (i > 0).then(|| read(i - 1).addr());
            let Some(addr) = highest_unread(settled_top, &runs, &ends) else {
                break;
            };
            // The address's records, oldest first: settled `[i..si]`, then
            // each run's `[ends[r]..before[r]]` (nearly always one in all).
            let si = i;
            while i > 0 && read(i - 1).addr() == addr {
                i -= 1;
            }
            before.copy_from_slice(&ends);
            take_address(&mut runs, &mut ends, &before, addr);
            records.clear();
            records.extend((i..si).map(read));
            for ((run, &end), &was) in runs.iter().zip(&ends).zip(&before) {
                records.extend_from_slice(&run[end..was]);
            }
            if let Some(jd) = judging.as_mut() {
                self.note_word_at_collection(&mut records, addr, jd);
            }
            // The survivor is the object of the last allocation not
            // followed by a free.
            let mut current: Option<Record> = None;
            for &r in &records {
                self.step(&mut current, r);
            }
            let Some(object) = current else { continue };
            if !self.judged_live(addr, &object, judging, tally) {
                continue;
            }
            let size = self.size(&object);
            let slot = &mut self.slots[object.slot() as usize];
            slot.tracked[0] += 1;
            slot.tracked[1] += size;
            let unread = slot.word == ObjectWord::Unread;
            let site = &mut self.sites[slot.site as usize].1;
            site.tracked_count += 1;
            site.tracked_bytes += size;
            if unread {
                self.unread_settled.push(addr);
            }
            w -= 1;
            // SAFETY: `w < s + t <= capacity`, and `w >= i`: no unread record is there.
            unsafe { at.add(w).write(object) };
        }
        let kept = s + t - w;
        // SAFETY: `[w, s + t)` was written above; moved to the front, they
        // are the initialized `[0, kept)`.
        unsafe {
            std::ptr::copy(at.add(w), at, kept);
            settled.set_len(kept);
        }
        drop(runs);
        self.settled = settled;
        // Walked from the highest address down.
        self.unread_settled.reverse();
    }

    /// Notes the first word read at collection `jd` at `addr` for the
    /// object there then: the last of `records` allocated before it (an
    /// object allocated since is another, and an older one was gone).
    fn note_word_at_collection(&mut self, records: &mut [Record], addr: u64, jd: &mut Judging) {
        let at_collection = records
            .iter()
            .rposition(|r| r.slot() != FREED && self.epochs.of(r.ticks()) < jd.epoch);
        if let Some(k) = at_collection.filter(|&k| self.unread(&records[k])) {
            if let Some(word) = (jd.first_word)(addr) {
                self.note_word(&mut records[k], Some(word));
            }
        }
    }

    /// Whether the survivor `object` at `addr` stays: judged by the pass
    /// when there is one (and no error yet) and it was allocated before
    /// the collection; an unmarked one is counted collected and dropped.
    fn judged_live(
        &mut self,
        addr: u64,
        object: &Record,
        judging: &mut Option<Judging>,
        tally: &mut Tally,
    ) -> bool {
        let (Some(jd), None) = (judging.as_mut(), &tally.failure) else {
            return true;
        };
        if self.epochs.of(object.ticks()) >= jd.epoch {
            return true;
        }
        match (jd.judge)(addr) {
            Ok((Verdict::Marked, gc_size)) => {
                // 0: the collector's size is not known.
                let gc_size = match gc_size {
                    0 => self.size(object),
                    n => n,
                };
                let m = &mut tally.per_site_marked[self.site_of(object)];
                m.0 += 1;
                m.1 += gc_size;
                tally.judged.marked_count += 1;
                tally.judged.marked_bytes += gc_size;
                true
            }
            Ok(_) => {
                self.collected(object, jd.now_ns, jd.epoch);
                false
            }
            // Kept, unjudged; the error ends the passes.
            Err(e) => {
                tally.failure = Some(e);
                true
            }
        }
    }

    /// What follows the settled objects: their blocks (when tracked), the
    /// sizes of the big ones still there, and the counts per kind.
    fn refresh_settled_indexes(&mut self) {
        if self.settled_blocks.0 != 0 {
            self.settled_blocks.1 = block_list(&self.settled, self.settled_blocks.0);
        }
        if !self.big.is_empty() {
            let big: std::collections::HashSet<u64> = self
                .settled
                .iter()
                .filter(|r| r.small_size() == BIG)
                .map(|r| r.addr())
                .collect();
            self.big.retain(|addr, _| big.contains(addr));
        }
        self.per_kind = [[0; 2]; memprof_common::AllocKind::COUNT];
        for (site, s) in &self.sites {
            let k = &mut self.per_kind[site.kind as usize & 3];
            k[0] += (s.tracked_count as f64 * s.objects_per_record()).round() as u64;
            k[1] += (s.tracked_bytes as f64 * s.bytes_per_record_byte()).round() as u64;
        }
    }

    /// The pass's marked counts, per site and in all, weighed by what the
    /// records stand for (sampled refills).
    fn record_marks(&mut self, j: &Judging, tally: &mut Tally) {
        // Marked counts are "as of the last pass"; every site gets a
        // point, so shrinking stacks show it. The point is what the
        // collection found live: the copy may already hold objects
        // allocated since (judging runs after the collector does).
        // Sites first seen after it get their first point at the next.
        let sites = self.sites.iter_mut().zip(&tally.per_site_marked);
        let (mut count, mut bytes_all) = (0.0, 0.0);
        for (n, ((_, s), &(marked, bytes))) in sites.enumerate() {
            // What the collector's marks stand for (sampled refills).
            count += marked as f64 * s.objects_per_record();
            bytes_all += bytes as f64 * s.bytes_per_record_byte();
            (s.marked_count, s.marked_bytes) = (marked, bytes);
            if n < j.sites {
                push_point(&mut s.history, [j.gc_no, marked]);
            }
        }
        tally.judged.marked_count = count.round() as u64;
        tally.judged.marked_bytes = bytes_all.round() as u64;
    }

    /// Gives each object `GC_realloc` made since the last settle the kind
    /// of the object it replaced (the latest allocation at that address
    /// before it), and notes the move for the kernel's site totals. The
    /// records since are in sorted runs by now (binary searches).
    fn retype_reallocs(&mut self) {
        for (replaced, addr, time) in std::mem::take(&mut self.reallocs) {
            let Some(kind) = self.replaced_kind(replaced, time) else {
                continue;
            };
            let Some((run, at)) = self.new_record(addr, time) else {
                continue;
            };
            let rec = self.runs[run][at];
            let site = self.sites[self.site_of(&rec)].0;
            if site.kind == kind {
                continue;
            }
            let to = self.site_number(Site { kind, ..site });
            self.runs[run][at].set_slot(to);
            let size = self.size(&rec);
            let to_site = self.slots[to as usize].site as usize;
            let s = &mut self.sites[to_site].1;
            s.retyped_count += 1;
            s.retyped_bytes += size;
            let k = &mut self.per_kind;
            k[site.kind as usize & 3][0] -= 1;
            k[site.kind as usize & 3][1] -= size;
            k[kind as usize & 3][0] += 1;
            k[kind as usize & 3][1] += size;
        }
    }

    /// The kind of the object a `GC_realloc` at `time` (ticks) replaced
    /// at `addr`: the last one allocated there before the realloc's free
    /// of it, in the order the events came. Times cannot tell: the next
    /// object at `addr` may carry the thread's clock as the realloc read
    /// it (one string in 1,000 of the Crystal fixture, under load), and in
    /// place the new object is at `addr` too. Without that free, the
    /// latest allocated there by `time`.
    fn replaced_kind(&self, addr: u64, time: u64) -> Option<memprof_common::AllocKind> {
        // Oldest first: the settled records, then the runs (oldest first);
        // one address's records keep their order of arrival.
        let mut there: Vec<&Record> = Vec::new();
        for records in std::iter::once(&self.settled).chain(&self.runs) {
            let start = records.partition_point(|r| r.addr() < addr);
            let end = records.partition_point(|r| r.addr() <= addr);
            there.extend(&records[start..end]);
        }
        let Some(freed) = there
            .iter()
            .rposition(|r| r.slot() == FREED && r.ticks() <= time)
        else {
            return self.kind_at(addr, time);
        };
        there[..freed]
            .iter()
            .rev()
            .find(|r| r.slot() != FREED)
            .map(|r| self.sites[self.site_of(r)].0.kind)
    }

    /// The kind of the latest object allocated at `addr` at or before
    /// `time` (ticks; the newest run that has one, else the settled records).
    fn kind_at(&self, addr: u64, time: u64) -> Option<memprof_common::AllocKind> {
        self.runs
            .iter()
            .rev()
            .chain([&self.settled])
            .find_map(|records| {
                let start = records.partition_point(|r| r.addr() < addr);
                let end = records.partition_point(|r| r.addr() <= addr);
                records[start..end]
                    .iter()
                    .rev()
                    .find(|r| r.slot() != FREED && r.ticks() <= time)
                    .map(|r| self.sites[self.site_of(r)].0.kind)
            })
    }

    /// Where the record of the allocation at `addr` at `time` (ticks) is: (run, index).
    fn new_record(&self, addr: u64, time: u64) -> Option<(usize, usize)> {
        self.runs
            .iter()
            .enumerate()
            .rev()
            .find_map(|(run, records)| {
                let start = records.partition_point(|r| r.addr() < addr);
                let end = records.partition_point(|r| r.addr() <= addr);
                (start..end)
                    .find(|&i| records[i].slot() != FREED && records[i].ticks() == time)
                    .map(|i| (run, i))
            })
    }

    /// The next record `r` of an address whose surviving object so far is
    /// `current`.
    #[inline]
    fn step(&mut self, current: &mut Option<Record>, r: Record) {
        match (r.slot(), *current) {
            (FREED, Some(mut old)) => {
                // `GC_free` read its first word before freeing it.
                if let Some(word) = r.freed_word() {
                    self.note_word(&mut old, Some(word));
                }
                self.died(&old, r.ticks(), false);
                *current = None;
            }
            (FREED, None) => self.unknown_frees += 1,
            (_, Some(old)) => {
                self.died(&old, r.ticks(), true);
                *current = Some(r);
            }
            (_, None) => *current = Some(r),
        }
    }

    pub(super) fn size(&self, r: &Record) -> u64 {
        match r.small_size() {
            BIG => self.big.get(&r.addr()).copied().unwrap_or(BIG),
            s => s,
        }
    }

    /// `old` died at `ticks`: freed, or collected (its address reused).
    fn died(&mut self, old: &Record, ticks: u64, reused: bool) {
        let size = self.size(old);
        let slot = &mut self.slots[old.slot() as usize];
        if reused {
            slot.collected[0] += 1;
            slot.collected[1] += size;
        }
        let s = &mut self.sites[slot.site as usize].1;
        s.lifetimes
            .record(ticks.saturating_sub(old.ticks()) * TICK_NS);
        if reused {
            s.collected_count += 1;
            s.collected_bytes += size;
        }
    }

    /// `old` was found unmarked at the end of collection `epoch`.
    fn collected(&mut self, old: &Record, now_ns: u64, epoch: u64) {
        let size = self.size(old);
        let born = self.epochs.of(old.ticks());
        let now = ticks(now_ns, self.base_ns);
        let slot = &mut self.slots[old.slot() as usize];
        slot.collected[0] += 1;
        slot.collected[1] += size;
        let s = &mut self.sites[slot.site as usize].1;
        s.collected_count += 1;
        s.collected_bytes += size;
        s.lifetimes
            .record(now.saturating_sub(old.ticks()) * TICK_NS);
        let survived = epoch.saturating_sub(1 + born);
        s.lifetimes.collections_survived += survived;
        if survived == 0 {
            s.lifetimes.within_first_collection += 1;
        }
    }
}

/// The highest address not yet walked: the top of the unread settled
/// records (`settled_top`) or of a run's (`run[..end]`).
fn highest_unread(settled_top: Option<u64>, runs: &[Vec<Record>], ends: &[usize]) -> Option<u64> {
    let mut top = settled_top;
    for (run, &end) in runs.iter().zip(ends) {
        if end > 0 {
            top = top.max(Some(run[end - 1].addr()));
        }
    }
    top
}

/// Moves each run's end below its records at `addr` (`before`: the ends
/// above them).
fn take_address(runs: &mut [Vec<Record>], ends: &mut [usize], before: &[usize], addr: u64) {
    for ((run, end), &was) in runs.iter_mut().zip(ends).zip(before) {
        while *end > 0 && run[*end - 1].addr() == addr {
            *end -= 1;
        }
        // Runs are read from the end: give their memory back as
        // they are, so the merge needs little more than the
        // records themselves.
        if run.len() - was >= CHUNK {
            run.truncate(was);
            run.shrink_to(was);
        }
    }
}
