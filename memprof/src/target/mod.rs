//! The process being profiled: finding it, launching it, knowing which
//! modules it maps, and noticing when it ends.
//!
//! - [`Target::attach`] checks a running pid.
//! - [`launch::launch`] starts a command held right after its `exec`, so
//!   probes are attached before its first instruction runs.
//! - [`modules`] lists the executable and the shared libraries it loads, in
//!   load order (the order in which the dynamic linker binds symbols).
pub mod launch;
pub mod maps;
pub mod trace;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::modules::ModuleCache;

/// A process to profile.
#[derive(Debug, Clone)]
pub struct Target {
    pub pid: u32,
    /// Absolute path of the executable.
    pub exe: PathBuf,
    /// The command line (argv).
    pub command: Vec<String>,
}

impl Target {
    /// Checks that `pid` is a live process and reads its executable and command line.
    pub fn attach(pid: u32) -> Result<Target> {
        if pid == 0 || !is_alive(pid) {
            bail!("no process with pid {pid}");
        }
        if pid == std::process::id() {
            bail!("memprof cannot profile itself (pid {pid})");
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("cannot read the executable of pid {pid}"))?;
        let exe = PathBuf::from(
            exe.to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_string(),
        );
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let command = cmdline
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        Ok(Target { pid, exe, command })
    }
}

/// True while `pid` exists and has not exited (a zombie has exited).
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // state is the field after the parenthesised command name
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Finds `program` the way `execvp` would: as given if it contains a `/`,
/// else in each `$PATH` directory.
pub fn find_command(program: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        if executable(&path) {
            return Ok(std::fs::canonicalize(&path)?);
        }
        bail!("command not found: {program}");
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .ok_or_else(|| anyhow::anyhow!("command not found: {program}"))
}

/// The executable and the shared libraries the dynamic linker loads for it,
/// in load order, plus any other file `loaded` names (a running process's
/// mappings: `dlopen`ed libraries) after those. The executable is read
/// through `cache`.
pub fn modules(cache: &ModuleCache, exe: &Path, loaded: &[PathBuf]) -> Vec<PathBuf> {
    let mut list = vec![exe.to_path_buf()];
    list.extend(needed_libraries(cache, exe));
    for path in loaded {
        if !list.contains(path) {
            list.push(path.clone());
        }
    }
    list
}

/// Asks the executable's own dynamic linker (`ld.so --list`, which is what
/// `ldd` does; it runs none of the program's code) which libraries it loads.
/// A static executable has none.
fn needed_libraries(cache: &ModuleCache, exe: &Path) -> Vec<PathBuf> {
    let Some(interp) = interpreter(cache, exe) else {
        return Vec::new();
    };
    let Ok(out) = Command::new(&interp).arg("--list").arg(exe).output() else {
        return vec![interp];
    };
    let mut libs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = match line.split_once("=>") {
                Some((_, rhs)) => rhs.trim(),
                None => line.trim(),
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    if libs.is_empty() {
        libs.push(interp);
    }
    libs
}

/// The dynamic linker named in the executable's `.interp`, if any.
pub fn interpreter(cache: &ModuleCache, exe: &Path) -> Option<PathBuf> {
    cache.get(exe).ok()?.interpreter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_commands_on_path() {
        let sh = find_command("sh").unwrap();
        assert!(sh.is_absolute());
        assert!(find_command("no-such-command-memprof").is_err());
        assert!(find_command("/no/such/cmd").is_err());
    }

    #[test]
    fn lists_libc_for_a_dynamic_executable() {
        let sh = find_command("sh").unwrap();
        let mods = modules(&ModuleCache::default(), &sh, &[]);
        assert_eq!(mods[0], sh);
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
