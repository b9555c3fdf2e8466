//! Each process's live memory over time, for its profile's timeline (the
//! page's chart, `report --agent --format timeline`): the agent's
//! sessions keep no timeline of their own (a reading of the live table
//! per process per period would cost the machine), so the figures the
//! agent reads anyway are sampled every [`EVERY`].
//!
//! Bounded: at most [`POINTS`] points per process; when full, every other
//! point of the older half goes (the recent past stays fine-grained, the
//! whole life stays in view). A process's points go when the agent lets
//! it go (not running, and not among the ended ones it keeps). Per point:
//! its time and live blocks and bytes per kind (80 bytes).
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use crate::driver::Figures;
use crate::profile::{kind_index, Profile, Sample, Timeline};

/// How often the figures are sampled.
pub const EVERY: Duration = Duration::from_secs(5);

/// Points kept per process at most.
pub const POINTS: usize = 120;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    unix_s: f64,
    /// Per [`memprof_common::AllocKind`]: live blocks and bytes.
    live: [[u64; 2]; memprof_common::AllocKind::COUNT],
    gc_heap_bytes: Option<u64>,
}

#[derive(Debug, Default)]
struct Series {
    points: Vec<Point>,
    /// Its allocations at the last point: fewer now means the pid is
    /// another process's (the kernel gave it again).
    allocations: u64,
}

/// The processes' series.
#[derive(Debug)]
pub struct History {
    series: HashMap<u32, Series>,
    next: Instant,
}

impl Default for History {
    fn default() -> Self {
        History {
            series: HashMap::new(),
            next: Instant::now(),
        }
    }
}

fn now_unix_s() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl History {
    /// Whether a round is due.
    pub fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// A point for each running process (`running`'s figures); the series
    /// of processes neither running nor in `kept` (the ended ones kept)
    /// go.
    pub fn sample(&mut self, running: &[Figures], kept: &HashSet<u32>) {
        self.next = Instant::now() + EVERY;
        let unix_s = now_unix_s();
        let live: HashSet<u32> = running.iter().map(|f| f.pid).collect();
        self.series
            .retain(|pid, _| live.contains(pid) || kept.contains(pid));
        for f in running {
            let series = self.series.entry(f.pid).or_default();
            if f.allocations < series.allocations {
                series.points.clear();
            }
            series.allocations = f.allocations;
            push(
                &mut series.points,
                Point {
                    unix_s,
                    live: f.live,
                    gc_heap_bytes: f.gc_heap_bytes,
                },
            );
        }
    }

    /// Processes with a series.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.series.len()
    }

    /// `profile` (of process `pid` alone) with its timeline: the points
    /// kept, then its own figures (now, or at its end).
    pub fn timeline_of(&self, pid: u32, profile: &mut Profile) {
        if !profile.timeline.samples.is_empty() {
            return;
        }
        let start = profile.start_unix_s;
        let mut samples: Vec<Sample> = self
            .series
            .get(&pid)
            .map(|s| s.points.iter().map(|p| sample(p, start)).collect())
            .unwrap_or_default();
        let end_s = profile
            .processes()
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.end_s)
            .unwrap_or_else(|| now_unix_s() - start);
        let mut last = Point {
            unix_s: start + end_s,
            live: [[0; 2]; memprof_common::AllocKind::COUNT],
            gc_heap_bytes: profile.gc.as_ref().and_then(|g| g.heap_size),
        };
        for g in &profile.groups {
            if let Some(k) = kind_index(&g.kind) {
                last.live[k][0] += g.live_count;
                last.live[k][1] += g.live_bytes;
            }
        }
        // Points after its end (read as it ended) are its end.
        samples.retain(|s| s.t_s < end_s);
        samples.push(Sample {
            t_s: end_s,
            ..sample(&last, start)
        });
        profile.timeline = Timeline {
            period_s: EVERY.as_secs_f64(),
            samples,
            longest_read_s: 0.0,
        };
    }
}

/// `point` appended; when full, every other point of the older half
/// goes (its first stays: the process's start).
fn push(points: &mut Vec<Point>, point: Point) {
    if points.len() >= POINTS {
        let half = points.len() / 2;
        let mut i = 0;
        points.retain(|_| {
            i += 1;
            i > half || i % 2 == 1
        });
    }
    points.push(point);
}

fn sample(p: &Point, start_unix_s: f64) -> Sample {
    Sample {
        t_s: p.unix_s - start_unix_s,
        live: memprof_common::AllocKind::ALL
            .iter()
            .filter(|k| p.live[**k as usize] != [0, 0])
            .map(|k| (k.name().to_string(), p.live[*k as usize]))
            .collect(),
        gc_heap_bytes: p.gc_heap_bytes,
        estimated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64) -> Point {
        Point {
            unix_s: t,
            live: [[1, t as u64], [0; 2], [0; 2], [0; 2], [0; 2]],
            gc_heap_bytes: None,
        }
    }

    /// A series never passes its bound; its first and latest points stay,
    /// and the recent half keeps every point.
    #[test]
    fn a_full_series_thins_its_older_half() {
        let mut points = Vec::new();
        for t in 0..1000 {
            push(&mut points, point(f64::from(t)));
            assert!(points.len() <= POINTS);
        }
        assert_eq!(points.last().unwrap().unix_s, 999.0);
        assert!(points.windows(2).all(|w| w[0].unix_s < w[1].unix_s));
        let recent: Vec<f64> = points[points.len() - 30..]
            .iter()
            .map(|p| p.unix_s)
            .collect();
        assert_eq!(recent, (970..1000).map(f64::from).collect::<Vec<_>>());
        assert_eq!(points[0].unix_s, 0.0);
    }

    /// A process's series: its points, then its figures as served; a pid
    /// given again starts over; one let go has none.
    #[test]
    fn a_profile_gets_its_points_and_its_end() {
        let mut history = History::default();
        let figures = |pid, allocations, bytes| Figures {
            pid,
            allocations,
            live: [[2, bytes], [0; 2], [0; 2], [0; 2], [0; 2]],
            ..Figures::default()
        };
        history.sample(&[figures(7, 10, 100), figures(8, 5, 50)], &HashSet::new());
        history.sample(&[figures(7, 20, 200), figures(8, 1, 10)], &HashSet::new());
        let mut profile = Profile {
            start_unix_s: now_unix_s() - 100.0,
            ..Profile::default()
        };
        profile.push(
            crate::profile::Group {
                kind: "libc".into(),
                live_count: 3,
                live_bytes: 300,
                ..Default::default()
            },
            vec![],
        );
        history.timeline_of(7, &mut profile);
        let bytes: Vec<u64> = profile
            .timeline
            .samples
            .iter()
            .map(|s| s.live["libc"][1])
            .collect();
        assert_eq!(bytes, [100, 200, 300]);
        assert!((profile.timeline.samples[0].t_s - 100.0).abs() < 5.0);
        // Pid 8's allocations went down: another process.
        assert_eq!(history.series[&8].points.len(), 1);
        // Neither running nor kept: gone.
        history.sample(&[figures(7, 30, 300)], &HashSet::new());
        assert_eq!(history.len(), 1);
        history.sample(&[], &HashSet::from([7]));
        assert_eq!(history.len(), 1);
    }
}
