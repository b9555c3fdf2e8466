//! `/debug/pprof/heap?seconds=N`: what was allocated between two profiles
//! of the same processes, as Go's `net/http/pprof` answers it (two
//! profiles N seconds apart, the first subtracted from the second).
//!
//! A group is the same in both when its process, kind, class and frames
//! (function, module, address) are: the stack tables of two snapshots
//! number their stacks each their own way. Allocated figures are what the
//! window added; live figures are what the window added to them (0 where
//! they shrank: a profile's figures are counts).
use std::collections::HashMap;

use crate::profile::{Group, Profile};

/// What identifies a group across two profiles of the same processes.
type Key = (u32, u32, String, Option<String>, Vec<(String, String, u64)>);

fn key(profile: &Profile, g: &Group) -> Key {
    (
        g.pid,
        g.pid_reuse,
        g.kind.clone(),
        g.type_name.clone(),
        profile
            .frames(g)
            .map(|f| (f.function.clone(), f.module.clone(), f.address))
            .collect(),
    )
}

/// `later` less `earlier`: the groups with something allocated between
/// them, with what was.
pub fn since(mut later: Profile, earlier: &Profile) -> Profile {
    let mut before: HashMap<Key, [u64; 4]> = HashMap::new();
    for g in &earlier.groups {
        let sum = before.entry(key(earlier, g)).or_default();
        sum[0] += g.total_count;
        sum[1] += g.total_bytes;
        sum[2] += g.live_count;
        sum[3] += g.live_bytes;
    }
    let groups = std::mem::take(&mut later.groups);
    for mut g in groups {
        if let Some(b) = before.get(&key(&later, &g)) {
            g.total_count = g.total_count.saturating_sub(b[0]);
            g.total_bytes = g.total_bytes.saturating_sub(b[1]);
            g.live_count = g.live_count.saturating_sub(b[2]);
            g.live_bytes = g.live_bytes.saturating_sub(b[3]);
            g.collected_count = 0;
            g.collected_bytes = 0;
        }
        if g.total_count > 0 {
            later.groups.push(g);
        }
    }
    later.duration_s = (later.duration_s - earlier.duration_s).max(0.0);
    later.compact_stacks();
    later
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Frame;

    fn frame(function: &str, address: u64) -> Frame {
        Frame {
            function: function.to_string(),
            module: "app".to_string(),
            address,
            ..Frame::default()
        }
    }

    fn group(count: u64, live: u64) -> Group {
        Group {
            pid: 7,
            kind: "libc".to_string(),
            total_count: count,
            total_bytes: count * 100,
            live_count: live,
            live_bytes: live * 100,
            ..Group::default()
        }
    }

    #[test]
    fn only_what_the_window_allocated_is_left() {
        let mut earlier = Profile::default();
        earlier.push(group(10, 10), vec![frame("before", 0x10)]);
        earlier.push(group(5, 5), vec![frame("both", 0x20)]);
        let mut later = Profile::default();
        // Stacks interned in another order: ids differ.
        later.push(group(3, 3), vec![frame("during", 0x30)]);
        later.push(group(8, 6), vec![frame("both", 0x20)]);
        later.push(group(10, 10), vec![frame("before", 0x10)]);
        let delta = since(later, &earlier);
        let figures: Vec<(String, u64, u64, u64)> = delta
            .groups
            .iter()
            .map(|g| {
                let f = delta.frames(g).next().unwrap().function.clone();
                (f, g.total_count, g.total_bytes, g.live_count)
            })
            .collect();
        assert_eq!(
            figures,
            vec![
                ("during".to_string(), 3, 300, 3),
                ("both".to_string(), 3, 300, 1)
            ]
        );
    }
}
