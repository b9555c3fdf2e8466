//! Report writers: a [`Profile`] in, text out. No tracing code here, so
//! `memprof report` runs anywhere, without privileges.
//!
//! What a library user gets: [`render`] writes a profile in one of the
//! [`Format`]s (markdown, tsv, json, types, folded, flamegraph, pprof,
//! timeline, html) as [`Options`] say (`--min-bytes`, `--depth`, `--skip`,
//! `--top`, …); [`diff`] compares two profiles, [`leaks`] ranks the stacks
//! whose objects keep growing, [`filter`] narrows a profile down first.
//!
//! Every writer sees the same rows: `select` sorts the groups (live bytes,
//! then live count, then stack text, all descending but the stack) and
//! applies `--min-bytes` and `--top`; `Options::frames` hides the
//! allocator plumbing (`--skip-runtime`) and applies `--skip` and `--depth`
//! to a stack. [`Format::Types`] sums live objects per allocated class instead.
//!
//! Render a profile as tsv and as markdown:
//!
//! ```
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let mut profile = Profile::default();
//! let frame = |function: &str, line| Frame {
//!     function: function.into(),
//!     file: Some("/src/basic.c".into()),
//!     line: Some(line),
//!     ..Frame::default()
//! };
//! let group = Group { kind: "libc".into(), live_count: 600, live_bytes: 28800, ..Group::default() };
//! profile.push(group, vec![frame("make_foo", 9), frame("main", 30)]);
//!
//! let mut out = Vec::new();
//! render(&profile, Format::Tsv, &Options::default(), &mut out).unwrap();
//! let tsv = String::from_utf8(out).unwrap();
//! // Live objects, live bytes, the program's frame, then the frames.
//! assert_eq!(tsv, "1\n600\t28800\t/src/basic.c:9 in 'make_foo'\t/src/basic.c:9 in 'make_foo'\t/src/basic.c:30 in 'main'\n");
//!
//! let mut out = Vec::new();
//! let options = Options { depth: Some(1), ..Options::default() };
//! render(&profile, Format::Markdown, &options, &mut out).unwrap();
//! let table = String::from_utf8(out).unwrap();
//! assert!(table.contains("|             600 |                28,800 | `/src/basic.c:9 in 'make_foo'` | `/src/basic.c:9 in 'make_foo'` |"), "{table}");
//! ```
pub mod diff;
pub mod filter;
mod flamegraph;
mod folded;
mod html;
mod json;
pub mod leaks;
pub(crate) mod markdown;
mod options;
mod plumbing;
mod pprof;
mod program;
mod rows;
mod runtime;
mod text;
mod timeline;
mod tsv;
mod types;

use std::io::Write;

use anyhow::Result;

use crate::profile::Profile;

pub use options::Options;
pub(crate) use rows::{plumbing_only_note, rows, select, Row};
pub(crate) use text::{
    folded_groups, frame_text, loss_summary, modules_without_symbols, symbol_notes, thousands,
    truncated_groups, FOLDED_FRAME, FOLDED_NOTE, LOSS_CATEGORIES, TRUNCATED_FRAME,
};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Table of live allocations per stack, as perf-tools' MemProf prints it.
    Markdown,
    /// Row count, then `count<TAB>bytes<TAB>frame<TAB>frame…` per stack.
    Tsv,
    /// Everything in the profile, documented in docs/formats.md.
    Json,
    /// Live objects and bytes per allocated Crystal class (`| Live objects | Live bytes | Type |`).
    Types,
    /// Folded stacks for flamegraph.pl and friends: `root;…;leaf VALUE` per line.
    Folded,
    /// Flamegraph SVG (inferno): live bytes by stack.
    Flamegraph,
    /// Gzipped pprof profile.proto (alloc_objects, alloc_space, inuse_objects,
    /// inuse_space), for `go tool pprof`; binary, use -o.
    Pprof,
    /// SVG line chart of live bytes per kind over time.
    Timeline,
    /// One self-contained HTML page: summary, timeline, flamegraph, top stacks, types.
    Html,
}

impl Format {
    /// The formats `--diff` can write.
    pub fn diffable(self) -> bool {
        matches!(self, Format::Markdown | Format::Json)
    }
}

/// What flamegraph, folded and the value of each stack count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Count {
    /// Bytes.
    #[default]
    Bytes,
    /// Blocks (objects).
    Objects,
}

/// Writes `profile` in `format`.
pub fn render(
    profile: &Profile,
    format: Format,
    options: &Options,
    out: &mut dyn Write,
) -> Result<()> {
    match format {
        Format::Markdown => markdown::write(profile, options, out),
        Format::Tsv => tsv::write(profile, options, out),
        Format::Json => json::write(profile, options, out),
        Format::Types => types::write(profile, options, out),
        Format::Folded => folded::write(profile, options, out),
        Format::Flamegraph => flamegraph::write(profile, options, out),
        Format::Pprof => pprof::write(profile, options, out),
        Format::Timeline => timeline::write(profile, options, out),
        Format::Html => html::write(profile, options, out),
    }
}
