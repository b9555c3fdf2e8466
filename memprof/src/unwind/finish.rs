//! Finishing in userspace a walk the kernel's unwinder stopped: it had
//! no rows for a return address (a file not read yet), so it sent that
//! frame's state and a copy of the stack above it
//! ([`memprof_common::DeferredStack`]). The rules are the kernel's
//! (`memprof-ebpf/src/unwind.rs`, `walk` and `caller_frame`), on the
//! same rows, read from the copy instead of the live stack.
use memprof_common::{cfa, UnwindRow};

/// A copy of the target's stack from `start` up.
pub struct StackCopy<'a> {
    pub start: u64,
    pub bytes: &'a [u8],
}

impl StackCopy<'_> {
    /// The word at `addr`, if the copy holds it (aligned or not).
    fn word(&self, addr: u64) -> Option<u64> {
        let at = usize::try_from(addr.checked_sub(self.start)?).ok()?;
        let bytes = self.bytes.get(at..at.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// The rows of one module, and where it is: what [`finish`] needs to
/// look a return address up.
pub struct ModuleRows<'a> {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    /// Sorted by `pc` (module-relative), as [`super::ModuleTable`] builds them.
    pub rows: &'a [UnwindRow],
}

/// The row covering `pc` (an address in the target) among `modules`:
/// the last row of its module starting at or before it.
fn row_at(modules: &[ModuleRows<'_>], pc: u64) -> Option<UnwindRow> {
    let module = modules.iter().find(|m| m.start <= pc && pc < m.end)?;
    let rel = pc.checked_sub(module.bias)?;
    let i = module.rows.partition_point(|r| u64::from(r.pc) <= rel);
    module.rows.get(i.checked_sub(1)?).copied()
}

/// The callers of the frame whose return address is `pc` (`sp` its
/// callee's CFA, `bp` its `%rbp`), outermost last, up to `max` frames;
/// and whether the walk stopped before the outermost frame.
pub fn finish(
    modules: &[ModuleRows<'_>],
    copy: &StackCopy<'_>,
    (mut pc, mut sp, mut bp): (u64, u64, u64),
    max: usize,
) -> (Vec<u64>, bool) {
    let mut callers = Vec::new();
    while callers.len() < max {
        // A return address points after the call: the call's row.
        let Some(row) = pc.checked_sub(1).and_then(|at| row_at(modules, at)) else {
            return (callers, true);
        };
        let base = match row.cfa_reg {
            cfa::RSP => sp,
            cfa::RBP => bp,
            cfa::END => return (callers, false),
            _ => return (callers, true),
        };
        let frame = base.wrapping_add(row.cfa_offset as i64 as u64);
        if row.rbp_saved == 1 {
            match copy.word(frame.wrapping_add(row.rbp_offset as i64 as u64)) {
                Some(saved) => bp = saved,
                None => return (callers, true),
            }
        }
        let Some(caller) = copy.word(frame.wrapping_sub(8)) else {
            return (callers, true);
        };
        if caller == 0 {
            return (callers, false);
        }
        (pc, sp) = (caller, frame);
        callers.push(pc);
    }
    (callers, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, cfa_reg: u8, cfa_offset: i32, rbp: Option<i16>) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset,
            rbp_offset: rbp.unwrap_or(0),
            cfa_reg,
            rbp_saved: u8::from(rbp.is_some()),
            func: pc,
        }
    }

    /// Three frames: `leaf` (CFA = rsp + 16), `mid` (an %rbp frame: CFA =
    /// rbp + 16, %rbp saved at CFA - 16), `outer` (the outermost: END).
    #[test]
    fn walks_the_kernel_rules_over_a_copy() {
        let rows = [
            row(0x100, cfa::RSP, 16, None),      // leaf 0x100..0x200
            row(0x200, cfa::RBP, 16, Some(-16)), // mid 0x200..0x300
            row(0x300, cfa::END, 0, None),       // outer
            row(0x400, cfa::UNKNOWN, 0, None),
        ];
        let bias = 0x5000_0000;
        let modules = [ModuleRows {
            start: bias,
            end: bias + 0x1000,
            bias,
            rows: &rows,
        }];
        // The stack from 0x7000: leaf's frame, then mid's.
        let mut words = [0u64; 8];
        // leaf: CFA = sp + 16 = 0x7010; return address at 0x7008 → mid.
        words[1] = bias + 0x250;
        // mid: rbp = 0x7020 (the caller's rbp saved at 0x7020), CFA =
        // 0x7030; return address at 0x7028 → outer.
        words[4] = 0x9999; // saved %rbp
        words[5] = bias + 0x350;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let copy = StackCopy {
            start: 0x7000,
            bytes: &bytes,
        };
        let (callers, truncated) = finish(&modules, &copy, (bias + 0x150, 0x7000, 0x7020), 64);
        assert_eq!(callers, [bias + 0x250, bias + 0x350]);
        assert!(!truncated);
        // A return address in no module: stopped there, truncated.
        let (callers, truncated) = finish(&modules, &copy, (0x1234, 0x7000, 0), 64);
        assert!(callers.is_empty() && truncated);
        // A copy too short for the next return address: truncated.
        let short = StackCopy {
            start: 0x7000,
            bytes: &bytes[..8],
        };
        let (callers, truncated) = finish(&modules, &short, (bias + 0x150, 0x7000, 0x7020), 64);
        assert!(callers.is_empty() && truncated);
    }
}
