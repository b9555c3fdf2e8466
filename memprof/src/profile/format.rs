//! The file format: a header line, the [`Profile`] as JSON, an end line
//! with the JSON's checksum and length (see the [module documentation](super)).
//! Writing streams the JSON out once; reading checks the header, the end
//! line, the stack ids and the sums before handing the profile over.
use std::io::Write;
use std::path::Path;

use super::error::{Corruption, ProfileError, ProfileErrorKind};
use super::Profile;

/// Starts the first line: `MEMPROF-PROFILE <version>`.
pub const MAGIC: &str = "MEMPROF-PROFILE";
/// The version this memprof writes (3: stacks interned).
pub const VERSION: u32 = 3;
/// The oldest version this memprof reads (2: with the end line; whole
/// frames in every group, converted on load).
pub const OLDEST_READ: u32 = 2;
/// Starts the last line: the checksum and length of the JSON.
const END: &str = "MEMPROF-END";

/// Writes `profile` in the file format.
pub fn write(profile: &Profile, out: &mut impl Write) -> anyhow::Result<()> {
    let header = format!("{MAGIC} {VERSION}\n");
    out.write_all(header.as_bytes())?;
    // The checksum covers the header too: a version changed by a flipped
    // bit is refused, not read as another format.
    let mut crc = crc32fast::Hasher::new();
    crc.update(header.as_bytes());
    let mut body = Checksummed {
        out: &mut *out,
        crc,
        bytes: 0,
    };
    // serde_json writes in small pieces: checksummed in big ones.
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut body);
    serde_json::to_writer(&mut buffered, profile)?;
    buffered.flush()?;
    drop(buffered);
    let (crc, bytes) = (body.crc.finalize(), body.bytes);
    writeln!(out)?;
    writeln!(out, "{END} crc32={crc:08x} bytes={bytes}")?;
    Ok(())
}

/// Passes bytes on, with their CRC-32 and count.
struct Checksummed<W> {
    out: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Writes `profile` to the file `path` as [`write`] does, whole or not at
/// all: a temporary file beside it, renamed into place once complete, never
/// written through a link planted at `path`.
pub fn save(profile: &Profile, path: &Path) -> anyhow::Result<()> {
    let mut out = crate::outfile::OutFile::create(path)?;
    write(profile, &mut out)?;
    out.commit()
}

/// Reads a profile file; errors say what is wrong with it in one line,
/// starting with the file's path.
pub fn load(path: &Path) -> Result<Profile, ProfileError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ProfileError::from(ProfileErrorKind::Io(e)).in_file(path))?;
    parse(&bytes).map_err(|e| e.in_file(path))
}

/// Parses the bytes of a profile file.
pub fn parse(bytes: &[u8]) -> Result<Profile, ProfileError> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_bytes()) else {
        return Err(ProfileErrorKind::NotAProfile {
            why: "no MEMPROF-PROFILE header",
        }
        .into());
    };
    let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
        return Err(ProfileErrorKind::Truncated {
            why: "header incomplete",
        }
        .into());
    };
    let version = std::str::from_utf8(&rest[..newline])
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let version = match version {
        Some(v) if (OLDEST_READ..=VERSION).contains(&v) => v,
        Some(found) => {
            return Err(ProfileErrorKind::Version {
                found,
                supported: OLDEST_READ..=VERSION,
            }
            .into())
        }
        None => {
            return Err(ProfileErrorKind::NotAProfile {
                why: "bad version in header",
            }
            .into())
        }
    };
    // Version 2 checksums the JSON only, later ones the header line too.
    let covered = if version == 2 {
        &[][..]
    } else {
        &bytes[..MAGIC.len() + newline + 1]
    };
    let body = checked_body(covered, &rest[newline + 1..])?;
    let mut profile: Profile = serde_json::from_slice(body).map_err(Corruption::Json)?;
    if version == 2 {
        from_version_2(&mut profile);
    }
    check_stacks(&profile)?;
    check_sums(&profile)?;
    Ok(profile)
}

