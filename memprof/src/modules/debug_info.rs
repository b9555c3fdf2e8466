//! Where a module's names and lines are read from: decided by memprof, not
//! left to blazesym when a user could have planted what it would open.
//!
//! Given a path, blazesym follows the file's debug links itself, by path,
//! with blocking opens: `.gnu_debuglink` (beside the file, in `.debug/`, in
//! /usr/lib/debug), `.gnu_debugaltlink`, `.debug_sup` and `PATH.dwp`. For a
//! file that only root can change, in a directory only root can write to
//! (a distribution's libraries and their -dbgsym packages), that is what a
//! user expects, and it keeps doing so. Any other file is a user's say: its
//! links may name a FIFO (which would hold memprof up forever), a device,
//! or a compressed section whose header claims a terabyte.
//!
//! So a user's file is given to blazesym as the descriptor memprof holds
//! (`/proc/self/fd/N`, beside which there is no `.dwp`), with DWARF only
//! when the file links to nothing and its compressed sections claim sizes
//! within [`MAX_SECTION`]; its `.gnu_debuglink` is followed by memprof, with
//! [`super::open_regular`] (no FIFO, no blocking), its CRC checked, and the
//! debug file held the same way. What is skipped is said once per file.
use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSection};

/// The most a compressed debug section may claim uncompressed (blazesym
/// allocates what it claims).
pub const MAX_SECTION: u64 = 256 << 20;
/// The most a compressed debug section may claim per compressed byte
/// (DWARF compresses 3–8×; a zlib bomb, 1000×).
const MAX_RATIO: u64 = 32;
/// The largest separate debug file read (its CRC reads it whole).
const MAX_DEBUG_FILE: u64 = 4 << 30;

/// Sections by which a file names another file to read.
const LINK_SECTIONS: [&str; 3] = [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"];

/// What blazesym is given for one module.
#[derive(Debug, Clone)]
pub struct DebugView {
    /// The file to read symbol names from (`.symtab`, `.dynsym`).
    pub names: PathBuf,
    /// Where its lines and inlined functions are read, if anywhere.
    pub lines: Option<Lines>,
}

/// A file with the module's DWARF.
#[derive(Debug, Clone)]
pub struct Lines {
    pub path: PathBuf,
    /// Addresses are given as link-time addresses (a separate debug file
    /// has no loadable bytes of its own), not as file offsets.
    pub by_address: bool,
    /// The debug file, held open while `path` (its `/proc/self/fd/N`) is used.
    _held: Option<Arc<File>>,
}

/// How a module file was opened, for [`view`].
pub struct Opened<'a> {
    /// The target's path of the file.
    pub path: &'a Path,
    pub file: &'a File,
    /// Whether `path` names this very file in memprof's namespace.
    pub same_here: bool,
    pub data: &'a [u8],
}

/// What blazesym reads for the module `opened`.
pub fn view(opened: &Opened) -> DebugView {
    let fd_path = fd_path(opened.file);
    if opened.same_here && root_only(opened.file, opened.path) {
        return DebugView {
            names: opened.path.to_path_buf(),
            lines: Some(Lines {
                path: opened.path.to_path_buf(),
                by_address: false,
                _held: None,
            }),
        };
    }
    let Ok(elf) = object::File::parse(opened.data) else {
        return DebugView {
            names: fd_path,
            lines: None,
        };
    };
    let lines = if let Some(skip) = unreadable_dwarf(&elf) {
        say_once(opened.path, &skip);
        None
    } else if LINK_SECTIONS
        .iter()
        .any(|s| elf.section_by_name(s).is_some())
    {
        linked_debug_file(opened, &elf)
    } else {
        Some(Lines {
            path: fd_path.clone(),
            by_address: false,
            _held: None,
        })
    };
    DebugView {
        names: fd_path,
        lines,
    }
}

/// Why blazesym must not read `elf`'s DWARF, if it must not: a compressed
/// section claiming more than the budgets.
fn unreadable_dwarf(elf: &object::File) -> Option<String> {
    for section in elf.sections() {
        let Ok(name) = section.name() else { continue };
        if !name.starts_with(".debug_") && !name.starts_with(".zdebug_") {
            continue;
        }
        let Ok(range) = section.compressed_file_range() else {
            return Some(format!("its {name} cannot be read"));
        };
        if range.format == object::CompressionFormat::None {
            continue;
        }
        let claimed = range.uncompressed_size;
        if claimed > MAX_SECTION || claimed / MAX_RATIO > range.compressed_size {
            return Some(format!(
                "its compressed {name} claims {} uncompressed from {} (more than memprof reads: {} and {MAX_RATIO}×); its lines are not read",
                bytes(claimed),
                bytes(range.compressed_size),
                bytes(MAX_SECTION)
            ));
        }
        // blazesym inflates a section whole, whatever it claims: a zlib
        // bomb of 4 GiB claiming a megabyte took memprof to 4.23 GB. So
        // memprof inflates it first, into nothing, up to its claim.
        if range.format == object::CompressionFormat::Zlib {
            let Ok(data) = section.compressed_data() else {
                return Some(format!("its {name} cannot be read"));
            };
            if let Err(why) = inflates_within(data.data, claimed) {
                return Some(format!(
                    "its compressed {name} {why} (it claims {}); its lines are not read",
                    bytes(claimed)
                ));
            }
        }
    }
    None
}

