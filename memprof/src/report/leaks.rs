//! `--leaks`: the GC stacks whose objects keep accumulating over the whole
//! run, most growth first, with the evidence: each row's live-count
//! history.
//!
//! A leak is growth that does not come back. From each stack's GC history
//! (its live objects after every collection memprof judged, see
//! [`Group::gc_history`]), a stack leaks when:
//! - it was seen at 6 or more collections, over at least half of the
//!   collections judged (a rise at the end of a phase, like a result built
//!   last, is not enough history);
//! - split in four quarters of its history, each quarter's mean count is
//!   above the one before (steady growth, not a cache warmed up once and
//!   then full, nor a level of buffers held by open connections);
//! - the lowest count of the last quarter is above the highest of the first
//!   (what was gained was never given back);
//! - the count rose from one collection to the next at a quarter or more of
//!   them (a few stragglers, like buffers a conservative collector keeps
//!   alive by a stale word, rise in steps, not steadily).
//!
//! Stacks are ranked by growth in bytes (objects gained × mean object size).
//! libc and mmap blocks have no collections: for them, "still live at the
//! end" is the leak signal (the plain table).
//!
//! ```
//! use memprof::profile::{Group, Profile};
//! use memprof::report::leaks;
//! let history = |f: &dyn Fn(u64) -> u64| (1..=8).map(|c| [c, f(c)]).collect::<Vec<_>>();
//! let growing = Group { kind: "gc".into(), total_count: 80, total_bytes: 80 * 32,
//!     gc_history: history(&|c| 10 * c), ..Default::default() };
//! let held = Group { kind: "gc".into(), total_count: 9000, total_bytes: 9000 * 32,
//!     gc_history: history(&|c| 16 + c % 2), ..Default::default() };
//! let profile = Profile { groups: vec![held, growing], ..Default::default() };
//! let leaking = leaks::leaking(profile);
//! assert_eq!(leaking.groups.len(), 1);
//! assert_eq!(leaks::assess(&leaking.groups[0], 8).unwrap().growth, 70);
//! ```
use std::io::Write;

use anyhow::Result;

use super::markdown::escape;
use super::{frame_text, thousands, Options};
use crate::profile::{Group, Profile};

/// Collections a stack must have been seen at.
const MIN_POINTS: usize = 6;

/// How a stack grew over the collections judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leak {
    /// Live objects gained from the first collection to the last.
    pub growth: u64,
    /// `growth` × mean object size.
    pub growth_bytes: u64,
    /// Collections seen, and at how many the count rose.
    pub collections: usize,
    pub rises: usize,
    /// First and last collection numbers (`GC_gc_no`).
    pub first: u64,
    pub last: u64,
}

/// Whether `group` leaks by the rule above, and how much; `judged` is the
/// number of collections judged in the whole profile (0: not known, the
/// coverage is not checked).
pub fn assess(group: &Group, judged: u64) -> Option<Leak> {
    let h = &group.gc_history;
    if h.len() < MIN_POINTS {
        return None;
    }
    let (first, last) = (h[0], h[h.len() - 1]);
    // Seen over at least half of the run's collections.
    if (last[0].saturating_sub(first[0]) + 1) * 2 < judged {
        return None;
    }
    let counts: Vec<u64> = h.iter().map(|p| p[1]).collect();
    let quarters: Vec<&[u64]> = (0..4)
        .map(|q| &counts[q * counts.len() / 4..(q + 1) * counts.len() / 4])
        .collect();
    // Means compared as sums scaled by the other quarter's length.
    let steady = quarters.windows(2).all(|w| {
        let (a, b) = (w[0], w[1]);
        let sum = |q: &[u64]| q.iter().map(|&n| n as u128).sum::<u128>();
        sum(b) * a.len() as u128 > sum(a) * b.len() as u128
    });
    let kept = quarters[3].iter().min() > quarters[0].iter().max();
    if !steady || !kept || last[1] <= first[1] {
        return None;
    }
    let rises = h.windows(2).filter(|w| w[1][1] > w[0][1]).count();
    if rises * 4 < h.len() - 1 {
        return None;
    }
    let growth = last[1] - first[1];
    let mean = group
        .total_bytes
        .checked_div(group.total_count)
        .unwrap_or(0);
    Some(Leak {
        growth,
        growth_bytes: growth * mean,
        collections: h.len(),
        rises,
        first: first[0],
        last: last[0],
    })
}

/// Collections judged in `profile` (0 when unknown).
fn judged(profile: &Profile) -> u64 {
    profile.gc.as_ref().map_or(0, |g| g.collections)
}

/// The live-count history as a sparkline of at most `width` bars (each the
/// count at evenly spaced points), lowest `▁` to highest `█`.
fn sparkline(history: &[[u64; 2]], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if history.is_empty() || width == 0 {
        return String::new();
    }
    let n = history.len().min(width);
    let points: Vec<u64> = (0..n)
        .map(|i| history[i * (history.len() - 1) / (n - 1).max(1)][1])
        .collect();
    let (lo, hi) = (
        *points.iter().min().unwrap_or(&0),
        *points.iter().max().unwrap_or(&0),
    );
    points
        .iter()
        .map(|&v| {
            let level = ((v - lo) as u128 * 7)
                .checked_div((hi - lo) as u128)
                .unwrap_or(0);
            BARS[level as usize]
        })
        .collect()
}

