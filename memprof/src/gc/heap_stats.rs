//! The collector's own heap figures — heap size, free bytes, unmapped
//! bytes — read from the target's memory, at offsets derived from the
//! machine code of the target's own libgc. No code runs in the target.
//!
//! libgc keeps them in its `GC_arrays` struct (`GC_heapsize`,
//! `GC_large_free_bytes`, `GC_unmapped_bytes` are macros for fields of it),
//! whose layout differs between builds. Three exported getters read them:
//!
//! ```text
//! GC_get_heap_size():      return GC_heapsize - GC_unmapped_bytes        // GC_arrays + 0, + 0xb8
//! GC_get_free_bytes():     return GC_large_free_bytes - GC_unmapped_bytes // GC_arrays + 0x18, + 0xb8
//! GC_get_unmapped_bytes(): return GC_unmapped_bytes                       // GC_arrays + 0xb8
//! ```
//!
//! (numbers: Debian's libgc 8.2.2). Built without `USE_MUNMAP`,
//! `GC_unmapped_bytes` is the constant 0 and the getters return the plain
//! fields; 7.x wraps each read in `LOCK()`/`UNLOCK()`. [`derive_heap_stats`]
//! runs each getter through the symbolic executor (following calls, spin
//! loops and spills to the value in `%rax` at `ret`) and accepts exactly
//! these shapes; anything else is `unsupported libgc layout: …`.
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
use std::io;
use std::path::Path;

use anyhow::{anyhow, Result};

use super::symbolic::{self, ReturnValue, Word};
use crate::modules::Module;

/// Where libgc keeps its heap figures in one module, and how its getters
/// combine them.
///
/// `arrays`/`arrays_slot` as in [`super::MarkLayout`]; offsets are bytes
/// from the `GC_arrays` the code uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapStatsLayout {
    /// The address the offsets count from, at link time: `GC_arrays` (or 0
    /// when the offsets are absolute link-time addresses because the module
    /// does not name `GC_arrays`).
    pub arrays: u64,
    /// The GOT slot the code reads that address from (a shared libgc): read
    /// it at run time, an executable may hold a copy-relocated `GC_arrays`.
    pub arrays_slot: Option<u64>,
    /// Offset of `GC_heapsize` (bytes of heap, unmapped parts included).
    pub heap_size: u64,
    /// Offset of `GC_large_free_bytes` (bytes in free blocks, unmapped ones included).
    pub large_free: u64,
    /// Offset of `GC_unmapped_bytes`; `None` in a build without `USE_MUNMAP`,
    /// where it is always 0.
    pub unmapped: Option<u64>,
    /// `GC_get_heap_size` subtracts the unmapped bytes (8.x does).
    pub heap_size_less_unmapped: bool,
    /// `GC_get_free_bytes` subtracts the unmapped bytes (8.x does).
    pub free_less_unmapped: bool,
    /// Offset of `GC_bytes_allocd` (bytes allocated since the last
    /// collection), from `GC_get_bytes_since_gc`; `None` where that getter
    /// has another shape (not needed for the figures above).
    pub bytes_allocd: Option<u64>,
}

/// The figures, as the getters in the target would return them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeapStats {
    /// What `GC_get_heap_size()` returns: heap bytes the GC holds (without
    /// the unmapped ones in 8.x).
    pub heap_size: u64,
    /// What `GC_get_free_bytes()` returns: bytes in free heap blocks
    /// (without the unmapped ones in 8.x). Free objects on free lists are
    /// not counted.
    pub free_bytes: u64,
    /// What `GC_get_unmapped_bytes()` returns: heap bytes returned to the OS.
    pub unmapped_bytes: u64,
}

