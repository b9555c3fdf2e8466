//! Tab-separated rows for scripts: the first line is the number of rows,
//! then one line per stack with live allocations:
//! `count<TAB>bytes<TAB>frame<TAB>frame…`, frames as `file:line in 'name'`.
use std::io::Write;

use anyhow::Result;

use super::{
    frame_text,
    markdown::{DEFAULT_DEPTH, DEFAULT_MIN_BYTES},
    select, Options,
};
use crate::profile::Profile;

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let rows = select(profile, options, DEFAULT_MIN_BYTES, true);
    writeln!(out, "{}", rows.len())?;
    for g in rows {
        write!(out, "{}\t{}", g.live_count, g.live_bytes)?;
        for f in options.frames(profile, g, DEFAULT_DEPTH) {
            write!(out, "\t{}", frame_text(f).replace(['\t', '\n'], " "))?;
        }
        writeln!(out)?;
    }
    Ok(())
}
