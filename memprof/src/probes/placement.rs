//! Where in a function to put its entry probe.
//!
//! A uprobe hit costs about 0.8 µs when the kernel can emulate the probed
//! instruction (push of a register, jmp/jcc/call rel, nop) and 10–11 µs when
//! it must single-step it out of line (docs/ARCHITECTURE.md, "Probe cost"). So the entry
//! probe goes on the first emulated instruction of the function, as long as
//! everything the probe reads is still what it was at entry:
//!
//! - the argument registers the probe reads are not written before it;
//! - `%rsp` is unchanged, so `[%rsp]` is still the return address (the probe
//!   reads the caller from it, and the return probe hijacks it);
//! - `%rbp` is unchanged, so the frame-pointer walk still starts at the caller;
//! - the path from the entry to the probe is straight-line code (no branch,
//!   no syscall), and no branch inside the function lands in that stretch
//!   (the probe would fire twice for one call).
//!
//! Otherwise the probe stays at +0.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, Mnemonic, Register};

use crate::allocators::{ArgReg, ResolvedFn};
use crate::x86::decode::{self, text};
use crate::x86::{regs, uprobe::emulated as is_emulated};

/// How many instructions to look at before giving up and probing at +0.
const MAX_SCAN: usize = 8;

/// The chosen entry-probe offset of one function and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Bytes from the function's first instruction.
    pub offset: u64,
    /// Whether the kernel emulates the probed instruction (cheap) or single-steps it.
    pub emulated: bool,
    /// One line for `memprof probes`: the instruction and the reason.
    pub reason: String,
}

/// Picks the entry-probe offset for a function whose code starts at `address`.
/// `args` are the argument registers the probe reads.
pub fn choose(code: &[u8], address: u64, args: &[ArgReg]) -> Placement {
    let instructions = decode::function(code, address);
    let Some(first) = instructions.first() else {
        return Placement {
            offset: 0,
            emulated: false,
            reason: "code could not be decoded: probed at +0".into(),
        };
    };
    if is_emulated(first) {
        return Placement {
            offset: 0,
            emulated: true,
            reason: format!("+0 `{}` is emulated", text(first)),
        };
    }
    let fallback = |why: String| Placement {
        offset: 0,
        emulated: false,
        reason: format!("+0 `{}` is single-stepped: {why}", text(first)),
    };

    let mut info = InstructionInfoFactory::new();
    for (index, insn) in instructions.iter().enumerate().take(MAX_SCAN) {
        let offset = insn.ip() - address;
        if index > 0 && is_emulated(insn) {
            let skipped: Vec<String> = instructions[..index].iter().map(text).collect();
            if let Some(from) = branch_into(&instructions, address, offset) {
                return fallback(format!(
                    "a branch at +{from:#x} lands before the candidate +{offset:#x}"
                ));
            }
            return Placement {
                offset,
                emulated: true,
                reason: format!(
                    "+{offset} `{}` is emulated; skipped `{}`",
                    text(insn),
                    skipped.join("; ")
                ),
            };
        }
        if insn.flow_control() != FlowControl::Next || insn.mnemonic() == Mnemonic::Syscall {
            return fallback(format!("`{}` changes control flow first", text(insn)));
        }
        if let Some(reg) = clobbers(&mut info, insn, args) {
            return fallback(format!("`{}` writes {reg:?} first", text(insn)));
        }
    }
    fallback("no emulated instruction in the first few".into())
}

/// The first register among the probe's arguments, `%rsp` and `%rbp` that
/// `insn` writes.
fn clobbers(
    info: &mut InstructionInfoFactory,
    insn: &Instruction,
    args: &[ArgReg],
) -> Option<Register> {
    let watched: Vec<Register> = args
        .iter()
        .map(|a| match a {
            ArgReg::Rdi => Register::RDI,
            ArgReg::Rsi => Register::RSI,
            ArgReg::Rdx => Register::RDX,
        })
        .chain([Register::RSP, Register::RBP])
        .collect();
    regs::written(info, insn).find(|r| watched.contains(r))
}

