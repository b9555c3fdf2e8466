//! Field names of Crystal classes, from DWARF: `crystal build --debug`
//! describes each class as a structure with its instance variables as
//! members (named without `@`, at their offsets):
//!
//! ```text
//! DW_TAG_structure_type  DW_AT_name ("B")
//!   DW_TAG_member        DW_AT_name ("c")  DW_AT_data_member_location (0x08)
//! ```
//!
//! A default build has no members at all: [`field_names`] is then empty
//! and fields are shown by their offset.
use std::collections::{BTreeMap, HashMap};

use gimli::{AttributeValue, EndianSlice, LittleEndian};

use crate::modules::Module;

/// Per class name, its fields by offset.
pub type Fields = HashMap<String, BTreeMap<u64, String>>;

/// The members of every named structure in `module`'s DWARF (empty
/// without DWARF, or when it cannot be read).
pub fn field_names(module: &Module) -> Fields {
    read(module).unwrap_or_default()
}

fn read(module: &Module) -> gimli::Result<Fields> {
    let dwarf = gimli::Dwarf::load(|id: gimli::SectionId| {
        let bytes = module.section(id.name()).map_or(&[][..], |(_, b)| b);
        Ok::<_, gimli::Error>(EndianSlice::new(bytes, LittleEndian))
    })?;
    let mut fields = Fields::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let mut entries = unit.entries();
        // The structure being read: its depth and name.
        let mut current: Option<(isize, String)> = None;
        while let Some(entry) = entries.next_dfs()? {
            let depth = entry.depth();
            if current.as_ref().is_some_and(|(d, _)| depth <= *d) {
                current = None;
            }
            let name = || -> Option<String> {
                let value = entry.attr_value(gimli::DW_AT_name)?;
                let s = dwarf.attr_string(&unit, value).ok()?;
                Some(s.to_string_lossy().into_owned())
            };
            match entry.tag() {
                gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type => {
                    current = name().map(|n| (depth, n));
                }
                gimli::DW_TAG_member => {
                    let Some((d, class)) = &current else { continue };
                    if depth != d + 1 {
                        continue;
                    }
                    let offset = match entry.attr_value(gimli::DW_AT_data_member_location) {
                        Some(AttributeValue::Udata(n)) => Some(n),
                        Some(v) => v.udata_value(),
                        None => None,
                    };
                    if let (Some(offset), Some(field)) = (offset, name()) {
                        fields
                            .entry(class.clone())
                            .or_default()
                            .entry(offset)
                            .or_insert(field);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(fields)
}
