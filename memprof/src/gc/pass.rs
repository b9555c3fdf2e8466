//! The mark-bit pass: after each collection's marking, the collector's own
//! verdict on every tracked GC object, read from the target's memory.
//!
//! When the probe on `GC_gc_no++` fires, the world is stopped and the mark
//! bits are final; the kernel holds the collecting thread (a signal memprof's
//! tracer takes), so nothing can change them while it is held: no mutator
//! runs and the next collection, which clears them, cannot start. A pass
//! has two parts:
//!
//! - held ([`Judge::read_marks`]): the heap blocks holding memprof's copy of
//!   the GC objects ([`GcCopy`]) are listed, and their headers (object
//!   size, flags, mark bytes) read in bulk: each bottom index once per
//!   region, the header pages in contiguous runs. The pause grows with the
//!   heap's blocks, not with its objects;
//! - after the collector runs again ([`Judge::judge`]): the copy is walked
//!   in address order and each GC object allocated before this collection
//!   (its epoch tag is older) gets `GC_base(p) == p && GC_is_marked(p)`
//!   from the headers read ([`MarkLayout::verdict_in`]); the unmarked are
//!   forgotten and counted as collected, with their lifetimes.
//!
//! With `--gc-sampling refill` the kernel judges instead, at the
//! collection itself ([`Judge::kernel_marks`] is what it needs), and the
//! copy settles by its verdicts ([`judged_in_kernel`]).
//!
//! Objects allocated after the collection started are not judged (their
//! mark is 0 until the next one). Objects whose address is allocated again
//! are found collected by the copy (address reuse) even if a pass was missed.
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::copy::{GcCopy, Judging};
use super::live_types::first_words;
use super::lookup::{Block, Headers};
use super::{end_of_mark, heap_stats, layout, EndOfMark, HeapStats, HeapStatsLayout};
use super::{MarkLayout, Verdict};
use crate::modules::{Module, ModuleCache};
use crate::profile::GcSummary;
use memprof_common::KernelMarks;

/// The passes' per-site record, named here by the session.
pub use super::site::SiteGc;

/// Judges tracked GC objects after each collection.
pub struct Judge {
    pid: u32,
    module: Arc<Module>,
    layout: MarkLayout,
    end: EndOfMark,
    /// Where the collector keeps its heap size and free bytes, if derivable.
    heap_stats: Option<HeapStatsLayout>,
    /// Run-time minus link-time address of `module` (found at the first pass).
    bias: Option<u64>,
    mem: File,
    summary: GcSummary,
    /// `--gc-verdicts`: one line per object judged.
    verdicts: Option<BufWriter<File>>,
}

/// The mark bits of the heap blocks holding tracked objects, read while
/// the collector was held at collection `epoch`.
pub struct Marks {
    epoch: u64,
    /// `GC_gc_no` then.
    gc_no: u64,
    /// When they were read (collected objects' lifetimes end there).
    now_ns: u64,
    /// Sites of the copy then.
    sites: usize,
    /// Block addresses, ascending, and their headers.
    starts: Vec<u64>,
    headers: Headers,
    /// The first word of each object not read before, by address
    /// (ascending): a collected object's memory is reused after the hold.
    first_words: Vec<(u64, Option<u32>)>,
}

impl Judge {
    /// Derives what the pass needs from `module` (the libgc the target
    /// uses: a shared library or the executable). Errors if its code is not
    /// shaped as memprof knows (`unsupported libgc layout: …`). The module
    /// is read through the session's `modules`.
    pub fn new(
        modules: &ModuleCache,
        pid: u32,
        module: &Path,
        verdicts: Option<&Path>,
    ) -> Result<Judge> {
        let module = modules.get(module)?;
        let layout = layout::derive(&module)?;
        let end = end_of_mark(&module)?;
        let mem = File::open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot read the memory of pid {pid}"))?;
        let verdicts = match verdicts {
            Some(path) => Some(BufWriter::new(File::create(path).with_context(|| {
                format!("cannot write GC verdicts to {}", path.display())
            })?)),
            None => None,
        };
        Ok(Judge {
            pid,
            heap_stats: heap_stats::derive(&module).ok(),
            module,
            layout,
            end,
            bias: None,
            mem,
            summary: GcSummary {
                liveness: "mark bits".into(),
                ..GcSummary::default()
            },
            verdicts,
        })
    }