impl HeapStatsLayout {
    /// Reads the figures from the target through `read(address, buffer)`;
    /// `bias` is the module's run-time minus link-time address. Three words
    /// are read one after the other: a collection or an allocation may run
    /// between them (read with the target stopped for exact figures).
    pub fn read(
        &self,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<HeapStats> {
        let mut load = |addr: u64| load_word(read, addr);
        let arrays = self.arrays_at(bias, &mut load)?;
        let heapsize = load(arrays.wrapping_add(self.heap_size))?;
        let large_free = load(arrays.wrapping_add(self.large_free))?;
        let unmapped = match self.unmapped {
            Some(off) => load(arrays.wrapping_add(off))?,
            None => 0,
        };
        let less = |value: u64, yes: bool| {
            if yes {
                value.wrapping_sub(unmapped)
            } else {
                value
            }
        };
        Ok(HeapStats {
            heap_size: less(heapsize, self.heap_size_less_unmapped),
            free_bytes: less(large_free, self.free_less_unmapped),
            unmapped_bytes: unmapped,
        })
    }
}

impl HeapStatsLayout {
    /// `GC_bytes_allocd`: bytes the collector handed out since its last
    /// collection ended (what `GC_get_bytes_since_gc()` returns; a
    /// thread's free list refilled counts whole). `None` where the getter
    /// did not show where it lives. Read with the target stopped.
    pub fn read_bytes_allocd(
        &self,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Option<u64>> {
        let Some(offset) = self.bytes_allocd else {
            return Ok(None);
        };
        let mut load = |addr: u64| load_word(read, addr);
        let arrays = self.arrays_at(bias, &mut load)?;
        load(arrays.wrapping_add(offset)).map(Some)
    }

    /// Where the collector's arrays are in the target (`bias`: its load
    /// bias), through the slot that points at them where there is one.
    fn arrays_at(
        &self,
        bias: u64,
        load: &mut impl FnMut(u64) -> io::Result<u64>,
    ) -> io::Result<u64> {
        match self.arrays_slot {
            Some(slot) => load(slot.wrapping_add(bias)),
            None => Ok(self.arrays.wrapping_add(bias)),
        }
    }
}

/// The target's word at `addr`, through `read`.
fn load_word(
    read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    addr: u64,
) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    read(addr, &mut buf)?;
    Ok(u64::from_le_bytes(buf))
}

fn unsupported(module: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("unsupported libgc layout: {what} (in {})", module.display())
}

/// What a getter returns: the words added (`false`) and subtracted (`true`),
/// or the constant 0.
#[derive(Debug)]
enum Returned {
    Zero,
    Words(Vec<Word>),
}

#[cfg(test)]
/// Derives the [`HeapStatsLayout`] of the libgc in `module` (a shared libgc
/// or an executable with libgc linked in, stripped or not) from its
/// `GC_get_heap_size`, `GC_get_free_bytes` and `GC_get_unmapped_bytes`.
pub fn derive_heap_stats(module: &Path) -> Result<HeapStatsLayout> {
    derive(&Module::open(module)?)
}

/// [`derive_heap_stats`] of a module already open.
pub(crate) fn derive(image: &Module) -> Result<HeapStatsLayout> {
    image.require_x86_64()?;
    let module = image.path();
    let heap = returned(image, "GC_get_heap_size")?;
    let free = returned(image, "GC_get_free_bytes")?;
    let unmapped = unmapped_word(module, returned(image, "GC_get_unmapped_bytes")?)?;
    let (heap, heap_less) = word_less_unmapped(module, "GC_get_heap_size", heap, unmapped)?;
    let (free, free_less) = word_less_unmapped(module, "GC_get_free_bytes", free, unmapped)?;
    if heap == free {
        return Err(unsupported(
            module,
            "GC_get_heap_size and GC_get_free_bytes read the same word",
        ));
    }
    let words = [Some(heap), Some(free), unmapped];
    let (arrays, arrays_slot, slot) = arrays_of(image, &words)?;
    let offset = |(_, off): ArraysWord| -> u64 {
        if arrays_slot.is_some() {
            off
        } else {
            off - arrays
        }
    };
    // Reached the same way as the others, or not used.
    let bytes_allocd = match returned(image, "GC_get_bytes_since_gc") {
        Ok(Returned::Words(words)) => match words.as_slice() {
            &[(s, off, false)] if s == slot && (s.is_some() || off >= arrays) => {
                Some(offset((s, off)))
            }
            _ => None,
        },
        _ => None,
    };
    Ok(HeapStatsLayout {
        arrays,
        arrays_slot,
        heap_size: offset(heap),
        large_free: offset(free),
        unmapped: unmapped.map(offset),
        heap_size_less_unmapped: heap_less,
        free_less_unmapped: free_less,
        bytes_allocd,
    })
}

/// A word of `GC_arrays` as the code reaches it: (the GOT slot of the
/// base, the offset from it; or `None`, the address).
type ArraysWord = (Option<u64>, u64);

/// What the getter `name` returns: every path through it must reach `ret`
/// with one and the same value, a sum of words, or 0.
fn returned(image: &Module, name: &str) -> Result<Returned> {
    let module = image.path();
    let entry = image
        .symbol(name)
        .map(|s| s.address)
        .ok_or_else(|| unsupported(module, format!("{name} is not defined")))?;
    let facts = symbolic::explore(image, entry);
    let fail = |what: String| {
        let cut: Vec<&str> = facts.cut.iter().map(String::as_str).collect();
        let cut = if cut.is_empty() {
            String::new()
        } else {
            format!("; paths cut: {}", cut.join(", "))
        };
        unsupported(module, format!("{name}: {what}{cut}"))
    };
    if !facts.cut.is_empty() {
        return Err(fail(
            "not every path could be followed to its return".into(),
        ));
    }
    let value = match facts.returns.iter().collect::<Vec<_>>().as_slice() {
        [ReturnValue::Zero] => Returned::Zero,
        [ReturnValue::Words(sum)] => Returned::Words(sum.terms().collect()),
        returns => {
            return Err(fail(format!(
                "does not return one sum of GC_arrays words on every path (returns {returns:?})"
            )))
        }
    };
    Ok(value)
}

/// The word `GC_get_unmapped_bytes` returns, `None` for the constant 0
/// (built without `USE_MUNMAP`).
fn unmapped_word(module: &Path, unmapped: Returned) -> Result<Option<ArraysWord>> {
    match unmapped {
        Returned::Zero => Ok(None),
        Returned::Words(words) => match words.as_slice() {
            &[(slot, off, false)] => Ok(Some((slot, off))),
            _ => Err(unsupported(
                module,
                format!("GC_get_unmapped_bytes: does not return one word: {words:x?}"),
            )),
        },
    }
}

/// `word` or `word - unmapped`: the word, and whether unmapped is subtracted.
fn word_less_unmapped(
    module: &Path,
    name: &str,
    returned: Returned,
    unmapped: Option<ArraysWord>,
) -> Result<(ArraysWord, bool)> {
    let words = match returned {
        Returned::Words(words) => words,
        Returned::Zero => {
            return Err(unsupported(
                module,
                format!("{name}: returns the constant 0"),
            ))
        }
    };
    let plus: Vec<ArraysWord> = words
        .iter()
        .filter(|w| !w.2)
        .map(|&(s, o, _)| (s, o))
        .collect();
    let minus: Vec<ArraysWord> = words
        .iter()
        .filter(|w| w.2)
        .map(|&(s, o, _)| (s, o))
        .collect();
    match (plus.as_slice(), minus.as_slice()) {
        (&[word], []) if Some(word) != unmapped => Ok((word, false)),
        (&[word], &[less]) if Some(less) == unmapped && Some(word) != unmapped => Ok((word, true)),
        _ => Err(unsupported(
            module,
            format!(
                "{name}: returns neither a word nor a word minus GC_unmapped_bytes: {words:x?}"
            ),
        )),
    }
}

/// The `GC_arrays` the heap figures are read from: all through one GOT
/// slot (its target is `GC_arrays`), or all plain addresses. (Its address,
/// its GOT slot if any, and the common slot of the words.)
fn arrays_of(
    image: &Module,
    words: &[Option<ArraysWord>],
) -> Result<(u64, Option<u64>, Option<u64>)> {
    let module = image.path();
    let slots: Vec<Option<u64>> = words.iter().flatten().map(|w| w.0).collect();
    if slots.iter().any(|&s| s != slots[0]) {
        return Err(unsupported(
            module,
            format!("the heap figures are not reached the same way: {words:x?}"),
        ));
    }
    match slots[0] {
        Some(slot) => {
            let arrays = image
                .slot_value(slot)
                .ok_or_else(|| unsupported(module, "GOT slot of GC_arrays not resolved"))?;
            Ok((arrays, Some(slot), slots[0]))
        }
        None => {
            let lowest = words.iter().flatten().map(|w| w.1).min().unwrap_or(0);
            let arrays = image
                .symbol("GC_arrays")
                .map(|s| s.address)
                .filter(|&a| a <= lowest)
                .unwrap_or(0);
            Ok((arrays, None, slots[0]))
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against Debian's libgc 8.2.2 (shared, and libgc.a in a C and a
    //! Crystal program, stripped and not), against getters shaped like
    //! 7.x's locked ones, and live: the figures read through
    //! `/proc/PID/mem` must be what the getters returned in the process.
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::FileExt;
    use std::path::Path;
    use std::process::{Command, Stdio};

    use super::super::test_programs::{
        build_once, c_program, crystal_program, libgc_in, run, symbol, Link, LIBGC_SO,
    };
    use super::*;

    const HEAP_STATS_C: &str = include_str!("fixtures/heap_stats.c");
    const HEAP_STATS_CR: &str = include_str!("fixtures/heap_stats.cr");
    const LOCKED_C: &str = include_str!("fixtures/heap_stats_locked.c");

    /// Debian 8.2.2: `GC_heapsize` +0, `GC_large_free_bytes` +0x18,
    /// `GC_unmapped_bytes` +0xb8, both getters subtract the unmapped bytes.
    fn debian(arrays: u64, arrays_slot: Option<u64>) -> HeapStatsLayout {
        HeapStatsLayout {
            arrays,
            arrays_slot,
            heap_size: 0,
            large_free: 0x18,
            unmapped: Some(0xb8),
            heap_size_less_unmapped: true,
            free_less_unmapped: true,
            bytes_allocd: Some(0x40),
        }
    }

    #[test]
    fn debian_shared() {
        let layout = derive_heap_stats(Path::new(LIBGC_SO)).unwrap();
        assert_eq!(layout, debian(0x2d920, Some(0x2cf08)));
        // The same GC_arrays the mark-bit layout indexes from.
        let marks = crate::gc::derive_layout(Path::new(LIBGC_SO)).unwrap();
        assert_eq!(
            (layout.arrays, layout.arrays_slot),
            (marks.arrays, marks.arrays_slot)
        );
    }

    #[test]
    fn static_c_build() {
        let exe = c_program("heap-stats", HEAP_STATS_C, Link::Static);
        let layout = derive_heap_stats(&exe).unwrap();
        assert_eq!(layout, debian(symbol(&exe, "GC_arrays"), None));
    }

    #[test]
    fn static_crystal_build_stripped_or_not() {
        let (exe, stripped) = crystal_program("heap-stats", HEAP_STATS_CR);
        let layout = derive_heap_stats(&exe).unwrap();
        assert_eq!(layout, debian(symbol(&exe, "GC_arrays"), None));
        assert_eq!(derive_heap_stats(&stripped).unwrap(), layout);
    }

    /// 7.x-shaped getters: the read between an inline test-and-set (with a
    /// call to a spinning `GC_lock` through the PLT when taken) and a store,
    /// or between `pthread_mutex_lock`/`unlock` calls into libc, kept in a
    /// callee-saved register or (-O0) a stack slot across them.
    #[test]
    fn locked_getters() {
        let shapes: [(&str, &[&str]); 6] = [
            ("locked-O0.so", &["-O0", "-fPIC", "-shared"]),
            ("locked-O2.so", &["-O2", "-fPIC", "-shared"]),
            ("locked-Os.so", &["-Os", "-fPIC", "-shared"]),
            ("locked-now.so", &["-O2", "-fPIC", "-shared", "-Wl,-z,now"]),
            (
                "locked-lazy.so",
                &["-O2", "-fPIC", "-shared", "-Wl,-z,lazy"],
            ),
            (
                "locked-exe",
                &["-O2", "-Wl,-z,lazy", "-Wl,--defsym=main=GC_lock"],
            ),
        ];
        for (name, flags) in shapes {
            let module = build_once(name, LOCKED_C, |source, out| {
                let c = source.with_extension("c");
                std::fs::write(&c, LOCKED_C).unwrap();
                run(Command::new("cc").args(flags).arg("-o").arg(out).arg(&c));
                std::fs::write(source, LOCKED_C).unwrap();
            });
            let layout = derive_heap_stats(&module).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let expected = HeapStatsLayout {
                arrays: symbol(&module, "GC_arrays"),
                arrays_slot: layout.arrays_slot,
                heap_size: 0,
                large_free: 0x28,
                unmapped: Some(0x68),
                heap_size_less_unmapped: true,
                free_less_unmapped: true,
                // No GC_get_bytes_since_gc in this library.
                bytes_allocd: None,
            };
            assert_eq!(layout, expected, "{name}");
            assert_eq!(
                layout.arrays_slot.is_some(),
                name.ends_with(".so"),
                "{name}"
            );
        }
    }

    #[test]
    fn not_a_libgc() {
        let error = derive_heap_stats(Path::new("/bin/true"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("unsupported libgc layout: GC_get_heap_size is not defined"),
            "{error}"
        );
    }

    #[test]
    fn live_shared_libgc_matches_getters() {
        live(&c_program("heap-stats", HEAP_STATS_C, Link::Shared));
    }

    #[test]
    fn live_static_libgc_matches_getters() {
        live(&c_program("heap-stats", HEAP_STATS_C, Link::Static));
    }

    #[test]
    fn live_stripped_crystal_matches_getters() {
        live(&crystal_program("heap-stats", HEAP_STATS_CR).1);
    }

    /// Runs a heap_stats program, which prints what its getters return and
    /// then waits allocating nothing; reads the same figures from outside.
    fn live(exe: &Path) {
        let mut child = Command::new(exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (pid, printed) = match fields.as_slice() {
            ["pid", pid, "heap", heap, "free", free, "unmapped", unmapped] => (
                hex(pid) as u32,
                HeapStats {
                    heap_size: hex(heap),
                    free_bytes: hex(free),
                    unmapped_bytes: hex(unmapped),
                },
            ),
            _ => panic!("bad line {line:?}"),
        };
        let (module, bias) = libgc_in(pid, exe);
        let layout = derive_heap_stats(&module).unwrap();
        let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
        let mut read = |addr: u64, buf: &mut [u8]| mem.read_exact_at(buf, addr);
        let stats = layout.read(bias, &mut read).unwrap();
        drop(child.stdin.take()); // lets the program exit
        let status = child.wait().unwrap();
        eprintln!("{}: {stats:?}", module.display());
        assert_eq!(stats, printed);
        assert!(status.success());
        // The fixture leaves all three nonzero and different: a swapped
        // or missing subtraction shows.
        let HeapStats {
            heap_size,
            free_bytes,
            unmapped_bytes,
        } = stats;
        assert!(free_bytes > 0 && unmapped_bytes > 0 && heap_size > free_bytes + unmapped_bytes);
        assert_ne!(free_bytes, unmapped_bytes);
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::gc::heap_stats::derive_heap_stats;
        let layout = derive_heap_stats("/usr/lib/x86_64-linux-gnu/libgc.so.1".as_ref())?;
        // Debian 8.2.2: GC_arrays through its GOT slot 0x2cf08.
        assert_eq!(
            (layout.heap_size, layout.large_free, layout.unmapped),
            (0, 0x18, Some(0xb8))
        );
        // In a process: `bias` is the module's run-time minus link-time address.
        let (pid, bias) = (1, 0);
        let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
        let mut read =
            |addr: u64, buf: &mut [u8]| std::os::unix::fs::FileExt::read_exact_at(&mem, buf, addr);
        let stats = layout.read(bias, &mut read)?;
        println!(
            "heap {} free {} unmapped {}",
            stats.heap_size, stats.free_bytes, stats.unmapped_bytes
        );
        Ok(())
    }
}
