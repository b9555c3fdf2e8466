//! What the running kernel offers memprof's probes, found once per memprof
//! process, and the one place every fallback is chosen from.
//!
//! memprof runs on Debian 12's Linux 6.1 and 6.12 as on newer kernels;
//! three features it prefers are younger than some of them:
//!
//! | feature | since | without it |
//! |---|---|---|
//! | multi-uprobe links (`BPF_TRACE_UPROBE_MULTI`) | 6.6 | one perf event per probe (`classic.rs`): ~0.1 s each to detach |
//! | uprobe sessions (`bpf_session_is_return` in uprobe programs) | 6.13 | every allocation's return is probed |
//! | the task-VMA iterator kfuncs (`bpf_iter_task_vma_*`) | 6.7 | `attach --all`: a new process's first module table waits for userspace's reading of /proc |
//!
//! Each is tested the cheapest reliable way, quietly (an absent feature is
//! no error): a two-instruction program loaded with the attach type the
//! feature needs, and for multi-uprobes a link made on an empty
//! memory file too (Linux 6.1 loads a program with that attach type, and
//! only refuses the link); the kfuncs by name in the kernel's BTF.
//!
//! For memprof's developers, `MEMPROF_KERNEL_FEATURES=-multi_uprobe,
//! -uprobe_session,-task_vma_iter` (any of them) turns features off, so the
//! fallbacks run on a new kernel too (docs/development.md).
//!
//! `memprof probes` and `--verbose` print [`KernelFeatures::summary`]; on
//! Debian 12's Linux 6.1:
//!
//! ```text
//! kernel 6.1.0-31-amd64: multi-uprobes no (classic uprobes, ~0.1 s each to detach),
//! uprobe sessions no (every allocation's return probed), task-VMA iterator no
//! (attach --all: /proc read for new processes)
//! ```
use std::collections::HashMap;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn};
use memprof_common::programs;

use super::syscall::{bpf, uprobe_program_attr, BPF_TRACE_UPROBE_SESSION};

/// The environment variable that turns features off (for tests of the
/// fallbacks on a kernel that has them all).
pub const FEATURES_VARIABLE: &str = "MEMPROF_KERNEL_FEATURES";

/// The names [`FEATURES_VARIABLE`] takes, each after a `-`.
const FEATURE_NAMES: [&str; 3] = ["multi_uprobe", "uprobe_session", "task_vma_iter"];

/// What the running kernel can do for memprof (see the module's table).
#[derive(Debug, Clone)]
pub struct KernelFeatures {
    /// The kernel's release (`uname -r`).
    pub release: String,
    /// Multi-uprobe links (Linux 6.6): else classic uprobes, a perf event each.
    pub multi_uprobe: bool,
    /// Uprobe sessions (Linux 6.13; implies `multi_uprobe`, whose links
    /// they are): else the entry/return pair.
    pub uprobe_session: bool,
    /// The task-VMA iterator kfuncs (Linux 6.7): else the kernel builds
    /// no module table of its own (`attach --all`).
    pub task_vma_iter: bool,
    /// Features [`FEATURES_VARIABLE`] turned off.
    pub turned_off: Vec<&'static str>,
    /// The BTF id of each kfunc the programs call ([`programs::KFUNCS`]),
    /// by placeholder number; absent: the kernel lacks it (or it is
    /// turned off).
    kfunc_ids: HashMap<u32, u32>,
}

/// The running kernel's features, found at the first call.
pub fn kernel() -> &'static KernelFeatures {
    static FEATURES: OnceLock<KernelFeatures> = OnceLock::new();
    FEATURES.get_or_init(|| {
        let off = std::env::var(FEATURES_VARIABLE).unwrap_or_default();
        KernelFeatures::probe().turn_off(&off)
    })
}

/// How a placeholder kfunc call of the programs is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KfuncLink {
    /// A call of the kfunc of this BTF id.
    Call(u32),
    /// `r0 = value` in place of the call: the kernel lacks the kfunc, and
    /// this is what the program reads as "not available".
    Returns(i32),
}

