//! Stacks the kernel could not finish: it met a return address in a
//! file it had no rows for yet (a program or library never seen, in a
//! process that may end before memprof reads it), and sent that frame's
//! state with a copy of the stack above it
//! ([`memprof_common::DeferredStack`], once per stack key and process). They are
//! finished here, by the kernel's rules (`unwind::finish`), once the
//! process's files are known: at its end, or for a snapshot.
use std::collections::HashMap;
use std::sync::Arc;

use memprof_common::{DeferredStack, UnwindRow, MAX_FRAMES};

use crate::modules::maps::MapsCache;
use crate::modules::ModuleCache;
use crate::unwind::finish::{finish, ModuleRows, StackCopy};
use crate::unwind::ModuleTable;

use super::file_ids::FileId;

/// Copies kept waiting at most (12 KiB each: 48 MiB); more are counted.
const MAX_WAITING: usize = 4096;

/// A stack finished: the callers to append to the kernel's frames, and
/// whether it still stops short of the outermost frame.
pub type Finished = (Vec<u64>, bool);

/// Rows of files kept here at most (32 MiB): the files a stack went
/// through that the kernel had no rows for (new, or given no room).
const ROWS_KEPT: usize = 1 << 21;

#[derive(Default)]
pub struct Deferred {
    /// By process index and stack key: copies not finished yet.
    waiting: HashMap<(u32, u64), Box<DeferredStack>>,
    /// By process index, then stack key: what the kernel's frames go on
    /// with (a key is the same frames in two processes of one non-PIE
    /// program, not the same callers beyond them).
    finished: HashMap<u32, Arc<HashMap<u64, Finished>>>,
    /// Each file's rows, built once (none: a file that has none, or is
    /// over the budget); all forgotten past [`ROWS_KEPT`].
    rows: HashMap<FileId, Arc<[UnwindRow]>>,
    /// Rows in `rows`.
    rows_kept: usize,
    /// Copies dropped for want of room here (the kernel counts those it
    /// could not send).
    pub dropped: u64,
}

impl Deferred {
    /// A copy the kernel sent.
    pub fn add(&mut self, stack: Box<DeferredStack>) {
        let at = (stack.index, stack.key);
        let done = self
            .finished
            .get(&stack.index)
            .is_some_and(|f| f.contains_key(&stack.key));
        if done || self.waiting.contains_key(&at) {
            return;
        }
        if self.waiting.len() >= MAX_WAITING {
            self.dropped += 1;
            return;
        }
        self.waiting.insert(at, stack);
    }

    /// The stacks of process `index` finished so far.
    pub fn finished(&self, index: u32) -> Arc<HashMap<u64, Finished>> {
        self.finished.get(&index).cloned().unwrap_or_default()
    }

    /// Process `index` ended: what was kept for it goes.
    pub fn forget(&mut self, index: u32) {
        self.finished.remove(&index);
        self.waiting.retain(|(i, _), _| *i != index);
    }

    /// Finishes the stacks of process `index` waiting, with its mappings
    /// (`maps`) and files (`modules`). Those whose walk still meets a
    /// file without rows stay cut there, marked truncated.
    pub fn finish_process(&mut self, index: u32, maps: &MapsCache, modules: &ModuleCache) {
        let keys: Vec<(u32, u64)> = self
            .waiting
            .keys()
            .filter(|(i, _)| *i == index)
            .copied()
            .collect();
        if keys.is_empty() {
            return;
        }
        // Every executable mapping with its rows (a file's built once).
        let mut held: Vec<(u64, u64, u64, Arc<[UnwindRow]>)> = Vec::new();
        for m in maps.all().iter().filter(|m| m.executable) {
            let Ok(module) = modules.get(&m.path) else {
                continue;
            };
            let Some(bias) = module.bias(m) else {
                continue;
            };
            let rows = match self.rows.get(&m.file_id) {
                Some(rows) => Arc::clone(rows),
                None => {
                    let rows: Arc<[UnwindRow]> = ModuleTable::build(&module)
                        .map(|t| t.rows)
                        .unwrap_or_default()
                        .into();
                    if self.rows_kept + rows.len() > ROWS_KEPT {
                        // Files of programs long gone, mostly: built again
                        // if a stack needs them.
                        self.rows.clear();
                        self.rows_kept = 0;
                    }
                    self.rows_kept += rows.len();
                    self.rows.insert(m.file_id.clone(), Arc::clone(&rows));
                    rows
                }
            };
            held.push((m.start, m.end, bias, rows));
        }
        let modules: Vec<ModuleRows<'_>> = held
            .iter()
            .map(|(start, end, bias, rows)| ModuleRows {
                start: *start,
                end: *end,
                bias: *bias,
                rows,
            })
            .collect();
        let finished = Arc::make_mut(self.finished.entry(index).or_default());
        for key in keys {
            let Some(stack) = self.waiting.remove(&key) else {
                continue;
            };
            let len = (stack.len as usize).min(stack.bytes.len());
            let copy = StackCopy {
                start: stack.sp,
                bytes: &stack.bytes[..len],
            };
            let done = finish(&modules, &copy, (stack.pc, stack.sp, stack.bp), MAX_FRAMES);
            finished.insert(key.1, done);
        }
    }
}
