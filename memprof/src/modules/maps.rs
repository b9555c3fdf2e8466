//! `/proc/PID/maps`: which file is mapped where.
//!
//! Symbolization needs it after the target may have exited, so the session
//! keeps a [`MapsCache`] that remembers every file-backed executable mapping
//! ever seen (refreshed periodically and at the target's exit stop).
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// One file-backed mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    pub executable: bool,
    pub path: PathBuf,
    /// The file's device (`major:minor` as the kernel prints it) and
    /// inode: the file itself, whatever its path in the process's root.
    pub file_id: (String, u64),
}

impl Mapping {
    /// Turns an address inside this mapping into a file offset.
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        addr - self.start + self.file_offset
    }
}

/// Parses a maps file; skips anonymous and special mappings. Its paths
/// are bytes (a file named in Latin-1 is a file all the same).
pub fn parse(text: &[u8]) -> Vec<Mapping> {
    text.split(|&b| b == b'\n').filter_map(parse_line).collect()
}

fn parse_line(line: &[u8]) -> Option<Mapping> {
    // 7f1c2a000000-7f1c2a028000 r-xp 00028000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6
    let mut fields = line.splitn(6, |&b| b == b' ');
    let mut field = || std::str::from_utf8(fields.next()?).ok();
    let (range, perms, offset, dev, inode) = (field()?, field()?, field()?, field()?, field()?);
    let path = fields.next()?.trim_ascii_start();
    if !path.starts_with(b"/") {
        return None;
    }
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        path: PathBuf::from(OsStr::from_bytes(path)),
        file_id: (dev.to_string(), inode.parse().ok()?),
    })
}

/// Reads the current mappings of `pid`.
pub fn read(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse(&std::fs::read(format!("/proc/{pid}/maps"))?))
}

/// Every executable mapping seen during a session. Newer snapshots win where
/// ranges overlap (a library unloaded and another loaded at its address).
#[derive(Debug, Default)]
pub struct MapsCache {
    mappings: Vec<Mapping>,
}

impl MapsCache {
    /// Takes a snapshot of `pid` and returns it; errors (the process is
    /// gone) keep the old view and return `None`.
    pub fn refresh(&mut self, pid: u32) -> Option<Vec<Mapping>> {
        let now = read(pid).ok()?;
        self.merge(now.clone());
        Some(now)
    }

    pub fn merge(&mut self, now: Vec<Mapping>) {
        let now: Vec<Mapping> = now.into_iter().filter(|m| m.executable).collect();
        self.mappings.retain(|old| {
            !now.iter()
                .any(|new| new.start < old.end && old.start < new.end)
        });
        self.mappings.extend(now);
        self.mappings.sort_by_key(|m| m.start);
    }

    /// Every mapping seen, by address.
    pub fn all(&self) -> &[Mapping] {
        &self.mappings
    }

    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0de0000-55d0c0de1000 r--p 00000000 08:01 42 /tmp/app
55d0c0de1000-55d0c0de2000 r-xp 00001000 08:01 42 /tmp/app
7f00aa000000-7f00aa100000 r-xp 00028000 08:01 7  /usr/lib/x86_64-linux-gnu/libc.so.6
7f00ab000000-7f00ab021000 rw-p 00000000 00:00 0  [heap]
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0  [vdso]
";

    #[test]
    fn parses_file_mappings_only() {
        let maps = parse(SAMPLE.as_bytes());
        assert_eq!(maps.len(), 3);
        assert_eq!(
            maps[2].path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(maps[2].file_offset_of(0x7f00aa000010), 0x28010);
        assert_eq!(maps[2].file_id, ("08:01".to_string(), 7));
    }

    #[test]
    fn file_names_not_in_utf8_are_kept() {
        let maps =
            parse(b"55d0c0de1000-55d0c0de2000 r-xp 00001000 08:01 42 /tmp/caf\xe9 \x1b[2J|\n");
        assert_eq!(
            maps[0].path.as_os_str().as_bytes(),
            b"/tmp/caf\xe9 \x1b[2J|"
        );
    }

    #[test]
    fn cache_finds_executable_mappings() {
        let mut cache = MapsCache::default();
        cache.merge(parse(SAMPLE.as_bytes()));
        assert_eq!(
            cache.find(0x55d0c0de1800).unwrap().path,
            PathBuf::from("/tmp/app")
        );
        assert!(cache.find(0x55d0c0de0800).is_none(), "not executable");
        assert!(cache.find(0x1000).is_none());
    }
}
