//! Opening a file of the target's as the target sees it.
//!
//! A path from `/proc/PID/maps` (or `.interp`, or `/proc/PID/exe`) names a
//! file in the target's mount namespace: in a container, or under a file
//! bind-mounted over another, the same path in memprof's namespace is
//! another file, or none. A file the target maps may also have been
//! deleted or replaced on disk since. So a file is opened, first that works:
//!
//! 1. through one of the target's mappings of it,
//!    `/proc/PID/map_files/START-END`: the very inode the target maps
//!    (the file of an overlay, a deleted or replaced file alike; needs
//!    CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE);
//! 2. `/proc/PID/exe` for the executable;
//! 3. the path resolved inside the target's root (`/proc/PID/root`,
//!    symbolic links included, with `openat2(RESOLVE_IN_ROOT)`);
//! 4. the path itself, only when the target shares memprof's mount
//!    namespace (what it names is then the same for both).
//!
//! Every path is opened with [`open_regular`]: without blocking and only as
//! a regular file (checked on the descriptor), so that a FIFO or a device
//! a user put at the path cannot hold memprof up.
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::maps::{self, Mapping};

/// Whose files a [`super::ModuleCache`] opens.
#[derive(Debug, Clone)]
pub(super) struct Process {
    pub pid: u32,
    /// Its executable's path (without " (deleted)").
    exe: Option<PathBuf>,
    /// Whether it shares memprof's mount namespace (read once: the answer
    /// is needed after it exited too).
    same_mounts: bool,
}

impl Process {
    pub fn new(pid: u32) -> Process {
        let ns = |p: &str| {
            std::fs::metadata(p).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
        };
        let theirs = ns(&format!("/proc/{pid}/ns/mnt"));
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| strip_deleted(&p));
        Process {
            pid,
            exe,
            same_mounts: theirs.is_some() && theirs == ns("/proc/self/ns/mnt"),
        }
    }

    /// Opens the target's `path`, `mapping` (one of its mappings of it) or
    /// the first mapping of it found now (see the module docs for the order).
    pub fn open(&self, path: &Path, mapping: Option<&Mapping>) -> io::Result<File> {
        let pid = self.pid;
        let found;
        let mapping = match mapping {
            Some(m) => Some(m),
            None => {
                found = maps::read(pid).ok().and_then(|all| {
                    all.into_iter()
                        .filter(|m| m.path == path)
                        .min_by_key(|m| m.file_offset)
                });
                found.as_ref()
            }
        };
        let mut first_error = None;
        let mut attempt = |result: io::Result<File>| match result {
            Ok(file) => Some(file),
            Err(e) => {
                first_error.get_or_insert(e);
                None
            }
        };
        if let Some(m) = mapping {
            let via = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            if let Some(file) = attempt(open_regular(Path::new(&via))) {
                return Ok(file);
            }
        }
        if self.exe.as_deref() == Some(path) {
            if let Some(file) = attempt(open_regular(Path::new(&format!("/proc/{pid}/exe")))) {
                return Ok(file);
            }
        }
        if let Some(file) = attempt(open_in_root(pid, path)) {
            return Ok(file);
        }
        if self.same_mounts {
            if let Some(file) = attempt(open_regular(path)) {
                return Ok(file);
            }
        }
        Err(first_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
    }
}

/// A path of `/proc/PID/maps` or `/proc/PID/exe` without the " (deleted)"
/// the kernel appends to a file removed since it was mapped.
pub fn strip_deleted(path: &Path) -> PathBuf {
    let bytes = path.as_os_str().as_bytes();
    let kept = bytes.strip_suffix(b" (deleted)").unwrap_or(bytes);
    PathBuf::from(std::ffi::OsStr::from_bytes(kept))
}

/// Opens `path` as process `pid` would resolve it: inside its root, where an
/// absolute symbolic link stays (`openat2` with `RESOLVE_IN_ROOT`).
pub fn open_in_root(pid: u32, path: &Path) -> io::Result<File> {
    let root = File::open(format!("/proc/{pid}/root"))?;
    let relative = path.strip_prefix("/").unwrap_or(path);
    let name = std::ffi::CString::new(relative.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    /// `struct open_how` (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        // O_NONBLOCK: a FIFO put at the path cannot hold memprof up.
        flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    use std::os::fd::AsRawFd;
    // SAFETY: `name` and `how` outlive the call; the size is `how`'s own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    regular(File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// Opens `path` for reading without blocking (a FIFO opened for reading
/// would wait for a writer) and only if it is a regular file, as the
/// descriptor says (the name may change between a check and an open).
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    regular(file)
}

/// `file` if it is a regular file; else an error that says what it is.
fn regular(file: File) -> io::Result<File> {
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}, not read"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn inode(file: &File) -> (u64, u64) {
        let m = file.metadata().unwrap();
        (m.dev(), m.ino())
    }

    #[test]
    fn opens_this_process_files_each_way() {
        let me = Process::new(std::process::id());
        assert!(me.same_mounts);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let expected = inode(&File::open(&exe).unwrap());
        assert_eq!(inode(&me.open(&exe, None).unwrap()), expected);
        assert_eq!(
            inode(&open_in_root(std::process::id(), &exe).unwrap()),
            expected
        );
        assert!(me.open(Path::new("/no/such/file"), None).is_err());
    }

    #[test]
    fn strips_deleted() {
        assert_eq!(
            strip_deleted(Path::new("/tmp/a b (deleted)")),
            PathBuf::from("/tmp/a b")
        );
        assert_eq!(strip_deleted(Path::new("/tmp/a")), PathBuf::from("/tmp/a"));
    }
}
