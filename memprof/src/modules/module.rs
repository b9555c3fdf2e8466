//! One ELF module, memory-mapped and parsed once: its loadable segments,
//! sections, defined symbols, GOT slots, build id and versioned Crystal
//! names, and the address ↔ file offset ↔ run-time address arithmetic.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionFlags, SectionKind};

use super::debug_info::{self, DebugView};
use super::error::Error;
use super::maps::{self, Mapping};
use super::slots::Slots;

/// A loadable segment (`PT_LOAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Link-time address.
    pub address: u64,
    /// Size in memory.
    pub mem_size: u64,
    pub file_offset: u64,
    /// Size of its part in the file.
    pub file_size: u64,
    pub executable: bool,
}

impl Segment {
    /// The bias of `mapping` of a module of `segments` (`Module::bias`).
    pub fn bias(segments: &[Segment], mapping: &Mapping) -> Option<u64> {
        const PAGE: u64 = 4096;
        let holds = |s: &&Segment| {
            mapping.file_offset >= s.file_offset & !(PAGE - 1)
                && mapping.file_offset < s.file_offset.saturating_add(s.file_size.max(1))
        };
        let segment = segments
            .iter()
            .filter(holds)
            .find(|s| s.executable == mapping.executable)
            .or_else(|| segments.iter().find(holds))?;
        let address = segment
            .address
            .wrapping_add(mapping.file_offset)
            .wrapping_sub(segment.file_offset);
        Some(mapping.start.wrapping_sub(address))
    }
}

/// A section, by name.
#[derive(Debug, Clone)]
struct Section {
    name: String,
    address: u64,
    size: u64,
    /// `(offset, size)` in the file; `None` for `.bss`-like sections.
    file_range: Option<(u64, u64)>,
    /// An executable code section (`.text`, `.plt`, `.init`, …).
    code: bool,
}

/// A defined symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// Link-time address (`st_value`).
    pub address: u64,
    /// `st_size` (0 when unknown).
    pub size: u64,
}

