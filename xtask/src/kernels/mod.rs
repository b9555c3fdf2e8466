//! Real Debian kernels for memprof's tests, booted under QEMU with virtme-ng.
//!
//! memprof's eBPF side must work on the kernels its users run, not only on
//! the host's. This module fetches Debian 12's two kernel series, 6.1 (the
//! release's own) and 6.12 (its newer one, from bookworm's security suite or
//! backports), and boots them with virtme-ng (`vng`), which shows the guest
//! the host's root read-only over 9p, so any host binary runs inside as is.
//!
//! Nothing here is installed system-wide but the apt libraries QEMU needs:
//!
//! ```text
//! target/virtme-ng/      32 MB  python venv holding virtme-ng (bin/vng)
//! target/qemu/           63 MB  bookworm's qemu-system-x86, extracted, not installed
//! target/kernels/6.1/   405 MB  linux-image-6.1.0-N-amd64-unsigned, extracted:
//!     boot/vmlinuz-6.1.0-N-amd64, lib/modules/6.1.0-N-amd64/ (with depmod's files)
//! target/kernels/6.12/  120 MB  linux-image-6.12.N+deb12-amd64-unsigned, the same way
//! ```
//!
//! N is the newest build apt knows when setup runs: a newer one replaces
//! the one there.
//!
//! Why extracted: bookworm's qemu-system-x86 conflicts with the backported
//! qemu-utils a machine may have, and a kernel package installed on the
//! host would change its boot setup. The plain `-amd64` flavours are used:
//! the `-cloud-amd64` ones have no 9p. Their 9p and virtio drivers are
//! modules; vng finds them itself next to the kernel image (it looks for
//! `lib/modules/VERSION` in the folders above the image) and puts the ones
//! it needs in its initramfs, loading the 6.12 series' `.ko.xz` as they are
//! (busybox's insmod first offers each to the kernel undecompressed, hence
//! six harmless "Invalid ELF header magic: != ELF" lines on the console).
//!
//! See [`boot`] for running a command in a guest, and `cargo xtask vm`.

mod boot;

#[allow(unused_imports)] // `boot` and `BootOutput` are for the test runner
pub use boot::{boot, vm, BootOutput};

use crate::apt::{
    apt_get, apt_install, apt_packages, apt_update_once, apt_updated, dpkg_installed,
};
use crate::{output, run, target_dir};
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtme-ng release the boot options below were worked out with.
const VIRTME_NG_VERSION: &str = "1.42";

/// What vng needs besides QEMU: a static busybox for its initramfs, and
/// depmod (kmod) for the extracted kernels' module lists.
const APT_PACKAGES: &[&str] = &["busybox-static", "kmod"];

/// bookworm's QEMU, downloaded and extracted (see the module's doc). The
/// libraries its binary links, seabios and ipxe-qemu come from apt: the
/// `Depends` of the first package, less the other two.
const QEMU_DEBS: &[&str] = &["qemu-system-x86", "qemu-system-common", "qemu-system-data"];

/// A kernel series: its name on the command line and the apt package names
/// `{prefix}N{suffix}` of its builds, N a number (the newest N is taken).
struct Series {
    name: &'static str,
    prefix: &'static str,
    suffix: &'static str,
}

const SERIES: &[Series] = &[
    Series {
        name: "6.1",
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64-unsigned",
    },
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64-unsigned",
    },
];

/// One extracted kernel, ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The series, "6.1" or "6.12".
    pub name: String,
    /// `boot/vmlinuz-VERSION` in the extracted package.
    pub vmlinuz: PathBuf,
    /// `lib/modules/VERSION` in the extracted package (vng finds it itself).
    #[allow(dead_code)]
    pub modules: PathBuf,
    /// What `uname -r` says in the guest, e.g. "6.1.0-57-amd64".
    pub version: String,
}

/// Installs virtme-ng, QEMU and the newest kernel of each series, skipping
/// what is already there; one line per step.
pub fn setup() -> Result<()> {
    apt_packages(APT_PACKAGES)?;
    virtme_ng()?;
    qemu()?;
    for series in SERIES {
        kernel(series)?;
    }
    Ok(())
}

/// The extracted kernels, in [`SERIES`] order; those not set up are left out.
pub fn kernels() -> Result<Vec<Kernel>> {
    let mut found = Vec::new();
    for series in SERIES {
        if let Some(kernel) = installed(series.name, &kernels_dir().join(series.name))? {
            found.push(kernel);
        }
    }
    Ok(found)
}

