//! Tab-separated rows for scripts: the first line is the number of rows,
//! then one line per stack with live allocations:
//! `count<TAB>bytes<TAB>program<TAB>frame<TAB>frame…`: the live count and
//! bytes at the end, the first frame of the program's own source (empty
//! when there is none), then the frames shown, each `file:line in 'name'`.
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
        let program = r.program.map(frame_text).unwrap_or_default();
        write!(
            out,
            "{}\t{}\t{}",
            r.group.live_count,
            r.group.live_bytes,
            program.replace(['\t', '\n'], " ")
        )?;
        for f in r.frames {
            write!(out, "\t{}", frame_text(f).replace(['\t', '\n'], " "))?;
        }
        writeln!(out)?;
    }
    Ok(())
}