/// One ELF file of the target (see the module docs of [`crate::modules`]).
pub struct Module {
    /// The target's path of the file (for messages and its mappings).
    path: PathBuf,
    /// The file, open for the whole session: [`Self::fd_path`] reaches it
    /// (one descriptor, shared with whatever else holds the same file:
    /// see `shared.rs`).
    file: Arc<File>,
    /// Whether `path` names this very file in memprof's own namespace too.
    same_here: bool,
    data: Mmap,
    x86_64: bool,
    segments: Vec<Segment>,
    sections: Vec<Section>,
    /// Defined symbols with a non-zero address, `.dynsym` first (the first
    /// definition of a name wins).
    symbols: HashMap<String, Symbol>,
    slots: Slots,
    /// Whole names of Crystal symbols of a module without `.symtab`.
    versioned: HashMap<u64, String>,
    /// Bytes of its thread-local storage block (`PT_TLS`), if it has one.
    tls_size: Option<u64>,
    /// What blazesym reads for it, decided on first use.
    debug: std::sync::OnceLock<DebugView>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("bytes", &self.data.len())
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Maps and parses the ELF file at `path`. Prefer [`super::ModuleCache::get`],
    /// which does this once per session.
    pub fn open(path: &Path) -> Result<Module, Error> {
        let file = super::open_regular(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Module::from_file(path, file)
    }

    /// Maps and parses `file`, which is the target's `path` (however it
    /// was opened: see [`super::ModuleCache::of_process`]).
    pub fn from_file(path: &Path, file: impl Into<Arc<File>>) -> Result<Module, Error> {
        let file: Arc<File> = file.into();
        let read = |source| Error::Read {
            path: path.to_path_buf(),
            source,
        };
        let same_here = {
            use std::os::unix::fs::MetadataExt;
            let id = |m: std::fs::Metadata| (m.dev(), m.ino());
            let ours = file.metadata().map_err(read)?;
            std::fs::metadata(path).is_ok_and(|here| id(here) == id(ours))
        };
        // SAFETY: the mapping is read-only and private. A file rewritten in
        // place while mapped would change under us (package managers
        // replace files instead; blazesym maps them the same way); one
        // truncated reads zeros past its end (`shrunk.rs`), not SIGBUS.
        super::shrunk::handle_sigbus();
        let data = unsafe { Mmap::map(&*file) }.map_err(read)?;
        let mapped = super::shrunk::mark();
        let parsed = object::File::parse(&*data).map_err(|source| Error::NotElf {
            path: path.to_path_buf(),
            source,
        })?;
        let segments = segments_of(&parsed);
        let sections = sections_of(&parsed);
        let symbols = symbols_of(&parsed);
        let tls_size = tls_size_of(&parsed);
        let got = sections
            .iter()
            .filter(|s| matches!(s.name.as_str(), ".got" | ".got.plt"))
            .map(|s| (s.address, s.address + s.size))
            .collect();
        if super::shrunk::shrank_within(&data, mapped) {
            return Err(read(std::io::Error::other(
                "the file shrank while memprof read it",
            )));
        }
        Ok(Module {
            path: path.to_path_buf(),
            file,
            same_here,
            x86_64: parsed.architecture() == object::Architecture::X86_64,
            slots: Slots::read(&parsed, got),
            versioned: super::versions::crystal_names(&parsed),
            segments,
            sections,
            symbols,
            tls_size,
            data,
            debug: std::sync::OnceLock::new(),
        })
    }

    /// The target's path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that reaches this very file from memprof, for as long as the
    /// session holds the module (`/proc/self/fd/N`): where uprobes are
    /// attached (the inode the target maps, in whichever namespace).
    pub fn fd_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// The files blazesym reads the module's names and lines from (see
    /// `debug_info.rs`: a user's file is never handed over by its path).
    pub fn debug_view(&self) -> &DebugView {
        self.debug.get_or_init(|| {
            debug_info::view(&debug_info::Opened {
                path: &self.path,
                file: &self.file,
                same_here: self.same_here,
                data: &self.data,
            })
        })
    }

    /// The link-time address of file offset `offset`, if a loadable
    /// segment holds it.
    pub fn address_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.file_offset..s.file_offset + s.file_size).contains(&offset))
            .map(|s| s.address + (offset - s.file_offset))
    }

    /// The whole file.
    /// The user who owns the file (its rows count in their share of the
    /// kernel's table under `attach --all`); `None` if it cannot be told.
    pub fn owner(&self) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().ok().map(|m| m.uid())
    }

    /// Drops the file's pages from memprof's resident memory (they are
    /// read again from the file if needed): after the unwind tables are
    /// built, a big library's sections need not stay resident.
    pub fn release_pages(&self) {
        // SAFETY: a read-only file mapping: dropped pages read back the
        // same bytes from the file (the page cache) when touched again.
        let _ = unsafe {
            self.data
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Errs unless the module is x86-64 code.
    pub fn require_x86_64(&self) -> Result<(), Error> {
        if self.x86_64 {
            Ok(())
        } else {
            Err(Error::NotX86_64 {
                path: self.path.clone(),
            })
        }
    }

    /// The loadable segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// A defined symbol (`.dynsym`, then `.symtab`).
    pub fn symbol(&self, name: &str) -> Option<Symbol> {
        self.symbols.get(name).copied()
    }

    /// Every defined symbol with a non-zero address, by name (in no order).
    pub fn symbols(&self) -> impl Iterator<Item = (&str, Symbol)> + '_ {
        self.symbols.iter().map(|(name, s)| (name.as_str(), *s))
    }

    /// Whether `vaddr` is in a section the program cannot write (`.rodata`,
    /// `.text`): bytes read there from the file are what the process has.
    pub fn is_read_only(&self, vaddr: u64) -> bool {
        self.sections.iter().any(|s| {
            s.file_range.is_some()
                && (s.address..s.address + s.size).contains(&vaddr)
                && (s.code || s.name.starts_with(".rodata"))
        })
    }

    /// The first section called `name`: its address and its bytes in the file.
    pub fn section(&self, name: &str) -> Option<(u64, &[u8])> {
        let section = self.sections.iter().find(|s| s.name == name)?;
        let data = match section.file_range {
            Some((offset, size)) => self.data.get(offset as usize..(offset + size) as usize)?,
            None => &[],
        };
        Some((section.address, data))
    }

    /// The link-time address of the first section called `name`.
    pub fn section_address(&self, name: &str) -> Option<u64> {
        self.sections
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.address)
    }

    /// The dynamic linker named in `.interp`, if any.
    pub fn interpreter(&self) -> Option<PathBuf> {
        let (_, interp) = self.section(".interp")?;
        let interp = std::str::from_utf8(interp).ok()?.trim_end_matches('\0');
        Some(PathBuf::from(interp))
    }

    /// Link-time address ranges of the executable sections (`.text`, …).
    pub fn code_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.sections
            .iter()
            .filter(|s| s.code)
            .map(|s| (s.address, s.address + s.size))
    }

    /// The loadable segment whose file part holds `vaddr`.
    fn segment_in_file(&self, vaddr: u64) -> Option<&Segment> {
        self.segments
            .iter()
            .find(|s| vaddr >= s.address && vaddr < s.address + s.file_size)
    }

    /// The file offset of a link-time address inside a segment's file part
    /// (what a uprobe attaches to).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segment_in_file(vaddr)
            .map(|s| vaddr - s.address + s.file_offset)
    }

    /// The file bytes from `vaddr` to the end of its segment's file part.
    pub fn bytes_at(&self, vaddr: u64) -> Option<&[u8]> {
        let s = self.segment_in_file(vaddr)?;
        let end = (s.file_offset + s.file_size).min(self.data.len() as u64);
        self.data
            .get((s.file_offset + vaddr - s.address) as usize..end as usize)
    }

    /// Whether `vaddr` is in an executable segment.
    pub fn is_code(&self, vaddr: u64) -> bool {
        self.segment_in_file(vaddr).is_some_and(|s| s.executable)
    }

    /// Whether the dynamic linker fills the word at `slot` with another
    /// module's symbol (a call through it leaves the module).
    pub fn is_external(&self, slot: u64) -> bool {
        self.slots.is_external(slot)
    }

    /// The symbol the dynamic linker fills the word at `slot` with, when
    /// it is another module's (what a PLT stub jumps through).
    pub(crate) fn external_name(&self, slot: u64) -> Option<&str> {
        self.slots.external_name(slot)
    }

    /// The value the word at `slot` holds at run time, as a link-time
    /// address, when the module's relocations (or, without them, its GOT's
    /// file contents) say so: how `mov GC_arrays@GOTPCREL(%rip),%rcx` is
    /// followed. `None` for ordinary data.
    pub fn slot_value(&self, slot: u64) -> Option<u64> {
        self.slots.value(slot, |at| {
            let bytes = self.bytes_at(at)?.get(..8)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        })
    }

    /// The whole names (`.dynsym` name `@` version) of the Crystal symbols
    /// (`*…`, `~…`) of a module without `.symtab`, by address; empty for a
    /// module with one (it keeps the names whole).
    pub fn versioned_crystal_names(&self) -> &HashMap<u64, String> {
        &self.versioned
    }

    /// Run-time minus link-time address of this module, from one of its
    /// mappings: the mapping belongs to the loadable segment whose
    /// page-aligned file range holds the mapping's file offset (an executable
    /// segment for an executable mapping, if one does), and the bias is the
    /// mapping's start minus the link-time address of that file offset.
    /// `None` if no segment holds it. Executable mappings and the mapping
    /// at file offset 0 are unambiguous; a data mapping may not be (two
    /// segments can share a file page), so use one of those.
    pub fn bias(&self, mapping: &Mapping) -> Option<u64> {
        Segment::bias(&self.segments, mapping)
    }

    /// Its (first) executable segment's link-time address minus its file
    /// offset: what the kernel subtracts, with a mapping's start and
    /// offset, to get the load bias of a mapping of that segment.
    pub fn exec_vaddr_less_offset(&self) -> Option<u64> {
        let s = self.segments.iter().find(|s| s.executable)?;
        Some(s.address.wrapping_sub(s.file_offset))
    }

    /// Bytes of the module's thread-local storage block, if it has one.
    pub fn tls_size(&self) -> Option<u64> {
        self.tls_size
    }

    /// The offset of thread-local variable `name` in the module's TLS
    /// block, from `.symtab` or `.dynsym` (a stripped file has neither
    /// for a hidden one). Read once: the symbol map keeps addresses only.
    pub fn tls_symbol(&self, name: &str) -> Option<u64> {
        let parsed = object::File::parse(&*self.data).ok()?;
        let found = parsed.symbols().chain(parsed.dynamic_symbols()).find(|s| {
            s.kind() == object::SymbolKind::Tls && !s.is_undefined() && s.name() == Ok(name)
        });
        found.map(|s| s.address())
    }

    /// Whether the dynamic linker fills `slot` with the thread-pointer
    /// offset of one of the module's own TLS variables.
    pub fn is_tls_offset_slot(&self, slot: u64) -> bool {
        self.slots.tls_offsets.contains(&slot)
    }

    /// A GOT slot the dynamic linker fills with this module's TLS module
    /// id (the index of its block in each thread's TLS vector).
    pub fn tls_module_slot(&self) -> Option<u64> {
        self.slots.tls_module
    }

    /// The load bias of this module in process `pid` ([`Self::bias`] of an
    /// executable mapping of it, else of its mapping at file offset 0).
    pub fn load_bias(&self, pid: u32) -> Result<u64, Error> {
        let not_mapped = || Error::NotMapped {
            path: self.path.clone(),
            pid,
        };
        let mappings = maps::read(pid).map_err(|_| not_mapped())?;
        let of = |path: &Path| -> Vec<&Mapping> {
            mappings
                .iter()
                .filter(|m| m.path == path)
                .filter(|m| m.file_offset == 0 || m.executable)
                .collect()
        };
        let mut ours = of(&self.path);
        if ours.is_empty() && self.same_here {
            // A path given through a symbolic link (memprof's own view).
            if let Ok(canonical) = self.path.canonicalize() {
                ours = of(&canonical);
            }
        }
        // An executable mapping first: only the loader maps the file so
        // (the process may also map it as data, at file offset 0).
        ours.sort_by_key(|m| !m.executable);
        ours.iter()
            .find_map(|m| self.bias(m))
            .ok_or_else(not_mapped)
    }
}

