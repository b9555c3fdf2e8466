//! Compact unwind tables for the in-kernel DWARF unwinder.
//!
//! Crystal code (and most optimized C) keeps no frame pointers, but every
//! x86-64 module carries `.eh_frame`: for each instruction, how to find the
//! canonical frame address (CFA), the return address (always CFA - 8 here) and
//! the caller's `%rbp`. [`ModuleTable::build`] evaluates those rules with gimli
//! and flattens them into sorted [`UnwindRow`]s of 16 bytes (each names its
//! function, by which the unwinder recognizes recursion) — what the eBPF
//! unwinder binary-searches at each frame. [`Tables::ranges`] then tells it
//! where each module is mapped in the target.
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::modules::maps::Mapping;
use crate::modules::{Module, ModuleCache};
use anyhow::{bail, Result};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, NativeEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use memprof_common::{cfa, ModuleRange, UnwindRow};

pub mod finish;

/// The most rows one file may have (32 MiB of them): the biggest real
/// files have half as many (rustc's `librustc_driver`, 6 MB of
/// `.eh_frame`: 1,151,938 rows, see `a_big_real_library_is_within_the_budget`);
/// a user's file with more is refused while it is read, before its rows
/// cost much memory (a 99 MB `.eh_frame` took 1.66 GB).
pub const MAX_FILE_ROWS: usize = 1 << 21;

/// The rows of one module.
#[derive(Debug, Clone, Default)]
pub struct ModuleTable {
    pub rows: Vec<UnwindRow>,
}

impl ModuleTable {
    /// Reads the module's `.eh_frame` and flattens it.
    pub fn build(module: &Module) -> Result<ModuleTable> {
        let Some((eh_frame_address, eh_frame)) = module.section(".eh_frame") else {
            return Ok(ModuleTable::default());
        };
        ModuleTable::of_eh_frame(
            (eh_frame_address, eh_frame),
            module.section_address(".text"),
            module.section_address(".got"),
        )
    }

    /// The rows of the section `.eh_frame` (its address and bytes), with
    /// the addresses of `.text` and `.got` its pointers may be relative to.
    fn of_eh_frame(
        (eh_frame_address, eh_frame): (u64, &[u8]),
        text: Option<u64>,
        got: Option<u64>,
    ) -> Result<ModuleTable> {
        let mut bases = BaseAddresses::default().set_eh_frame(eh_frame_address);
        if let Some(text) = text {
            bases = bases.set_text(text);
        }
        if let Some(got) = got {
            bases = bases.set_got(got);
        }
        let eh_frame = EhFrame::new(eh_frame, NativeEndian);
        let spans = spans(&eh_frame, &bases)?;
        let rows = flatten(spans);
        if rows.len() > MAX_FILE_ROWS {
            bail!(
                "{} unwind rows, more than the {MAX_FILE_ROWS} a file may have",
                rows.len()
            );
        }
        Ok(ModuleTable { rows })
    }
}

/// One FDE row: `[start, end)` with its rule (addresses past 4 GiB have
/// no row: the kernel's rows say a pc in 32 bits).
struct Span {
    start: u32,
    end: u32,
    row: UnwindRow,
}

/// Spans read from one file at most: [`MAX_FILE_ROWS`] and a margin (a
/// span gives a row, and one more before a gap; neighbours with one rule
/// merge: rustc's library has 1,155,304 spans and 1,151,938 rows).
const MAX_FILE_SPANS: usize = MAX_FILE_ROWS + MAX_FILE_ROWS / 4;

fn spans(
    eh_frame: &EhFrame<gimli::EndianSlice<'_, NativeEndian>>,
    bases: &BaseAddresses,
) -> Result<Vec<Span>> {
    let mut ctx = UnwindContext::new();
    let mut spans = Vec::new();
    let mut entries = eh_frame.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        // The function's start names it (the unwinder folds recursion by it).
        let func = u32::try_from(fde.initial_address()).unwrap_or(0);
        let fde_end = fde.end_address();
        let Ok(mut rows) = fde.rows(eh_frame, bases, &mut ctx) else {
            continue;
        };
        while let Ok(Some(row)) = rows.next_row() {
            let Ok(start) = u32::try_from(row.start_address()) else {
                continue;
            };
            // A row ends where its function does: a file's instructions
            // may advance past that end (gimli lets them), and a span
            // that ends before it starts would put the rows out of order
            // (the kernel binary-searches them).
            let end = u32::try_from(row.end_address().min(fde_end)).unwrap_or(u32::MAX);
            if end <= start {
                continue;
            }
            if spans.len() == spans.capacity() {
                if spans.len() >= MAX_FILE_SPANS {
                    bail!("more than {MAX_FILE_ROWS} unwind rows, the most a file may have");
                }
                // Doubling, but never past the budget.
                spans.reserve_exact(spans.len().clamp(1024, MAX_FILE_SPANS - spans.len()));
            }
            spans.push(Span {
                start,
                end,
                row: UnwindRow { func, ..rule(row) },
            });
        }
    }
    Ok(spans)
}

