//! Debian's packages, through apt: installed when missing, the lists
//! updated at most once a run.

use crate::{output, run};
use anyhow::{Context, Result};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// Installs the missing apt packages, one line per package.
pub(crate) fn apt_packages(packages: &[&str]) -> Result<()> {
    let mut missing = Vec::new();
    for package in packages {
        if dpkg_installed(package)? {
            println!("setup: {package} ... already installed");
        } else {
            println!("setup: {package} ... installing");
            missing.push(*package);
        }
    }
    apt_install(&missing)
}

/// Installs these apt packages, if any, after one `apt-get update` (a fresh
/// machine has empty package lists).
pub(crate) fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    apt_update_once()?;
    run(apt_get().args(["install", "-y"]).args(packages))
}

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// `apt-get update`, at most once per run.
pub(crate) fn apt_update_once() -> Result<()> {
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        run(apt_get().arg("update"))?;
    }
    Ok(())
}

/// Whether this run updated apt's lists already.
pub(crate) fn apt_updated() -> bool {
    APT_UPDATED.load(Ordering::SeqCst)
}

pub(crate) fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}

pub(crate) fn dpkg_installed(package: &str) -> Result<bool> {
    let mut query = Command::new("dpkg-query");
    query.args(["-W", "-f=${Status}", package]);
    let out = output(&mut query).context("setup expects a Debian system (dpkg-query)")?;
    // Unknown packages make dpkg-query fail; removed ones show another status.
    Ok(out.status.success()
        && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}
