//! The `.mprof` profile file: everything a report needs, symbolized, so
//! `memprof report` runs anywhere, without privileges and after the target is
//! gone.
//!
//! What a library user gets: the data model ([`Profile`], its [`Group`]s
//! of allocations per call stack, their [`Frame`]s through [`Stacks`], the
//! [`Counters`] of what was lost, the collector's [`GcSummary`], the
//! [`Timeline`]); [`write()`] to write a profile, [`load`] and [`parse`] to
//! read one back, and [`ProfileError`] saying why a file could not be
//! read ([`ProfileErrorKind`]: not a profile, another version, truncated,
//! corrupt, unreadable).
//!
//! Layout: one header line `MEMPROF-PROFILE <version>\n`, then the
//! [`Profile`] as JSON and a newline, then an end line
//! `MEMPROF-END crc32=<hex> bytes=<n>\n` with the CRC-32 of the header
//! line and the JSON (version 2: of the JSON only) and the length of the
//! JSON. The header lets [`load`] tell "not a profile" and "another
//! version" apart, the end line "truncated" and "corrupt" (a flipped byte),
//! before anything is parsed. (The check is at the end so the profile is
//! streamed out once, never held twice in memory.) Counts whose sums would
//! overflow are refused as corrupt.
//!
//! Stacks are interned as pprof does (version 3): a group names its stack
//! by an id into [`Stacks`], where each distinct return address is one
//! [`Location`] (its frames, inlined functions first; strings once in a
//! string table) and each stack a node `[location, caller]` of a tree whose
//! root is the outermost frame, so stacks sharing their outer frames share
//! their nodes. Version-2 files (every group with its whole frames) are
//! still read, and converted on load.
//!
//! Build a profile, write it, read it back:
//!
//! ```
//! use memprof::profile::{self, Frame, Group, Profile};
//! let mut p = Profile::default();
//! let make_foo = Frame { function: "make_foo".into(), address: 0x1234, ..Frame::default() };
//! let main = Frame { function: "main".into(), address: 0x5678, ..Frame::default() };
//! let group = Group { kind: "libc".into(), live_count: 2, live_bytes: 96, ..Group::default() };
//! p.push(group, vec![make_foo, main]);
//!
//! let mut bytes = Vec::new();
//! profile::write(&p, &mut bytes).unwrap();
//! assert!(bytes.starts_with(b"MEMPROF-PROFILE 3\n"));
//!
//! let back = profile::parse(&bytes).unwrap();
//! assert_eq!(back.groups[0].live_bytes, 96);
//! let names: Vec<&str> = back.frames(&back.groups[0]).map(|f| f.function.as_str()).collect();
//! assert_eq!(names, ["make_foo", "main"]);
//! ```
//!
//! A file that is not a whole profile of this version is refused with one
//! line, and a kind to act on:
//!
//! ```
//! use memprof::profile::{self, Corruption, Profile, ProfileErrorKind};
//! let mut bytes = Vec::new();
//! profile::write(&Profile::default(), &mut bytes).unwrap();
//!
//! let half = profile::parse(&bytes[..bytes.len() / 2]).unwrap_err();
//! assert!(matches!(half.kind(), ProfileErrorKind::Truncated { .. }));
//! assert_eq!(half.to_string(), "profile is truncated (the file ends early)");
//!
//! let newer = String::from_utf8(bytes.clone()).unwrap().replacen(" 3\n", " 9\n", 1);
//! match profile::parse(newer.as_bytes()).unwrap_err().kind() {
//!     ProfileErrorKind::Version { found, supported } => {
//!         assert_eq!((*found, *supported.end()), (9, profile::VERSION))
//!     }
//!     other => panic!("{other}"),
//! }
//!
//! let mut flipped = bytes.clone();
//! flipped[20] ^= 0x20;
//! let e = profile::parse(&flipped).unwrap_err();
//! assert!(matches!(e.kind(), ProfileErrorKind::Corrupt(Corruption::Checksum)));
//!
//! let e = profile::load("/no/such/file.mprof".as_ref()).unwrap_err();
//! assert!(matches!(e.kind(), ProfileErrorKind::Io(_)));
//! assert_eq!(e.to_string(), "cannot read /no/such/file.mprof");
//!
//! let e = profile::parse(b"\x7fELF").unwrap_err();
//! assert_eq!(e.to_string(), "not a memprof profile (no MEMPROF-PROFILE header)");
//! ```
mod collector;
mod counters;
mod error;
pub(crate) mod family;
mod format;
mod history;
mod lifetimes;
mod model;
mod stacks;
mod timeline;

pub use collector::{CensusType, Censuses, GcSummary, HeapCensus};
pub use counters::Counters;
pub use error::{Corruption, ProfileError, ProfileErrorKind};
pub use format::{load, parse, save, write, MAGIC, OLDEST_READ, VERSION};
pub use lifetimes::{Lifetimes, LIFETIME_BOUNDS_NS};
pub use model::{
    kind_index, ExitInfo, Frame, Group, KernelInfo, ProbeInfo, ProcessInfo, Profile, TargetInfo,
};
pub use stacks::{Location, Stacks};
pub use timeline::{Sample, Timeline};
