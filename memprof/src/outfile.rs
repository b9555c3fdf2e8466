//! Output files (profiles, snapshots, reports) written whole or not at all,
//! safe for root to write in a directory other users can write to.
//!
//! The bytes go to a new, unnamed file in the destination's directory
//! (`O_TMPFILE`): there is no name on which to plant a link, and nothing is
//! left behind if memprof dies, even by SIGKILL. Only [`OutFile::commit`]
//! gives it the destination's name, by a rename, which replaces a link
//! there rather than following it; a run that fails leaves the destination
//! as it was. Files are created with mode 0644 less the umask: never
//! world-writable. On a filesystem without `O_TMPFILE`, a hidden temporary
//! name is created exclusively (`O_EXCL`, `O_NOFOLLOW`) and removed on failure.
//!
//! A destination that is not a file (`-o /dev/stdout`, `/dev/null`) is
//! written to directly, but only if it is memprof's own standard output or
//! error, or `/dev/null`: a link planted to a device is refused.
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// The permissions of every output: read-write for the owner, readable by others.
const MODE: libc::mode_t = 0o644;

/// A file being written to `dest`.
pub struct OutFile {
    file: std::io::BufWriter<File>,
    /// The destination's directory, open: every name is relative to it
    /// (`None`: memprof's own output stream, written directly).
    dir: Option<File>,
    dest: PathBuf,
    name: OsString,
    /// The temporary name, where `O_TMPFILE` is not supported.
    temporary: Option<CString>,
    committed: bool,
}

impl OutFile {
    /// Opens the file that will become `dest` (a bad directory fails here,
    /// before any work is done).
    pub fn create(dest: &Path) -> Result<OutFile> {
        let fail = |why: String| anyhow::anyhow!("cannot write {}: {why}", dest.display());
        let name = dest
            .file_name()
            .ok_or_else(|| fail("not a file name".into()))?
            .to_os_string();
        match std::fs::metadata(dest) {
            Ok(m) if m.is_dir() => return Err(fail("it is a directory".into())),
            Ok(m) if !m.is_file() => {
                if !is_own_stream(&m) {
                    return Err(fail(
                        "not a regular file (only memprof's own standard output or error, or /dev/null, can be written directly)".into(),
                    ));
                }
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dest)
                    .map_err(|e| fail(e.to_string()))?;
                return Ok(OutFile {
                    file: std::io::BufWriter::new(file),
                    dir: None,
                    dest: dest.to_path_buf(),
                    name,
                    temporary: None,
                    committed: false,
                });
            }
            _ => {}
        }
        let dir_path = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = open_dir(dir_path).map_err(|e| fail(e.to_string()))?;
        let (fd, temporary) = match open_unnamed(&dir) {
            Ok(fd) => (fd, None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                let (fd, temporary) =
                    open_exclusive(&dir, &name).map_err(|e| fail(e.to_string()))?;
                (fd, Some(temporary))
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(OutFile {
            file: std::io::BufWriter::new(file),
            dir: Some(dir),
            dest: dest.to_path_buf(),
            name,
            temporary,
            committed: false,
        })
    }

    /// Gives the written file the destination's name.
    pub fn commit(mut self) -> Result<()> {
        let fail = |e: std::io::Error| anyhow::anyhow!("cannot write {}: {e}", self.dest.display());
        self.file.flush().map_err(fail)?;
        let Some(dir) = &self.dir else {
            self.committed = true;
            return Ok(());
        };
        let dir = dir.as_raw_fd();
        let name = CString::new(self.name.as_bytes()).map_err(|e| fail(e.into()))?;
        let temporary = match self.temporary.take() {
            Some(t) => t,
            None => self.link_unnamed(dir).map_err(fail)?,
        };
        let renamed = unsafe { libc::renameat(dir, temporary.as_ptr(), dir, name.as_ptr()) };
        if renamed != 0 {
            let e = std::io::Error::last_os_error();
            unsafe { libc::unlinkat(dir, temporary.as_ptr(), 0) };
            return Err(fail(e));
        }
        self.committed = true;
        Ok(())
    }

    /// Names the unnamed file, with a fresh hidden name in its directory.
    fn link_unnamed(&self, dir: libc::c_int) -> std::io::Result<CString> {
        let fd = self.file.get_ref().as_raw_fd();
        let source = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
        for attempt in 0.. {
            let temporary = temporary_name(&self.name, attempt);
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    source.as_ptr(),
                    dir,
                    temporary.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if r == 0 {
                return Ok(temporary);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) || attempt >= 100 {
                return Err(e);
            }
        }
        unreachable!()
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if let (false, Some(dir), Some(temporary)) = (self.committed, &self.dir, &self.temporary) {
            unsafe { libc::unlinkat(dir.as_raw_fd(), temporary.as_ptr(), 0) };
        }
    }
}

/// Whether `m` is memprof's own standard output or error, or `/dev/null`.
fn is_own_stream(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same = |fd: libc::c_int| {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
        ok && st.st_dev == m.dev() && st.st_ino == m.ino()
    };
    let dev_null = std::fs::metadata("/dev/null").is_ok_and(|null| {
        null.rdev() == m.rdev() && null.dev() == m.dev() && null.ino() == m.ino()
    });
    same(libc::STDOUT_FILENO) || same(libc::STDERR_FILENO) || dev_null
}

fn open_dir(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
}

/// `O_TMPFILE` in `dir`.
fn open_unnamed(dir: &File) -> std::io::Result<libc::c_int> {
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
            MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// A new hidden file next to the destination, never an existing one or a link.
fn open_exclusive(dir: &File, name: &OsString) -> std::io::Result<(libc::c_int, CString)> {
    for attempt in 0.. {
        let temporary = temporary_name(name, attempt);
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                temporary.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
                MODE as libc::c_uint,
            )
        };
        if fd >= 0 {
            return Ok((fd, temporary));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) || attempt >= 100 {
            return Err(e);
        }
    }
    unreachable!()
}

