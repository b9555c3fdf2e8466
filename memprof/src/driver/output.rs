//! The profile file of a session: named after the target unless `-o`
//! says otherwise, opened before anything is attached (a bad path fails
//! early), and given its name only once the profile is written whole
//! ([`crate::outfile`]).
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::allocators;
use crate::outfile::OutFile;
use crate::profile::{self, Profile};
use crate::report::{self, markdown};

pub struct Output {
    path: PathBuf,
    /// `None` once written.
    file: Option<OutFile>,
}

impl Output {
    pub fn create(given: Option<&PathBuf>, exe: &Path, pid: Option<u32>) -> Result<Output> {
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
        let file = OutFile::create(&path)
            .map_err(|e| anyhow::anyhow!("cannot write profile to {}: {e:#}", path.display()))?;
        Ok(Output {
            path,
            file: Some(file),
        })
    }

    /// No file: a session whose profile becomes part of another's (a
    /// process `run` follows).
    pub fn none() -> Output {
        Output {
            path: PathBuf::new(),
            file: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the profile and gives the file its name.
    pub fn write(&mut self, profile: &Profile) -> Result<()> {
        let Some(mut file) = self.file.take() else {
            anyhow::bail!("the profile {} was written already", self.path.display());
        };
        profile::write(profile, &mut file)
            .and_then(|()| file.commit())
            .map_err(|e| anyhow::anyhow!("cannot write profile to {}: {e:#}", self.path.display()))
    }
}

impl Output {
    /// Writes the profile, then prints its header and its `top` stacks.
    pub fn write_and_print(&mut self, profile: &Profile, top: usize) -> Result<()> {
        use std::io::Write;
        self.write(profile)?;
        let path = self.path();
        let mut stderr = std::io::stderr().lock();
        writeln!(stderr)?;
        markdown::header(profile, &mut stderr)?;
        let table = report::Options {
            top: Some(top),
            ..report::Options::default()
        };
        markdown::table(profile, &table, &mut stderr)?;
        writeln!(stderr)?;
        writeln!(
            stderr,
            "memprof: profile written to {} (memprof report {} --format markdown|tsv|json)",
            path.display(),
            path.display()
        )?;
        Ok(())
    }
}
