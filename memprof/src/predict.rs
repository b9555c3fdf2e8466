//! Allocations without their return probed: the entry of an allocator
//! reads its result from the calling thread's cache ([`Predict`]).
//!
//! Probing a call's return costs as much again as its entry (binary-trees
//! 14: 0.97 µs per allocation with entry probes alone, 1.64 µs with the
//! return too). Two allocators serve a small request from a per-thread
//! cache whose head, for the request's class, is the result:
//!
//! - bdwgc's thread-local allocation (`GC_malloc`, `GC_malloc_atomic`):
//!   the thread's free list for the size's granules, found through
//!   `GC_thread_key` (a TLS variable: libgc's TLS block is found through
//!   the thread's TLS vector, libgc's module id being in a GOT slot the
//!   dynamic linker fills, or 1 when libgc is in the executable);
//! - glibc's tcache (`malloc`): `tcache->entries[bin]`, `tcache` being a
//!   TLS variable of libc at a thread-pointer offset the dynamic linker
//!   writes into the GOT slot `malloc`'s own code loads it from.
//!
//! The kernel finds a thread's cache variable once and reads it at each
//! call; where the head is an object, it records the allocation at the
//! entry and skips the return (a uprobe session). An empty list, a large
//! request, anything unexpected: the return is probed as before.
//!
//! Nothing is assumed blindly: predictions are compared with the real
//! returns until [`memprof_common::PREDICT_TRUST_AFTER`] matched, then one
//! in [`memprof_common::PREDICT_CHECK_EVERY`] still is; a single wrong one
//! turns that predictor off, and the profile counts it. Both need the
//! offset of a task's `fs` base in the kernel's `task_struct` (its BTF).
use anyhow::{anyhow, bail, Context, Result};
use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
use memprof_common::{predict, predictor, Predict};

use crate::modules::Module;

/// What one predictor needs, found in its module's file and the kernel.
#[derive(Debug, Clone)]
pub struct Predictor {
    kind: Kind,
    fsbase_offset: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    Gc {
        /// libgc's TLS module id: a GOT slot holding it (link-time
        /// address), or the id itself (the executable: 1).
        module: ModuleId,
        tls_offset: u64,
        /// `GC_all_interior_pointers` (link-time address), read at the start.
        interior_pointers: Option<u64>,
    },
    Malloc {
        /// The GOT slot holding `tcache`'s thread-pointer offset.
        slot: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum ModuleId {
    Slot(u64),
    Known(u64),
}

impl Predictor {
    /// For libgc in `libgc` (`in_executable`: linked into the program).
    pub fn gc(libgc: &Module, in_executable: bool) -> Result<Predictor> {
        let size = libgc
            .tls_size()
            .ok_or_else(|| anyhow!("libgc has no thread-local storage"))?;
        // `GC_thread_key`, thread-local with the compiler's TLS (bdwgc's
        // `USE_COMPILER_TLS`: it holds the free lists' address itself), by
        // its symbol; a libgc whose TLS block holds one word has only it
        // (Debian's libgc.so.1, whose symbol is not exported).
        let tls_offset = match libgc.tls_symbol("GC_thread_key") {
            Some(offset) if offset + 8 <= size => offset,
            _ if size == 8 => 0,
            _ => bail!("GC_thread_key not found in libgc's thread-local storage"),
        };
        let module = match (libgc.tls_module_slot(), in_executable) {
            (Some(slot), _) => ModuleId::Slot(slot),
            // The program's own TLS block is the first one.
            (None, true) => ModuleId::Known(1),
            (None, false) => bail!("no TLS module slot in libgc"),
        };
        Ok(Predictor {
            kind: Kind::Gc {
                module,
                tls_offset,
                interior_pointers: libgc.symbol("GC_all_interior_pointers").map(|s| s.address),
            },
            fsbase_offset: fsbase_offset()?,
        })
    }

    /// For glibc's `malloc` in `libc`: the GOT slot of `tcache`'s
    /// thread-pointer offset is the first TLS offset slot `malloc` loads
    /// (its tcache check comes before anything else thread-local).
    pub fn malloc(libc: &Module) -> Result<Predictor> {
        let malloc = libc
            .symbol("malloc")
            .ok_or_else(|| anyhow!("no malloc symbol"))?;
        let code = libc
            .bytes_at(malloc.address)
            .ok_or_else(|| anyhow!("malloc's code is not in the file"))?;
        let code = &code[..code.len().min(256)];
        let mut decoder = Decoder::with_ip(64, code, malloc.address, DecoderOptions::NONE);
        let slot = decoder
            .iter()
            .take(64)
            .find_map(|i| {
                let load = i.mnemonic() == Mnemonic::Mov
                    && i.op0_kind() == OpKind::Register
                    && i.op1_kind() == OpKind::Memory
                    && i.is_ip_rel_memory_operand();
                let slot = i.ip_rel_memory_address();
                (load && libc.is_tls_offset_slot(slot)).then_some(slot)
            })
            .ok_or_else(|| {
                anyhow!("malloc reads no thread-local variable up front (not glibc's tcache)")
            })?;
        Ok(Predictor {
            kind: Kind::Malloc { slot },
            fsbase_offset: fsbase_offset()?,
        })
    }

    /// The kernel's predictor ([`predictor`]).
    pub fn which(&self) -> u32 {
        match self.kind {
            Kind::Gc { .. } => predictor::GC,
            Kind::Malloc { .. } => predictor::MALLOC,
        }
    }

    /// The kernel's settings for process `pid`, the module loaded at `bias`.
    pub fn settings(&self, pid: u32, bias: u64) -> Predict {
        let mut settings = Predict {
            state: predict::CHECKING,
            fsbase_offset: self.fsbase_offset,
            ..Predict::default()
        };
        match self.kind {
            Kind::Gc {
                module,
                tls_offset,
                interior_pointers,
            } => {
                match module {
                    ModuleId::Slot(slot) => settings.slot = bias + slot,
                    ModuleId::Known(id) => settings.module_id = id,
                }
                settings.tls_offset = tls_offset;
                // `EXTRA_BYTES`: 1 when the collector recognizes interior
                // pointers (a wrong guess only makes predictions wrong,
                // which are checked).
                settings.extra_bytes = interior_pointers
                    .and_then(|at| {
                        let mut word = [0u8; 4];
                        crate::tracee::memory::vm_read(pid, bias + at, &mut word).ok()?;
                        Some(u64::from(i32::from_le_bytes(word) != 0))
                    })
                    .unwrap_or(1);
            }
            Kind::Malloc { slot } => settings.slot = bias + slot,
        }
        settings
    }
}

/// `task_struct.thread.fsbase`'s offset in the running kernel.
fn fsbase_offset() -> Result<u64> {
    use crate::probes::btf::kernel_member_offset;
    kernel_member_offset("task_struct", &["thread", "fsbase"]).context("the kernel's BTF")
}