impl KernelFeatures {
    /// Tests the running kernel.
    fn probe() -> KernelFeatures {
        // The link (~10 ms here) is made while the BTF is read (~40 ms).
        let (kfunc_ids, multi_uprobe) = std::thread::scope(|s| {
            let multi = signals_blocked(|| s.spawn(multi_uprobe_links));
            (kfunc_ids(), multi.join().unwrap_or(false))
        });
        let has = |placeholder: u32| kfunc_ids.contains_key(&placeholder);
        let task_vma_iter = has(programs::ITER_TASK_VMA_NEW)
            && has(programs::ITER_TASK_VMA_NEXT)
            && has(programs::ITER_TASK_VMA_DESTROY);
        let uprobe_session = multi_uprobe
            && kfunc_ids
                .get(&programs::SESSION_IS_RETURN)
                .is_some_and(|&id| session_program_loads(id));
        KernelFeatures {
            release: release(),
            multi_uprobe,
            uprobe_session,
            task_vma_iter,
            turned_off: Vec::new(),
            kfunc_ids,
        }
    }

    /// These features less those `spec` turns off (`-name,-name`); a
    /// name it does not know is said once on stderr.
    fn turn_off(mut self, spec: &str) -> KernelFeatures {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let name = item.strip_prefix('-').unwrap_or(item);
            match FEATURE_NAMES.iter().find(|n| **n == name) {
                Some(known) if item.starts_with('-') => self.turned_off.push(known),
                _ => {
                    eprintln!(
                        "memprof: {FEATURES_VARIABLE}: `{item}` ignored (it takes -{})",
                        FEATURE_NAMES.join(", -")
                    );
                }
            }
        }
        let off = |name: &str| self.turned_off.contains(&name);
        let (no_multi, no_session, no_iter) = (
            off("multi_uprobe"),
            off("uprobe_session"),
            off("task_vma_iter"),
        );
        if no_multi {
            self.multi_uprobe = false;
        }
        // A session is a multi-uprobe link.
        if no_session || no_multi {
            self.uprobe_session = false;
            self.kfunc_ids.remove(&programs::SESSION_IS_RETURN);
        }
        if no_iter {
            self.task_vma_iter = false;
            for placeholder in [
                programs::ITER_TASK_VMA_NEW,
                programs::ITER_TASK_VMA_NEXT,
                programs::ITER_TASK_VMA_DESTROY,
            ] {
                self.kfunc_ids.remove(&placeholder);
            }
        }
        self
    }

    /// How the programs' placeholder call `placeholder` is linked here;
    /// `None`: the kernel lacks a kfunc the program cannot do without.
    pub(super) fn kfunc(&self, placeholder: u32) -> Option<KfuncLink> {
        if let Some(&id) = self.kfunc_ids.get(&placeholder) {
            return Some(KfuncLink::Call(id));
        }
        // Without the iterator, `new` fails as a kernel without it would
        // (-ENOSYS: the program counts the table as not built, and
        // userspace's reading of /proc gives one), `next` ends the walk
        // and `destroy` does nothing.
        match placeholder {
            programs::ITER_TASK_VMA_NEW => Some(KfuncLink::Returns(-libc::ENOSYS)),
            programs::ITER_TASK_VMA_NEXT | programs::ITER_TASK_VMA_DESTROY => {
                Some(KfuncLink::Returns(0))
            }
            _ => None,
        }
    }

    /// What a profile records of it.
    pub fn info(&self) -> crate::profile::KernelInfo {
        crate::profile::KernelInfo {
            release: self.release.clone(),
            multi_uprobe: self.multi_uprobe,
            uprobe_session: self.uprobe_session,
            task_vma_iter: self.task_vma_iter,
        }
    }

    /// One line: the kernel, and what each feature's absence costs.
    pub fn summary(&self) -> String {
        let yes_no = |on: bool| if on { "yes" } else { "no" };
        let mut line = format!(
            "kernel {}: multi-uprobes {}{}, uprobe sessions {}{}, task-VMA iterator {}{}",
            self.release,
            yes_no(self.multi_uprobe),
            match self.multi_uprobe {
                true => "",
                false => " (classic uprobes, ~0.1 s each to detach)",
            },
            yes_no(self.uprobe_session),
            match self.uprobe_session {
                true => "",
                false => " (every allocation's return probed)",
            },
            yes_no(self.task_vma_iter),
            match self.task_vma_iter {
                true => "",
                false => " (attach --all: /proc read for new processes)",
            },
        );
        if !self.turned_off.is_empty() {
            line += &format!(
                "; turned off by {FEATURES_VARIABLE}: {}",
                self.turned_off.join(", ")
            );
        }
        line
    }
}