/// The kernel of that series ("6.1", "6.12"), with a hint if it is missing.
pub fn kernel_named(name: &str) -> Result<Kernel> {
    let names: Vec<_> = SERIES.iter().map(|s| s.name).collect();
    ensure!(
        names.contains(&name),
        "no kernel series {name:?}: there are {}",
        names.join(", ")
    );
    kernels()?
        .into_iter()
        .find(|k| k.name == name)
        .with_context(|| format!("kernel {name} is not set up: run `cargo xtask setup`"))
}

fn kernels_dir() -> PathBuf {
    target_dir().join("kernels")
}

/// The venv holding virtme-ng.
fn venv_dir() -> PathBuf {
    target_dir().join("virtme-ng")
}

/// The `vng` command.
fn vng_path() -> PathBuf {
    venv_dir().join("bin/vng")
}

/// The extracted QEMU's root (its `usr/bin`, `usr/share/qemu`, ...).
fn qemu_dir() -> PathBuf {
    target_dir().join("qemu")
}

/// virtme-ng in its own venv, pinned: the host's python may refuse `pip
/// install` outside a venv (PEP 668), and this keeps `vng`'s path known.
fn virtme_ng() -> Result<()> {
    let step = format!("setup: virtme-ng {VIRTME_NG_VERSION}");
    let installed = Command::new(vng_path())
        .arg("--version")
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout).trim() == format!("virtme-ng {VIRTME_NG_VERSION}")
        })
        .unwrap_or(false);
    if installed {
        println!("{step} ... already installed");
        return Ok(());
    }
    println!("{step} ... installing into {}", venv_dir().display());
    run(Command::new("python3").args(["-m", "venv"]).arg(venv_dir()))?;
    run(Command::new(venv_dir().join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("virtme-ng=={VIRTME_NG_VERSION}"),
    ]))
}