/// Moves the whole stacks of a version-2 file into the stack table.
fn from_version_2(profile: &mut Profile) {
    let mut stacks = std::mem::take(&mut profile.stacks);
    for g in &mut profile.groups {
        g.stack = stacks.intern(std::mem::take(&mut g.v2_frames));
    }
    profile.stacks = stacks;
}

/// Refuses groups naming a stack the table does not have, and frames in a
/// version-3 group (a file edited by hand, or written by another tool).
fn check_stacks(profile: &Profile) -> Result<(), Corruption> {
    let stacks = profile.stacks.node_count();
    for g in &profile.groups {
        if g.stack as usize >= stacks {
            return Err(Corruption::StackId {
                stack: g.stack,
                stacks,
            });
        }
        if !g.v2_frames.is_empty() {
            return Err(Corruption::WholeFrames);
        }
    }
    Ok(())
}

/// The JSON between the header and the end line, once its length and
/// checksum match the end line's.
fn checked_body<'a>(covered: &[u8], rest: &'a [u8]) -> Result<&'a [u8], ProfileError> {
    let truncated = || -> ProfileError {
        ProfileErrorKind::Truncated {
            why: "the file ends early",
        }
        .into()
    };
    let text = rest.strip_suffix(b"\n").ok_or_else(truncated)?;
    let start = text
        .iter()
        .rposition(|&b| b == b'\n')
        .ok_or_else(truncated)?;
    let Some(end) = std::str::from_utf8(&text[start + 1..])
        .ok()
        .and_then(|l| l.strip_prefix(END))
    else {
        return Err(truncated());
    };
    let field = |name: &str| {
        end.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
    };
    let crc = field("crc32").and_then(|v| u32::from_str_radix(v, 16).ok());
    let len = field("bytes").and_then(|v| v.parse::<usize>().ok());
    let (Some(crc), Some(len)) = (crc, len) else {
        return Err(Corruption::EndLine.into());
    };
    if end != format!(" crc32={crc:08x} bytes={len}") {
        return Err(Corruption::EndLine.into());
    }
    let body = &text[..start];
    if body.len() != len {
        // Bytes lost or added in the middle: a copy gone wrong.
        return Err(Corruption::Length {
            found: body.len(),
            expected: len,
        }
        .into());
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(covered);
    hasher.update(body);
    if hasher.finalize() != crc {
        return Err(Corruption::Checksum.into());
    }
    Ok(body)
}