/// Runs `spawn` (which starts a thread) with every signal blocked, so the
/// thread starts with them blocked: this may run before the driver blocks
/// SIGINT and SIGTERM to take them synchronously, and a thread that left
/// them open would take a Ctrl-C's default action, ending memprof with
/// its target's probes still attached.
fn signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    // SAFETY: plain data, then the calling thread's own mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // A fault's signal blocked would end memprof at once.
        for fault in [libc::SIGBUS, libc::SIGSEGV, libc::SIGILL, libc::SIGFPE] {
            libc::sigdelset(&mut all, fault);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut before);
        let spawned = spawn();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        spawned
    }
}

/// `uname -r`.
fn release() -> String {
    // SAFETY: plain data, filled by the call.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid utsname to write.
    if unsafe { libc::uname(&mut name) } != 0 {
        return "(unknown)".to_string();
    }
    // SAFETY: the kernel wrote a NUL-terminated string there.
    let release = unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) };
    release.to_string_lossy().into_owned()
}

/// The BTF ids of the kfuncs the programs call, those the kernel has.
fn kfunc_ids() -> HashMap<u32, u32> {
    let Ok(btf) = aya_obj::btf::Btf::from_sys_fs() else {
        return HashMap::new();
    };
    programs::KFUNCS
        .iter()
        .filter_map(|&(placeholder, name)| {
            let id = btf
                .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
                .ok()?;
            Some((placeholder, id))
        })
        .collect()
}

/// `r0 = 0; exit`.
const RETURN_0: [bpf_insn; 2] = [
    // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm 0
    insn(0xb7, 0, 0),
    // BPF_JMP | BPF_EXIT
    insn(0x95, 0, 0),
];

/// An instruction of `code` with `src_reg` (dst r0) and `imm`.
const fn insn(code: u8, src_reg: u8, imm: i32) -> bpf_insn {
    bpf_insn {
        code,
        _bitfield_align_1: [],
        // dst_reg in the low nibble, src_reg in the high one.
        _bitfield_1: aya_obj::generated::__BindgenBitfieldUnit::new([src_reg << 4]),
        off: 0,
        imm,
    }
}

/// Loads `instructions` as a uprobe program (`BPF_PROG_TYPE_KPROBE`)
/// with `expected_attach_type`; the kernel's errno if it refuses.
fn load_tiny(instructions: &[bpf_insn], expected_attach_type: u32) -> std::io::Result<OwnedFd> {
    let mut attr = uprobe_program_attr(instructions, expected_attach_type);
    bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

/// Whether a multi-uprobe link can be made: the program loads (Linux
/// 6.1 loads it too) and the link is made on an empty-but-for-a-`nop`
/// memory file no process maps (6.1 refuses it, EINVAL). The link is
/// closed on a thread of its own: closing it waits for a grace period.
fn multi_uprobe_links() -> bool {
    let multi = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    let Ok(program) = load_tiny(&RETURN_0, multi) else {
        return false;
    };
    let Some(file) = memory_file() else {
        return false;
    };
    let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap_or_default();
    let (offsets, cookies) = ([0u64], [0u64]);
    // SAFETY: plain data; all-zero is the kernel's "unset".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the union members BPF_LINK_CREATE reads for uprobe_multi.
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
    link.attach_type = multi;
    let m = unsafe { &mut link.__bindgen_anon_3.uprobe_multi };
    m.path = path.as_ptr() as u64;
    m.offsets = offsets.as_ptr() as u64;
    m.cookies = cookies.as_ptr() as u64;
    m.cnt = 1;
    match bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr) {
        Ok(link) => {
            signals_blocked(|| std::thread::spawn(move || drop((link, program, file))));
            true
        }
        Err(_) => false,
    }
}

