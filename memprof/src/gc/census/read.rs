//! The held part of a census ([`HeapReader::copy`]): the block index
//! walked, the headers read, and the memory of the blocks holding marked
//! objects copied, nothing decoded yet.
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::heap_copy::{is_atomic, marked, BlockState, HeapBlock, HeapCopy};
use crate::gc::heap_stats::{self, HeapStatsLayout};
use crate::gc::layout::{self, kind_offset};
use crate::gc::lookup::Block;
use crate::gc::{end_of_mark, EndOfMark, MarkLayout};
use crate::modules::Module;
use crate::tracee::memory::vm_read;

/// What memprof needs to copy the heap of one libgc, derived from its code.
pub struct HeapReader {
    module: Arc<Module>,
    layout: MarkLayout,
    kind: u64,
    end: EndOfMark,
    stats: Option<HeapStatsLayout>,
}

/// The collector's counters between collections ([`HeapReader::counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// `GC_gc_no`: collections completed (0: none yet, no mark is a verdict).
    pub gc_no: u64,
    /// `GC_bytes_allocd`: bytes allocated since collection `gc_no` (a
    /// thread's free list counted whole when refilled); `None` where
    /// memprof does not know where this libgc keeps it.
    pub bytes_allocd: Option<u64>,
    /// `GC_get_heap_size()`, where known.
    pub heap_size: Option<u64>,
}

/// Most bytes read from the target at once.
const MAX_READ: usize = 1 << 20;
/// Bytes copied from the start of a large object (its type id and more).
const LARGE_HEAD: u64 = 16;

impl HeapReader {
    /// Derives the layout from `module` (a shared libgc or an executable
    /// with libgc in it); `unsupported libgc layout: …` if its code is not
    /// shaped as memprof knows.
    pub fn new(module: Arc<Module>) -> Result<HeapReader> {
        let layout = layout::derive(&module)?;
        let kind = kind_offset(&module, &layout)?;
        let end = end_of_mark(&module)?;
        Ok(HeapReader {
            stats: heap_stats::derive(&module).ok(),
            module,
            layout,
            kind,
            end,
        })
    }

    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The `GC_gc_no++` instructions ([`EndOfMark::probe_points`]).
    pub fn collection_increments(&self) -> Vec<(u64, u64)> {
        self.end.probe_points()
    }

    /// Process `pid`'s load bias for the collector's module, and its memory.
    fn open(&self, pid: u32) -> Result<(u64, File)> {
        let bias = self.module.load_bias(pid)?;
        let mem = File::open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot read the memory of pid {pid}"))?;
        Ok((bias, mem))
    }

    /// The collector's counters in process `pid` (stopped, or its
    /// collector held): which collection its mark bits describe, and what
    /// it allocated since ([`Counters`]).
    pub fn counters(&self, pid: u32) -> Result<Counters> {
        let (bias, mem) = self.open(pid)?;
        let mut read = |a: u64, buf: &mut [u8]| mem.read_exact_at(buf, a);
        let gc_no = self
            .end
            .read_gc_no(bias, &mut read)
            .context("reading GC_gc_no")?;
        let (bytes_allocd, heap_size) = match &self.stats {
            Some(stats) => (
                stats
                    .read_bytes_allocd(bias, &mut read)
                    .context("reading GC_bytes_allocd")?,
                stats.read(bias, &mut read).ok().map(|s| s.heap_size),
            ),
            None => (None, None),
        };
        Ok(Counters {
            gc_no,
            bytes_allocd,
            heap_size,
        })
    }

    /// The held part: copies what the census needs from process `pid`,
    /// whose collector must be held at the end of a collection's marking.
    /// `whole`: large scanned objects too, whole (for retained sizes: their
    /// words are edges of the object graph), not only their heads.
    pub fn copy(&self, pid: u32, whole: bool) -> Result<HeapCopy> {
        let (bias, mem) = self.open(pid)?;
        let mut read = |a: u64, buf: &mut [u8]| mem.read_exact_at(buf, a);
        let gc_no = self
            .end
            .read_gc_no(bias, &mut read)
            .context("reading GC_gc_no")?;
        let layout = &self.layout;
        let arrays = layout.arrays_at(bias, &mut read)?;
        let found = layout
            .every_block(arrays, &mut read)
            .context("walking the GC's block index")?;
        let hdrs = found.iter().map(|&(_, hdr)| hdr).collect();
        let headers = layout
            .read_header_pages(hdrs, Some(self.kind), &mut read)
            .context("reading the GC's block headers")?;
        let hblk = layout.hblksize();
        let mut blocks = Vec::with_capacity(found.len());
        for (i, &(addr, _)) in found.iter().enumerate() {
            let state = match layout.block_in(&headers, i)? {
                Block::Objects { size, marks } => BlockState::Objects {
                    kind: headers.field(i, self.kind, 1).unwrap_or(0) as u8,
                    size,
                    marks,
                },
                Block::Not(_) => BlockState::Free {
                    bytes: headers.field(i, layout.hb_sz, 8).unwrap_or(hblk),
                },
            };
            blocks.push(HeapBlock { addr, state });
        }
        // The bulk of the copy: process_vm_readv moves it several times
        // faster than reads of /proc/PID/mem.
        let mut bulk = |a: u64, buf: &mut [u8]| vm_read(pid, a, buf);
        let contents = copy_contents(&blocks, hblk, layout.granule_shift, whole, &mut bulk)?;
        let stats = self
            .stats
            .as_ref()
            .and_then(|s| s.read(bias, &mut read).ok());
        Ok(HeapCopy {
            gc_no,
            hblksize: hblk,
            granule_shift: layout.granule_shift,
            blocks,
            contents,
            stats,
        })
    }
}

/// Copies the memory of the blocks holding marked objects: small-object
/// blocks whole, in runs of neighbours; the head of each large object.
fn copy_contents(
    blocks: &[HeapBlock],
    hblk: u64,
    granule_shift: u32,
    whole: bool,
    read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut wanted: Vec<(u64, u64)> = Vec::new();
    for block in blocks {
        let BlockState::Objects { size, marks, kind } = &block.state else {
            continue;
        };
        if !block
            .starts(*size, hblk)
            .any(|p| marked(marks, p - block.addr, granule_shift))
        {
            continue;
        }
        let len = if *size <= hblk {
            hblk
        } else if whole && !is_atomic(*kind) {
            *size
        } else {
            LARGE_HEAD
        };
        match wanted.last_mut() {
            Some((start, end))
                if *end == block.addr && *end - *start < MAX_READ as u64 && len == hblk =>
            {
                *end += len
            }
            _ => wanted.push((block.addr, block.addr + len)),
        }
    }
    let mut runs = Vec::with_capacity(wanted.len());
    for (start, end) in wanted {
        let mut data = vec![0u8; (end - start) as usize];
        read(start, &mut data).with_context(|| format!("copying GC heap memory at {start:#x}"))?;
        runs.push((start, data));
    }
    Ok(runs)
}
