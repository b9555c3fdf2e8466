//! The profile file of a session: named after the target unless `-o`
//! says otherwise, created before anything is attached (a bad path fails
//! early), removed again if the session ends before writing it.
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::allocators;
use crate::profile::{self, Profile};

/// The profile file, created up front so a bad path fails before anything
/// is attached; removed again if the session fails before writing it.
pub(super) struct Output {
    path: PathBuf,
    file: File,
    written: bool,
}

impl Output {
    pub(super) fn create(given: Option<&PathBuf>, exe: &Path, pid: Option<u32>) -> Result<Output> {
        let path = match given {
            Some(p) => p.clone(),
            None => {
                let name = allocators::short(exe);
                PathBuf::from(match pid {
                    Some(pid) => format!("{name}-{pid}.mprof"),
                    None => format!("{name}.mprof"),
                })
            }
        };
        let file = File::create(&path)
            .map_err(|e| anyhow::anyhow!("cannot write profile to {}: {}", path.display(), e))?;
        Ok(Output {
            path,
            file,
            written: false,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the profile; from then on the file stays.
    pub(super) fn write(&mut self, profile: &Profile) -> Result<()> {
        let mut buffered = std::io::BufWriter::new(&mut self.file);
        profile::write(profile, &mut buffered)
            .and_then(|_| Ok(buffered.flush()?))
            .with_context(|| format!("cannot write profile to {}", self.path.display()))?;
        self.written = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
