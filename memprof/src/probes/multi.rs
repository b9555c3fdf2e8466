//! The uprobe programs, loaded for the links the kernel has, and the
//! multi-uprobe links.
//!
//! A uprobe attached through a perf event costs the kernel ~0.1 s to
//! detach, and the detaches are serialized (`event_mutex`): 20–35 probes
//! made every session end 2–4 s late. A multi-uprobe link
//! (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6) attaches one program at many
//! offsets of one file, with a cookie each, and detaches them all with one
//! grace period. aya 0.14 neither loads programs for it (the expected
//! attach type is fixed at load) nor creates such links, so both are raw
//! `bpf(2)` calls here, on the instructions aya's own object parser
//! (`aya-obj`, the crate aya loads with) relocates against the maps aya
//! created. On a kernel without them (Linux < 6.6, [`super::kernel`]) the
//! same programs are loaded for perf events instead (expected attach
//! type 0) and attached by `classic.rs`. A program the verifier refuses
//! is explained by `verifier.rs`.
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::Map;
use aya::Ebpf;
use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, BPF_DW, BPF_F_UPROBE_MULTI_RETURN, BPF_IMM,
    BPF_LD, BPF_PSEUDO_FUNC,
};
use memprof_common::programs;

use super::kernel::{kernel, KfuncLink};
use super::syscall::{bpf, uprobe_program_attr, BPF_TRACE_UPROBE_SESSION};

/// The eBPF object's programs, relocated once, loaded on first use.
pub(super) struct Programs {
    object: aya_obj::Object,
    loaded: HashMap<String, OwnedFd>,
    /// The object's BTF, loaded into the kernel for the first program that
    /// hands a helper a callback (the verifier wants its functions' BTF).
    btf: Option<OwnedFd>,
}

impl Programs {
    /// Parses `object` and points its map references at the maps `ebpf`
    /// created from the same bytes.
    pub(super) fn new(object: &[u8], ebpf: &Ebpf) -> Result<Programs> {
        let mut parsed = aya_obj::Object::parse(object).context("parsing the eBPF object")?;
        // As aya fixes it before loading it (this kernel has every feature).
        let features =
            aya_obj::btf::BtfFeatures::new(true, true, true, true, true, true, true, true);
        parsed
            .fixup_and_sanitize_btf(&features)
            .map_err(|e| anyhow!("preparing the eBPF object's BTF: {e}"))?;
        let fds: HashMap<&str, RawFd> = ebpf
            .maps()
            .filter_map(|(name, map)| Some((name, map_fd(map)?)))
            .collect();
        let text_sections = parsed
            .functions
            .keys()
            .map(|(section, _)| *section)
            .collect();
        let maps: Vec<(String, RawFd, aya_obj::Map)> = parsed
            .maps
            .iter()
            .filter_map(|(name, map)| Some((name.clone(), *fds.get(name.as_str())?, map.clone())))
            .collect();
        parsed
            .relocate_maps(
                maps.iter().map(|(name, fd, map)| (name.as_str(), *fd, map)),
                &text_sections,
            )
            .map_err(|e| anyhow!("relocating the eBPF object's map references: {e}"))?;
        parsed
            .relocate_calls(&text_sections)
            .map_err(|e| anyhow!("relocating the eBPF object's calls: {e}"))?;
        Ok(Programs {
            object: parsed,
            loaded: HashMap::new(),
            btf: None,
        })
    }

    /// The object's BTF in the kernel (loaded once).
    fn btf_fd(&mut self) -> Result<RawFd> {
        if let Some(fd) = &self.btf {
            return Ok(fd.as_raw_fd());
        }
        let btf = self
            .object
            .btf
            .as_ref()
            .ok_or_else(|| anyhow!("the eBPF object has no BTF"))?
            .to_bytes();
        // SAFETY: plain data; all-zero is the kernel's "unset".
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        let u = unsafe { &mut attr.__bindgen_anon_7 };
        u.btf = btf.as_ptr() as u64;
        u.btf_size = btf.len() as u32;
        let fd = bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr).context("loading the eBPF object's BTF")?;
        let raw = fd.as_raw_fd();
        self.btf = Some(fd);
        Ok(raw)
    }

    /// The descriptor of program `name`, loaded (verified) the first time.
    pub(super) fn get(&mut self, name: &str) -> Result<RawFd> {
        if let Some(fd) = self.loaded.get(name) {
            return Ok(fd.as_raw_fd());
        }
        let program = self
            .object
            .programs
            .get(name)
            .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?;
        let key = program.function_key();
        // A program that passes a callback (`bpf_for_each_map_elem`) is
        // loaded with its functions' BTF, which the verifier then requires.
        let function = &self.object.functions[&key];
        let btf = if passes_callback(&function.instructions) {
            Some(self.btf_fd()?)
        } else {
            None
        };
        let function = &self.object.functions[&key];
        let btf = btf.map(|fd| FuncInfo {
            btf: fd,
            bytes: function.func_info.func_info_bytes(),
            count: function.func_info.len() as u32,
            record_size: function.func_info_rec_size as u32,
        });
        let mut instructions = function.instructions.clone();
        link_kfuncs(&mut instructions, |placeholder| kernel().kfunc(placeholder))?;
        let fd = load(
            name,
            &instructions,
            expected_attach_type(name)?,
            btf.as_ref(),
        )?;
        let raw = fd.as_raw_fd();
        self.loaded.insert(name.to_string(), fd);
        Ok(raw)
    }
}

