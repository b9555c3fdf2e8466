//! `--leaks`: the GC stacks whose objects survive collections while their
//! number keeps growing, most growth first.
//!
//! The rule, from each stack's GC history (its live objects after every
//! collection memprof judged, see [`Group::gc_history`]): a stack leaks
//! when it was seen at 3 or more collections, has more live objects at the
//! last than at the first, rose at more collections than it fell, and ends
//! within 10% of its highest count (still growing, not a peak that passed).
//! Stacks are ranked by growth in bytes (objects gained × mean object size).
//! libc and mmap blocks have no collections: for them, "still live at the
//! end" is the leak signal (the plain table).
//!
//! ```
//! use memprof::profile::{Group, Profile};
//! use memprof::report::leaks;
//! let growing = Group { kind: "gc".into(), total_count: 30, total_bytes: 960,
//!     gc_history: vec![[1, 10], [2, 20], [3, 30]], ..Default::default() };
//! let garbage = Group { kind: "gc".into(), total_count: 9000, total_bytes: 9000 * 32,
//!     gc_history: vec![[1, 3], [2, 0], [3, 2]], ..Default::default() };
//! let profile = Profile { groups: vec![garbage, growing], ..Default::default() };
//! let leaking = leaks::leaking(profile);
//! assert_eq!(leaking.groups.len(), 1);
//! assert_eq!(leaks::assess(&leaking.groups[0]).unwrap().growth, 20);
//! ```
use std::io::Write;

use anyhow::Result;

use super::markdown::escape;
use super::{frame_text, thousands, Options};
use crate::profile::{Group, Profile};

/// Collections a stack must have been seen at.
const MIN_POINTS: usize = 3;

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

/// Whether `group` leaks by the rule above, and how much.
pub fn assess(group: &Group) -> Option<Leak> {
    let h = &group.gc_history;
    if h.len() < MIN_POINTS {
        return None;
    }
    let (first, last) = (h[0], h[h.len() - 1]);
    let max = h.iter().map(|p| p[1]).max().unwrap_or(0);
    let rises = h.windows(2).filter(|w| w[1][1] > w[0][1]).count();
    let falls = h.windows(2).filter(|w| w[1][1] < w[0][1]).count();
    if last[1] <= first[1] || rises <= falls || last[1] * 10 < max * 9 {
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

/// `profile` with only its leaking stacks, most growth (bytes) first.
pub fn leaking(mut profile: Profile) -> Profile {
    let groups = std::mem::take(&mut profile.groups);
    profile.groups = rank(groups.into_iter().filter_map(|g| Some((assess(&g)?, g))));
    profile
}

/// The leaking stacks of `profile`, most growth (bytes) first.
pub fn ranked(profile: &Profile) -> Vec<&Group> {
    rank(profile.groups.iter().filter_map(|g| Some((assess(g)?, g))))
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
        "| Growth | Growth (bytes) | Live | Live size | Collections (rose at) | Context |"
    )?;
    writeln!(
        out,
        "|-------:|---------------:|-----:|----------:|----------------------:|---------|"
    )?;
    for &group in leaking.iter().take(options.top.unwrap_or(usize::MAX)) {
        let Some(leak) = assess(group) else { continue };
        let frames: Vec<String> = options
            .frames(profile, group, 5)
            .map(|f| format!("`{}`", escape(&frame_text(f))))
            .collect();
        writeln!(
            out,
            "| {} | {} | {} | {} | {} ({}) | {} |",
            thousands(leak.growth),
            thousands(leak.growth_bytes),
            thousands(group.live_count),
            thousands(group.live_bytes),
            leak.collections,
            leak.rises,
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

    #[test]
    fn steady_growth_leaks() {
        let leak = assess(&group(&[[5, 100], [6, 200], [7, 250], [8, 400]])).unwrap();
        assert_eq!(
            (leak.growth, leak.growth_bytes, leak.rises),
            (300, 300 * 48, 3)
        );
        assert_eq!((leak.first, leak.last), (5, 8));
    }

    #[test]
    fn churn_peaks_and_short_histories_do_not() {
        assert_eq!(
            assess(&group(&[[1, 5], [2, 0], [3, 7], [4, 1], [5, 6]])),
            None
        );
        assert_eq!(assess(&group(&[[1, 10], [2, 1000], [3, 20]])), None);
        assert_eq!(assess(&group(&[[1, 10], [2, 20]])), None);
        assert_eq!(
            assess(&group(&[[1, 10], [2, 900], [3, 1000], [4, 500]])),
            None
        );
    }
}
