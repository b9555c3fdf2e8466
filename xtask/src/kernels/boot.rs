//! Booting a kernel with virtme-ng and running one command in it.
//!
//! The guest sees the host's root read-only over 9p (so `/work/...` and the
//! host's binaries are there at the same paths), with tmpfs-backed overlays
//! on /tmp, /etc, /usr, /var, /home..., debugfs and tracefs mounted, and
//! the loopback interface up. The command runs as root in a POSIX shell,
//! from the workspace root. Only `rwdir` is written through to the host.
//!
//! This machine's /dev/kvm cannot run Debian's kernels, so QEMU emulates
//! (TCG, `--disable-kvm`): a boot takes 20 to 40 s before the command starts.
//!
//! How a run ends: vng exits with the guest command's status, but also with
//! its own (255 for a kernel panic, 1 for its own errors). To tell them
//! apart, the command runs from a script in `rwdir` that writes its exit
//! status to a file beside it; no file means the command never finished.
//! The script also keeps long commands off the kernel command line, where
//! vng would put them (x86 allows 2048 bytes in all).
//!
//! vng runs QEMU through a shell and a python process; all of them run in
//! their own process group, which is killed with SIGKILL on timeout, when
//! the run ends (stragglers), on a panic here, and on SIGINT, SIGTERM or
//! SIGHUP to this process: no QEMU is left running.

