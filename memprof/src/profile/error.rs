//! Why a profile could not be read: [`ProfileError`], one line a user
//! reads and a kind ([`ProfileErrorKind`]) a program acts on.
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

/// A profile that could not be read ([`super::load`], [`super::parse`]).
///
/// Its message is one line: `not a memprof profile (…)`, `profile version
/// N is not supported: …`, `profile is truncated (…)`, `profile is corrupt
/// …`, or `cannot read FILE` (the I/O error is its [`source`]); read from a
/// file, the other kinds start with the file's path (`FILE: profile is
/// truncated (…)`).
///
/// [`source`]: std::error::Error::source
#[derive(Debug)]
pub struct ProfileError {
    path: Option<PathBuf>,
    kind: ProfileErrorKind,
}

/// What is wrong with a profile.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProfileErrorKind {
    /// Not a memprof profile: no `MEMPROF-PROFILE` header, or one without a
    /// version number. `why` says which.
    NotAProfile { why: &'static str },
    /// A profile of a version this memprof does not read (written by a
    /// newer memprof, or one too old).
    Version {
        found: u32,
        supported: RangeInclusive<u32>,
    },
    /// The file ends early (still being written, or cut short by a copy).
    /// `why` says where.
    Truncated { why: &'static str },
    /// The file was changed after memprof wrote it, or was not written by
    /// memprof.
    Corrupt(Corruption),
    /// The file could not be read.
    Io(std::io::Error),
}

/// What is corrupt in a profile.
#[derive(Debug)]
#[non_exhaustive]
pub enum Corruption {
    /// The end line is not `MEMPROF-END crc32=<hex> bytes=<n>`.
    EndLine,
    /// Bytes lost or added in the middle: `found` bytes of JSON where the
    /// end line says `expected`.
    Length { found: usize, expected: usize },
    /// The checksum is not the end line's.
    Checksum,
    /// The JSON does not read as a profile (a missing field, a bad stack
    /// table or collection history).
    Json(serde_json::Error),
    /// A group names stack `stack` of a table of `stacks`.
    StackId { stack: u32, stacks: usize },
    /// A group of the current version with its whole frames (a file edited
    /// by hand, or written by another tool).
    WholeFrames,
    /// Counts whose sums overflow 64 bits: no run can produce them.
    CountsTooLarge,
}

impl ProfileError {
    /// What is wrong.
    pub fn kind(&self) -> &ProfileErrorKind {
        &self.kind
    }

    /// The file, when the profile was read from one ([`super::load`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The same error, in the file `path`.
    pub(super) fn in_file(self, path: &Path) -> ProfileError {
        ProfileError {
            path: Some(path.to_path_buf()),
            ..self
        }
    }
}

impl From<ProfileErrorKind> for ProfileError {
    fn from(kind: ProfileErrorKind) -> ProfileError {
        ProfileError { path: None, kind }
    }
}

impl From<Corruption> for ProfileError {
    fn from(corruption: Corruption) -> ProfileError {
        ProfileErrorKind::Corrupt(corruption).into()
    }
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, &self.kind) {
            // The I/O error follows as the source, as anyhow's context had it.
            (Some(path), ProfileErrorKind::Io(_)) => write!(f, "cannot read {}", path.display()),
            (None, ProfileErrorKind::Io(_)) => f.write_str("cannot read the profile"),
            (Some(path), kind) => write!(f, "{}: {kind}", path.display()),
            (None, kind) => kind.fmt(f),
        }
    }
}

impl std::error::Error for ProfileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ProfileErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for ProfileErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileErrorKind::NotAProfile { why } => write!(f, "not a memprof profile ({why})"),
            ProfileErrorKind::Version { found, supported } => write!(
                f,
                "profile version {found} is not supported: this memprof reads versions {} to {}",
                supported.start(),
                supported.end()
            ),
            ProfileErrorKind::Truncated { why } => write!(f, "profile is truncated ({why})"),
            ProfileErrorKind::Corrupt(Corruption::Json(e)) => write!(f, "profile is corrupt: {e}"),
            ProfileErrorKind::Corrupt(what) => write!(f, "profile is corrupt ({what})"),
            ProfileErrorKind::Io(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::EndLine => f.write_str("bad end line"),
            Corruption::Length { found, expected } => write!(
                f,
                "{found} bytes of JSON where the end line says {expected}"
            ),
            Corruption::Checksum => {
                f.write_str("checksum mismatch: the file was changed after memprof wrote it")
            }
            Corruption::Json(e) => e.fmt(f),
            Corruption::StackId { stack, stacks } => {
                write!(f, "a group names stack {stack} of {stacks}")
            }
            Corruption::WholeFrames => {
                write!(f, "a version-{} group with whole frames", super::VERSION)
            }
            Corruption::CountsTooLarge => f.write_str("counts too large to add up"),
        }
    }
}
