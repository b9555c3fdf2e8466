//! A task's files as the kernel has them: a word of a kernel struct
//! (`read_at`), a file's path walked through its dentries and mounts
//! (`path_of`), and the task-VMA iterator's kfuncs that `host.rs` builds
//! a process's module table with.
use aya_ebpf::{
    helpers::{
        bpf_probe_read_kernel, bpf_probe_read_kernel_buf, bpf_probe_read_kernel_str_bytes,
        generated as gen,
    },
    macros::map,
    maps::PerCpuArray,
};
use memprof_common::{host, programs};

use crate::layout;

/// `attach --all`: a file's path being walked, per CPU.
#[map]
static PATH_WALK: PerCpuArray<PathWalk> = PerCpuArray::with_max_entries(1, 0);

/// `file`'s path, as the kernel's `d_path` walks it (dentries up to
/// their mount's root, then the mount point in the parent mount), written
/// innermost component first, each NUL-terminated (userspace puts them
/// in order). Cut at [`host::PATH_COMPONENTS`] components. One step per
/// `bpf_loop` call: the verifier checks a step once, not once per
/// component.
#[inline(always)]
pub(crate) fn path_of(file: u64, path: &mut [u8; host::PATH_BYTES]) {
    let Some(walk) = PATH_WALK.get_ptr_mut(0) else {
        return;
    };
    let vfsmount = read_at(file, layout!(path_mnt));
    unsafe {
        *walk = PathWalk {
            vfsmount,
            dentry: read_at(file, layout!(path_dentry)),
            mount: vfsmount.wrapping_sub(u64::from(layout!(mount_mnt))),
            at: 0,
            path: [0; host::PATH_BYTES],
        };
        gen::bpf_loop(
            host::PATH_COMPONENTS as u32 * 2,
            path_step as *mut _,
            core::ptr::null_mut(),
            0,
        );
        let _ = bpf_probe_read_kernel_buf((*walk).path.as_ptr(), path);
    }
}

/// The walk of [`path_of`], per CPU.
pub(crate) struct PathWalk {
    vfsmount: u64,
    dentry: u64,
    mount: u64,
    at: u64,
    path: [u8; host::PATH_BYTES],
}

/// A kernel word at `base + offset` (0 if unreadable).
#[inline(always)]
pub(crate) fn read_at(base: u64, offset: u32) -> u64 {
    let at = (base as *const u8).wrapping_add(offset as usize);
    unsafe { bpf_probe_read_kernel(at as *const u64) }.unwrap_or(0)
}

/// One step of [`path_of`] (a `bpf_loop` callback): a component written,
/// or a mount crossed; 1 when the path is done.
extern "C" fn path_step(_index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let Some(walk) = PATH_WALK.get_ptr_mut(0) else {
        return 1;
    };
    let walk = unsafe { &mut *walk };
    if walk.dentry == 0 {
        return 1;
    }
    if walk.dentry == read_at(walk.vfsmount, layout!(vfsmount_root)) {
        // The root of its mount: on to where it is mounted.
        let parent = read_at(walk.mount, layout!(mount_parent));
        if parent == walk.mount || parent == 0 {
            return 1;
        }
        walk.dentry = read_at(walk.mount, layout!(mount_mountpoint));
        walk.mount = parent;
        walk.vfsmount = parent.wrapping_add(u64::from(layout!(mount_mnt)));
        return 0;
    }
    let parent = read_at(walk.dentry, layout!(dentry_parent));
    if parent == walk.dentry {
        return 1;
    }
    let name = read_at(walk.dentry, layout!(dentry_name));
    let at = walk.at as usize;
    let Some(dest) = walk.path.get_mut(at..at + host::PATH_COMPONENT) else {
        return 1;
    };
    match unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, dest) } {
        Ok(bytes) => walk.at = (at + bytes.len() + 1) as u64,
        Err(_) => return 1,
    }
    walk.dentry = parent;
    0
}

/// The task-VMA iterator's kfuncs, called by placeholder helper numbers
/// that userspace rewrites (as `bpf_session_is_return`): `new` returns
/// 0 when the process's memory map could be read.
#[inline(always)]
pub(crate) fn vma_iter_new(iter: u64, task: u64) -> i64 {
    let r: i64;
    unsafe {
        core::arch::asm!(
            "call {n}",
            n = const programs::ITER_TASK_VMA_NEW,
            inlateout("r1") iter => _,
            inlateout("r2") task => _,
            inlateout("r3") 0u64 => _,
            lateout("r0") r,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
    r
}

#[inline(always)]
pub(crate) fn vma_iter_next(iter: u64) -> u64 {
    let r: u64;
    unsafe {
        core::arch::asm!(
            "call {n}",
            n = const programs::ITER_TASK_VMA_NEXT,
            inlateout("r1") iter => _,
            lateout("r0") r,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
    r
}

#[inline(always)]
pub(crate) fn vma_iter_destroy(iter: u64) {
    unsafe {
        core::arch::asm!(
            "call {n}",
            n = const programs::ITER_TASK_VMA_DESTROY,
            inlateout("r1") iter => _,
            lateout("r0") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
}
