//! Where the process's resident memory goes: every mapping of
//! `/proc/PID/smaps` given to one row, the GC heap's blocks split by what
//! the census found in them, so that the rows add up to the process's RSS.
//!
//! The GC heap is anonymous memory memprof knows block by block (from the
//! collector's block index); how much of each block is resident comes from
//! `/proc/PID/pagemap` (bit 63 of a page's entry). The rest of each
//! anonymous mapping, and every other mapping, is named by its shape:
//!
//! | row | mappings |
//! |---|---|
//! | GC heap: live objects | resident bytes of object blocks, up to the live bytes in each |
//! | GC heap: free space in object blocks | the rest of those blocks: dead, free or never used slots |
//! | GC heap: free blocks | resident pages of blocks the collector keeps free |
//! | malloc heap | `[heap]` (brk) |
//! | malloc arenas | an anonymous read-write mapping at a 64 MiB boundary followed by its `---p` reserve (glibc's per-thread arenas) |
//! | thread and fiber stacks | `[stack]`, and an anonymous read-write mapping right above a `---p` guard (pthread and Crystal fiber stacks) |
//! | MODULE: code / data | a file's executable mappings / its other mappings and the anonymous `.bss` right after them |
//! | kernel | `[vdso]`, `[vvar]`, `[vsyscall]` |
//! | other anonymous | the rest, the collector's own headers among it |
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use anyhow::{Context, Result};

/// glibc's arena reservation (HEAP_MAX_SIZE on 64-bit).
const ARENA: u64 = 64 << 20;
const PAGE: u64 = 4096;
/// Most pagemap entries read at once (64 MiB of address space).
const MAX_PAGES: u64 = 16 << 10;

/// One mapping of `/proc/PID/smaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` as the kernel writes it.
    pub perms: String,
    /// The file, `[heap]`-like name, or empty for anonymous memory.
    pub path: String,
    /// Resident bytes.
    pub rss: u64,
}

/// What was read from the target for the table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub mappings: Vec<Mapping>,
    /// Resident bytes of each range asked for, in order.
    pub resident: Vec<u64>,
}

/// Reads the mappings of `pid` and how much of each of `ranges`
/// (`(start, bytes)`, page-aligned) is resident.
pub(crate) fn read(pid: u32, ranges: &[(u64, u64)]) -> Result<Snapshot> {
    let bytes = std::fs::read(format!("/proc/{pid}/smaps"))
        .with_context(|| format!("cannot read /proc/{pid}/smaps"))?;
    // File names are any bytes: each line as it is shown, `\xe9` escapes.
    let lines: Vec<String> = bytes
        .split(|&b| b == b'\n')
        .map(crate::text::visible_bytes)
        .collect();
    let mappings = parse_smaps(&lines.join("\n"));
    let pagemap = File::open(format!("/proc/{pid}/pagemap"))
        .with_context(|| format!("cannot read /proc/{pid}/pagemap"))?;
    // One read of the entries of each run of neighbouring ranges (heap
    // blocks are mostly contiguous), then the ranges' shares of it.
    let mut resident = Vec::with_capacity(ranges.len());
    let mut entries = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        let first = ranges[i].0 / PAGE;
        let mut j = i;
        let mut end = first;
        while j < ranges.len() && ranges[j].0 / PAGE == end && end - first < MAX_PAGES {
            end = (ranges[j].0 + ranges[j].1).div_ceil(PAGE);
            j += 1;
        }
        if j == i {
            // Not page-aligned after the previous one: a run of its own.
            end = (ranges[i].0 + ranges[i].1).div_ceil(PAGE);
            j = i + 1;
        }
        entries.resize(((end - first) * 8) as usize, 0);
        pagemap
            .read_exact_at(&mut entries, first * 8)
            .with_context(|| format!("reading /proc/{pid}/pagemap"))?;
        for &(start, bytes) in &ranges[i..j] {
            let from = (start / PAGE - first) as usize;
            let pages = bytes.div_ceil(PAGE) as usize;
            let present = entries[from * 8..(from + pages) * 8]
                .chunks_exact(8)
                .filter(|e| e[7] & 0x80 != 0)
                .count() as u64;
            resident.push(present * PAGE);
        }
        i = j;
    }
    Ok(Snapshot { mappings, resident })
}