/// bookworm's qemu-system-x86, extracted into target/qemu, and the apt
/// packages it depends on.
fn qemu() -> Result<()> {
    let depends = qemu_depends()?;
    let binary = qemu_dir().join("usr/bin/qemu-system-x86_64");
    if binary.exists() {
        println!("setup: qemu-system-x86 (extracted) ... already there");
    } else {
        println!(
            "setup: qemu-system-x86 (extracted) ... downloading into {}",
            qemu_dir().display()
        );
        let debs = download(QEMU_DEBS, &target_dir().join("qemu.debs"))?;
        extract(&debs, &qemu_dir(), |_| Ok(()))?;
    }
    let mut missing = Vec::new();
    for package in &depends {
        if !dpkg_installed(package)? {
            missing.push(package.as_str());
        }
    }
    if missing.is_empty() {
        println!(
            "setup: qemu-system-x86's {} apt dependencies ... already installed",
            depends.len()
        );
    } else {
        println!(
            "setup: qemu-system-x86's apt dependencies ... installing {}",
            missing.join(" ")
        );
        apt_install(&missing)?;
    }
    // It must start, with its libraries found.
    let out = output(Command::new(&binary).arg("--version"))?;
    ensure!(
        out.status.success(),
        "{} does not start: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The apt packages qemu-system-x86 depends on, less the qemu ones
/// extracted here, from the `Depends` field apt knows (after one `apt-get
/// update` if it knows no qemu-system-x86: a fresh machine's lists are empty).
fn qemu_depends() -> Result<Vec<String>> {
    loop {
        let out = output(Command::new("apt-cache").args([
            "depends",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            "qemu-system-x86",
        ]))?;
        // "  Depends: libaio1"; "<name>" is a virtual package, "|" marks an
        // alternative (all are installed).
        let mut depends: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.trim().trim_start_matches('|').strip_prefix("Depends:"))
            .map(|package| package.trim().to_string())
            .filter(|package| !package.starts_with("qemu-") && !package.starts_with('<'))
            .collect();
        depends.sort();
        depends.dedup();
        if out.status.success() && !depends.is_empty() {
            return Ok(depends);
        }
        if apt_updated() {
            bail!(
                "apt knows no dependencies of qemu-system-x86 (Debian bookworm must be in apt's sources): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        apt_update_once()?;
    }
}

/// The newest build of a series in apt, extracted into target/kernels/NAME
/// (replacing an older one), with depmod's module lists that the package
/// leaves to its postinst.
fn kernel(series: &Series) -> Result<()> {
    let dir = kernels_dir().join(series.name);
    let current = installed(series.name, &dir)?;
    let mut package = newest_package(series)?;
    // apt's lists may be older than the kernel already here: keep it.
    if let Some(kernel) = &current {
        if series.build(&series.package(&kernel.version)) >= series.build(&package) {
            println!("setup: kernel {} ... already there", kernel.version);
            return Ok(());
        }
    }
    let debs_dir = kernels_dir().join(format!("{}.debs", series.name));
    let announce = |package: &str| {
        let version = series.version(package);
        println!(
            "setup: kernel {version} ... installing into {}",
            dir.display()
        );
    };
    announce(&package);
    let debs = match download(&[package.as_str()], &debs_dir) {
        Ok(debs) => debs,
        // Stale lists name a build the archive has dropped: update, retry.
        Err(e) if !apt_updated() => {
            eprintln!("setup: {e:#}; updating apt's lists");
            apt_update_once()?;
            package = newest_package(series)?;
            announce(&package);
            download(&[package.as_str()], &debs_dir)?
        }
        Err(e) => return Err(e),
    };
    let version = series.version(&package);
    extract(&debs, &dir, |root| {
        run(Command::new("depmod").arg("-b").arg(root).arg(&version))
    })?;
    ensure!(
        installed(series.name, &dir)?.is_some_and(|k| k.version == version),
        "{package} was extracted into {} but has no boot/vmlinuz-{version} or modules",
        dir.display()
    );
    Ok(())
}

impl Series {
    /// N in a package name of this series.
    fn build(&self, package: &str) -> Option<u32> {
        package
            .strip_prefix(self.prefix)?
            .strip_suffix(self.suffix)?
            .parse()
            .ok()
    }

    /// The package of a kernel version ("6.1.0-57-amd64").
    fn package(&self, version: &str) -> String {
        format!("linux-image-{version}-unsigned")
    }

    /// The kernel version (`uname -r`) of a package of this series.
    fn version(&self, package: &str) -> String {
        package
            .strip_prefix("linux-image-")
            .and_then(|v| v.strip_suffix("-unsigned"))
            .expect("the series' package names start and end so")
            .to_string()
    }
}

/// The newest `{prefix}N{suffix}` package apt knows (after one `apt-get
/// update` if it knows none: a fresh machine's package lists are empty).
fn newest_package(series: &Series) -> Result<String> {
    loop {
        let out = output(Command::new("apt-cache").args(["pkgnames", series.prefix]))?;
        let newest = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|name| Some((series.build(name)?, name.to_string())))
            .max();
        if let Some((_, name)) = newest {
            return Ok(name);
        }
        if apt_updated() {
            bail!(
                "apt knows no package {}N{}: Debian bookworm (and its security suite, for 6.12) must be in apt's sources",
                series.prefix,
                series.suffix
            );
        }
        apt_update_once()?;
    }
}

/// The kernel extracted in `dir`, if complete: one `boot/vmlinuz-VERSION`
/// and its `lib/modules/VERSION/modules.dep` (written last, by depmod).
fn installed(name: &str, dir: &Path) -> Result<Option<Kernel>> {
    let boot = dir.join("boot");
    let Ok(entries) = std::fs::read_dir(&boot) else {
        return Ok(None);
    };
    let mut versions = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", boot.display()))?;
        if let Some(version) = entry
            .file_name()
            .to_str()
            .and_then(|f| f.strip_prefix("vmlinuz-"))
        {
            versions.push(version.to_string());
        }
    }
    let [version] = versions.as_slice() else {
        return Ok(None);
    };
    let modules = dir.join("lib/modules").join(version);
    if !modules.join("modules.dep").exists() {
        return Ok(None);
    }
    Ok(Some(Kernel {
        name: name.to_string(),
        vmlinuz: boot.join(format!("vmlinuz-{version}")),
        modules,
        version: version.clone(),
    }))
}

/// `apt-get download`s packages (their candidate versions) into a fresh
/// `dir`; returns the .deb files.
fn download(packages: &[&str], dir: &Path) -> Result<Vec<PathBuf>> {
    remove_dir(dir)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // As root, apt would rather download as _apt, which cannot write here.
    run(apt_get()
        .args(["-q", "-o", "APT::Sandbox::User=root", "download"])
        .args(packages)
        .current_dir(dir))?;
    let mut debs = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            debs.push(path);
        }
    }
    ensure!(
        debs.len() == packages.len(),
        "apt-get download {} left {} .deb files in {}",
        packages.join(" "),
        debs.len(),
        dir.display()
    );
    Ok(debs)
}

/// Extracts .debs into `dest` (replacing it) through a temporary folder
/// beside it, finished by `finish(temporary)`, then renamed: an interrupted
/// setup never leaves a half-extracted `dest`. Removes the .debs' folder.
fn extract(debs: &[PathBuf], dest: &Path, finish: impl Fn(&Path) -> Result<()>) -> Result<()> {
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    remove_dir(&partial)?;
    std::fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    for deb in debs {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))?;
    }
    finish(&partial)?;
    remove_dir(dest)?;
    std::fs::rename(&partial, dest)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), dest.display()))?;
    if let Some(debs_dir) = debs.first().and_then(|d| d.parent()) {
        remove_dir(debs_dir)?;
    }
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", dir.display()))
        }
        _ => Ok(()),
    }
}
