//! Tests against real libgc builds: Debian's `libgc.so.1` (bdwgc 8.2.2),
//! executables linked with Debian's `libgc.a` (a C program, and a Crystal
//! program stripped and not), and the live collector inside those programs.
//!
//! The programs (`fixtures/verdicts.{c,cr}`) are built by
//! [`super::test_programs`].
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use super::test_programs::{c_program, crystal_program, libgc_in, symbol, Link, LIBGC_SO};
use super::*;

const VERDICTS_C: &str = include_str!("fixtures/verdicts.c");
const VERDICTS_CR: &str = include_str!("fixtures/verdicts.cr");

/// Debian 8.2.2's layout, as docs/ARCHITECTURE.md ("GC liveness") gives it; `arrays` differs per build.
pub(super) fn debian_layout(arrays: u64, arrays_slot: Option<u64>) -> MarkLayout {
    MarkLayout {
        arrays,
        arrays_slot,
        top_index: 0x289f0,
        all_nils: 0xc0,
        key_shift: 22,
        top_mask: 0x7ff,
        bi_key: 0x2010,
        bi_hash_link: 0x2018,
        bi_index: 0,
        log_hblksize: 12,
        bottom_mask: 0x3ff,
        hb_marks: 0x40,
        granule_shift: 4,
        hb_flags: 0x19,
        free_blk: 4,
        hb_sz: 0x20,
        max_forward: 0xfff,
    }
}

#[test]
fn debian_shared_layout() {
    let layout = derive_layout(Path::new(LIBGC_SO)).unwrap();
    // GC_arrays at 0x2d920, read through its GOT slot 0x2cf08.
    assert_eq!(layout, debian_layout(0x2d920, Some(0x2cf08)));
}

#[test]
fn debian_shared_kind_offset() {
    // `movzbl 0x18(%rax),%eax` in GC_get_kind_and_size: hb_obj_kind.
    let module = Module::open(Path::new(LIBGC_SO)).unwrap();
    let layout = layout::derive(&module).unwrap();
    assert_eq!(layout::kind_offset(&module, &layout).unwrap(), 0x18);
}

#[test]
fn static_c_build_kind_offset() {
    let exe = c_program("verdicts", VERDICTS_C, Link::Static);
    let module = Module::open(&exe).unwrap();
    let layout = layout::derive(&module).unwrap();
    assert_eq!(layout::kind_offset(&module, &layout).unwrap(), 0x18);
}

#[test]
fn debian_shared_end_of_mark() {
    let end = find_end_of_mark(Path::new(LIBGC_SO)).unwrap();
    assert_eq!((end.gc_no, end.gc_no_slot), (0x5a348, Some(0x2cf88)));
    let sites: Vec<(u64, u64, &str, bool)> = end
        .increments
        .iter()
        .map(|i| (i.offset, i.after_offset, i.text.as_str(), i.after_joined))
        .collect();
    assert_eq!(
        sites,
        [
            // The one docs/ARCHITECTURE.md ("GC liveness") names; the other copy's path rejoins right after it.
            (0x18572, 0x18576, "add qword ptr [rax],1", true),
            // mov (%rax),%rcx; lea 1(%rcx),%rsi; mov %rsi,(%rax): the copy that runs.
            (0x18628, 0x1862b, "mov [rax],rsi", false),
        ]
    );
    assert!(end.increments.iter().all(|i| !i.after_emulated));
}

#[test]
fn static_c_build() {
    let exe = c_program("verdicts", VERDICTS_C, Link::Static);
    let layout = derive_layout(&exe).unwrap();
    assert_eq!(layout, debian_layout(symbol(&exe, "GC_arrays"), None));
    let end = find_end_of_mark(&exe).unwrap();
    assert_eq!(
        (end.gc_no, end.gc_no_slot),
        (symbol(&exe, "GC_gc_no"), None)
    );
    assert_eq!(end.increments.len(), 2, "{end:#x?}");
}

#[test]
fn static_crystal_build_stripped_or_not() {
    let (exe, stripped) = crystal_program("verdicts", VERDICTS_CR);
    let layout = derive_layout(&exe).unwrap();
    assert_eq!(layout, debian_layout(symbol(&exe, "GC_arrays"), None));
    assert_eq!(derive_layout(&stripped).unwrap(), layout);
    let end = find_end_of_mark(&exe).unwrap();
    assert_eq!(end.gc_no, symbol(&exe, "GC_gc_no"));
    let texts: Vec<&str> = end.increments.iter().map(|i| i.text.as_str()).collect();
    assert!(
        matches!(texts.as_slice(), [store, add] if store.starts_with("mov [") && add.starts_with("add qword ptr [")),
        "{end:#x?}"
    );
    assert_eq!(find_end_of_mark(&stripped).unwrap(), end);
}

