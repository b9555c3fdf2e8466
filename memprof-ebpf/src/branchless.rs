//! Comparisons and choices without a branch, for the unwinder and the
//! entry program. The verifier walks every path of a program: a
//! data-dependent branch in a loop body doubles the paths at each
//! iteration, where arithmetic on 0/1 values keeps one.

/// 1 if `a != b`, else 0, without a branch.
#[inline(always)]
pub(crate) fn differ(a: u64, b: u64) -> u64 {
    let x = a ^ b;
    // `x | -x` has the top bit set unless x is 0.
    opaque((x | opaque(x.wrapping_neg())) >> 63)
}

/// `if pick == 1 { a } else { b }` for `pick` 0 or 1, without a branch.
#[inline(always)]
pub(crate) fn select(pick: u64, a: u64, b: u64) -> u64 {
    let mask = opaque(pick.wrapping_neg());
    (a & mask) | (b & !mask)
}

/// `x`, hidden from LLVM: it recognizes `differ` and `select` as a
/// comparison and a choice and compiles them back into branches (BPF
/// has no conditional move), which is what they are here to avoid.
/// An empty `asm!` (LLVM cannot see through it) rather than
/// `black_box`, which spills the value to the stack and reloads it.
#[inline(always)]
fn opaque(mut x: u64) -> u64 {
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) x, options(pure, nomem, nostack)) };
    x
}

/// 1 if `a <= b`, else 0, without a branch (both below 2^63).
#[inline(always)]
pub(crate) fn at_or_before(a: u64, b: u64) -> u32 {
    ((b.wrapping_sub(a) >> 63) ^ 1) as u32
}
