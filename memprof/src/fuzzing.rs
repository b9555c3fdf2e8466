//! Entry points for `fuzz/` only: the cargo-fuzz targets (one per reader
//! of outside input, `docs/development.md`, "Fuzzing") call the crate's
//! private readers through these thin wrappers. Not an API: hidden from
//! the documentation, changed with the readers.
//!
//! | target | the reader | wrapper |
//! |---|---|---|
//! | `demangle` | a symbol's name as shown (Crystal's, demangled C++/Rust) | [`display_name`] |
//! | `eh_frame` | `.eh_frame` flattened into the kernel's unwind rows | [`unwind_rows`] |
//! | `elf_module` | an ELF file as a session reads it (segments, symbols, GOT slots, versioned names, debug links) | [`elf_module`] |
//! | `symbolize` | names and `file:line` of addresses, blazesym reading the file as memprof hands it over | [`symbolize`] |
//! | `crystal_source` | a program's Crystal source, read for the class of an inlined `new` | [`crystal_source`] |
//! | `btf` | the kernel's BTF, members' offsets | [`btf_member_offsets`] |
//! | `agent_query` | the agent's routes, queries included | [`agent_router`] |
//!
//! (`mprof` needs none: [`crate::profile::parse`] and [`crate::report`]
//! are public.) A file's bytes are handed over as an anonymous memory file
//! under a path that does not exist here: read as a user's file is, by
//! its descriptor.
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::sync::Arc;

pub use memprof_common::UnwindRow;

use crate::modules::maps::{Mapping, MapsCache};
use crate::modules::{Module, ModuleCache};
use crate::profile::{Profile, Stacks};

/// The target's path of a module made of fuzzed bytes: no such file.
const MODULE_PATH: &str = "/nonexistent/memprof-fuzz/module";

/// Where a fuzzed module's first executable mapping starts, as if mapped.
const MAPPED_AT: u64 = 0x5555_0000_0000;

/// The name memprof shows for the symbol `raw` (`crate::symbolize::display_name`).
pub fn display_name(raw: &str) -> String {
    crate::symbolize::display_name(raw)
}

