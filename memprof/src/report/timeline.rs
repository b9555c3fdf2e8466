//! Timeline: live bytes per kind over the run (and the GC's heap size where
//! known), as an SVG line chart drawn with plotters: time since start on
//! the x axis in seconds, live memory on the y axis in B, KiB, MiB or GiB
//! (whichever fits), one line per kind, a legend right of the plot (never
//! over a line: `#legend`, beside `#plot-area`). The samples come from the
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

/// Chart size in pixels: the plot, and the legend in a column of its
/// own at its right ([`LEGEND_WIDTH`]), so it never covers a line.
pub const SIZE: (u32, u32) = (1040, 420);

/// The legend's column, right of the plot.
pub const LEGEND_WIDTH: u32 = 170;

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
    let plot;
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| anyhow!("cannot draw the timeline: {e}");
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (left, _) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&left)
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
        for (i, (_, points)) in lines.iter().enumerate() {
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|&(t, y)| (t, y / unit_size)),
                    color(i).stroke_width(2),
                ))
                .map_err(|e| err(&e))?;
        }
        plot = chart.plotting_area().get_pixel_range();
        root.present().map_err(|e| err(&e))?;
    }
    // The plot's frame and the legend, right of it, as elements of their
    // own (`#plot-area`, `#legend`): a reader (or a test) finds them by id.
    let legend = legend(&lines, plot.0.end + 16, plot.1.start);
    let frame = format!(
        "<rect id=\"plot-area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"none\"/>\n",
        plot.0.start,
        plot.1.start,
        plot.0.end - plot.0.start,
        plot.1.end - plot.1.start
    );
    let end = out.rfind("</svg>").unwrap_or(out.len());
    out.insert_str(end, &(frame + &legend));
    Ok(out)
}

/// Line `i`'s colour.
fn color(i: usize) -> RGBAColor {
    Palette99::pick(i).to_rgba()
}

/// The legend at (`x`, `y`), top left: a line of each colour and its name.
fn legend(lines: &[(String, Vec<(f64, f64)>)], x: i32, y: i32) -> String {
    let row = 22;
    let mut svg = format!(
        "<g id=\"legend\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"white\" stroke=\"black\"/>\n",
        LEGEND_WIDTH - 28,
        row * lines.len() as i32 + 10
    );
    for (i, (name, _)) in lines.iter().enumerate() {
        let c = color(i);
        let line_y = y + 16 + row * i as i32;
        svg += &format!(
            "<line x1=\"{}\" y1=\"{line_y}\" x2=\"{}\" y2=\"{line_y}\" stroke=\"rgb({},{},{})\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{}\">{}</text>\n",
            x + 8,
            x + 30,
            c.0,
            c.1,
            c.2,
            x + 36,
            line_y + 4,
            crate::text::html_escape(name)
        );
    }
    svg + "</g>\n"
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    out.write_all(svg(profile, options)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Sample;

    /// The number in `attr="N"` after `from` in `svg`.
    fn attr(svg: &str, from: &str, attr: &str) -> i32 {
        let rest = &svg[svg.find(from).unwrap_or_else(|| panic!("no {from}"))..];
        let start = rest.find(&format!(" {attr}=\"")).unwrap() + attr.len() + 3;
        rest[start..].split('"').next().unwrap().parse().unwrap()
    }

    #[test]
    fn the_legend_is_right_of_the_plot() {
        let mut profile = Profile::default();
        for (t, bytes) in [(0.0, 1 << 20), (0.1, 0), (0.2, 1 << 20)] {
            let mut s = Sample {
                t_s: t,
                gc_heap_bytes: Some(2 << 20),
                ..Default::default()
            };
            s.live.insert("gc".into(), [bytes / 64, bytes]);
            s.live.insert("libc".into(), [1, 64]);
            profile.timeline.samples.push(s);
        }
        let svg = svg(&profile, &Options::default()).unwrap();
        let plot_right =
            attr(&svg, "id=\"plot-area\"", "x") + attr(&svg, "id=\"plot-area\"", "width");
        let legend = attr(&svg, "<g id=\"legend\"", "x");
        assert!(
            legend > plot_right,
            "legend at {legend}, plot to {plot_right}"
        );
        assert!(legend + LEGEND_WIDTH as i32 - 28 <= SIZE.0 as i32);
        for name in ["gc", "libc", "GC heap size"] {
            assert!(svg.contains(&format!(">{name}</text>")), "{name}");
        }
    }
}
