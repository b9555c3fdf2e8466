//! The running kernel's own types, from its BTF
//! (`/sys/kernel/btf/vmlinux`): where a member sits in a kernel struct, for
//! the programs that read `task_struct` and `vm_area_struct`.
use std::path::Path;

use anyhow::{anyhow, bail, Result};

/// The byte offset of `path` (nested members) in kernel struct `name`,
/// from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
pub fn kernel_member_offset(name: &str, path: &[&str]) -> Result<u64> {
    Ok(kernel_member_offsets(&[(name, path)])?[0])
}

/// [`kernel_member_offset`] of each `(struct, path)`, the BTF read once.
pub fn kernel_member_offsets(queries: &[(&str, &[&str])]) -> Result<Vec<u64>> {
    let data = std::fs::read(Path::new("/sys/kernel/btf/vmlinux"))?;
    member_offsets(&data, queries)
}

/// [`kernel_member_offsets`] in the BTF `data` (the fuzz target's entry:
/// `crate::fuzzing`).
pub fn member_offsets(data: &[u8], queries: &[(&str, &[&str])]) -> Result<Vec<u64>> {
    let btf = Btf::parse(data)?;
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
