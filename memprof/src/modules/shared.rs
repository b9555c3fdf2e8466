//! One descriptor per file (device, inode), however many processes map
//! it: `attach --all` opens a process's files the moment it starts, and
//! thousands of short processes of one program would otherwise each hold
//! their own descriptors of the same few files until finalized (memprof
//! then runs out of descriptors, and processes lose their names).
//!
//! A file is held as long as a process's [`super::ModuleCache`] or a
//! [`super::Module`] holds it ([`Arc`]), and closed when none does: the
//! registry itself keeps only [`Weak`] references.
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// A file as /proc/PID/maps names it: device and inode.
pub type FileId = (String, u64);

/// The files open now, by [`FileId`].
struct Registry {
    files: HashMap<FileId, Weak<File>>,
    /// Entries counted when dead ones were last swept out: swept again
    /// once there are twice as many (the map stays within twice the files
    /// open).
    swept_at: usize,
}

static OPEN: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        files: HashMap::new(),
        swept_at: 0,
    })
});

/// The file `id`, shared if open already, else opened by `open` (and
/// shared from now on if it is the very file `id`: `open` may reach
/// another file by a path, when the mapped one was replaced).
pub fn open_shared(id: &FileId, open: impl FnOnce() -> io::Result<File>) -> io::Result<Arc<File>> {
    if let Some(file) = lock().files.get(id).and_then(Weak::upgrade) {
        return Ok(file);
    }
    let file = open()?;
    let file = Arc::new(file);
    if file.metadata().is_ok_and(|meta| id_of(&meta) == *id) {
        let mut registry = lock();
        // Another thread may have opened it meanwhile: one is kept.
        if let Some(theirs) = registry.files.get(id).and_then(Weak::upgrade) {
            return Ok(theirs);
        }
        registry.files.insert(id.clone(), Arc::downgrade(&file));
        if registry.files.len() >= 2 * registry.swept_at.max(64) {
            registry.files.retain(|_, f| f.strong_count() > 0);
            registry.swept_at = registry.files.len();
        }
    }
    Ok(file)
}

/// Whether `error` is the system refusing a resource (descriptors,
/// memory), not the file being missing or unreadable.
pub fn is_refusal(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS)
    )
}

/// The [`FileId`] of an open file, by its metadata.
pub fn id_of(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    // Linux's `MAJOR`/`MINOR` of a 64-bit dev_t, as /proc/PID/maps prints them.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (format!("{major:02x}:{minor:02x}"), meta.ino())
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    OPEN.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn one_descriptor_per_file_while_held() {
        let path = std::env::current_exe().unwrap();
        let id = id_of(&std::fs::metadata(&path).unwrap());
        let a = open_shared(&id, || File::open(&path)).unwrap();
        let b = open_shared(&id, || panic!("opened twice")).unwrap();
        assert_eq!(a.as_raw_fd(), b.as_raw_fd());
        drop((a, b));
        // Closed with its last holder: opened anew.
        let mut opened = false;
        let _c = open_shared(&id, || {
            opened = true;
            File::open(&path)
        })
        .unwrap();
        assert!(opened);
    }

    #[test]
    fn a_refusal_is_told_apart() {
        assert!(is_refusal(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(!is_refusal(&io::Error::from_raw_os_error(libc::ENOENT)));
    }
}