    /// The `GC_gc_no++` instructions ([`EndOfMark::probe_points`]).
    pub fn collection_increments(&self) -> Vec<(u64, u64)> {
        self.end.probe_points()
    }

    /// What the kernel needs to judge objects by the mark bits itself
    /// ([`crate::probes::Probes::judge_gc_in_kernel`]): the layout, in
    /// link-time addresses.
    pub fn kernel_marks(&self) -> KernelMarks {
        let l = &self.layout;
        KernelMarks {
            arrays: l.arrays_slot.unwrap_or(l.arrays),
            gc_no: self.end.gc_no_slot.unwrap_or(self.end.gc_no),
            top_index: l.top_index,
            all_nils: l.all_nils,
            bi_key: l.bi_key,
            bi_hash_link: l.bi_hash_link,
            bi_index: l.bi_index,
            top_mask: l.top_mask,
            bottom_mask: l.bottom_mask,
            hb_marks: l.hb_marks,
            hb_flags: l.hb_flags,
            hb_sz: l.hb_sz,
            max_forward: l.max_forward,
            key_shift: l.key_shift,
            log_hblksize: l.log_hblksize,
            granule_shift: l.granule_shift,
            arrays_in_slot: u8::from(l.arrays_slot.is_some()),
            gc_no_in_slot: u8::from(self.end.gc_no_slot.is_some()),
            free_blk: l.free_blk,
            _pad: 0,
        }
    }

    pub fn module(&self) -> &Path {
        self.module.path()
    }

    /// The module itself (where the collection probes go).
    pub fn module_file(&self) -> &Module {
        &self.module
    }

    /// Counts a collection that could not be judged.
    pub fn not_judged(&mut self, collections: u64) {
        self.summary.collections_not_judged += collections;
    }

    /// The held part of a pass, at the end of the marking of collection
    /// `epoch` (memprof's count), with every event up to the hold applied
    /// to `copy`: reads the mark bits of every heap block holding one of
    /// its objects (each header once, in address order). The objects are
    /// judged against them by [`Self::judge`] once the collector runs
    /// again, so the pause grows with the heap's blocks, not its objects.
    /// `started`: when the collector was found held (the pause counts from there).
    /// `typed`: the program's objects say their class in their first
    /// word, read here for the objects not read before (each once).
    pub fn read_marks(
        &mut self,
        epoch: u64,
        copy: &GcCopy,
        started: Instant,
        typed: bool,
    ) -> Result<Marks> {
        let bias = self.bias()?;
        let mut pages = PageCache::new(&self.mem);
        let gc_no = self.read_gc_no(bias, &mut pages)?;
        let mut read = |a: u64, buf: &mut [u8]| pages.read(a, buf);
        let arrays = self.layout.arrays_at(bias, &mut read)?;
        let starts = copy.blocks(!(self.layout.hblksize() - 1));
        let headers = self
            .layout
            .read_headers(&starts, arrays, &mut read)
            .with_context(|| format!("reading the GC's block headers in pid {}", self.pid))?;
        let first_words = if typed {
            let addrs = copy.unread_objects();
            let words = first_words(self.pid, &addrs);
            addrs.into_iter().zip(words).collect()
        } else {
            Vec::new()
        };
        self.summary
            .count_pass(gc_no, started.elapsed().as_secs_f64());
        Ok(Marks {
            epoch,
            gc_no,
            now_ns: monotonic_ns(),
            sites: copy.site_count(),
            starts,
            headers,
            first_words,
        })
    }

    /// The hold of the last pass went on after it (for a heap census):
    /// the pause was `total` seconds, `extra` of them after the pass.
    pub fn held_longer(&mut self, extra: f64, total: f64) {
        self.summary.pass_seconds += extra;
        self.summary.longest_pass_seconds = self.summary.longest_pass_seconds.max(total);
    }