#[test]
fn not_a_libgc() {
    let error = derive_layout(Path::new("/bin/true"))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("unsupported libgc layout: GC_is_marked is not defined"),
        "{error}"
    );
    let error = find_end_of_mark(Path::new("/bin/true"))
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("unsupported libgc layout"), "{error}");
}

#[test]
fn live_shared_libgc_matches_gc_is_marked() {
    live(&c_program("verdicts", VERDICTS_C, Link::Shared), 200_000);
}

#[test]
fn live_static_libgc_matches_gc_is_marked() {
    live(&c_program("verdicts", VERDICTS_C, Link::Static), 200_000);
}

#[test]
fn live_stripped_crystal_matches_gc_is_marked() {
    live(&crystal_program("verdicts", VERDICTS_CR).1, 200_000);
}

/// Runs a verdicts program, then judges every object it printed from
/// outside, through `/proc/PID/mem` with the derived layout: the verdicts
/// must be the GC's own, one for one.
fn live(exe: &Path, objects: usize) {
    let mut child = Command::new(exe)
        .arg(objects.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    let fields: Vec<&str> = header.split(' ').collect();
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    let (pid, gc_no) = match fields.as_slice() {
        ["pid", pid, "gc_no", gc_no, ..] => (hex(pid) as u32, hex(gc_no)),
        _ => panic!("bad header {header}"),
    };
    let printed_arrays = match fields.as_slice() {
        [.., "arrays", arrays] => Some(hex(arrays)),
        _ => None,
    };
    let mut expected = Vec::with_capacity(objects);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line == "end" {
            break;
        }
        let (p, live) = line.split_once(' ').unwrap();
        expected.push((hex(p), live == "1"));
    }
    assert_eq!(expected.len(), objects);

    // The module holding libgc, and where it is loaded.
    let (module, bias) = libgc_in(pid, exe);
    let layout = derive_layout(&module).unwrap();
    let end = find_end_of_mark(&module).unwrap();

    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut read = |addr: u64, buf: &mut [u8]| mem.read_exact_at(buf, addr);
    let word = |addr: u64| {
        let mut buf = [0; 8];
        read(addr, &mut buf).unwrap();
        u64::from_le_bytes(buf)
    };
    // GC_gc_no and GC_arrays where the library really uses them (through its
    // GOT, which a copy relocation may point into the executable).
    let gc_no_at = match end.gc_no_slot {
        Some(slot) => word(slot + bias),
        None => end.gc_no + bias,
    };
    assert_eq!(word(gc_no_at), gc_no, "GC_gc_no");
    let arrays_at = match layout.arrays_slot {
        Some(slot) => word(slot + bias),
        None => layout.arrays + bias,
    };
    if let Some(printed) = printed_arrays {
        assert_eq!(arrays_at, printed, "GC_arrays");
    }

    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for &(p, live) in &expected {
        let verdict = layout.verdict(p, bias, &mut read).unwrap();
        *kinds.entry(format!("{verdict:?}")).or_default() += 1;
        if verdict.is_live() != live {
            mismatches.push((p, live, verdict));
        }
    }
    // The pass's bulk read of every block gives the same verdicts.
    let mask = !(layout.hblksize() - 1);
    let mut starts: Vec<u64> = expected.iter().map(|&(p, _)| p & mask).collect();
    starts.sort_unstable();
    starts.dedup();
    let headers = layout.read_headers(&starts, arrays_at, &mut read).unwrap();
    for &(p, _) in &expected {
        let i = starts.binary_search(&(p & mask)).unwrap();
        let one = layout.verdict(p, bias, &mut read).unwrap();
        let block = layout.block_in(&headers, i).unwrap();
        assert_eq!(layout.verdict_in(p, &block).0, one, "{p:#x}");
    }
    drop(child.stdin.take()); // lets the program exit
    child.wait().unwrap();
    let live_count = expected.iter().filter(|e| e.1).count();
    eprintln!(
        "{}: {} objects, {live_count} live, GC_gc_no {gc_no}, GC_arrays at {arrays_at:#x}{}, verdicts {kinds:?}, {} mismatches",
        module.display(),
        expected.len(),
        if layout.arrays_slot.is_some() && arrays_at != layout.arrays + bias {
            " (copy-relocated into the executable)"
        } else {
            ""
        },
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "first mismatches: {:x?}",
        &mismatches[..mismatches.len().min(10)]
    );
    // The fixture keeps about 60%: both verdicts must be well represented.
    assert!(live_count > objects / 3 && live_count < objects * 9 / 10);
}