/// The attach type program `name` is loaded for: the session program's
/// own; else multi-uprobe links where the kernel has them, or perf
/// events (0, classic uprobes).
fn expected_attach_type(name: &str) -> Result<u32> {
    if name == programs::ALLOC_SESSION {
        if !kernel().uprobe_session {
            bail!("program {name} needs uprobe sessions (Linux 6.13), which this kernel lacks");
        }
        return Ok(BPF_TRACE_UPROBE_SESSION);
    }
    Ok(match kernel().multi_uprobe {
        true => bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        false => 0,
    })
}

/// Where a probe fires.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub(super) enum Attach {
    /// At returns (first in this order: see `Probes::attach`).
    Return,
    /// At entries and, where the entry asks, at the returns of the same
    /// calls (`BPF_TRACE_UPROBE_SESSION`, Linux 6.13; never chosen
    /// without [`super::KernelFeatures::uprobe_session`]).
    Session,
    /// At function entries.
    Entry,
}

/// Rewrites the placeholder helper calls of kfuncs
/// ([`programs::KFUNCS`]: `bpf_session_is_return()`, the task-VMA
/// iterator) as `link` says: into calls of the kfuncs, by the running
/// kernel's BTF ids, or, for a kfunc the kernel lacks and the program can
/// do without, into `r0 = value` (see [`super::KernelFeatures::kfunc`]).
/// Returns how many calls were rewritten.
fn link_kfuncs(
    instructions: &mut [bpf_insn],
    link: impl Fn(u32) -> Option<KfuncLink>,
) -> Result<usize> {
    const BPF_CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    const BPF_MOV64_IMM: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
    let mut patched = 0;
    for insn in instructions.iter_mut() {
        let placeholder = insn.imm as u32;
        let Some(&(_, name)) = programs::KFUNCS.iter().find(|(n, _)| *n == placeholder) else {
            continue;
        };
        if insn.code != BPF_CALL || insn.src_reg() != 0 {
            continue;
        }
        match link(placeholder) {
            Some(KfuncLink::Call(id)) => {
                insn.set_src_reg(BPF_PSEUDO_KFUNC_CALL);
                insn.imm = id as i32;
            }
            // The call's other effect, r1-r5 clobbered, the compiled code
            // already assumes: it reads none of them after.
            Some(KfuncLink::Returns(value)) => {
                insn.code = BPF_MOV64_IMM;
                insn.set_dst_reg(0);
                insn.set_src_reg(0);
                insn.off = 0;
                insn.imm = value;
            }
            None => bail!("the kernel has no kfunc {name}"),
        }
        patched += 1;
    }
    Ok(patched)
}

/// The descriptor of a map, whatever its type.
fn map_fd(map: &Map) -> Option<RawFd> {
    Some(super::map_data(map)?.fd().as_fd().as_raw_fd())
}

/// A program's functions as its BTF describes them ([`load`]).
struct FuncInfo {
    btf: RawFd,
    bytes: Vec<u8>,
    count: u32,
    record_size: u32,
}

/// Whether `instructions` load a function's address (`BPF_PSEUDO_FUNC`): a
/// callback handed to a helper.
fn passes_callback(instructions: &[bpf_insn]) -> bool {
    instructions.iter().any(|i| {
        i.code == (BPF_LD | BPF_IMM | BPF_DW) as u8 && i.src_reg() == BPF_PSEUDO_FUNC as u8
    })
}

