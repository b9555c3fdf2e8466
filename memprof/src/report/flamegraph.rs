//! Flamegraph SVG, drawn by [inferno](https://docs.rs/inferno) from the
//! [folded](super::folded) stacks: the memory palette, a title naming the
//! target and what is counted (live bytes by default; `--total` for
//! everything allocated, `--count objects` for blocks), `--inverted` for an
//! icicle graph. Frame names are escaped by inferno (Crystal names carry
//! `<`, `>`, `(` and `|`); hovering a frame shows its bytes and share.
//!
//! ```
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let f = |name: &str| Frame { function: name.into(), ..Default::default() };
//! let mut profile = Profile::default();
//! profile.push(Group { kind: "gc".into(), live_count: 2, live_bytes: 64, ..Default::default() },
//!     vec![f("Array(Foo)#<<"), f("main")]);
//! let mut out = Vec::new();
//! render(&profile, Format::Flamegraph, &Options::default(), &mut out).unwrap();
//! let svg = String::from_utf8(out).unwrap();
//! assert!(svg.contains("Array(Foo)#&lt;&lt; (64 bytes, 100.00%)"));
//! ```
use std::io::Write;

use anyhow::{bail, Result};
use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Direction};

use super::{folded, Count, Options};
use crate::profile::Profile;

/// What the graph counts, for its title: `live bytes`, `allocated objects`, ….
pub fn measure(options: &Options) -> String {
    let when = if options.total { "allocated" } else { "live" };
    let what = match options.count {
        Count::Bytes => "bytes",
        Count::Objects => "objects",
    };
    format!("{when} {what}")
}

/// The target as a title names it: its command line (or executable) and pid.
pub fn target_name(profile: &Profile) -> String {
    let t = &profile.target;
    let name = if t.command.is_empty() {
        t.exe.clone()
    } else {
        t.command.join(" ")
    };
    format!("{} (pid {})", crate::text::visible(&name), t.pid)
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let stacks = folded::stacks(profile, options);
    if stacks.is_empty() {
        bail!(
            "nothing to draw: no stack has {} (check the filters, or try --total)",
            measure(options)
        );
    }
    let lines: Vec<String> = stacks.iter().map(|(s, v)| format!("{s} {v}")).collect();
    let mut fg = inferno_fg::Options::default();
    fg.colors = Palette::Basic(BasicPalette::Mem);
    fg.title = format!("memprof: {} by stack", measure(options));
    fg.subtitle = Some(target_name(profile));
    fg.count_name = match options.count {
        Count::Bytes => "bytes".to_string(),
        Count::Objects => "objects".to_string(),
    };
    fg.name_type = "Function:".to_string();
    // Same input, same picture: colours from the names, not random.
    fg.hash = true;
    fg.deterministic = true;
    if options.inverted {
        fg.direction = Direction::Inverted;
    }
    inferno_fg::from_lines(&mut fg, lines.iter().map(String::as_str), out)?;
    Ok(())
}

/// memprof's labels for the graph's script (run after inferno's, whose
/// `update_text` it replaces): a name too long for its frame shows its most
/// telling part, the method (`Foo(Bar)#baz` → `Foo#baz` → `#baz`), not its
/// last characters (`..baz`); the full name stays in the tooltip.
pub const LABELS_SCRIPT: &str = include_str!("flamegraph_labels.js");