/// A branch anywhere in the decoded function that targets (0, offset]:
/// a probe at `offset` would then fire more than once per call.
fn branch_into(instructions: &[Instruction], address: u64, offset: u64) -> Option<u64> {
    instructions.iter().find_map(|i| {
        let target = i.near_branch_target();
        (target > address && target <= address + offset).then(|| i.ip() - address)
    })
}

/// A function with its chosen entry-probe offset: what `memprof probes` shows
/// and what [`crate::probes`] attaches.
#[derive(Debug, Clone)]
pub struct Planned {
    pub func: ResolvedFn,
    pub placement: Placement,
}

/// Chooses the entry offset of every resolved function; aliases (the same
/// code under two names) are dropped. `at_entry` forces +0 (for comparison).
pub fn plan(resolved: &[ResolvedFn], at_entry: bool) -> Vec<Planned> {
    resolved
        .iter()
        .filter(|f| f.alias_of.is_none())
        .map(|f| {
            let placement = if at_entry {
                Placement {
                    offset: 0,
                    emulated: false,
                    reason: "+0 (placement disabled by --probe-at-entry)".into(),
                }
            } else {
                choose(&f.code, f.address, f.func.args)
            };
            Planned {
                func: f.clone(),
                placement,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_at_entry_is_kept() {
        // malloc: push %r12 ; push %rbp
        let p = choose(&[0x41, 0x54, 0x55], 0x1000, &[ArgReg::Rdi]);
        assert_eq!((p.offset, p.emulated), (0, true));
    }

    #[test]
    fn skips_compare_to_reach_branch() {
        // aligned_alloc: cmpb $0,0x140e71(%rip) ; je +7
        let code = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07];
        let p = choose(&code, 0x99610, &[ArgReg::Rsi]);
        assert_eq!((p.offset, p.emulated), (7, true), "{}", p.reason);
    }

    #[test]
    fn argument_write_keeps_entry() {
        // mov %rdi,%rsi (writes rsi) ; jmp
        let code = [0x48, 0x89, 0xfe, 0xeb, 0x00];
        let p = choose(&code, 0x1000, &[ArgReg::Rsi]);
        assert_eq!((p.offset, p.emulated), (0, false), "{}", p.reason);
        // … but it is harmless when the probe does not read rsi.
        let p = choose(&code, 0x1000, &[ArgReg::Rdi]);
        assert_eq!(p.offset, 3, "{}", p.reason);
    }

    #[test]
    fn stack_change_keeps_entry() {
        // sub $0x18,%rsp ; push %rbx
        let p = choose(&[0x48, 0x83, 0xec, 0x18, 0x53], 0x1000, &[ArgReg::Rdi]);
        assert_eq!(p.offset, 0, "{}", p.reason);
    }

    #[test]
    fn syscall_is_a_barrier() {
        // munmap: mov $0xb,%eax ; syscall ; cmp ; jae
        let code = [
            0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01,
        ];
        let p = choose(&code, 0x1000, &[ArgReg::Rdi]);
        assert_eq!(p.offset, 0, "{}", p.reason);
    }

    #[test]
    fn branch_back_into_skipped_stretch_keeps_entry() {
        // test %rdi,%rdi ; je +0 (to itself: lands on the candidate)
        let code = [0x48, 0x85, 0xff, 0x74, 0xfe];
        let p = choose(&code, 0x1000, &[ArgReg::Rdi]);
        assert_eq!(p.offset, 0, "{}", p.reason);
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::{allocators::ArgReg, probes::placement::choose};
        // glibc's free: test %rdi,%rdi ; je … ; push %rbp
        let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        let p = choose(&code, 0x98ef0, &[ArgReg::Rdi]);
        assert_eq!(p.offset, 3);
        assert!(p.emulated);
    }
}