use super::{kernel_named, qemu_dir, venv_dir, vng_path, Kernel};
use crate::{root, show, target_dir};
use anyhow::{bail, ensure, Context, Result};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Once;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Guest size: two CPUs, as most machines have more than one (QEMU runs
/// them in turn on one host thread, see below), and memory enough for
/// memprof and its targets (about 1.85 GiB of it is free at the prompt).
const CPUS: &str = "2";
const MEMORY: &str = "2G";

/// Drivers udev would load at boot for the emulated machine's devices and
/// CPU features (q35's AHCI, TCO watchdog and SMBus, the PS/2 mouse, KVM
/// for the emulated SVM, CPU-specific crypto...): none is of use to a test,
/// and loading them under emulation doubled the time to the command (from
/// about 10 s of udev to 30 s). Only udev's automatic loading is refused;
/// `modprobe NAME` still works. A name no kernel has is harmless.
const UNUSED_MODULES: &[&str] = &[
    "aesni_intel",
    "ahci",
    "button",
    "ccp",
    "cdrom",
    "crc32_pclmul",
    "crc32c_intel",
    "crct10dif_pclmul",
    "evdev",
    "ghash_clmulni_intel",
    "i2c_i801",
    "i6300esb",
    "intel_pmc_bxt",
    "iTCO_vendor_support",
    "iTCO_wdt",
    "kvm",
    "kvm_amd",
    "kvm_intel",
    "lpc_ich",
    "pcspkr",
    "powernow_k8",
    "psmouse",
    "qemu_fw_cfg",
    "serio_raw",
    "sg",
    "sha1_ssse3",
    "sha256_ssse3",
    "sha512_ssse3",
    "sr_mod",
];

/// What a guest command did.
#[derive(Debug)]
#[allow(dead_code)] // `vm` shows the output as it comes; the test runner reads it here
pub struct BootOutput {
    /// The command's exit status; `None` if it never finished: timeout, a
    /// kernel panic, or the VM did not boot (see `stderr`).
    pub exit_code: Option<i32>,
    /// The run was killed at the timeout.
    pub timed_out: bool,
    /// The command's standard output.
    pub stdout: String,
    /// The command's standard error, mixed with the kernel's errors and
    /// warnings (a panic's among them) and vng's and QEMU's messages.
    pub stderr: String,
    /// From starting vng to QEMU's exit, boot included.
    pub elapsed: Duration,
}

impl BootOutput {
    /// The command ran to its end and exited 0.
    #[allow(dead_code)] // for the test runner
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Boots `kernel` and runs `command` (a shell command line) in it as root;
/// `rwdir` (created if missing) is the one host folder the guest can write.
/// Kills the VM after `timeout`, boot included.
#[allow(dead_code)] // for the test runner
pub fn boot(kernel: &Kernel, command: &str, rwdir: &Path, timeout: Duration) -> Result<BootOutput> {
    boot_with(kernel, command, rwdir, timeout, false)
}

/// `cargo xtask vm KERNEL -- CMD`: boots the kernel of that series, runs
/// CMD with its output shown as it comes, and fails unless CMD exits 0.
pub fn vm(name: &str, command: &str, rwdir: Option<PathBuf>, timeout: Duration) -> Result<()> {
    let kernel = kernel_named(name)?;
    let rwdir = rwdir.unwrap_or_else(|| target_dir().join("vm-rwdir"));
    eprintln!(
        "vm: booting {} ({}) with {} writable",
        kernel.version,
        kernel.vmlinuz.display(),
        rwdir.display()
    );
    let out = boot_with(&kernel, command, &rwdir, timeout, true)?;
    let secs = out.elapsed.as_secs_f64();
    match out.exit_code {
        Some(0) => {
            eprintln!("vm: exit 0 after {secs:.1} s (boot included)");
            Ok(())
        }
        Some(code) => bail!("the command exited {code} after {secs:.1} s (boot included)"),
        None if out.timed_out => bail!("killed after the timeout of {} s", timeout.as_secs()),
        None => bail!("the command did not finish: the VM failed or panicked after {secs:.1} s"),
    }
}

fn boot_with(
    kernel: &Kernel,
    command: &str,
    rwdir: &Path,
    timeout: Duration,
    echo: bool,
) -> Result<BootOutput> {
    std::fs::create_dir_all(rwdir).with_context(|| format!("cannot create {}", rwdir.display()))?;
    let rwdir = rwdir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", rwdir.display()))?;
    let files = RunFiles::new(&rwdir, command)?;

    let qemu = qemu_dir();
    let mut vng = Command::new(vng_path());
    // vng starts `virtme-run` through a shell, by name: the venv's bin must
    // come first on PATH (outside an activated venv nothing else has it).
    vng.env("PATH", path_with(&venv_dir().join("bin")))
        .arg("--run")
        .arg(&kernel.vmlinuz)
        .args([
            "--disable-kvm",
            "--force-9p",
            "--cpus",
            CPUS,
            "--memory",
            MEMORY,
        ])
        .arg("--qemu")
        .arg(qemu.join("usr/bin/qemu-system-x86_64"))
        // --verbose sends the kernel's console to stderr, where vng would
        // send it to /dev/null; loglevel=4 (after vng's 7) keeps errors and
        // warnings only: panics, oopses and WARNs show, not the boot's
        // chatter (some 20 lines print before the loglevel applies).
        .args(["--verbose", "--append=loglevel=4"])
        .arg(format!(
            "--append=modprobe.blacklist={}",
            UNUSED_MODULES.join(",")
        ))
        // -nodefaults: no CD-ROM drive (its drivers cost seconds to load).
        // thread=single: one host thread takes the vCPUs in turn. With a
        // thread each, 6.12 sometimes died at boot ("Oops: int3" in
        // sched_clock_idle_wakeup_event, while the kernel patched its own
        // code), and the boot was no faster.
        // The extracted QEMU looks for its ROMs and modules where an
        // installed one has them; seabios is from apt.
        .arg(format!(
            "--qemu-opts=-nodefaults -accel tcg,thread=single -L {} -L /usr/share/seabios",
            qemu.join("usr/share/qemu").display()
        ))
        .env(
            "QEMU_MODULE_DIR",
            qemu.join("usr/lib/x86_64-linux-gnu/qemu"),
        )
        .arg("--rwdir")
        .arg(&rwdir)
        .arg("--exec")
        .arg(format!("sh {}", sh_quote(&files.script)))
        // The guest starts in vng's working directory.
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);

    let start = Instant::now();
    let mut child = vng
        .spawn()
        .with_context(|| format!("cannot run {}", show(&vng)))?;
    let group = Group::new(child.id())?;
    let stdout = drain(
        child.stdout.take(),
        echo.then(|| Box::new(std::io::stdout()) as Box<_>),
    );
    let stderr = drain(
        child.stderr.take(),
        echo.then(|| Box::new(std::io::stderr()) as Box<_>),
    );
    let timed_out = !wait_until(&mut child, start + timeout)?;
    // On timeout, and for anything vng left behind.
    drop(group);
    child.wait().context("cannot wait for vng")?;
    let elapsed = start.elapsed();

    let stdout = stdout.join().expect("reader thread");
    let mut stderr = stderr.join().expect("reader thread");
    if timed_out {
        stderr.push_str(&format!(
            "\nxtask: VM killed after the timeout of {} s\n",
            timeout.as_secs()
        ));
    }
    Ok(BootOutput {
        exit_code: files.exit_code()?,
        timed_out,
        stdout,
        stderr,
        elapsed,
    })
}

/// Waits for the child until `deadline`; false if it was still running.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<bool> {
    loop {
        if child.try_wait().context("cannot wait for vng")?.is_some() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// Reads a pipe to its end in a thread, copying to `echo` as it comes.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
    mut echo: Option<Box<dyn Write + Send>>,
) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let Some(mut pipe) = pipe else {
            return String::new();
        };
        let mut buf = [0u8; 8192];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            all.extend_from_slice(&buf[..n]);
            if let Some(out) = echo.as_mut() {
                let _ = out.write_all(&buf[..n]).and_then(|()| out.flush());
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    })
}