/// Whether the zlib stream `data` inflates to at most `claimed` bytes
/// (read through a small buffer, kept nowhere).
fn inflates_within(data: &[u8], claimed: u64) -> Result<(), &'static str> {
    use std::io::Read;
    let mut inflated = flate2::read::ZlibDecoder::new(data).take(claimed + 1);
    let mut buffer = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        match inflated.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(_) => return Err("does not inflate"),
        }
    }
    if total > claimed {
        return Err("inflates to more than it claims");
    }
    Ok(())
}

/// The lines of a user's file that links its DWARF elsewhere: its
/// `.gnu_debuglink` followed by memprof (other links are not).
fn linked_debug_file(opened: &Opened, elf: &object::File) -> Option<Lines> {
    let (name, crc) = match elf.gnu_debuglink() {
        Ok(Some((name, crc))) => (name.to_vec(), crc),
        _ => {
            say_once(
                opened.path,
                "it names its debug info elsewhere (.gnu_debugaltlink or .debug_sup), which memprof does not follow for a file a user can change; its lines are not read",
            );
            return None;
        }
    };
    let name = String::from_utf8_lossy(&name).into_owned();
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        say_once(
            opened.path,
            &format!("its debug link {name:?} is not a file name; not followed"),
        );
        return None;
    }
    let mut candidates = Vec::new();
    if let Ok(Some(id)) = elf.build_id() {
        if id.len() >= 2 {
            let rest: String = id[1..].iter().map(|b| format!("{b:02x}")).collect();
            candidates.push(PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{:02x}/{rest}.debug",
                id[0]
            )));
        }
    }
    if opened.same_here {
        if let Some(dir) = opened.path.parent() {
            candidates.push(dir.join(&name));
            candidates.push(dir.join(".debug").join(&name));
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(Path::new("/usr/lib/debug").join(relative).join(&name));
        }
    }
    for candidate in candidates {
        let file = match super::open_regular(&candidate) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                say_once(
                    opened.path,
                    &format!("its debug file {}: {e}", candidate.display()),
                );
                continue;
            }
        };
        match debug_file_lines(&candidate, file, crc) {
            Ok(lines) => return Some(lines),
            Err(why) => say_once(
                opened.path,
                &format!("its debug file {}: {why}", candidate.display()),
            ),
        }
    }
    None
}

/// `file` (found at `path`) as the lines of the module whose debug link
/// names `crc`, if it is that file and can be read safely.
fn debug_file_lines(path: &Path, file: File, crc: u32) -> Result<Lines, String> {
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > MAX_DEBUG_FILE {
        return Err(format!("{} is more than memprof reads", bytes(size)));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut reader = (&file).take(size);
    loop {
        let n = reader.read(&mut buffer).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    if hasher.finalize() != crc {
        return Err("its CRC is not the one the program's debug link names; not read".into());
    }
    if root_only(&file, path) {
        return Ok(Lines {
            path: path.to_path_buf(),
            by_address: true,
            _held: Some(Arc::new(file)),
        });
    }
    // SAFETY: read-only, private; a file shrinking under memprof is
    // handled (see `shrink`).
    let data = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
    let elf = object::File::parse(&*data).map_err(|e| e.to_string())?;
    if let Some(why) = unreadable_dwarf(&elf) {
        return Err(why);
    }
    if LINK_SECTIONS
        .iter()
        .any(|s| elf.section_by_name(s).is_some())
    {
        return Err("it links further debug files, which memprof does not follow for a file a user can change; not read".into());
    }
    Ok(Lines {
        path: fd_path(&file),
        by_address: true,
        _held: Some(Arc::new(file)),
    })
}

/// Whether only root can change `file` and what its path leads to: root
/// owns the file and every directory up to `/`, none writable by others
/// (an ancestor with the sticky bit aside; never the file's own directory,
/// where a user could add a debug file).
fn root_only(file: &File, path: &Path) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return false;
    }
    let Ok(real) = path.canonicalize() else {
        return false;
    };
    let mut dirs = real.ancestors().skip(1);
    let Some(own) = dirs.next() else {
        return false;
    };
    let safe = |dir: &Path, sticky_ok: bool| {
        std::fs::symlink_metadata(dir).is_ok_and(|m| {
            m.uid() == 0 && (m.mode() & 0o022 == 0 || (sticky_ok && m.mode() & libc::S_ISVTX != 0))
        })
    };
    safe(own, false) && dirs.all(|dir| safe(dir, true))
}

fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Says `what` about `path`'s debug info on stderr, once per file.
fn say_once(path: &Path, what: &str) {
    static SAID: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(path.to_path_buf())
    {
        eprintln!("memprof: {}: {what}", crate::text::lossy_path(path));
    }
}

/// `n` bytes in B to GiB, one decimal.
fn bytes(n: u64) -> String {
    crate::text::bytes(n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_files_are_root_only_and_tmp_is_not() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(root_only(&File::open(libc).unwrap(), libc));
        let dir = std::env::temp_dir().join(format!("memprof-root-only-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let in_tmp =
            std::env::temp_dir().join(format!("memprof-root-only-{}.bin", std::process::id()));
        std::fs::write(&in_tmp, b"x").unwrap();
        // /tmp itself is writable by all: a file right in it is not root-only.
        assert!(!root_only(&File::open(&in_tmp).unwrap(), &in_tmp));
        let nested = dir.join("bin");
        std::fs::write(&nested, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A root directory under the sticky /tmp: root-only.
        assert_eq!(
            root_only(&File::open(&nested).unwrap(), &nested),
            nix_uid() == 0
        );
        std::fs::remove_file(&in_tmp).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn nix_uid() -> u32 {
        // SAFETY: no arguments, no failure.
        unsafe { libc::getuid() }
    }
}