    /// The rest of a pass, while the target runs: the objects of `copy`
    /// allocated before the collection are judged by `marks`, the dead
    /// forgotten and counted as collected. Events applied since the hold
    /// are newer objects (not judged), or frees and address reuse, which
    /// settle the objects they name as they would have at the next pass.
    pub fn judge(&mut self, marks: Marks, copy: &mut GcCopy) -> Result<()> {
        let block_mask = !(self.layout.hblksize() - 1);
        let (layout, verdicts) = (&self.layout, &mut self.verdicts);
        let Marks {
            epoch,
            gc_no,
            now_ns,
            sites,
            starts,
            headers,
            first_words,
        } = marks;
        let mut first_word = |addr: u64| -> Option<u32> {
            let i = first_words.binary_search_by_key(&addr, |w| w.0).ok()?;
            first_words[i].1
        };
        // The block of the previous object (objects come in address order).
        let mut last: Option<(u64, Block)> = None;
        let mut judge = |addr: u64| -> Result<(Verdict, u64)> {
            let start = addr & block_mask;
            let block = match &last {
                Some((at, block)) if *at == start => block,
                _ => {
                    let i = starts.binary_search(&start).map_err(|_| {
                        anyhow::anyhow!("no header was read for the block of {addr:#x}")
                    })?;
                    &last.insert((start, layout.block_in(&headers, i)?)).1
                }
            };
            let (verdict, size) = layout.verdict_in(addr, block);
            if let Some(out) = verdicts {
                let word = if verdict.is_live() { "live" } else { "dead" };
                writeln!(out, "{gc_no} {addr:#x} {word} {verdict:?}")?;
            }
            Ok((verdict, size))
        };
        // The next hold lists the settled objects' blocks from here.
        copy.track_blocks(block_mask);
        let judged = copy.settle(Some(Judging {
            epoch,
            gc_no,
            now_ns,
            sites,
            judge: &mut judge,
            first_word: &mut first_word,
        }))?;
        self.summary.marked_count = judged.marked_count;
        self.summary.marked_bytes = judged.marked_bytes;
        Ok(())
    }

    /// The collector's module's load bias, read from the maps once
    /// found (the timeline asks for the heap's size ten times a second).
    fn bias(&mut self) -> Result<u64> {
        if let Some(b) = self.bias {
            return Ok(b);
        }
        let b = self.module.load_bias(self.pid)?;
        self.bias = Some(b);
        Ok(b)
    }

    /// `GC_gc_no` ([`EndOfMark::read_gc_no`]).
    fn read_gc_no(&self, bias: u64, pages: &mut PageCache) -> Result<u64> {
        self.end
            .read_gc_no(bias, &mut |a, buf| pages.read(a, buf))
            .context("reading GC_gc_no")
    }

    /// The collector's heap size, free and unmapped bytes now (`None` if
    /// its layout was not derivable or the memory is gone).
    pub fn heap_stats(&mut self) -> Option<HeapStats> {
        self.heap_stats.as_ref()?;
        let bias = self.bias().ok()?;
        let layout = self.heap_stats.as_ref()?;
        let mem = &self.mem;
        layout
            .read(bias, &mut |a, buf| mem.read_exact_at(buf, a))
            .ok()
    }

    pub fn summary(&self) -> &GcSummary {
        &self.summary
    }

    /// Flushes the `--gc-verdicts` file.
    pub fn finish(&mut self) -> Result<()> {
        if let Some(out) = &mut self.verdicts {
            out.flush()?;
        }
        Ok(())
    }
}

/// Collection `gc_no` (memprof's `epoch`), judged by the kernel
/// ([`KernelMarks`]) at `now_ns` in `kernel_ns`: `copy` settles by its
/// `verdicts` (every object allocated before the collection that the
/// kernel did not find collected was marked), and `summary` counts it.
pub fn judged_in_kernel(
    summary: &mut GcSummary,
    collection: KernelCollection,
    verdicts: &KernelVerdicts,
    copy: &mut GcCopy,
) -> Result<()> {
    let KernelCollection {
        epoch,
        gc_no,
        now_ns,
        kernel_ns,
    } = collection;
    let mut judge = |addr: u64| -> Result<(Verdict, u64)> { Ok(verdicts.of(addr)) };
    let mut first_word = |addr: u64| verdicts.first_words.get(&addr).copied();
    let sites = copy.site_count();
    let judged = copy.settle(Some(Judging {
        epoch,
        gc_no,
        now_ns,
        sites,
        judge: &mut judge,
        first_word: &mut first_word,
    }))?;
    // The collector waited for the kernel only; memprof's part runs beside it.
    summary.count_pass(gc_no, kernel_ns as f64 * 1e-9);
    summary.marked_count = judged.marked_count;
    summary.marked_bytes = judged.marked_bytes;
    Ok(())
}