/// The script the guest runs and the file it leaves its exit status in,
/// both in `rwdir`, named for this run; removed when dropped.
struct RunFiles {
    script: PathBuf,
    status: PathBuf,
}

impl RunFiles {
    fn new(rwdir: &Path, command: &str) -> Result<RunFiles> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            ".xtask-vm-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::SeqCst)
        );
        let files = RunFiles {
            script: rwdir.join(format!("{name}.sh")),
            status: rwdir.join(format!("{name}.status")),
        };
        let _ = std::fs::remove_file(&files.status);
        // The newline before ")" ends a comment the command may end with.
        let script = format!(
            "# cargo xtask's kernels::boot: the command, then its exit status\n({command}\n)\necho $? > {}\n",
            sh_quote(&files.status)
        );
        std::fs::write(&files.script, script)
            .with_context(|| format!("cannot write {}", files.script.display()))?;
        Ok(files)
    }

    fn exit_code(&self) -> Result<Option<i32>> {
        match std::fs::read_to_string(&self.status) {
            Ok(text) => {
                let code = text.trim().parse().with_context(|| {
                    format!(
                        "{} holds {text:?}, not an exit status",
                        self.status.display()
                    )
                })?;
                Ok(Some(code))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", self.status.display())),
        }
    }
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.script);
        let _ = std::fs::remove_file(&self.status);
    }
}

/// A path in single quotes for sh.
fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The process groups of the running VMs, for the signal handler: 0 is a
/// free slot. More VMs than slots at once is refused.
static GROUPS: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];

/// A VM's process group (vng's pid): SIGKILLed when dropped.
struct Group {
    pgid: i32,
}

impl Group {
    fn new(pid: u32) -> Result<Group> {
        static HANDLER: Once = Once::new();
        HANDLER.call_once(install_signal_handler);
        let pgid = i32::try_from(pid).expect("pids fit in i32");
        let registered = GROUPS.iter().any(|slot| {
            slot.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        let group = Group { pgid };
        // Unregistered, it is killed at once, by the drop.
        ensure!(registered, "more than {} VMs at once", GROUPS.len());
        Ok(group)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.pgid);
        for slot in &GROUPS {
            let _ = slot.compare_exchange(self.pgid, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

fn kill_group(pgid: i32) {
    // SAFETY: kill(2) has no memory effects; ESRCH (all gone) is fine.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// On SIGINT, SIGTERM and SIGHUP: kill the VMs' groups (they are not in
/// the terminal's foreground group, so a ^C does not reach them), then
/// die of the signal as if unhandled.
fn install_signal_handler() {
    extern "C" fn handler(signal: libc::c_int) {
        for slot in &GROUPS {
            let pgid = slot.load(Ordering::SeqCst);
            if pgid != 0 {
                kill_group(pgid);
            }
        }
        // SAFETY: signal(2) and raise(3) are async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only touches atomics and async-signal-safe calls.
        unsafe {
            libc::signal(
                signal,
                handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}
