//! Whole Crystal symbol names in a module without `.symtab`.
//!
//! Crystal names may contain `@` (`Array(T)#push…`); in `.dynsym` the
//! dynamic linker reads what follows the last `@` as a symbol version, so
//! the name is split into a name and a version. Joined again here.
use std::collections::HashMap;

/// The whole names of the Crystal symbols (`*…`, `~…`) of a module without
/// `.symtab`, by address: `.dynsym` name `@` version name. (`.symtab` keeps
/// the names whole, so modules that have one get an empty map.)
pub(super) fn crystal_names(file: &object::File) -> HashMap<u64, String> {
    match file {
        object::File::Elf64(elf) => versioned_names(elf).unwrap_or_default(),
        _ => HashMap::new(),
    }
}

fn versioned_names(
    elf: &object::read::elf::ElfFile64,
) -> object::read::Result<HashMap<u64, String>> {
    use object::elf::{SHT_DYNSYM, SHT_SYMTAB};
    use object::read::elf::Sym as _;
    use object::SymbolIndex;

    let mut names = HashMap::new();
    let (endian, data) = (elf.endian(), elf.data());
    let sections = elf.elf_section_table();
    if !sections.symbols(endian, data, SHT_SYMTAB)?.is_empty() {
        return Ok(names);
    }
    let Some(versions) = sections.versions(endian, data)? else {
        return Ok(names);
    };
    let dynsym = sections.symbols(endian, data, SHT_DYNSYM)?;
    for (i, sym) in dynsym.symbols().iter().enumerate() {
        let name = dynsym.symbol_name(endian, sym)?;
        if !name.starts_with(b"*") && !name.starts_with(b"~") {
            continue;
        }
        let version = versions.version(versions.version_index(endian, SymbolIndex(i)))?;
        if let Some(version) = version {
            let whole = [name, version.name()].join(&b'@');
            names.insert(
                sym.st_value(endian),
                String::from_utf8_lossy(&whole).into_owned(),
            );
        }
    }
    Ok(names)
}