/// A memory file holding one `nop`: a file to make a link on that no
/// process maps, so no breakpoint is ever written.
fn memory_file() -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated name; the flags are memfd_create's.
    let fd = unsafe { libc::memfd_create(c"memprof-probe".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(&[0x90; 16]).ok()?;
    Some(file.into())
}

/// Whether a uprobe-session program calling `bpf_session_is_return` (BTF
/// id `id`) loads: Linux 6.13 (6.12 has the kfunc for kprobe sessions
/// only, and refuses it here).
fn session_program_loads(id: u32) -> bool {
    const BPF_CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
    let program = [
        insn(BPF_CALL, BPF_PSEUDO_KFUNC_CALL, id as i32),
        RETURN_0[0],
        RETURN_0[1],
    ];
    load_tiny(&program, BPF_TRACE_UPROBE_SESSION).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn everything() -> KernelFeatures {
        KernelFeatures {
            release: "6.18.0".to_string(),
            multi_uprobe: true,
            uprobe_session: true,
            task_vma_iter: true,
            turned_off: Vec::new(),
            kfunc_ids: programs::KFUNCS
                .iter()
                .enumerate()
                .map(|(i, &(placeholder, _))| (placeholder, 100 + i as u32))
                .collect(),
        }
    }

    #[test]
    fn the_variable_turns_features_off() {
        let k = everything().turn_off("-multi_uprobe, -task_vma_iter");
        assert!(!k.multi_uprobe && !k.task_vma_iter);
        // A session is a multi-uprobe link: off with them.
        assert!(!k.uprobe_session);
        assert_eq!(k.kfunc(programs::SESSION_IS_RETURN), None);
        assert_eq!(k.turned_off, ["multi_uprobe", "task_vma_iter"]);
        let k = everything().turn_off("-uprobe_session,bogus");
        assert!(k.multi_uprobe && !k.uprobe_session && k.task_vma_iter);
        let k = everything().turn_off("");
        assert!(k.multi_uprobe && k.uprobe_session && k.task_vma_iter);
    }

    #[test]
    fn without_the_iterator_its_calls_return_what_the_program_expects() {
        let k = everything();
        assert_eq!(
            k.kfunc(programs::ITER_TASK_VMA_NEW),
            Some(KfuncLink::Call(101))
        );
        let k = k.turn_off("-task_vma_iter");
        assert_eq!(
            k.kfunc(programs::ITER_TASK_VMA_NEW),
            Some(KfuncLink::Returns(-38))
        );
        assert_eq!(
            k.kfunc(programs::ITER_TASK_VMA_NEXT),
            Some(KfuncLink::Returns(0))
        );
        assert_eq!(
            k.kfunc(programs::ITER_TASK_VMA_DESTROY),
            Some(KfuncLink::Returns(0))
        );
        assert_eq!(
            k.kfunc(programs::SESSION_IS_RETURN),
            Some(KfuncLink::Call(100))
        );
    }

    #[test]
    fn the_summary_says_what_each_absence_costs() {
        let all = everything().summary();
        assert_eq!(
            all,
            "kernel 6.18.0: multi-uprobes yes, uprobe sessions yes, task-VMA iterator yes"
        );
        let none = everything()
            .turn_off("-multi_uprobe,-task_vma_iter")
            .summary();
        assert!(none.contains("multi-uprobes no (classic uprobes"), "{none}");
        assert!(
            none.contains("uprobe sessions no (every allocation's return probed)"),
            "{none}"
        );
        assert!(
            none.ends_with("turned off by MEMPROF_KERNEL_FEATURES: multi_uprobe, task_vma_iter"),
            "{none}"
        );
    }
}
