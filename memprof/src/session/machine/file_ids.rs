//! A file's identity, (device, inode): as `/proc/PID/maps` prints it
//! ([`FileId`]), and as the kernel's programs key it ([`FileKey`]).
use memprof_common::host::FileKey;

/// A file: `(device, inode)` as /proc/PID/maps says them.
pub type FileId = (String, u64);

/// The [`FileId`] of the file at `path` as memprof sees it.
pub fn file_id(path: &std::path::Path) -> Option<FileId> {
    Some(file_id_of_meta(&std::fs::metadata(path).ok()?))
}

/// The [`FileId`] of a file memprof has, by its metadata.
pub fn file_id_of_meta(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    // Linux's `MAJOR`/`MINOR` of a 64-bit dev_t, as /proc/PID/maps prints them.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (format!("{major:02x}:{minor:02x}"), meta.ino())
}

/// A [`FileId`] as the kernel names the file (`s_dev` is `MAJOR << 20 |
/// MINOR`).
pub fn kernel_key((dev, ino): &FileId) -> Option<FileKey> {
    let (major, minor) = dev.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some(FileKey {
        dev: major << 20 | minor,
        _pad: 0,
        ino: *ino,
    })
}

/// [`kernel_key`] back: the [`FileId`] of a file the kernel named.
pub fn file_id_of(key: &FileKey) -> FileId {
    let (major, minor) = (key.dev >> 20, key.dev & 0xf_ffff);
    (format!("{major:02x}:{minor:02x}"), key.ino)
}