/// The mappings of an smaps text, with their `Rss`.
fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                let perms = fields.next().unwrap_or("").to_string();
                out.push(Mapping {
                    start,
                    end,
                    perms,
                    path: full_path(line),
                    rss: 0,
                });
                continue;
            }
        }
        if first == "Rss:" {
            if let (Some(kb), Some(m)) = (
                fields.next().and_then(|k| k.parse::<u64>().ok()),
                out.last_mut(),
            ) {
                m.rss = kb * 1024;
            }
        }
    }
    out
}

/// The path of a mapping line: everything after the inode, spaces kept.
fn full_path(line: &str) -> String {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = rest.find(char::is_whitespace).map_or("", |i| &rest[i..]);
    }
    rest.trim().to_string()
}

/// What the GC heap's blocks hold, for the table.
pub struct GcBlock {
    pub start: u64,
    /// Live bytes in it (0 for a free block).
    pub live: u64,
    pub free_block: bool,
}

/// One row: what, and its resident bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub what: String,
    pub bytes: u64,
}

const GC_LIVE: &str = "GC heap: live objects";
const GC_SLACK: &str = "GC heap: free space in object blocks (dead, free, unused slots)";
const GC_FREE: &str = "GC heap: free blocks";

/// The table: every mapping's resident bytes in one row, the GC heap's
/// blocks (`blocks`, with `resident` bytes each, ascending) split by the
/// census. Rows of 0 bytes are left out; GC rows first, then by size.
pub(crate) fn table(snapshot: &Snapshot, blocks: &[GcBlock]) -> Vec<Row> {
    let mut rows: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |what: &str, bytes: u64| *rows.entry(what.to_string()).or_default() += bytes;
    let maps = &snapshot.mappings;
    // Resident GC bytes per mapping (blocks lie inside the heap's mappings).
    let mut gc_in: Vec<u64> = vec![0; maps.len()];
    for (block, &res) in blocks.iter().zip(&snapshot.resident) {
        if block.free_block {
            add(GC_FREE, res);
        } else {
            let live = block.live.min(res);
            add(GC_LIVE, live);
            add(GC_SLACK, res - live);
        }
        let i = maps.partition_point(|m| m.start <= block.start);
        if let Some(i) = i.checked_sub(1).filter(|&i| block.start < maps[i].end) {
            gc_in[i] += res;
        }
    }
    for (i, m) in maps.iter().enumerate() {
        let rss = m.rss.saturating_sub(gc_in[i]);
        if rss == 0 {
            continue;
        }
        add(&what(maps, i), rss);
    }
    let gc = [GC_LIVE, GC_SLACK, GC_FREE];
    let mut out: Vec<Row> = gc
        .iter()
        .map(|w| Row {
            what: w.to_string(),
            bytes: rows.remove(*w).unwrap_or(0),
        })
        .collect();
    let mut rest: Vec<Row> = rows
        .into_iter()
        .map(|(what, bytes)| Row { what, bytes })
        .collect();
    rest.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.what.cmp(&b.what)));
    out.extend(rest);
    out.retain(|r| r.bytes > 0);
    out
}