/// `bytes` in an anonymous memory file, at offset 0.
fn memory_file(bytes: &[u8]) -> std::io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor
    // returned is owned by the File.
    let fd = unsafe { libc::memfd_create(c"memprof-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes)?;
    Ok(file)
}

/// `bytes` parsed as a module file, as a session parses the target's.
fn module(bytes: &[u8]) -> Result<Module, String> {
    let file = memory_file(bytes).map_err(|e| e.to_string())?;
    Module::from_file(Path::new(MODULE_PATH), file).map_err(|e| e.to_string())
}

/// `.eh_frame` of the ELF file `bytes` flattened into unwind rows
/// (`crate::unwind::ModuleTable::build`), or why not.
pub fn unwind_rows(bytes: &[u8]) -> Result<Vec<UnwindRow>, String> {
    let module = module(bytes)?;
    crate::unwind::ModuleTable::build(&module)
        .map(|table| table.rows)
        .map_err(|e| format!("{e:#}"))
}

/// The ELF file `bytes` read as the stages of a session read a module:
/// its symbols, code and its bytes, GOT slots, thread-local storage,
/// versioned Crystal names, load bias and where its DWARF is read
/// (`crate::modules::Module`). Its symbol count, or why it was refused.
pub fn elf_module(bytes: &[u8]) -> Result<usize, String> {
    let module = module(bytes)?;
    let _ = module.require_x86_64();
    let _ = module.interpreter();
    let _ = module.tls_size();
    let _ = module.tls_module_slot();
    let _ = module.exec_vaddr_less_offset();
    let _ = module.section(".eh_frame");
    let _ = module.section_address(".text");
    let mut symbols = 0;
    for (name, symbol) in module.symbols().take(256) {
        symbols += 1;
        let _ = module.file_offset(symbol.address);
        let _ = module.bytes_at(symbol.address).map(<[u8]>::len);
        let _ = module.is_code(symbol.address);
        let _ = module.is_read_only(symbol.address);
        let _ = module.symbol(name);
    }
    for name in ["malloc", "GC_malloc", "GC_arrays", "_dl_debug_state"] {
        let _ = module.symbol(name);
    }
    let _ = module.tls_symbol("GC_thread_key");
    for (start, end) in module.code_ranges().take(64) {
        let _ = (module.is_code(start), module.is_code(end));
    }
    for got in [".got", ".got.plt"] {
        if let Some((address, data)) = module.section(got) {
            for slot in (0..data.len() as u64).step_by(8).take(512) {
                let slot = address.wrapping_add(slot);
                let _ = module.slot_value(slot);
                let _ = module.is_external(slot);
                let _ = module.external_name(slot);
                let _ = module.is_tls_offset_slot(slot);
            }
        }
    }
    for segment in module.segments().iter().take(64) {
        let _ = module.address_of_offset(segment.file_offset);
        let _ = module.bias(&mapping(segment.file_offset, segment.executable));
    }
    let _ = module.versioned_crystal_names().len();
    let _ = module.debug_view();
    Ok(symbols)
}

/// A mapping of the fuzzed module at [`MAPPED_AT`], from file offset
/// `file_offset` (page-aligned down, and below 2^63 as the kernel's
/// are), a megabyte long.
fn mapping(file_offset: u64, executable: bool) -> Mapping {
    let file_offset = file_offset.min(i64::MAX as u64) & !0xfff;
    let start = MAPPED_AT.wrapping_add(file_offset & 0xffff_ffff);
    Mapping {
        start,
        end: start.saturating_add(1 << 20),
        file_offset,
        executable,
        path: MODULE_PATH.into(),
        file_id: ("00:00".to_string(), 1),
    }
}

/// The frames memprof makes of addresses in the ELF file `bytes`, mapped
/// at [`MAPPED_AT`] (its first executable segment's pages): those of each
/// of its first symbols, and `extra` offsets from the mapping's start.
/// Names and lines come from blazesym, given the file as memprof gives a
/// user's file ([`Module::debug_view`]), on the naming thread (whose
/// guard against a panic in blazesym libFuzzer's panic hook overrides:
/// a panic there is found too); each frame as `function file:line`.
pub fn symbolize(bytes: &[u8], extra: &[u64]) -> Result<Vec<String>, String> {
    let module = module(bytes)?;
    let Some(code) = module.segments().iter().find(|s| s.executable).copied() else {
        return Ok(Vec::new());
    };
    let mapped = mapping(code.file_offset, true);
    let bias = module.bias(&mapped);
    let mut addresses: Vec<u64> = extra
        .iter()
        .map(|&offset| mapped.start.wrapping_add(offset % (1 << 20)))
        .collect();
    if let Some(bias) = bias {
        // A return address just after each symbol's start.
        addresses.extend(
            module
                .symbols()
                .take(64)
                .map(|(_, s)| s.address.wrapping_add(bias).wrapping_add(1)),
        );
    }
    let modules = ModuleCache::default();
    modules.adopt(Path::new(MODULE_PATH), Arc::new(module));
    let mut maps = MapsCache::default();
    maps.merge(vec![mapped]);
    let mut stacks = Stacks::default();
    let mut cache = crate::symbolize::SymbolCache::default();
    let (located, _) = crate::symbolize::locations(
        &addresses,
        (&maps, &modules),
        (false, crate::symbolize::Budget::WHOLE),
        &mut stacks,
        &mut cache,
    );
    let mut frames = Vec::new();
    for location in located.values() {
        for frame in &stacks.locations()[*location as usize].frames {
            frames.push(format!(
                "{} {}:{}",
                frame.function,
                frame.file.as_deref().unwrap_or("?"),
                frame.line.unwrap_or(0)
            ));
        }
    }
    Ok(frames)
}

/// What memprof reads of a Crystal source file `text` (a target's file,
/// named by its DWARF: `crate::crystal::source`) for the class an
/// inlined `new` makes, at some of its lines (each line's text also read
/// as a call's receiver and as a construction): the answers found.
pub fn crystal_source(text: &str) -> usize {
    use crate::crystal::source;
    let lines: Vec<&str> = text.lines().collect();
    let step = (lines.len() / 32).max(1);
    let mut found = 0;
    for line in (0..=lines.len() + 1).step_by(step) {
        let text = lines.get(line.wrapping_sub(1)).map_or("", |l| l.trim());
        let answers = [
            source::enclosing_type(&lines, line),
            source::enclosing_scope(&lines, line),
            source::definition(&lines, line, "new").map(|(at, _)| at.to_string()),
            source::definition(&lines, line, "initialize").map(|(at, _)| at.to_string()),
            source::receiver_type(&lines, line, text),
            source::receiver_type(&lines, line, text.rsplit('=').next().unwrap_or("").trim()),
            source::constructed(text),
            source::constructed(text.rsplit('=').next().unwrap_or("").trim()),
        ];
        found += answers.iter().flatten().count();
    }
    found
}

/// The offsets memprof asks of the kernel's BTF (`crate::probes`), read
/// from the BTF `bytes` instead: each `Ok(offset)` or the error's text.
pub fn btf_member_offsets(bytes: &[u8]) -> Vec<Result<u64, String>> {
    const ASKED: [(&str, &[&str]); 8] = [
        ("task_struct", &["thread", "fsbase"]),
        ("task_struct", &["tgid"]),
        ("vm_area_struct", &["vm_start"]),
        ("vm_area_struct", &["vm_end"]),
        ("vm_area_struct", &["vm_flags"]),
        ("file", &["f_path", "dentry"]),
        ("inode", &["i_ino"]),
        ("dentry", &["d_parent"]),
    ];
    // One query at a time: each one's answer, not only the first error.
    ASKED
        .iter()
        .map(|query| {
            crate::probes::btf::member_offsets(bytes, std::slice::from_ref(query))
                .map(|offsets| offsets[0])
                .map_err(|e| format!("{e:#}"))
        })
        .collect()
}

/// The agent's routes (`crate::commands::agent::serve`), served by a
/// thread standing for the driver's: it answers a profile of `pid=1` or
/// `comm=app` with `profile`, any other process with "not found", the
/// metrics and the process list empty.
pub fn agent_router(profile: Profile) -> axum::Router {
    use crate::commands::agent::{Request, Which};
    let (requests, received) = std::sync::mpsc::channel::<Request>();
    let (waker_sent, waker) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("memprof-fuzz-driver".to_string())
        .spawn(move || {
            // The server wakes the driver with a signal: blocked here, as
            // the driver blocks it (it is never taken: it only pends).
            // SAFETY: a signal set built and given to pthread_sigmask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, crate::driver::signals::WAKE);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            let _ = waker_sent.send(crate::driver::signals::Waker::current());
            for request in received {
                let _ = match request {
                    Request::Metrics(reply) => reply.send(String::new()).map_err(drop),
                    Request::Processes(reply) => reply.send(Vec::new()).map_err(drop),
                    Request::Escalations(reply) => reply.send(Vec::new()).map_err(drop),
                    Request::Profile(which, reply) => {
                        let known = matches!(&which, Which::Pid(1))
                            || matches!(&which, Which::Comm(comm) if comm == "app");
                        let answer = match known {
                            true => Ok(profile.clone()),
                            false => Err(format!("{which:?}: no such process")),
                        };
                        reply.send(answer).map_err(drop)
                    }
                };
            }
        })
        .expect("a thread");
    let waker = waker.recv().expect("the driver thread's waker");
    crate::commands::agent::serve::routes(requests, waker)
}
