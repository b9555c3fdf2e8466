//! memprof's failures: each must exit non-zero with one clear line
//! `memprof: error: ...` on stderr, never a panic.

use memprof_tests::*;
use std::process::Command;

/// Runs memprof with `args` and checks it fails with one error line holding `words`.
fn assert_fails(args: &[&OsStr], words: &[&str]) {
    assert_one_line_error(&run(args), words);
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The bytes of a real profile (of the basic fixture).
fn real_profile(dir: &TempDir) -> Vec<u8> {
    let profile = dir.join("real.mprof");
    profile_run(&profile, &[fixture::BASIC]);
    std::fs::read(&profile).expect("cannot read the profile")
}

/// Writes `bytes` into `dir/name` and checks `memprof report` refuses it with `words`.
fn assert_report_refuses(dir: &TempDir, name: &str, bytes: &[u8], words: &[&str]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    assert_fails(
        &[os("report"), path.as_os_str(), os("--format"), os("json")],
        words,
    );
}

#[test]
fn attach_to_missing_pid() {
    assert_fails(
        &[os("attach"), os("--pid"), os("999999")],
        &["no process with pid 999999"],
    );
}

#[test]
fn run_missing_command() {
    assert_fails(
        &[os("run"), os("--"), os("/no/such/cmd")],
        &["command not found"],
    );
}

#[test]
fn run_program_without_allocator() {
    assert_fails(
        &[os("run"), os("--"), os(fixture::NO_LIBC)],
        &["no allocator"],
    );
}

#[test]
fn run_unwritable_output() {
    assert_fails(
        &[
            os("run"),
            os("-o"),
            os("/nonexistent-dir/x.mprof"),
            os("--"),
            os(fixture::BASIC),
        ],
        &["cannot write"],
    );
}

#[test]
fn attach_needs_root() {
    // As user nobody, attaching (here to this test process) must be refused up front.
    let pid = std::process::id().to_string();
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(memprof_bin())
        .args(["attach", "--pid", &pid])
        .output()
        .expect("cannot run setpriv");
    assert_one_line_error(&output, &["root"]);
}

#[test]
fn report_garbage() {
    let dir = TempDir::new("report-garbage");
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    assert_report_refuses(&dir, "garbage.mprof", &garbage, &["not a memprof profile"]);
}

#[test]
fn report_truncated() {
    let dir = TempDir::new("report-truncated");
    let profile = real_profile(&dir);
    assert_report_refuses(
        &dir,
        "truncated.mprof",
        &profile[..profile.len() / 2],
        &["truncated"],
    );
}

#[test]
fn report_future_version() {
    let dir = TempDir::new("report-version");
    let profile = real_profile(&dir);
    assert_report_refuses(
        &dir,
        "version.mprof",
        &with_version(&profile, 999),
        &["version"],
    );
}

#[test]
fn report_unknown_format() {
    let dir = TempDir::new("report-format");
    let path = dir.join("any.mprof");
    std::fs::write(&path, b"").unwrap();
    let output = run([os("report"), path.as_os_str(), os("--format"), os("nope")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "accepted --format nope\n{}",
        describe(&output)
    );
    assert!(
        stderr.contains("nope"),
        "error does not name the bad format:\n{stderr}"
    );
}

/// A copy of `profile` claiming to be format version `version`: a profile
/// starts with the header line `MEMPROF-PROFILE <version>`.
fn with_version(profile: &[u8], version: u32) -> Vec<u8> {
    let newline = profile
        .iter()
        .position(|&b| b == b'\n')
        .expect("profile has a header line");
    let header = std::str::from_utf8(&profile[..newline]).expect("header is text");
    let (magic, _) = header.rsplit_once(' ').expect("header is `MAGIC VERSION`");
    let mut edited = format!("{magic} {version}").into_bytes();
    edited.extend_from_slice(&profile[newline..]);
    edited
}