/// The row of mapping `i` (see the module docs).
fn what(maps: &[Mapping], i: usize) -> String {
    let m = &maps[i];
    match m.path.as_str() {
        "[heap]" => return "malloc heap ([heap])".into(),
        "[stack]" => return "thread and fiber stacks".into(),
        p if p.starts_with('[') => return "kernel ([vdso], [vvar], …)".into(),
        p if p.starts_with('/') => {
            let name = p.rsplit('/').next().unwrap_or(p);
            let part = if m.perms.contains('x') {
                "code"
            } else {
                "data"
            };
            return format!("{name}: {part}");
        }
        _ => {}
    }
    let before = i
        .checked_sub(1)
        .map(|j| &maps[j])
        .filter(|p| p.end == m.start);
    let after = maps.get(i + 1).filter(|n| n.start == m.end);
    let reserve = |n: &Mapping| n.perms.starts_with("---") && n.path.is_empty();
    if m.start.is_multiple_of(ARENA)
        && after.is_some_and(|n| reserve(n) && n.end.is_multiple_of(ARENA))
    {
        return "malloc arenas (threads)".into();
    }
    if before.is_some_and(reserve) {
        return "thread and fiber stacks".into();
    }
    if let Some(p) = before.filter(|p| p.path.starts_with('/') && p.perms.starts_with("rw")) {
        let name = p.path.rsplit('/').next().unwrap_or(&p.path);
        return format!("{name}: data");
    }
    "other anonymous".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234   /opt/my app/bin
Rss:                   4 kB
55d0c0001000-55d0c0003000 r-xp 00001000 08:01 1234   /opt/my app/bin
Rss:                   8 kB
55d0c0003000-55d0c0004000 rw-p 00003000 08:01 1234   /opt/my app/bin
Rss:                   4 kB
55d0c0004000-55d0c0006000 rw-p 00000000 00:00 0
Rss:                   8 kB
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0      [heap]
Rss:                 132 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Rss:                1024 kB
7f0004000000-7f0004021000 rw-p 00000000 00:00 0
Rss:                  12 kB
7f0004021000-7f0008000000 ---p 00000000 00:00 0
Rss:                   0 kB
7f0010000000-7f0010001000 ---p 00000000 00:00 0
Rss:                   0 kB
7f0010001000-7f0010801000 rw-p 00000000 00:00 0
Rss:                  16 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0      [stack]
Rss:                  20 kB
7ffc10000000-7ffc10002000 r-xp 00000000 00:00 0      [vdso]
Rss:                   8 kB
";

    #[test]
    fn every_mapping_is_one_row_and_the_gc_blocks_are_split() {
        let maps = parse_smaps(SMAPS);
        assert_eq!(maps.len(), 12);
        assert_eq!(maps[0].path, "/opt/my app/bin");
        assert_eq!(maps[4].rss, 132 * 1024);
        // Two GC blocks in the 1 MiB anonymous mapping: one of 8 KiB with
        // 3 KiB live (all resident), one free of 4 KiB (resident).
        let snapshot = Snapshot {
            mappings: maps,
            resident: vec![8192, 4096],
        };
        let blocks = [
            GcBlock {
                start: 0x7f0000000000,
                live: 3072,
                free_block: false,
            },
            GcBlock {
                start: 0x7f0000002000,
                live: 0,
                free_block: true,
            },
        ];
        let rows = table(&snapshot, &blocks);
        let get = |w: &str| rows.iter().find(|r| r.what == w).map(|r| r.bytes);
        assert_eq!(get(GC_LIVE), Some(3072));
        assert_eq!(get(GC_SLACK), Some(5120));
        assert_eq!(get(GC_FREE), Some(4096));
        assert_eq!(get("other anonymous"), Some(1024 * 1024 - 12288));
        assert_eq!(get("bin: code"), Some(8192));
        assert_eq!(get("bin: data"), Some(4096 + 4096 + 8192));
        assert_eq!(get("malloc heap ([heap])"), Some(132 * 1024));
        assert_eq!(get("malloc arenas (threads)"), Some(12 * 1024));
        assert_eq!(get("thread and fiber stacks"), Some((16 + 20) * 1024));
        assert_eq!(get("kernel ([vdso], [vvar], …)"), Some(8192));
        let total: u64 = rows.iter().map(|r| r.bytes).sum();
        assert_eq!(total, snapshot.mappings.iter().map(|m| m.rss).sum::<u64>());
        assert_eq!(rows[0].what, GC_LIVE);
    }
}
