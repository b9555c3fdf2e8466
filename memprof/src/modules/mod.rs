//! The target's module files (the executable, its shared libraries), each
//! opened, memory-mapped and parsed once per session.
//!
//! Every stage needs something from the same ELF files: the allocator
//! symbols and their code ([`crate::allocators`], [`crate::placement`]),
//! `.eh_frame` ([`crate::unwind`]), `.interp` ([`crate::target`]), libgc's
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
//! ```no_run
//! use memprof::modules::ModuleCache;
//! let cache = ModuleCache::default();
//! let libc = cache.get("/usr/lib/x86_64-linux-gnu/libc.so.6".as_ref()).unwrap();
//! let malloc = libc.symbol("malloc").unwrap();
//! println!("malloc at {:#x}, file offset {:?}", malloc.address, libc.file_offset(malloc.address));
//! ```
mod module;
mod slots;
mod versions;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use self::module::{Module, Segment, Symbol};

/// Why a module could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an ELF file: {source}", path.display())]
    NotElf {
        path: PathBuf,
        source: object::read::Error,
    },
    #[error("{}: only x86-64 is supported", path.display())]
    NotX86_64 { path: PathBuf },
    #[error("{} is not mapped in pid {pid}", path.display())]
    NotMapped { path: PathBuf, pid: u32 },
}

/// The modules opened so far in one session, by path. Cheap to share:
/// each [`Module`] is behind an [`Arc`].
#[derive(Debug, Default)]
pub struct ModuleCache {
    modules: Mutex<HashMap<PathBuf, Arc<Module>>>,
}

impl ModuleCache {
    /// The module at `path`, opened and parsed on first use.
    pub fn get(&self, path: &Path) -> Result<Arc<Module>, Error> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = modules.get(path) {
            return Ok(Arc::clone(module));
        }
        let module = Arc::new(Module::open(path)?);
        modules.insert(path.to_path_buf(), Arc::clone(&module));
        Ok(module)
    }
}
