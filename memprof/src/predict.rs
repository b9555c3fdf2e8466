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
use std::path::Path;

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
                        crate::gc::census::vm_read(pid, bias + at, &mut word).ok()?;
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
    kernel_member_offset("task_struct", &["thread", "fsbase"]).context("the kernel's BTF")
}

/// The byte offset of `path` (nested members) in kernel struct `name`,
/// from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
pub(crate) fn kernel_member_offset(name: &str, path: &[&str]) -> Result<u64> {
    Ok(kernel_member_offsets(&[(name, path)])?[0])
}

/// [`kernel_member_offset`] of each `(struct, path)`, the BTF read once.
pub(crate) fn kernel_member_offsets(queries: &[(&str, &[&str])]) -> Result<Vec<u64>> {
    let data = std::fs::read(Path::new("/sys/kernel/btf/vmlinux"))?;
    let btf = Btf::parse(&data)?;
    queries
        .iter()
        .map(|(name, path)| {
            let mut id = btf
                .struct_named(name)
                .ok_or_else(|| anyhow!("no struct {name}"))?;
            let mut offset = 0;
            for member in *path {
                let (bits, next) = btf
                    .member(id, member)
                    .ok_or_else(|| anyhow!("no member {member} in struct {name}"))?;
                offset += bits / 8;
                id = btf.resolve(next);
            }
            Ok(offset)
        })
        .collect()
}

/// Just enough of BTF's format (the kernel's `Documentation/bpf/btf.rst`)
/// to find a struct's members: the type table and the strings.
struct Btf<'a> {
    strings: &'a [u8],
    /// Each type's (name offset, info, size/type, its extra data).
    types: Vec<(u32, u32, u32, &'a [u8])>,
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Btf<'a>> {
        let u32_at = |at: usize| -> Result<u32> {
            let b = data
                .get(at..at + 4)
                .ok_or_else(|| anyhow!("truncated BTF"))?;
            Ok(u32::from_le_bytes(b.try_into().unwrap()))
        };
        if data.get(..2) != Some(&[0x9f, 0xeb]) {
            bail!("not little-endian BTF");
        }
        let header = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let strings = data
            .get(header + str_off..header + str_off + str_len)
            .ok_or_else(|| anyhow!("truncated BTF strings"))?;
        // Type id 0 is void: ids start at 1.
        let mut types = vec![(0, 0, 0, &data[..0])];
        let (mut at, end) = (header + type_off, header + type_off + type_len);
        while at < end {
            let (name, info, size) = (u32_at(at)?, u32_at(at + 4)?, u32_at(at + 8)?);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                1 | 14 | 17 => 4,     // int, var, decl tag
                3 => 12,              // array
                4 | 5 => 12 * vlen,   // struct, union: members
                6 | 13 => 8 * vlen,   // enum, function prototype
                15 | 19 => 12 * vlen, // datasec, enum64
                2 | 7..=12 | 16 | 18 => 0,
                _ => bail!("unknown BTF kind {kind}"),
            };
            let extra = data
                .get(at + 12..at + 12 + extra)
                .ok_or_else(|| anyhow!("truncated BTF types"))?;
            types.push((name, info, size, extra));
            at += 12 + extra.len();
        }
        Ok(Btf { strings, types })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    fn struct_named(&self, name: &str) -> Option<usize> {
        self.types.iter().position(|&(n, info, _, extra)| {
            (info >> 24) & 0x1f == KIND_STRUCT
                && !extra.is_empty()
                && self.name(n) == name.as_bytes()
        })
    }

    /// Member `name` of struct (or union) `id`: its offset in bits and
    /// its type. Members of anonymous structs and unions inside it are
    /// its own (`vm_area_struct.vm_start` is in one).
    fn member(&self, id: usize, name: &str) -> Option<(u64, usize)> {
        self.member_within(id, name, 4)
    }

    fn member_within(&self, id: usize, name: &str, depth: u32) -> Option<(u64, usize)> {
        let &(_, info, _, extra) = self.types.get(id)?;
        let bitfields = info >> 31 == 1;
        let members = extra.chunks_exact(12).map(|m| {
            let word = |i: usize| u32::from_le_bytes(m[i..i + 4].try_into().unwrap());
            let offset = if bitfields {
                word(8) & 0xff_ffff
            } else {
                word(8)
            };
            (word(0), u64::from(offset), word(4) as usize)
        });
        let mut anonymous = Vec::new();
        for (member, offset, ty) in members {
            if self.name(member) == name.as_bytes() {
                return Some((offset, ty));
            }
            if member == 0 {
                anonymous.push((offset, ty));
            }
        }
        if depth == 0 {
            return None;
        }
        anonymous.into_iter().find_map(|(offset, ty)| {
            let inner = self.resolve(ty);
            let kind = (self.types.get(inner)?.1 >> 24) & 0x1f;
            if kind != KIND_STRUCT && kind != KIND_UNION {
                return None;
            }
            let (at, ty) = self.member_within(inner, name, depth - 1)?;
            Some((offset + at, ty))
        })
    }

    /// Type `id` with typedefs and qualifiers looked through.
    fn resolve(&self, mut id: usize) -> usize {
        for _ in 0..16 {
            match self.types.get(id) {
                Some(&(_, info, next, _))
                    if matches!(
                        (info >> 24) & 0x1f,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = next as usize
                }
                _ => break,
            }
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_fs_base_of_a_task_in_the_running_kernel() {
        // x86-64 (6.x): `fsbase` follows thread_struct's tls_array (3
        // words), sp and the four 16-bit segment selectors.
        let offset = kernel_member_offset("task_struct", &["thread", "fsbase"]).unwrap();
        let thread = kernel_member_offset("task_struct", &["thread"]).unwrap();
        assert_eq!(offset - thread, 40);
        assert!(kernel_member_offset("task_struct", &["no_such_member"]).is_err());
    }

    #[test]
    fn finds_members_inside_anonymous_unions() {
        // vm_start and vm_end open vm_area_struct, inside an anonymous
        // struct inside an anonymous union (6.x).
        let offsets = kernel_member_offsets(&[
            ("vm_area_struct", &["vm_start"]),
            ("vm_area_struct", &["vm_end"]),
        ])
        .unwrap();
        assert_eq!(offsets, [0, 8]);
    }
}
