//! Why a module could not be used ([`Error`]).
use std::path::PathBuf;

/// Why a module could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an ELF file: {source}", path.display())]
    NotElf {
        path: PathBuf,
        source: object::read::Error,
    },
    #[error("{}: only x86-64 is supported", path.display())]
    NotX86_64 { path: PathBuf },
    #[error("{} is not mapped in pid {pid}", path.display())]
    NotMapped { path: PathBuf, pid: u32 },
}
