//! Tab-separated rows for scripts: the first line is the number of rows,
//! then one line per stack with live allocations:
//! `count<TAB>bytes<TAB>frame<TAB>frame…`, frames as `file:line in 'name'`.
//! Rows as in the markdown table: stacks showing the same frames merged,
//! the runtime's own allocations last.
use std::io::Write;

use anyhow::Result;

use super::{
    frame_text,
    markdown::{DEFAULT_DEPTH, DEFAULT_MIN_BYTES},
    rows, Options,
};
use crate::profile::Profile;

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let rows = rows(profile, options, DEFAULT_MIN_BYTES, DEFAULT_DEPTH, true);
    writeln!(out, "{}", rows.len())?;
    for r in rows {
        write!(out, "{}\t{}", r.group.live_count, r.group.live_bytes)?;
        for f in r.frames {
            write!(out, "\t{}", frame_text(f).replace(['\t', '\n'], " "))?;
        }
        writeln!(out)?;
    }
    Ok(())
}
