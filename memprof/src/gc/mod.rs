//! What memprof needs to know about the target's Boehm GC to tell, from
//! outside the process, which objects the last collection reclaimed — all
//! derived from the machine code of the target's own libgc, never from a
//! table of known builds.
//!
//! The GC never calls `free` for what it collects; it sets a mark byte for
//! each reachable object during marking and sweeps the rest lazily. The
//! mark bytes are its verdict from the end of marking until the next
//! collection (docs/ARCHITECTURE.md, "GC liveness"). Two things locate that verdict:
//!
//! - [`find_end_of_mark`]: the `GC_gc_no++` instructions (and the ones right
//!   after them). The increment runs once per collection inside the
//!   stopped-world mark phase, after the marks are final: a uprobe there is
//!   the "collection done" event.
//! - [`derive_layout`]: how `GC_is_marked(p)` finds `p`'s block header and
//!   mark byte (the two-level block index inside `GC_arrays`, the header
//!   fields), so the oracle can repeat the lookup by reading the target's
//!   memory ([`MarkLayout::verdict`]).
//!
//! Both work on a shared `libgc.so` or on an executable with libgc linked in
//! (Crystal release builds), stripped or not: the `GC_*` symbols stay in
//! `.dynsym`. Code that is not shaped as expected is an error
//! (`unsupported libgc layout: …`), never a guess.
//!
//! The files, in data-flow order:
//!
//! - `symbolic.rs`: libgc's exported functions run symbolically (over
//!   [`crate::x86::explore`]), the facts of their block lookup collected;
//! - `mod.rs` (here): where the collection-done probes go ([`EndOfMark`]);
//! - [`layout`], [`heap_stats`]: the mark-bit lookup and the heap figures,
//!   derived from those facts; [`lookup`]: the verdict on one object, read
//!   from the target's memory with that layout;
//! - [`site`]: what is learned per allocation site ([`site::SiteGc`]) and
//!   its history of live objects per collection;
//! - [`copy`]: memprof's copy of the GC objects (`copy/record.rs` the
//!   records, runs and epochs; `copy/mod.rs` the events fed in;
//!   `copy/settle.rs` the merge that applies reuse, frees and verdicts);
//! - [`pass`]: the mark-bit pass after each collection (marks read while
//!   the collector is held, the copy judged after);
//! - [`census`]: the whole heap at one collection (`census/read.rs` the
//!   held copy, into `census/heap_copy.rs`; `census/count.rs` the census
//!   by mark bits; `census/graph.rs` the object graph and retained bytes).
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
pub mod census;
pub mod copy;
pub mod heap_stats;
pub mod layout;
pub mod live_types;
pub mod lookup;
pub mod pass;
pub mod refill;
pub(crate) mod site;
mod symbolic;

use std::collections::HashSet;

use anyhow::{anyhow, Result};
use iced_x86::{
    Code, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpKind, Register,
};

pub use self::heap_stats::{HeapStats, HeapStatsLayout};
#[cfg(test)]
pub use self::layout::derive_layout;
pub use self::layout::MarkLayout;
pub use self::lookup::Verdict;
use crate::modules::Module;
use crate::x86::{decode, regs, uprobe};

/// Where the collection-done probes go: every machine copy of `GC_gc_no++`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndOfMark {
    /// Link-time address of `GC_gc_no` (a `word`).
    pub gc_no: u64,
    /// The GOT slot the increments read `&GC_gc_no` from (a shared libgc).
    /// Read `GC_gc_no` through it at run time: an executable that refers to
    /// `GC_gc_no` has its own copy-relocated one, which the library uses.
    pub gc_no_slot: Option<u64>,
    /// The increments, in address order. The source has one `GC_gc_no++`
    /// (in `GC_stopped_mark`), but compilers duplicate it onto the paths
    /// that lead to it: Debian's libgc.so.1 and libgc.a each hold two
    /// copies, an `add $1` and a load, add, store. Counted with uprobes on
    /// both, the load/add/store copy ran once per collection and the `add`
    /// never (it runs after marking with a disabled parallel marker, as
    /// incremental collections do). Every copy needs a probe; a collection
    /// runs exactly one of them.
    pub increments: Vec<Increment>,
}

