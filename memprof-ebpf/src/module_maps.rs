//! Where each module of a process is mapped (`MODULE_RANGES`), and which
//! half of that table is in use (`MODULE_TABLE`): written by userspace
//! (and, under `attach --all`, by the host's programs), read by the
//! unwinder at each frame.
use aya_ebpf::{macros::map, maps::Array};
use memprof_common::{module_table, ModuleRange};

/// Two halves (`module_table`): userspace fills the one not in use, then
/// switches (`MODULE_TABLE`), so no probe sees a half-written one.
#[map]
pub(crate) static MODULE_RANGES: Array<ModuleRange> =
    Array::with_max_entries(module_table::ENTRIES, 0);
/// `[0]`: the module table in use (packed by `module_table::pack`).
/// Written by userspace whenever the target's mappings change: one
/// aligned word, read once per call.
#[map]
pub(crate) static MODULE_TABLE: Array<u32> = Array::with_max_entries(1, 0);