/// The compact form of one gimli row.
fn rule(row: &gimli::UnwindTableRow<usize>) -> UnwindRow {
    let unknown = UnwindRow {
        cfa_reg: cfa::UNKNOWN,
        ..UnwindRow::default()
    };
    match row.register(X86_64::RA) {
        Some(RegisterRule::Undefined) => {
            return UnwindRow {
                cfa_reg: cfa::END,
                ..UnwindRow::default()
            }
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => return unknown,
    }
    let (cfa_reg, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => {
            (cfa::RSP, *offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => {
            (cfa::RBP, *offset)
        }
        _ => return unknown,
    };
    let Ok(cfa_offset) = i32::try_from(cfa_offset) else {
        return unknown;
    };
    let (rbp_saved, rbp_offset) = match row.register(X86_64::RBP) {
        Some(RegisterRule::Offset(o)) => match i16::try_from(o) {
            Ok(o) => (1, o),
            Err(_) => return unknown,
        },
        _ => (0, 0),
    };
    UnwindRow {
        pc: 0,
        cfa_offset,
        rbp_offset,
        cfa_reg,
        rbp_saved,
        func: 0,
    }
}

/// Sorts the spans, marks the gaps between functions as unknown and merges
/// neighbours with the same rule in the same function.
fn flatten(mut spans: Vec<Span>) -> Vec<UnwindRow> {
    spans.sort_by_key(|s| s.start);
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(spans.len());
    let mut push = |pc: u32, mut row: UnwindRow| {
        row.pc = pc;
        match rows.last_mut() {
            Some(last) if last.pc == pc => *last = row,
            Some(last) if UnwindRow { pc, ..*last } == row => {}
            _ => rows.push(row),
        }
    };
    for (i, span) in spans.iter().enumerate() {
        push(span.start, span.row);
        let next_start = spans.get(i + 1).map(|n| n.start);
        if next_start.is_none_or(|n| n > span.end) {
            push(
                span.end,
                UnwindRow {
                    cfa_reg: cfa::UNKNOWN,
                    ..UnwindRow::default()
                },
            );
        }
    }
    rows
}

/// The tables of every module of a target, concatenated as the kernel sees them.
#[derive(Debug, Default)]
pub struct Tables {
    /// Per module: its first row, its row count, the module (for its load bias).
    modules: HashMap<PathBuf, (u32, u32, Arc<Module>)>,
    pub rows: Vec<UnwindRow>,
}

impl Tables {
    /// Builds the tables of `modules`; modules that cannot be read are left out
    /// (their frames end the unwinding, and such stacks are marked truncated).
    /// The modules are read through `cache`.
    pub fn build(cache: &ModuleCache, modules: &[PathBuf]) -> Tables {
        let mut tables = Tables::default();
        for module in modules {
            let _ = tables.add(cache, module);
        }
        tables
    }

    /// The rows, once the kernel has them: only the module index is
    /// needed afterwards ([`Self::ranges`]).
    pub fn release_rows(&mut self) {
        self.rows = Vec::new();
    }

    fn add(&mut self, cache: &ModuleCache, path: &Path) -> Result<()> {
        if self.modules.contains_key(path) {
            return Ok(());
        }
        let module = cache.get(path)?;
        let table = ModuleTable::build(&module)?;
        if table.rows.is_empty() {
            bail!("no unwind rows in {}", path.display());
        }
        let start = self.rows.len() as u32;
        self.rows.extend_from_slice(&table.rows);
        self.modules
            .insert(path.to_path_buf(), (start, table.rows.len() as u32, module));
        Ok(())
    }

    /// How many modules have rows.
    pub fn module_count(&self) -> usize {
        self.modules.len()
    }

    /// Where the target has each module's code mapped, sorted by address,
    /// for the kernel's `MODULE_RANGES`.
    pub fn ranges(&self, mappings: &[Mapping]) -> Vec<ModuleRange> {
        let mut ranges: Vec<ModuleRange> = mappings
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| {
                let (row_start, row_count, module) = self.modules.get(&m.path)?;
                Some(ModuleRange {
                    start: m.start,
                    end: m.end,
                    bias: module.bias(m)?,
                    row_start: *row_start,
                    row_count: *row_count,
                })
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_has_rows_for_malloc() {
        let cache = ModuleCache::default();
        // The libc this test process maps.
        let libc = crate::modules::maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .map(|m| m.path)
            .find(|m| m.to_string_lossy().contains("libc.so"))
            .unwrap();
        let table = ModuleTable::build(&cache.get(&libc).unwrap()).unwrap();
        assert!(table.rows.len() > 1000, "{} rows", table.rows.len());
        assert!(
            table.rows.windows(2).all(|w| w[0].pc < w[1].pc),
            "sorted, unique pcs"
        );
        // Function entries are CFA = rsp + 8.
        assert!(table
            .rows
            .iter()
            .any(|r| r.cfa_reg == cfa::RSP && r.cfa_offset == 8));
        // Every row with a rule names its function, which starts at or before it.
        for r in &table.rows {
            assert!(r.func <= r.pc, "{r:?}");
            if r.cfa_reg != cfa::UNKNOWN {
                assert!(r.func != 0, "{r:?}");
            }
        }
        // malloc: a function's first row is at its start.
        let malloc = cache
            .get(&libc)
            .unwrap()
            .symbol("malloc")
            .expect("libc has malloc")
            .address;
        let first = table.rows.iter().find(|r| r.func as u64 == malloc).unwrap();
        assert_eq!(first.pc as u64, malloc);
    }
}

/// `.eh_frame` as files have it, or not.
#[cfg(test)]
mod bad_files {
    use super::*;

    /// gcc's CIE: code alignment 1, data alignment -8, return address
    /// in r16, pointers pc-relative (`zR`, `1b`); CFA = rsp + 8, return
    /// address at CFA - 8.
    const CIE: [u8; 24] = [
        0x14, 0, 0, 0, 0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 0x10, 1, 0x1b, 0x0c, 7, 8, 0x90, 1,
        0, 0,
    ];

    /// An FDE at `at` in a section at 0x2000, of the function at `start`
    /// (8 bytes long), with these CFA instructions (at most 8 bytes).
    fn fde(at: u32, start: u32, instructions: &[u8]) -> Vec<u8> {
        let mut fde = Vec::new();
        fde.extend_from_slice(&0x14u32.to_le_bytes());
        fde.extend_from_slice(&(at + 4).to_le_bytes()); // back to the CIE at 0
        let field = 0x2000 + at + 8;
        fde.extend_from_slice(&start.wrapping_sub(field).to_le_bytes());
        fde.extend_from_slice(&8u32.to_le_bytes());
        fde.push(0); // no augmentation data
        fde.extend_from_slice(instructions);
        fde.resize(0x18, 0); // DW_CFA_nop
        fde
    }

    /// Found by the eh_frame fuzz target: instructions that advance past
    /// their function's end gave a row ending before it started, and the
    /// rows came out of order (the kernel's binary search missed rows).
    #[test]
    fn rows_past_a_functions_end_are_cut_and_rows_stay_in_order() {
        let mut eh_frame = CIE.to_vec();
        // At 0x1000: CFA = rsp + 16; then 10 bytes on (past its end, 0x1008): rsp + 8.
        eh_frame.extend(fde(0x18, 0x1000, &[0x0e, 0x10, 0x4a, 0x0e, 0x08]));
        // At 0x1008, the next function: CFA = rsp + 16.
        eh_frame.extend(fde(0x30, 0x1008, &[0x0e, 0x10]));
        eh_frame.extend_from_slice(&[0; 4]);
        let table = ModuleTable::of_eh_frame((0x2000, &eh_frame), None, None).unwrap();
        let rows: Vec<(u32, u8, i32, u32)> = table
            .rows
            .iter()
            .map(|r| (r.pc, r.cfa_reg, r.cfa_offset, r.func))
            .collect();
        assert_eq!(
            rows,
            [
                (0x1000, cfa::RSP, 16, 0x1000),
                (0x1008, cfa::RSP, 16, 0x1008),
                (0x1010, cfa::UNKNOWN, 0, 0),
            ]
        );
    }
}

/// The biggest real file on these machines (rustc's `librustc_driver`,
/// 6 MB of `.eh_frame`, 107,000 functions: 1,151,938 rows) is within
/// [`MAX_FILE_ROWS`].
#[cfg(test)]
mod budget {
    use super::*;

    #[test]
    fn a_big_real_library_is_within_the_budget() {
        let sysroot = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .expect("rustc");
        let lib = PathBuf::from(String::from_utf8(sysroot.stdout).unwrap().trim()).join("lib");
        let driver = std::fs::read_dir(&lib)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("librustc_driver-"))
            })
            .expect("librustc_driver in the sysroot");
        let table = ModuleTable::build(&Module::open(&driver).unwrap()).unwrap();
        eprintln!("{}: {} rows", driver.display(), table.rows.len());
        assert!(table.rows.len() <= MAX_FILE_ROWS);
        assert!(table.rows.len() > MAX_FILE_ROWS / 4, "{}", table.rows.len());
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() {
        use crate::{modules::Module, unwind::ModuleTable};
        let libc = Module::open("/usr/lib/x86_64-linux-gnu/libc.so.6".as_ref()).unwrap();
        let table = ModuleTable::build(&libc).unwrap();
        println!("{} rows", table.rows.len());
    }
}