impl EndOfMark {
    /// The increments as (file offset, link-time address): where the
    /// collection probes go, and their attach cookies.
    pub fn probe_points(&self) -> Vec<(u64, u64)> {
        self.increments
            .iter()
            .map(|i| (i.offset, i.address))
            .collect()
    }

    /// `GC_gc_no` in the target, through its GOT slot when the library has
    /// one (the executable may hold a copy-relocated `GC_gc_no`); `bias`:
    /// the module's run-time minus link-time address.
    pub fn read_gc_no(
        &self,
        bias: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<u64> {
        let mut word = |addr: u64| -> std::io::Result<u64> {
            let mut buf = [0u8; 8];
            read(addr, &mut buf)?;
            Ok(u64::from_le_bytes(buf))
        };
        let at = match self.gc_no_slot {
            Some(slot) => word(slot + bias)?,
            None => self.gc_no + bias,
        };
        word(at)
    }
}

/// One `GC_gc_no++` instruction and the instruction after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Increment {
    /// Link-time address of the increment.
    pub address: u64,
    /// Its file offset: a uprobe here fires once per collection with the
    /// world stopped and the marks final, before the counter moves (the
    /// collection that just finished marking is `GC_gc_no + 1`).
    pub offset: u64,
    /// The instruction, for messages (`add qword ptr [rax],1`).
    pub text: String,
    /// Link-time address of the instruction right after the increment.
    pub after: u64,
    /// Its file offset (a probe there reads the new `GC_gc_no`).
    pub after_offset: u64,
    pub after_text: String,
    /// Whether the kernel emulates the instruction after (≈0.8 µs a hit)
    /// or single-steps it (≈10 µs); docs/ARCHITECTURE.md, "Probe cost". Either is
    /// small next to a collection's pause. (The increments themselves, a
    /// memory add or store, are always single-stepped.)
    pub after_emulated: bool,
    /// A direct branch elsewhere in the module lands on [`Self::after`], so
    /// a probe there also fires on paths that did not run this increment.
    /// Debian 8.2.2's 0x18576 is such a join: the other copy's path may jump
    /// there. Probe the increments, or ignore events whose `GC_gc_no` did not
    /// change.
    pub after_joined: bool,
}

#[cfg(test)]
/// Finds every increment of `GC_gc_no` in `module`.
///
/// `GC_gc_no` is exported data; the increment sits in a static function
/// (`GC_stopped_mark`), so the executable sections are swept linearly,
/// tracking registers loaded with `&GC_gc_no` (from its GOT slot in a
/// shared library). Accepted forms: `add $1` / `inc` / `sub $-1` on the
/// qword at `GC_gc_no` (rip-relative, absolute, or through such a
/// register), or a load, add 1, store back.
///
/// That every increment found is a copy of the one source statement is
/// what bdwgc's source says (7.x to master), not something the code can
/// show; a run can check it: each collection event must see `GC_gc_no`
/// one higher than the last.
pub fn find_end_of_mark(module: &std::path::Path) -> Result<EndOfMark> {
    end_of_mark(&Module::open(module)?)
}