/// Refuses counts no run can produce: sums that overflow 64 bits.
fn check_sums(profile: &Profile) -> Result<(), Corruption> {
    let mut sums = [0u64; 8];
    for g in &profile.groups {
        let values = [
            g.live_count,
            g.live_bytes,
            g.total_count,
            g.total_bytes,
            g.collected_count,
            g.collected_bytes,
            g.marked_count,
            g.marked_bytes,
        ];
        for (sum, value) in sums.iter_mut().zip(values) {
            *sum = sum.checked_add(value).ok_or(Corruption::CountsTooLarge)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, Group};

    fn sample() -> Vec<u8> {
        let mut p = Profile::default();
        p.groups.push(Group {
            kind: "libc".into(),
            live_count: 1,
            ..Group::default()
        });
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        bytes
    }

    fn error(bytes: &[u8]) -> String {
        format!("{:#}", parse(bytes).unwrap_err())
    }

    #[test]
    fn round_trips() {
        assert_eq!(parse(&sample()).unwrap().groups[0].live_count, 1);
    }

    /// A profile read back is the profile written, to the bit: the agent
    /// serves a snapshot it read from `--dir` as the bytes it wrote, and
    /// a report of a file says the times the profile had.
    #[test]
    fn times_read_back_are_the_times_written() {
        let mut p = Profile::default();
        for i in 0..20_000u32 {
            // Wall-clock seconds with their nanoseconds, as start times are.
            p.start_unix_s = 1_764_324_059.0 + f64::from(i) * 0.000_123_456_7;
            p.duration_s = f64::from(i) / 7.0;
            let mut bytes = Vec::new();
            write(&p, &mut bytes).unwrap();
            let back = parse(&bytes).unwrap();
            assert_eq!(
                back.start_unix_s.to_bits(),
                p.start_unix_s.to_bits(),
                "{}",
                p.start_unix_s
            );
            assert_eq!(back.duration_s.to_bits(), p.duration_s.to_bits());
            let mut again = Vec::new();
            write(&back, &mut again).unwrap();
            assert_eq!(again, bytes);
        }
    }

    #[test]
    fn names_each_kind_of_bad_file() {
        assert!(error(b"\x7fELF garbage").contains("not a memprof profile"));
        let bytes = sample();
        assert!(error(&bytes[..bytes.len() / 2]).contains("truncated"));
        let other = String::from_utf8(bytes.clone())
            .unwrap()
            .replacen(" 3\n", " 999\n", 1);
        assert!(error(other.as_bytes()).contains("version 999"));
        let mut corrupt = bytes.clone();
        let at = corrupt.len() - 5;
        corrupt[at] = b'#';
        assert!(error(&corrupt).contains("corrupt"));
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = sample();
        for at in 0..bytes.len() {
            for bit in [0x01, 0x20, 0x80] {
                let mut flipped = bytes.clone();
                flipped[at] ^= bit;
                assert!(parse(&flipped).is_err(), "byte {at} ^ {bit:#x} accepted");
            }
        }
    }

    /// A file around `json` as memprof `version` writes it.
    fn file(version: u32, json: &str) -> Vec<u8> {
        let header = format!("{MAGIC} {version}\n");
        let mut crc = crc32fast::Hasher::new();
        if version > 2 {
            crc.update(header.as_bytes());
        }
        crc.update(json.as_bytes());
        let end = format!("{END} crc32={:08x} bytes={}\n", crc.finalize(), json.len());
        format!("{header}{json}\n{end}").into_bytes()
    }

    const V2: &str = r#"{"memprof_version":"0.1.0","mode":"run","target":{"pid":1,"command":["a"],"exe":"/a"},"start_unix_s":0.0,"duration_s":1.0,"exit":null,"unwind":"dwarf","counters":{"live_map_full":0,"sites_map_full":0,"stack_errors":0,"pending_full":0,"unknown_frees":0,"allocs":3,"frees":0,"failed_allocs":0},"probes":[],"groups":[
        {"kind":"gc","live_count":1,"live_bytes":32,"total_count":2,"total_bytes":64,"frames":[
            {"function":"inl","raw_name":"inl","file":"/a.cr","line":3,"module":"/a","address":4352,"offset":256},
            {"function":"Foo.new","raw_name":"*Foo::new:Foo","file":"/a.cr","line":9,"module":"/a","address":4352,"offset":256},
            {"function":"main","raw_name":"main","file":null,"line":null,"module":"/a","address":8192,"offset":4096}],
         "truncated":true,"lifetimes":{"died":1,"total_ns":5,"buckets":[1,0,0,0,0,0,0,0],"within_first_collection":1,"collections_survived":0},
         "gc_history":[[4,1],[5,1],[7,0]]},
        {"kind":"gc_atomic","live_count":1,"live_bytes":8,"total_count":1,"total_bytes":8,"frames":[
            {"function":"main","raw_name":"main","file":null,"line":null,"module":"/a","address":8192,"offset":4096}]}]}"#;

    #[test]
    fn reads_version_2_into_the_stack_table() {
        let p = parse(&file(2, V2)).unwrap();
        // `main` once, `Foo.new` with its inlined frame as one location.
        assert_eq!(p.stacks.locations().len(), 2);
        assert_eq!(p.stacks.locations()[0].frames.len(), 2);
        assert_eq!(p.stacks.node_count(), 3);
        let names =
            |g: &Group| -> Vec<String> { p.frames(g).map(|f| f.function.clone()).collect() };
        assert_eq!(names(&p.groups[0]), ["inl", "Foo.new", "main"]);
        assert_eq!(names(&p.groups[1]), ["main"]);
        // gc_atomic's stack is the caller node of gc's.
        assert_eq!(p.stacks.node(p.groups[0].stack)[1], p.groups[1].stack);
        let main = p.frames(&p.groups[1]).next().unwrap();
        assert_eq!((main.address, main.offset), (8192, Some(4096)));
        assert!(p.groups[0].truncated && !p.groups[0].folded);
        assert_eq!(p.groups[0].lifetimes.within_first_collection, 1);
        assert_eq!(p.groups[0].gc_history, [[4, 1], [5, 1], [7, 0]]);
        // Written again, it is version 3 and reads back the same.
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        let back = parse(&bytes).unwrap();
        assert_eq!(back.stacks, p.stacks);
        assert_eq!(back.groups[0].gc_history, p.groups[0].gc_history);
        assert_eq!(back.groups[0].lifetimes, p.groups[0].lifetimes);
        assert_eq!(back.groups[1].stack, p.groups[1].stack);
        // The version-2 bytes are refused as version 3: the checksum covers the header.
        let v2 = file(2, V2);
        let relabeled = [b"MEMPROF-PROFILE 3".as_slice(), &v2[17..]].concat();
        assert!(
            error(&relabeled).contains("checksum"),
            "{}",
            error(&relabeled)
        );
    }

    #[test]
    fn version_3_layout() {
        let mut p = Profile::default();
        let frame = |function: &str, address| Frame {
            function: function.into(),
            raw_name: function.into(),
            module: "/bin/a".into(),
            address,
            ..Frame::default()
        };
        let stack = vec![frame("leaf", 1), frame("main", 2)];
        let group = |kind: &str| Group {
            kind: kind.into(),
            folded: true,
            gc_history: (10..70).map(|c| [c, 0]).collect(),
            ..Group::default()
        };
        p.push(group("gc"), stack.clone());
        p.push(group("gc_atomic"), stack);
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        let body = text.lines().nth(1).unwrap();
        // Both kinds name one stack; strings once; 60 points as one run;
        // empty fields left out.
        assert_eq!(p.groups[0].stack, p.groups[1].stack);
        assert!(body.contains(r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"stack":2,"folded":true,"gc_history":[[10,0,60]]},"#), "{body}");
        assert!(body.contains(r#""stacks":{"strings":["/bin/a","leaf","main"],"locations":[{"address":1,"offset":null,"module":0,"frames":[{"function":1,"raw_name":1,"file":null,"line":null}]},{"address":2,"offset":null,"module":0,"frames":[{"function":2,"raw_name":2,"file":null,"line":null}]}],"nodes":[[1,0],[0,1]]}"#), "{body}");
        let back = parse(&bytes).unwrap();
        assert!(back.groups[1].folded);
        assert_eq!(back.groups[1].gc_history, p.groups[1].gc_history);
        assert_eq!(back.stacks, p.stacks);
    }

    #[test]
    fn refuses_bad_stack_ids_in_one_line() {
        let p = Profile::default();
        let json = serde_json::to_string(&p).unwrap();
        let bad = [
            // A group naming a stack the table does not have.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"stack":1}]"#),
            // A node naming a location the table does not have.
            json.replace(r#""nodes":[]"#, r#""nodes":[[0,0]]"#),
            // Whole frames in a version-3 group.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"frames":[{"function":"f","raw_name":"f","file":null,"line":null,"module":"m","address":1}]}]"#),
            // A history run longer than any history.
            json.replace(r#""groups":[]"#, r#""groups":[{"kind":"gc","live_count":0,"live_bytes":0,"total_count":0,"total_bytes":0,"gc_history":[[1,0,99999999999]]}]"#),
        ];
        for json in bad {
            assert_ne!(json, serde_json::to_string(&p).unwrap());
            let e = error(&file(VERSION, &json));
            assert!(e.contains("profile is corrupt") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn refuses_counts_that_overflow() {
        let mut p = Profile::default();
        for _ in 0..2 {
            p.groups.push(Group {
                kind: "libc".into(),
                live_bytes: u64::MAX - 1,
                ..Group::default()
            });
        }
        let mut bytes = Vec::new();
        write(&p, &mut bytes).unwrap();
        assert!(error(&bytes).contains("too large"), "{}", error(&bytes));
    }
}
