//! The target's module files (the executable, its shared libraries), each
//! opened, memory-mapped and parsed once per session.
//!
//! Every stage needs something from the same ELF files: the allocator
//! symbols and their code ([`crate::allocators`], [`crate::probes::placement`]),
//! `.eh_frame` ([`crate::unwind`]), `.interp` ([`crate::tracee`]), libgc's
//! code, symbols and GOT slots ([`crate::gc`]), the versioned Crystal names
//! ([`crate::symbolize`]) and the load bias (unwinding ranges, GC passes).
//! A [`ModuleCache`] is made once per session and handed down; it gives
//! each stage the same [`Module`], so a file is read and parsed once.
//!
//! The load bias (run-time minus link-time address) has one rule, in
//! [`Module::bias`]: a mapping of the file belongs to the loadable segment
//! whose page-aligned file range holds the mapping's file offset (an
//! executable mapping to an executable segment), and the bias is the
//! mapping's start minus the address that file offset has in that segment.
//! It holds for position-independent and fixed-address executables and for
//! shared libraries, whichever of their mappings is at hand.
//!
//! The files are the target's: [`ModuleCache::of_process`] opens each path
//! as the target sees it (another mount namespace, a container, a file
//! deleted or replaced since it was mapped; see `files.rs`), keeps it open
//! for the whole session (symbols are read after the target may have
//! exited) and hands out [`Module::fd_path`] for whatever must open it again
//! (the kernel's uprobes) and [`Module::debug_view`] for blazesym (a user's
//! file by that descriptor, its debug links followed by memprof, never by a
//! blocking open: `debug_info.rs`). Paths are opened only as regular files,
//! without blocking ([`open_regular`]); a file shrinking while read is an
//! error for that file, not a SIGBUS (`shrunk.rs`). Messages name the
//! target's path.
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
#[cfg(test)]
mod bad_files;
mod debug_info;
mod error;
mod files;
pub mod maps;
mod module;
pub mod shared;
mod shrunk;
mod slots;
mod versions;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use self::error::Error;
pub use self::files::{open_regular, strip_deleted};
pub use self::module::{Module, Segment};
use maps::Mapping;

/// The modules opened so far in one session, by the target's path. Cheap
/// to share: each [`Module`] is behind an [`Arc`].
#[derive(Debug, Default)]
pub struct ModuleCache {
    modules: Mutex<HashMap<PathBuf, Arc<Module>>>,
    /// The target whose files these are; `None`: memprof's own view.
    process: Option<files::Process>,
    /// Files of the target opened as soon as seen mapped ([`Self::keep`]),
    /// not parsed yet: each shared with every process that maps it
    /// ([`shared`]).
    kept: Mutex<HashMap<PathBuf, Arc<File>>>,
    /// An open of one of its files was refused for want of a resource
    /// (descriptors, memory): its frames there may be addresses.
    refused: std::sync::atomic::AtomicBool,
}

impl ModuleCache {
    /// [`Module::release_pages`] of every module parsed so far.
    pub fn release_pages(&self) {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        for module in modules.values() {
            module.release_pages();
        }
    }

    /// The cache of process `pid`'s files, opened as `pid` sees them.
    pub fn of_process(pid: u32) -> ModuleCache {
        ModuleCache {
            process: Some(files::Process::new(pid)),
            ..ModuleCache::default()
        }
    }

    /// The module at the target's `path`, opened and parsed on first use.
    pub fn get(&self, path: &Path) -> Result<Arc<Module>, Error> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = modules.get(path) {
            return Ok(Arc::clone(module));
        }
        let module = match &self.process {
            None => Module::open(path)?,
            Some(process) => {
                let kept = self.lock_kept().remove(path);
                let file = match kept {
                    Some(file) => file,
                    None => Arc::new(process.open(path, None).map_err(|source| {
                        self.note_refusal(&source);
                        Error::Read {
                            path: path.to_path_buf(),
                            source,
                        }
                    })?),
                };
                Module::from_file(path, file)?
            }
        };
        let module = Arc::new(module);
        modules.insert(path.to_path_buf(), Arc::clone(&module));
        Ok(module)
    }

    /// An empty cache of the same process's files (or memprof's own).
    pub fn sibling(&self) -> ModuleCache {
        ModuleCache {
            process: self.process.clone(),
            ..ModuleCache::default()
        }
    }

    /// Takes in what `other` (the same process's, read meanwhile) opened
    /// or parsed that this one lacks.
    pub fn absorb(&self, other: ModuleCache) {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = self.lock_kept();
        for (path, module) in other
            .modules
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
        {
            modules.entry(path).or_insert(module);
        }
        for (path, file) in other.kept.into_inner().unwrap_or_else(|e| e.into_inner()) {
            if !modules.contains_key(&path) {
                kept.entry(path).or_insert(file);
            }
        }
        if other.refused.into_inner() {
            self.refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Every module parsed so far, by the target's path.
    pub fn parsed(&self) -> Vec<(PathBuf, Arc<Module>)> {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules
            .iter()
            .map(|(path, module)| (path.clone(), Arc::clone(module)))
            .collect()
    }

    /// `module` at `path` from now on, in place of any other parse of the
    /// same file: one parse (one open file) shared by the processes that
    /// map it, not parsed again for each (a build runs its compiler
    /// thousands of times).
    pub fn share(&self, path: &Path, module: Arc<Module>) {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules.insert(path.to_path_buf(), module);
    }

    /// Takes `module`, parsed for another process, as this one's `path`:
    /// the same file (`attach --all` knows files by device and inode).
    pub fn adopt(&self, path: &Path, module: Arc<Module>) {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules.entry(path.to_path_buf()).or_insert(module);
    }

    /// Opens (without parsing) each file of `mappings` (the target's, now)
    /// not opened yet, so that it can be read after the target unmapped it
    /// or exited.
    pub fn keep(&self, mappings: &[Mapping]) {
        let Some(process) = &self.process else {
            return;
        };
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = self.lock_kept();
        for m in mappings.iter().filter(|m| m.executable) {
            if modules.contains_key(&m.path) || kept.contains_key(&m.path) {
                continue;
            }
            match shared::open_shared(&m.file_id, || process.open(&m.path, Some(m))) {
                Ok(file) => {
                    kept.insert(m.path.clone(), file);
                }
                Err(e) => self.note_refusal(&e),
            }
        }
    }

    /// Whether an open of one of its files was refused for want of a
    /// resource (descriptors, memory).
    pub fn refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Remembers `error` if it is a refusal ([`shared::is_refusal`]).
    fn note_refusal(&self, error: &std::io::Error) {
        if shared::is_refusal(error) {
            self.refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Opens the target's `path` without parsing or keeping it.
    pub fn open_file(&self, path: &Path) -> std::io::Result<File> {
        match &self.process {
            Some(process) => process.open(path, None),
            None => open_regular(path),
        }
    }

    fn lock_kept(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<File>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::modules::ModuleCache;
        let cache = ModuleCache::default();
        let libc = cache
            .get("/usr/lib/x86_64-linux-gnu/libc.so.6".as_ref())
            .unwrap();
        let malloc = libc.symbol("malloc").unwrap();
        println!(
            "malloc at {:#x}, file offset {:?}",
            malloc.address,
            libc.file_offset(malloc.address)
        );
        Ok(())
    }
}