/// `profile` with only its leaking stacks, most growth (bytes) first.
pub fn leaking(mut profile: Profile) -> Profile {
    let judged = judged(&profile);
    let groups = std::mem::take(&mut profile.groups);
    profile.groups = rank(
        groups
            .into_iter()
            .filter_map(|g| Some((assess(&g, judged)?, g))),
    );
    profile
}

/// The leaking stacks of `profile`, most growth (bytes) first.
fn ranked(profile: &Profile) -> Vec<&Group> {
    let judged = judged(profile);
    rank(
        profile
            .groups
            .iter()
            .filter_map(|g| Some((assess(g, judged)?, g))),
    )
}

fn rank<G>(leaks: impl Iterator<Item = (Leak, G)>) -> Vec<G> {
    let mut ranked: Vec<(Leak, G)> = leaks.collect();
    ranked.sort_by(|(a, _), (b, _)| {
        b.growth_bytes
            .cmp(&a.growth_bytes)
            .then(b.growth.cmp(&a.growth))
    });
    ranked.into_iter().map(|(_, g)| g).collect()
}

/// The leak table: growth, what is live now, and the stack.
pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let leaking = ranked(profile);
    let collections = profile.gc.as_ref().map_or(0, |g| g.collections);
    writeln!(
        out,
        "# memprof: leaking GC stacks ({} of {} stacks; {} collections judged)",
        leaking.len(),
        profile.groups.len(),
        thousands(collections)
    )?;
    writeln!(out)?;
    if collections < MIN_POINTS as u64 {
        writeln!(
            out,
            "Fewer than {MIN_POINTS} collections were judged: too few to see growth (profile longer, or with --gc-liveness marks)."
        )?;
        writeln!(out)?;
    }
    writeln!(
        out,
        "| Growth | Growth (bytes) | Live | Live size | Live objects after each collection (first → last) | Context |"
    )?;
    writeln!(
        out,
        "|-------:|---------------:|-----:|----------:|---------------------------------------------------|---------|"
    )?;
    let judged = judged(profile);
    for &group in leaking.iter().take(options.top.unwrap_or(usize::MAX)) {
        let Some(leak) = assess(group, judged) else {
            continue;
        };
        let frames: Vec<String> = options
            .frames(profile, group, 5)
            .map(|f| format!("`{}`", escape(&frame_text(f))))
            .collect();
        let h = &group.gc_history;
        writeln!(
            out,
            "| {} | {} | {} | {} | {} → {} over {} collections (#{}–#{}, rose at {}) {} | {} |",
            thousands(leak.growth),
            thousands(leak.growth_bytes),
            thousands(group.live_count),
            thousands(group.live_bytes),
            thousands(h[0][1]),
            thousands(h[h.len() - 1][1]),
            leak.collections,
            leak.first,
            leak.last,
            leak.rises,
            sparkline(h, 16),
            frames.join("<br>")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(history: &[[u64; 2]]) -> Group {
        Group {
            kind: "gc".into(),
            total_count: 10,
            total_bytes: 480,
            gc_history: history.to_vec(),
            ..Group::default()
        }
    }

    fn points(counts: &[u64]) -> Vec<[u64; 2]> {
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| [i as u64 + 5, n])
            .collect()
    }

    #[test]
    fn steady_growth_leaks() {
        let h = points(&[100, 200, 250, 400, 450, 500, 600, 640]);
        let leak = assess(&group(&h), 8).unwrap();
        assert_eq!(
            (leak.growth, leak.growth_bytes, leak.rises),
            (540, 540 * 48, 7)
        );
        assert_eq!((leak.first, leak.last), (5, 12));
        assert_eq!(sparkline(&h, 16), "▁▂▂▄▅▆▇█");
    }

    #[test]
    fn held_levels_warmed_caches_late_phases_and_peaks_do_not() {
        // Buffers of open connections: a level with churn.
        assert_eq!(
            assess(&group(&points(&[16, 18, 15, 20, 16, 19, 17, 20])), 8),
            None
        );
        // A cache warmed up, then full.
        let cache = points(&[
            200, 400, 600, 800, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000,
        ]);
        assert_eq!(assess(&group(&cache), 12), None);
        // A result built in the last collections of 40: too short a history.
        let late = points(&[100, 200, 300, 400, 500, 600]);
        assert_eq!(assess(&group(&late), 40), None);
        assert!(assess(&group(&late), 6).is_some());
        // A peak that passed, and growth given back.
        assert_eq!(
            assess(&group(&points(&[10, 900, 1000, 500, 400, 300])), 6),
            None
        );
        assert_eq!(assess(&group(&points(&[10, 20, 30, 40, 50, 5])), 6), None);
        assert_eq!(assess(&group(&points(&[10, 20])), 0), None);
        // Held buffers of which three stayed alive, one at a time, by stale
        // words (seen in CI): 15 → 18 in three steps over 41 collections.
        let stragglers: Vec<u64> = (0..41)
            .map(|c| 15 + u64::from(c >= 3) + u64::from(c >= 22) + u64::from(c >= 30))
            .collect();
        assert_eq!(assess(&group(&points(&stragglers)), 41), None);
        // A slow leak still counts when it rises at a quarter of them.
        let slow: Vec<u64> = (0..41).map(|c| 100 + c / 4).collect();
        assert!(assess(&group(&points(&slow)), 41).is_some());
    }
}