/// [`find_end_of_mark`] in a module already open.
pub(crate) fn end_of_mark(image: &Module) -> Result<EndOfMark> {
    image.require_x86_64()?;
    let module = image.path();
    let unsupported =
        |what: String| anyhow!("unsupported libgc layout: {what} (in {})", module.display());
    let gc_no = image
        .symbol("GC_gc_no")
        .map(|s| s.address)
        .ok_or_else(|| unsupported("GC_gc_no is not defined".into()))?;
    let targets = decode::branch_targets(image);
    let (found, slots) = increments(image, gc_no, &targets);
    let gc_no_slot = match slots.as_slice() {
        [] => None,
        [slot] => Some(*slot),
        _ => {
            return Err(unsupported(format!(
                "GC_gc_no read through several GOT slots {slots:x?}"
            )))
        }
    };
    if found.is_empty() {
        return Err(unsupported(format!(
            "no increment of GC_gc_no ({gc_no:#x}) in the code"
        )));
    }
    let increments = found
        .iter()
        .map(|add| {
            let after = add.next_ip();
            let (Some(offset), Some(after_offset), Some(code)) = (
                image.file_offset(add.ip()),
                image.file_offset(after),
                image.bytes_at(after),
            ) else {
                return Err(unsupported(format!("{after:#x} is not in the file")));
            };
            let next = decode::one(code, after);
            Ok(Increment {
                address: add.ip(),
                offset,
                text: decode::text(add),
                after,
                after_offset,
                after_text: decode::text(&next),
                after_emulated: uprobe::emulated(&next),
                after_joined: targets.contains(&after),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(EndOfMark {
        gc_no,
        gc_no_slot,
        increments,
    })
}

/// What a register is known to hold during the sweep.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// `&GC_gc_no`, read from this GOT slot if any.
    Addr(Option<u64>),
    /// `GC_gc_no + k`.
    Value(u64),
}

/// The instructions that add 1 to the qword at `gc_no`, and the GOT slots
/// they took its address from.
fn increments(image: &Module, gc_no: u64, targets: &HashSet<u64>) -> (Vec<Instruction>, Vec<u64>) {
    let mut sweep = IncrementSweep {
        gc_no,
        found: Vec::new(),
        slots: Vec::new(),
        held: Vec::new(),
    };
    let mut info = InstructionInfoFactory::new();
    decode::sweep(image, |insn| {
        // What is known about registers holds only within straight-line code.
        if targets.contains(&insn.ip()) {
            sweep.held.clear();
        }
        sweep.note_increment(insn);
        sweep.track_registers(image, insn, &mut info);
    });
    (sweep.found, sweep.slots)
}

/// The state of the sweep of [`increments`].
struct IncrementSweep {
    gc_no: u64,
    /// The increments found, and the GOT slots they read `&GC_gc_no` from.
    found: Vec<Instruction>,
    slots: Vec<u64>,
    /// What registers are known to hold.
    held: Vec<(Register, Held)>,
}

impl IncrementSweep {
    fn get(&self, reg: Register) -> Option<Held> {
        self.held
            .iter()
            .find(|(r, _)| *r == reg.full_register())
            .map(|&(_, h)| h)
    }

    /// Whether the memory operand of `insn` is GC_gc_no: `Some(slot)`, with
    /// the GOT slot its address came from when it came from one.
    fn at_gc_no(&self, insn: &Instruction) -> Option<Option<u64>> {
        if insn.memory_index() != Register::None || insn.segment_prefix() != Register::None {
            return None;
        }
        if insn.is_ip_rel_memory_operand() {
            (insn.ip_rel_memory_address() == self.gc_no).then_some(None)
        } else if insn.memory_base() == Register::None {
            (insn.memory_displacement64() == self.gc_no).then_some(None)
        } else {
            match self.get(insn.memory_base()) {
                Some(Held::Addr(slot)) if insn.memory_displacement64() == 0 => Some(slot),
                _ => None,
            }
        }
    }

    /// Notes `insn` if it adds 1 to the qword at GC_gc_no.
    fn note_increment(&mut self, insn: &Instruction) {
        let mem_qword = insn.memory_size().size() == 8;
        let op0_at = (insn.op0_kind() == OpKind::Memory && mem_qword)
            .then(|| self.at_gc_no(insn))
            .flatten();
        let imm1 = |k: u64| {
            insn.op_count() == 2
                && insn.op1_kind() != OpKind::Register
                && insn.op1_kind() != OpKind::Memory
                && insn.immediate(1) == k
        };
        let increments = op0_at.is_some()
            && match insn.mnemonic() {
                Mnemonic::Add => imm1(1),
                Mnemonic::Sub => imm1(u64::MAX),
                Mnemonic::Inc => true,
                Mnemonic::Mov => {
                    insn.op1_kind() == OpKind::Register
                        && self.get(insn.op1_register()) == Some(Held::Value(1))
                }
                _ => false,
            };
        if increments {
            self.found.push(*insn);
            if let Some(Some(slot)) = op0_at {
                if !self.slots.contains(&slot) {
                    self.slots.push(slot);
                }
            }
        }
    }

    /// What `insn` leaves in the registers it writes.
    fn track_registers(
        &mut self,
        image: &Module,
        insn: &Instruction,
        info: &mut InstructionInfoFactory,
    ) {
        let dest = (insn.op0_kind() == OpKind::Register && insn.op0_register().is_gpr64())
            .then(|| insn.op0_register());
        let now = dest.and_then(|reg| self.held_after(image, insn, reg));
        let written: Vec<Register> = regs::written(info, insn).collect();
        self.held.retain(|(r, _)| !written.contains(r));
        if let (Some(reg), Some(h)) = (dest, now) {
            self.held.push((reg, h));
        }
        if insn.flow_control() != FlowControl::Next || insn.code() == Code::INVALID {
            self.held.clear();
        }
    }

    /// What `reg`, the destination of `insn`, holds after it, if known.
    fn held_after(&self, image: &Module, insn: &Instruction, reg: Register) -> Option<Held> {
        let mem_qword = insn.memory_size().size() == 8;
        match (insn.mnemonic(), insn.op1_kind()) {
            (Mnemonic::Mov, OpKind::Memory) if mem_qword => {
                let plain_addr = insn.is_ip_rel_memory_operand()
                    || (insn.memory_base() == Register::None
                        && insn.memory_index() == Register::None);
                let addr = if insn.is_ip_rel_memory_operand() {
                    insn.ip_rel_memory_address()
                } else {
                    insn.memory_displacement64()
                };
                if plain_addr && image.slot_value(addr) == Some(self.gc_no) {
                    Some(Held::Addr(Some(addr)))
                } else if self.at_gc_no(insn).is_some() {
                    Some(Held::Value(0))
                } else {
                    None
                }
            }
            (Mnemonic::Lea, _) if insn.is_ip_rel_memory_operand() => {
                (insn.ip_rel_memory_address() == self.gc_no).then_some(Held::Addr(None))
            }
            (Mnemonic::Lea, _) => match self.get(insn.memory_base()) {
                Some(Held::Value(k)) if insn.memory_index() == Register::None => {
                    Some(Held::Value(k.wrapping_add(insn.memory_displacement64())))
                }
                _ => None,
            },
            (Mnemonic::Mov, OpKind::Immediate64 | OpKind::Immediate32to64) => {
                (insn.immediate(1) == self.gc_no).then_some(Held::Addr(None))
            }
            (Mnemonic::Mov, OpKind::Register) => self.get(insn.op1_register()),
            (Mnemonic::Add, _) if insn.op1_kind() != OpKind::Register => match self.get(reg) {
                Some(Held::Value(k)) if insn.op1_kind() != OpKind::Memory => {
                    Some(Held::Value(k.wrapping_add(insn.immediate(1))))
                }
                _ => None,
            },
            (Mnemonic::Inc, _) => match self.get(reg) {
                Some(Held::Value(k)) => Some(Held::Value(k + 1)),
                _ => None,
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod test_programs;
#[cfg(test)]
mod tests;

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::gc;
        let libgc = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libgc.so.1");
        let end = gc::find_end_of_mark(libgc)?;
        // Debian 8.2.2: `add qword ptr [rax],1` at 0x18572, and `mov [rax],rsi` at 0x18628
        // (the copy that usually runs).
        assert_eq!(
            (end.increments[0].offset, end.increments[0].after_offset),
            (0x18572, 0x18576)
        );
        let layout = gc::derive_layout(libgc)?;
        assert_eq!(
            (layout.top_index, layout.all_nils, layout.hb_marks),
            (0x289f0, 0xc0, 0x40)
        );
        Ok(())
    }
}