/// `.NAME.memprof-PID-N.tmp`
fn temporary_name(name: &OsString, attempt: u32) -> CString {
    let mut bytes = b".".to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(format!(".memprof-{}-{attempt}.tmp", std::process::id()).as_bytes());
    CString::new(bytes).unwrap_or_else(|_| c".memprof.tmp".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("outfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_a_planted_link_without_following_it() {
        let dir = temp_dir("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let dest = dir.join("out.mprof");
        std::os::unix::fs::symlink(&victim, &dest).unwrap();
        let mut out = OutFile::create(&dest).unwrap();
        out.write_all(b"profile").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o777, 0o600);
        assert!(!std::fs::symlink_metadata(&dest).unwrap().is_symlink());
        assert_eq!(std::fs::read(&dest).unwrap(), b"profile");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_destination_and_nothing_else() {
        let dir = temp_dir("fail");
        let dest = dir.join("out.mprof");
        std::fs::write(&dest, b"before").unwrap();
        let mut out = OutFile::create(&dest).unwrap();
        out.write_all(b"half").unwrap();
        drop(out);
        assert_eq!(std::fs::read(&dest).unwrap(), b"before");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn never_world_writable() {
        let dir = temp_dir("mode");
        let dest = dir.join("out.mprof");
        let old = unsafe { libc::umask(0) };
        let out = OutFile::create(&dest);
        unsafe { libc::umask(old) };
        out.unwrap().commit().unwrap();
        assert_eq!(std::fs::metadata(&dest).unwrap().mode() & 0o777, 0o644);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_link_to_a_device() {
        let dir = temp_dir("device");
        let dest = dir.join("out.mprof");
        std::os::unix::fs::symlink("/dev/zero", &dest).unwrap();
        let e = OutFile::create(&dest).err().unwrap();
        assert!(format!("{e}").contains("not a regular file"), "{e}");
        let null = OutFile::create(Path::new("/dev/null")).unwrap();
        null.commit().unwrap();
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_directory() {
        let dir = temp_dir("dir");
        let e = OutFile::create(&dir).err().unwrap();
        assert!(format!("{e}").contains("is a directory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("outfile-doc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("out.txt");
        let mut out = crate::outfile::OutFile::create(&dest).unwrap();
        out.write_all(b"done\n").unwrap();
        assert!(!dest.exists()); // nothing there until the commit
        out.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"done\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