/// A collection the kernel judged ([`GcChange::Judged`](crate::probes::GcChange::Judged)).
#[derive(Debug, Clone, Copy)]
pub struct KernelCollection {
    /// memprof's count of collections.
    pub epoch: u64,
    /// The collector's `GC_gc_no` of it.
    pub gc_no: u64,
    /// When its marking ended (`CLOCK_MONOTONIC`).
    pub now_ns: u64,
    /// How long the kernel took to judge (the collector waited that long).
    pub kernel_ns: u64,
}

/// The kernel's verdicts between two collections it judged: the objects
/// it found collected, and the collector's sizes of those it found marked;
/// the first words it read of both.
#[derive(Debug, Default)]
pub struct KernelVerdicts {
    collected: std::collections::HashSet<u64, BuildAddressHasher>,
    sizes: HashMap<u64, u64, BuildAddressHasher>,
    first_words: HashMap<u64, u32, BuildAddressHasher>,
}

impl KernelVerdicts {
    pub fn marked(&mut self, addr: u64, size: u64, first_word: Option<u32>) {
        self.sizes.insert(addr, size);
        if let Some(word) = first_word {
            self.first_words.insert(addr, word);
        }
    }

    pub fn collected(&mut self, addr: u64, first_word: Option<u32>) {
        self.sizes.remove(&addr);
        self.collected.insert(addr);
        if let Some(word) = first_word {
            self.first_words.insert(addr, word);
        }
    }

    /// The object at `addr` is gone otherwise (freed).
    pub fn forget(&mut self, addr: u64) {
        self.sizes.remove(&addr);
    }

    /// The verdict on `addr` at the last collection judged, and the
    /// collector's size of it if known (else 0: the copy's size stands):
    /// what the kernel did not find collected was marked.
    fn of(&self, addr: u64) -> (Verdict, u64) {
        if self.collected.contains(&addr) {
            (Verdict::Unmarked, 0)
        } else {
            (Verdict::Marked, self.sizes.get(&addr).copied().unwrap_or(0))
        }
    }

    /// The collection's verdicts were applied: the next start afresh.
    pub fn applied(&mut self) {
        self.collected.clear();
        self.first_words.clear();
    }
}

/// Addresses are already well spread: a multiply is hash enough (SipHash
/// would dominate a pass).
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type BuildAddressHasher = BuildHasherDefault<AddressHasher>;

/// Pages of the target's memory read during one pass (the target is held:
/// they cannot change meanwhile). Neighbouring headers share pages: the
/// page of the last read is checked first.
struct PageCache<'a> {
    mem: &'a File,
    index: HashMap<u64, usize, BuildAddressHasher>,
    pages: Vec<Box<[u8; PAGE]>>,
    /// (page address, index) of the last read.
    last: (u64, usize),
}

const PAGE: usize = 4096;

impl<'a> PageCache<'a> {
    fn new(mem: &'a File) -> PageCache<'a> {
        PageCache {
            mem,
            index: HashMap::default(),
            pages: Vec::new(),
            last: (u64::MAX, 0),
        }
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let at = addr + done as u64;
            let page = at & !(PAGE as u64 - 1);
            let offset = (at - page) as usize;
            let n = (PAGE - offset).min(buf.len() - done);
            if self.last.0 != page {
                let i = match self.index.get(&page) {
                    Some(&i) => i,
                    None => {
                        let mut data = Box::new([0u8; PAGE]);
                        self.mem.read_exact_at(&mut data[..], page)?;
                        self.pages.push(data);
                        self.index.insert(page, self.pages.len() - 1);
                        self.pages.len() - 1
                    }
                };
                self.last = (page, i);
            }
            buf[done..done + n].copy_from_slice(&self.pages[self.last.1][offset..offset + n]);
            done += n;
        }
        Ok(())
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::{gc::pass::Judge, modules::ModuleCache};
        let libgc = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libgc.so.1");
        let judge = Judge::new(&ModuleCache::default(), 1234, libgc, None)?; // pid 1234
        assert_eq!(judge.summary().collections, 0);
        Ok(())
    }
}
