//! A spare load of a followed session's probes, its programs verified
//! ahead of need. Starting a Boehm GC program's session takes ~0.5 s,
//! ~0.4 s of it the kernel loading and verifying the programs (measured
//! here: 80 ms the object and its maps, 350 ms the programs at their
//! first attach): a Crystal program that ends sooner is missed. The
//! sessions of one program started again (a command run again and again,
//! a server's workers) load the same programs with the same settings, so
//! once one session's probes are loaded, a spare with its settings is
//! loaded beside it in the background (even if that process ends before
//! it is attached), and the next session with those settings takes it
//! and only attaches: ~0.08 s in all, measured here.
//!
//! One spare at a time, for the settings of the last session loaded (it
//! holds the kernel memory of a session's maps, ~90 MB with the agent's
//! defaults); only for sessions attached to a process already running
//! (`agent`, `attach --comm/--exe`, and `run`'s forked workers that never
//! `exec`): a process `run` holds after its `exec` waits for its probes.
use std::sync::Mutex;
use std::thread::JoinHandle;

use anyhow::Result;
use memprof_common::programs;

use super::{ProbeOptions, Probes};
use crate::unwind::Tables;

/// What a load is made for: its settings and the size of its table of
/// unwind rows (the rows themselves are written when it is taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LoadKey {
    options: String,
    /// `None`: unwound by frame pointers.
    rows: Option<usize>,
}

impl LoadKey {
    pub(super) fn of(options: &ProbeOptions, tables: Option<&Tables>) -> LoadKey {
        LoadKey::of_sized(options, tables.map(|t| t.rows.len()))
    }

    pub(super) fn of_sized(options: &ProbeOptions, rows: Option<usize>) -> LoadKey {
        LoadKey {
            options: format!("{options:?}"),
            rows,
        }
    }
}

/// The spare: the settings it is loaded for, and its load's thread (the
/// load kept there once done).
struct Spare {
    key: LoadKey,
    loading: JoinHandle<Result<Probes>>,
}

static SPARE: Mutex<Option<Spare>> = Mutex::new(None);

fn spare() -> std::sync::MutexGuard<'static, Option<Spare>> {
    SPARE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The spare loaded for `key`, if there is one (waited for if it is
/// still loading, the lock let go meanwhile: it is further along than a
/// load started now).
pub(super) fn take(key: &LoadKey) -> Option<Probes> {
    let spare = {
        let mut held = spare();
        if held.as_ref().is_none_or(|s| s.key != *key) {
            return None;
        }
        held.take()?
    };
    spare.loading.join().ok()?.ok()
}

/// The programs a followed session attaches: verified in the spare.
/// The allocations' session program where the kernel has uprobe
/// sessions (Linux 6.13), else the entry and return pair.
fn session_programs() -> Vec<&'static str> {
    let allocations: &[&str] = match super::kernel().uprobe_session {
        true => &[programs::ALLOC_SESSION],
        false => &[programs::ALLOC_ENTER, programs::ALLOC_EXIT],
    };
    let others = [
        programs::FREE_ENTER,
        programs::MUNMAP_ENTER,
        programs::GC_COLLECTION,
    ];
    allocations.iter().copied().chain(others).collect()
}

/// After a followed session's probes were loaded for `key`: a spare with
/// the same settings is loaded in the background, unless one is held or
/// loading for them already.
pub(super) fn prepare_like(key: LoadKey, options: ProbeOptions) {
    let mut held = spare();
    match held.as_ref() {
        Some(spare) if spare.key == key => return,
        // A spare still loading for other settings is let finish first.
        Some(spare) if !spare.loading.is_finished() => return,
        _ => {}
    }
    let rows = key.rows;
    let loading = std::thread::spawn(move || {
        let mut probes = Probes::load_sized(&options, rows)?;
        probes.prepare(&session_programs());
        Ok(probes)
    });
    *held = Some(Spare { key, loading });
}