/// The loadable segments of `parsed`, but those whose addresses or file
/// range run past the end of the 64-bit space (no loader maps them; left
/// out, the arithmetic on the others cannot overflow).
fn segments_of(parsed: &object::File<'_>) -> Vec<Segment> {
    parsed
        .segments()
        .map(|s| {
            let (file_offset, file_size) = s.file_range();
            let executable = matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
            Segment {
                address: s.address(),
                mem_size: s.size(),
                file_offset,
                file_size,
                executable,
            }
        })
        .filter(|s| {
            s.address.checked_add(s.mem_size.max(s.file_size)).is_some()
                && s.file_offset.checked_add(s.file_size).is_some()
        })
        .collect()
}

/// The sections of `parsed`, but those whose addresses or file range run
/// past the end of the 64-bit space (as for segments).
fn sections_of(parsed: &object::File<'_>) -> Vec<Section> {
    parsed
        .sections()
        .map(|s| Section {
            name: s.name().unwrap_or_default().to_string(),
            address: s.address(),
            size: s.size(),
            file_range: s.file_range(),
            code: s.kind() == SectionKind::Text
                && matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0),
        })
        .filter(|s| {
            s.address.checked_add(s.size).is_some()
                && s.file_range
                    .is_none_or(|(offset, size)| offset.checked_add(size).is_some())
        })
        .collect()
}

