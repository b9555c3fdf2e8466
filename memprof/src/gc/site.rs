//! What the mark-bit passes learn per allocation site ([`SiteGc`]), and its
//! history of live objects per collection: the records the copy
//! ([`super::copy`]) keeps and the passes ([`super::pass`]) read.
use std::collections::BTreeMap;

use crate::profile::Lifetimes;

/// Most points kept in a stack's GC history (older points are thinned out).
const HISTORY_POINTS: usize = 64;

/// What the passes learned about one allocation site.
#[derive(Debug, Clone, Default)]
pub struct SiteGc {
    /// Allocations of this site, and their requested bytes: the kernel
    /// streams every GC allocation to the copy, which sums them (the
    /// kernel's per-site totals hold the other kinds).
    pub allocated_count: u64,
    pub allocated_bytes: u64,
    /// Objects found unmarked (collected), and their requested bytes.
    pub collected_count: u64,
    pub collected_bytes: u64,
    /// Lifetimes of the collected objects.
    pub lifetimes: Lifetimes,
    /// At the last pass: objects found marked, and their size as the GC counts it.
    pub marked_count: u64,
    pub marked_bytes: u64,
    /// Objects in memprof's copy at its last settle (marked, or allocated
    /// since the last pass), and their requested bytes: the site's live GC objects.
    pub tracked_count: u64,
    pub tracked_bytes: u64,
    /// Allocations of this site by `GC_realloc` that the kernel counted
    /// under the same stack with kind `gc` (`GC_realloc`'s own): the block
    /// they replaced was of this site's kind, which a realloc keeps.
    pub retyped_count: u64,
    pub retyped_bytes: u64,
    /// `[GC_gc_no, live objects]` after each pass, in 32 bits each: every
    /// site gets a point at every pass, and a big program has 100,000s.
    pub history: Vec<[u32; 2]>,
    /// Allocations the copy recorded for this site: `allocated_count`
    /// itself, except with `--gc-sampling refill`, where a refill's sample
    /// stands for the objects of its list (`allocated_count` sums those).
    pub records: u64,
    /// The requested bytes of those records: the bytes they stand for
    /// (`allocated_bytes`) over these weigh each byte figure
    /// ([`Self::bytes_per_record_byte`]).
    pub record_bytes: u64,
    /// The objects by their class, read from their first word (a Crystal
    /// object's type id) while they still held it: at the first collection
    /// after their allocation, at `GC_free`, or at the end. Objects whose
    /// first word is no type id (buffers), or was not read, are not in it.
    pub classes: Vec<ClassGc>,
}

/// One class's objects at a site (records, sampled refills estimated by
/// [`SiteGc::estimated`]): allocated, collected, and live at the end, and
/// their requested bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassGc {
    pub name: String,
    pub allocated_count: u64,
    pub allocated_bytes: u64,
    pub collected_count: u64,
    pub collected_bytes: u64,
    pub live_count: u64,
    pub live_bytes: u64,
}

impl ClassGc {
    /// Adds `other`'s figures (same class) to this one's.
    pub fn add(&mut self, other: &ClassGc) {
        self.allocated_count += other.allocated_count;
        self.allocated_bytes += other.allocated_bytes;
        self.collected_count += other.collected_count;
        self.collected_bytes += other.collected_bytes;
        self.live_count += other.live_count;
        self.live_bytes += other.live_bytes;
    }
}

impl SiteGc {
    /// Objects each recorded allocation stands for, on average: 1 unless
    /// sampled at refills.
    pub fn objects_per_record(&self) -> f64 {
        if self.records == 0 || self.records == self.allocated_count {
            1.0
        } else {
            self.allocated_count as f64 / self.records as f64
        }
    }

    /// Bytes each recorded byte stands for: 1 unless sampled at refills.
    /// Not [`Self::objects_per_record`]: a refill of a bigger size class
    /// stands for fewer objects, so a site whose samples mix sizes would
    /// have its byte figures over-weighted by the average (all 400,000
    /// objects of the `gc_threads` fixture live: +17 % live bytes).
    pub fn bytes_per_record_byte(&self) -> f64 {
        if self.record_bytes == 0 || self.records == self.allocated_count {
            self.objects_per_record()
        } else {
            self.allocated_bytes as f64 / self.record_bytes as f64
        }
    }

    /// What the recorded allocations stand for: every count per record
    /// (live, marked, collected, lifetimes, history) times
    /// [`Self::objects_per_record`], every byte figure times
    /// [`Self::bytes_per_record_byte`]; the allocated totals already are.
    pub fn estimated(&self) -> SiteGc {
        let f = self.objects_per_record();
        let fb = self.bytes_per_record_byte();
        let mut s = self.clone();
        if f == 1.0 {
            return s;
        }
        let times = |n: &mut u64, f: f64| *n = (*n as f64 * f).round() as u64;
        for n in [
            &mut s.collected_count,
            &mut s.marked_count,
            &mut s.tracked_count,
        ] {
            times(n, f);
        }
        for n in [
            &mut s.collected_bytes,
            &mut s.marked_bytes,
            &mut s.tracked_bytes,
        ] {
            times(n, fb);
        }
        s.lifetimes.scale(f);
        for c in &mut s.classes {
            for n in [
                &mut c.allocated_count,
                &mut c.collected_count,
                &mut c.live_count,
            ] {
                times(n, f);
            }
            for n in [
                &mut c.allocated_bytes,
                &mut c.collected_bytes,
                &mut c.live_bytes,
            ] {
                times(n, fb);
            }
        }
        for point in &mut s.history {
            point[1] = (point[1] as f64 * f).round().min(u32::MAX as f64) as u32;
        }
        s
    }
}

/// Appends a point; past twice the limit, keeps every other one.
pub(super) fn push_point(history: &mut Vec<[u32; 2]>, point: [u64; 2]) {
    history.push(point.map(|x| u32::try_from(x).unwrap_or(u32::MAX)));
    if history.len() >= 2 * HISTORY_POINTS {
        let mut i = 0;
        history.retain(|_| {
            i += 1;
            i % 2 == 0
        });
    }
}

/// Merges the GC histories of sites that make one stack, summing counts
/// per collection.
pub fn merge_histories(a: &[[u64; 2]], b: &[[u32; 2]]) -> Vec<[u64; 2]> {
    let mut by_collection: BTreeMap<u64, u64> = BTreeMap::new();
    for [no, n] in a.iter().copied().chain(b.iter().map(|p| p.map(u64::from))) {
        *by_collection.entry(no).or_default() += n;
    }
    by_collection.into_iter().map(|(no, n)| [no, n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_thinned_not_cut() {
        let mut h = Vec::new();
        for i in 0..200 {
            push_point(&mut h, [i, i]);
        }
        assert!(h.len() < 2 * HISTORY_POINTS);
        assert_eq!(h.last(), Some(&[199, 199]));
        assert!(h[0][0] < 10, "{:?}", h[0]);
    }

    #[test]
    fn histories_merge_per_collection() {
        assert_eq!(
            merge_histories(&[[1, 2], [2, 3]], &[[2, 1], [3, 1]]),
            vec![[1, 2], [2, 4], [3, 1]]
        );
    }
}
