//! The process being profiled: finding it, launching it, knowing which
//! modules it maps, and noticing when it ends.
//!
//! - [`Tracee::attach`] checks a running pid.
//! - [`launch::launch`] starts a command held right after its `exec`, so
//!   probes are attached before its first instruction runs.
//! - [`modules`] lists the executable and the shared libraries it loads, in
//!   load order (the order in which the dynamic linker binds symbols).
//! - [`preflight`] checks what every mode needs before it attaches:
//!   memprof's capabilities, its open-files limit, the files mapped.
pub(crate) mod exit;
pub mod family;
pub mod launch;
pub mod memory;
pub mod preflight;
mod router;
pub mod startup;
pub mod trace;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::modules::ModuleCache;

/// A process to profile.
#[derive(Debug, Clone)]
pub struct Tracee {
    pub pid: u32,
    /// Absolute path of the executable.
    pub exe: PathBuf,
    /// The command line (argv).
    pub command: Vec<String>,
}

impl Tracee {
    /// Checks that `pid` is a live process and reads its executable and command line.
    pub fn attach(pid: u32) -> Result<Tracee> {
        if pid == 0 || !is_alive(pid) {
            bail!("no process with pid {pid}");
        }
        if pid == std::process::id() {
            bail!("memprof cannot profile itself (pid {pid})");
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("cannot read the executable of pid {pid}"))?;
        // Replaced or removed since it started: still named by its path
        // (its file is opened through the process, see `modules`).
        let exe = crate::modules::strip_deleted(&exe);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let command = cmdline
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(crate::text::lossy)
            .collect();
        Ok(Tracee { pid, exe, command })
    }
}

/// True while `pid` exists and has not exited (a zombie has exited).
pub fn is_alive(pid: u32) -> bool {
    // Read as bytes: the command name in it is any bytes the program's
    // file name had.
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // state is the field after the parenthesised command name
        Ok(stat) => String::from_utf8_lossy(&stat)
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Finds `program` the way `execvp` would: as given if it contains a `/`,
/// else in each `$PATH` directory. Its name is any bytes (Latin-1 too).
pub fn find_command(program: impl AsRef<std::ffi::OsStr>) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let program = program.as_ref();
    let name = crate::text::lossy(program.as_bytes());
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        if executable(&path) {
            return Ok(std::fs::canonicalize(&path)?);
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => bail!("{name} is a directory, not a program"),
            Ok(_) => {
                bail!("{name} is not executable (chmod +x it, or run it through its interpreter)")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("command not found: {name}")
            }
            Err(e) => bail!("cannot run {name}: {e}"),
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .ok_or_else(|| anyhow::anyhow!("command not found: {name}"))
}

/// The executable, then every other file the process maps (`loaded`,
/// from its own mappings: read, never asked of its dynamic linker, which
/// would mean executing a file of the target's; see [`startup`]).
pub fn modules(exe: &Path, loaded: &[PathBuf]) -> Vec<PathBuf> {
    let mut list = vec![exe.to_path_buf()];
    for path in loaded {
        if !list.contains(path) {
            list.push(path.clone());
        }
    }
    list
}

/// Refuses a program memprof cannot profile: anything but a 64-bit x86-64
/// ELF executable (its probes and unwinder know only that ABI).
/// `exe` names the program in messages; its bytes are read from `pid`'s
/// own executable (whatever is at that path now, in whichever namespace).
pub fn check_architecture(pid: u32, exe: &Path) -> Result<()> {
    use std::io::Read;
    let mut header = [0u8; 20];
    crate::modules::open_regular(std::path::Path::new(&format!("/proc/{pid}/exe")))
        .and_then(|mut f| f.read_exact(&mut header))
        .with_context(|| format!("cannot read {}", exe.display()))?;
    if &header[..4] != b"\x7fELF" {
        bail!("{} is not an ELF program", exe.display());
    }
    let machine = u16::from_le_bytes([header[18], header[19]]);
    let what = match (header[4], machine) {
        (2, 62) => return Ok(()),
        (1, 3) => "a 32-bit x86 program".to_string(),
        (1, _) => "a 32-bit program".to_string(),
        (_, 183) => "an AArch64 program".to_string(),
        (_, m) => format!("a program for another machine (ELF machine {m})"),
    };
    bail!(
        "{} is {what}: memprof profiles 64-bit x86-64 programs only",
        exe.display()
    )
}

/// The dynamic linker named in the executable's `.interp`, if any.
pub fn interpreter(cache: &ModuleCache, exe: &Path) -> Option<PathBuf> {
    cache.get(exe).ok()?.interpreter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::maps;

    #[test]
    fn finds_commands_on_path() {
        let sh = find_command("sh").unwrap();
        assert!(sh.is_absolute());
        assert!(find_command("no-such-command-memprof").is_err());
        assert!(find_command("/no/such/cmd").is_err());
    }

    #[test]
    fn lists_the_executable_then_each_mapped_file_once() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let loaded: Vec<PathBuf> = maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .map(|m| m.path)
            .collect();
        let mods = modules(&exe, &loaded);
        assert_eq!(mods[0], exe);
        assert_eq!(mods.iter().filter(|m| **m == exe).count(), 1);
        assert!(
            mods.iter().any(|m| m.to_string_lossy().contains("libc.so")),
            "{mods:?}"
        );
    }

    #[test]
    fn own_process_is_alive() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX - 1));
    }
}