/// The symbols `parsed` defines, by name (`.dynsym` first).
fn symbols_of(parsed: &object::File<'_>) -> HashMap<String, Symbol> {
    let mut symbols = HashMap::new();
    for symbol in parsed.dynamic_symbols().chain(parsed.symbols()) {
        if let Ok(name) = symbol.name() {
            if symbol.is_definition() && symbol.address() != 0 {
                symbols.entry(name.to_string()).or_insert(Symbol {
                    address: symbol.address(),
                    size: symbol.size(),
                });
            }
        }
    }
    symbols
}

/// The size of the module's TLS block.
fn tls_size_of(parsed: &object::File<'_>) -> Option<u64> {
    // PT_TLS (`segments()` has the loadable ones only).
    match parsed {
        object::File::Elf64(elf) => {
            use object::read::elf::ProgramHeader;
            let endian = elf.endian();
            elf.elf_program_headers()
                .iter()
                .find(|h| h.p_type(endian) == object::elf::PT_TLS)
                .map(|h| h.p_memsz(endian))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, file_offset: u64, executable: bool) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            file_offset,
            executable,
            path: PathBuf::from("/m"),
            file_id: (String::from("00:00"), 1),
        }
    }

    #[test]
    fn bias_of_any_mapping_of_this_process() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let module = Module::open(&exe).unwrap();
        let ours: Vec<Mapping> = maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .filter(|m| m.path == exe)
            .collect();
        // The loader's mapping at offset 0 comes first (this test process
        // also maps the file as data, for `Module::open`).
        let at_zero = ours.iter().find(|m| m.file_offset == 0).unwrap();
        let bias = at_zero.start - module.segments()[0].address;
        // (A data mapping can be ambiguous: two segments may share a file page.)
        for m in ours.iter().filter(|m| m.executable).chain([at_zero]) {
            assert_eq!(module.bias(m), Some(bias), "{m:?}");
        }
        assert_eq!(module.load_bias(std::process::id()).unwrap(), bias);
        // A function of this file is where the bias says it is.
        let here = bias_of_any_mapping_of_this_process as *const () as u64;
        assert!(ours.iter().any(|m| m.executable
            && here >= m.start
            && here < m.end
            && module.file_offset(here - bias) == Some(m.file_offset_of(here))));
    }

    #[test]
    fn bias_of_a_segment_not_at_a_page_boundary() {
        // The older layout: text at file offset 0, data at 0x1e10 mapped
        // from the page at 0x1000 to 0x201000 (+ bias).
        let text = Segment {
            address: 0x400000,
            mem_size: 0x1e10,
            file_offset: 0,
            file_size: 0x1e10,
            executable: true,
        };
        let data = Segment {
            address: 0x601e10,
            mem_size: 0x300,
            file_offset: 0x1e10,
            file_size: 0x230,
            executable: false,
        };
        let bias_of = |m: Mapping| {
            let holds = [text, data];
            // The rule of `Module::bias` on these two segments.
            let module = Module {
                segments: holds.to_vec(),
                ..Module::open(&std::fs::read_link("/proc/self/exe").unwrap()).unwrap()
            };
            module.bias(&m)
        };
        assert_eq!(bias_of(mapping(0x400000, 0, true)), Some(0));
        assert_eq!(bias_of(mapping(0x601000, 0x1000, false)), Some(0));
    }
}