/// Loads one uprobe program with `expected_attach_type`. A refusal by the
/// verifier says why (`verifier.rs`).
fn load(
    name: &str,
    instructions: &[bpf_insn],
    expected_attach_type: u32,
    funcs: Option<&FuncInfo>,
) -> Result<OwnedFd> {
    let prog_name = CString::new(name.chars().take(15).collect::<String>())?;
    let attempt = |log_level: u32, log: &mut [u8]| {
        let mut attr = uprobe_program_attr(instructions, expected_attach_type);
        let u = unsafe { &mut attr.__bindgen_anon_3 };
        if let Some(f) = funcs {
            u.prog_btf_fd = f.btf as u32;
            u.func_info = f.bytes.as_ptr() as u64;
            u.func_info_cnt = f.count;
            u.func_info_rec_size = f.record_size;
        }
        for (dst, src) in u.prog_name.iter_mut().zip(prog_name.as_bytes_with_nul()) {
            *dst = *src as libc::c_char;
        }
        if log_level > 0 {
            u.log_level = log_level;
            u.log_buf = log.as_mut_ptr() as u64;
            u.log_size = log.len() as u32;
        }
        bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    // For memprof's developers: how hard the verifier worked (log level 4: statistics).
    let stats = std::env::var_os("MEMPROF_VERIFIER_STATS").is_some();
    let mut log = vec![0u8; if stats { 1 << 16 } else { 0 }];
    match attempt(if stats { 4 } else { 0 }, &mut log) {
        Ok(fd) => {
            if stats {
                let text = String::from_utf8_lossy(&log);
                let text = text.trim_end_matches('\0').replace('\n', "; ");
                eprintln!("memprof: program {name}: {text}");
            }
            Ok(fd)
        }
        Err(first) if first.raw_os_error() == Some(libc::EPERM) => Err(first.into()),
        Err(first) => super::verifier::explain_refusal(name, first, attempt),
    }
}

/// One multi-uprobe link: `program` at `offsets` of the file at `path`
/// (each with its cookie), for process `pid` only. Closing the descriptor
/// detaches every offset.
pub(super) fn attach(
    program: RawFd,
    path: &Path,
    probes: &[(u64, u64)],
    pid: u32,
    how: Attach,
) -> Result<OwnedFd> {
    if probes.is_empty() {
        bail!("no offsets to attach");
    }
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(path.as_os_str().as_bytes())?;
    let offsets: Vec<u64> = probes.iter().map(|&(offset, _)| offset).collect();
    let cookies: Vec<u64> = probes.iter().map(|&(_, cookie)| cookie).collect();
    // SAFETY: plain data; all-zero is the kernel's "unset".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = program as u32;
    link.attach_type = match how {
        Attach::Session => BPF_TRACE_UPROBE_SESSION,
        Attach::Entry | Attach::Return => bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
    };
    let multi = unsafe { &mut link.__bindgen_anon_3.uprobe_multi };
    multi.path = path.as_ptr() as u64;
    multi.offsets = offsets.as_ptr() as u64;
    multi.cookies = cookies.as_ptr() as u64;
    multi.cnt = offsets.len() as u32;
    multi.flags = if how == Attach::Return {
        BPF_F_UPROBE_MULTI_RETURN
    } else {
        0
    };
    multi.pid = pid;
    Ok(bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A helper call of number `imm`.
    fn call(imm: u32) -> bpf_insn {
        // SAFETY: plain data.
        let mut insn: bpf_insn = unsafe { std::mem::zeroed() };
        insn.code = 0x85;
        insn.imm = imm as i32;
        insn
    }

    #[test]
    fn kfunc_calls_are_linked_or_stubbed() {
        let mut instructions = [
            call(programs::SESSION_IS_RETURN),
            call(programs::ITER_TASK_VMA_NEW),
            call(programs::ITER_TASK_VMA_NEXT),
            call(1), // bpf_map_lookup_elem: left alone
        ];
        let linked = link_kfuncs(&mut instructions, |placeholder| match placeholder {
            programs::SESSION_IS_RETURN => Some(KfuncLink::Call(77)),
            programs::ITER_TASK_VMA_NEW => Some(KfuncLink::Returns(-38)),
            _ => Some(KfuncLink::Returns(0)),
        })
        .unwrap();
        assert_eq!(linked, 3);
        let [session, new, next, helper] = instructions;
        assert_eq!(
            (session.code, session.src_reg(), session.imm),
            (0x85, 2, 77)
        );
        // `r0 = -38`, `r0 = 0`: mov64 with an immediate, into r0.
        assert_eq!(
            (new.code, new.dst_reg(), new.src_reg(), new.imm),
            (0xb7, 0, 0, -38)
        );
        assert_eq!((next.code, next.dst_reg(), next.imm), (0xb7, 0, 0));
        assert_eq!((helper.code, helper.src_reg(), helper.imm), (0x85, 0, 1));
    }

    #[test]
    fn a_missing_kfunc_the_program_needs_is_an_error() {
        let mut instructions = [call(programs::SESSION_IS_RETURN)];
        let err = link_kfuncs(&mut instructions, |_| None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the kernel has no kfunc bpf_session_is_return"
        );
    }
}
