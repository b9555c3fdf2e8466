//! `attach --all`: stacks the unwinder stopped in a file it had no
//! rows for yet (a program or library never seen, in a process that may
//! end before userspace reads it). The frame's state and a copy of the
//! stack above it go to userspace (`DEFERRED_STACKS`), which finishes
//! the walk once the file's rows exist. Once per stack key and process:
//! calls with the same frames up to that file share the first one's
//! completion (two processes of one program at the same addresses, a
//! non-PIE one, have the same key but their libraries elsewhere).
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user_buf},
    macros::map,
    maps::{LruHashMap, RingBuf},
};
use memprof_common::{DeferredStack, DEFERRED_BYTES};

use crate::counters::bump;
use crate::host::known_process;

/// Copies of stacks for userspace to finish.
#[map]
static DEFERRED_STACKS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// Keys already sent (mixed with the process index).
#[map]
static DEFERRED_SENT: LruHashMap<u64, u8> = LruHashMap::with_max_entries(1 << 14, 0);

const PAGE: u64 = 4096;

/// Sends stack `key`, stopped at return address `pc` with CFA `sp` and
/// `%rbp` `bp`, unless it was sent before.
#[inline(never)]
pub(crate) fn send(key: u64, pc: u64, sp: u64, bp: u64) {
    let Some(index) = known_process() else {
        return;
    };
    // And the process's start: an index is given again once its
    // process is done.
    let sent = key
        ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ crate::host::start_time().wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    if DEFERRED_SENT.get_ptr(&sent).is_some() {
        return;
    }
    let Some(mut entry) = DEFERRED_STACKS.reserve::<DeferredStack>(0) else {
        bump(|c| &mut c.deferred_lost);
        return;
    };
    let _ = DEFERRED_SENT.insert(&sent, &1, 0);
    let record = unsafe { &mut *entry.as_mut_ptr() };
    record.index = index;
    record.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    record.key = key;
    record.pc = pc;
    record.sp = sp;
    record.bp = bp;
    // The rest of sp's page, then whole pages while they read (a copy
    // that crosses into an unmapped page fails whole).
    let first = (PAGE - (sp & (PAGE - 1))) as usize;
    let mut len = 0usize;
    if first <= PAGE as usize {
        let dest = &mut record.bytes[..first];
        if unsafe { bpf_probe_read_user_buf(sp as *const u8, dest) }.is_ok() {
            len = first;
            for _ in 0..2 {
                if len > 2 * PAGE as usize {
                    break;
                }
                let Some(dest) = record.bytes.get_mut(len..len + PAGE as usize) else {
                    break;
                };
                if unsafe { bpf_probe_read_user_buf((sp + len as u64) as *const u8, dest) }.is_err()
                {
                    break;
                }
                len += PAGE as usize;
            }
        }
    }
    record.len = len.min(DEFERRED_BYTES) as u64;
    entry.submit(0);
}
