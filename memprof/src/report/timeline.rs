//! Timeline: live bytes per kind over the run (and the GC's heap size where
//! known), as an SVG line chart drawn with plotters: time since start on
//! the x axis in seconds, live memory on the y axis in B, KiB, MiB or GiB
//! (whichever fits), one line per kind, a legend. The samples come from the
//! daemon (`--sample-period`, default 100 ms), stored in the profile.
//!
//! ```
//! use memprof::profile::{Profile, Sample};
//! use memprof::report::{render, Format, Options};
//! let mut profile = Profile::default();
//! for (t, bytes) in [(0.1, 0), (0.2, 2048), (0.3, 4096)] {
//!     let mut s = Sample { t_s: t, ..Default::default() };
//!     s.live.insert("libc".into(), [bytes / 64, bytes]);
//!     profile.timeline.samples.push(s);
//! }
//! let mut out = Vec::new();
//! render(&profile, Format::Timeline, &Options::default(), &mut out).unwrap();
//! let svg = String::from_utf8(out).unwrap();
//! assert!(svg.starts_with("<svg") && svg.contains("live (KiB)") && svg.contains("libc"));
//! ```
use std::io::Write;

use anyhow::{anyhow, bail, Result};
use plotters::prelude::*;

use super::{flamegraph::target_name, Options};
use crate::profile::Profile;

/// Chart size in pixels.
pub const SIZE: (u32, u32) = (960, 420);

/// The lines of the chart: (name, points (seconds, bytes)).
pub fn series(profile: &Profile, options: &Options) -> Vec<(String, Vec<(f64, f64)>)> {
    let _ = options;
    let samples = &profile.timeline.samples;
    let mut kinds: Vec<&String> = samples.iter().flat_map(|s| s.live.keys()).collect();
    kinds.sort();
    kinds.dedup();
    let mut out: Vec<(String, Vec<(f64, f64)>)> = kinds
        .into_iter()
        .map(|kind| {
            let points = samples
                .iter()
                .map(|s| (s.t_s, s.live.get(kind).map_or(0, |v| v[1]) as f64))
                .collect();
            (kind.clone(), points)
        })
        .collect();
    let heap: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.gc_heap_bytes.map(|b| (s.t_s, b as f64)))
        .collect();
    if !heap.is_empty() {
        out.push(("GC heap size".to_string(), heap));
    }
    out
}

/// The unit the y axis uses for values up to `max` bytes.
fn unit(max: f64) -> (&'static str, f64) {
    [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find(|&(_, size)| max >= 2.0 * size as f64)
        .map_or(("B", 1.0), |(name, size)| (name, size as f64))
}

/// The chart as an SVG document (no XML prolog, so it can be inlined in HTML).
pub fn svg(profile: &Profile, options: &Options) -> Result<String> {
    let lines = series(profile, options);
    if lines.is_empty() {
        bail!("this profile has no timeline (it was recorded with --sample-period 0, or by an older memprof)");
    }
    let t_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(t, _)| t))
        .fold(profile.duration_s, f64::max)
        .max(0.001);
    let y_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(0.0, f64::max);
    let (unit_name, unit_size) = unit(y_max);
    let y_top = (y_max / unit_size * 1.1).max(1.0);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| anyhow!("cannot draw the timeline: {e}");
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("memprof: live memory over time, {}", target_name(profile)),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(72)
            .build_cartesian_2d(0f64..t_max, 0f64..y_top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("time since start (s)")
            .y_desc(format!("live ({unit_name})"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, points)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|&(t, y)| (t, y / unit_size)),
                    color.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    out.write_all(svg(profile, options)?.as_bytes())?;
    Ok(())
}
