//! Writing the tables the kernel's DWARF unwinder searches: the CFI rows of
//! every module (`UNWIND_ROWS`, once, at load) and where each module is
//! mapped (`MODULE_RANGES`, again whenever the target's mappings change).
//!
//! The module table's layout (two halves, the packed count) is
//! [`memprof_common::module_table`]: the same constants the kernel's search
//! uses.
use anyhow::Result;
use aya::maps::{Array, MapData};
use memprof_common::{maps, module_table, ModuleRange, UnwindRow};

use super::Probes;
use crate::unwind::Tables;

/// How many module ranges the kernel's table holds.
const MAX_MODULES: usize = module_table::MAX_MODULES as usize;

/// What the kernel's module table holds now.
#[derive(Debug, Default)]
pub(super) struct ModuleTable {
    /// The ranges in the half in use.
    ranges: Vec<ModuleRange>,
    /// Which half (0 or 1) is in use.
    half: u32,
    /// How many tables were written before this one.
    generation: u32,
}

impl Probes {
    /// Writes the CFI rows (the kernel unwinds with them: `UNWIND_DWARF` was set at load).
    pub(super) fn write_unwind_rows(&mut self, tables: &Tables) -> Result<()> {
        let map = self.map(maps::UNWIND_ROWS)?;
        let copied = match map {
            aya::maps::Map::Array(data) => {
                super::batch::copy_into_mappable(data, 0, &tables.rows).is_ok()
            }
            _ => false,
        };
        if !copied {
            super::batch::fill_array::<UnwindRow>(map, &tables.rows)?;
        }
        Ok(())
    }

    /// Tells the unwinder where each module is mapped (sorted by address;
    /// past [`module_table::MAX_MODULES`] ranges are dropped).
    ///
    /// The kernel's table is double: the new ranges go into the half not in
    /// use, then one write of `MODULE_TABLE` switches halves, so a probe
    /// never unwinds with a half-written (or empty) table. Unchanged ranges
    /// are not rewritten.
    pub fn set_module_ranges(&mut self, ranges: &[ModuleRange]) -> Result<()> {
        let ranges = &ranges[..ranges.len().min(MAX_MODULES)];
        if ranges == self.modules.ranges.as_slice() {
            return Ok(());
        }
        let half = self.modules.half ^ 1;
        {
            let mut table: Array<&mut MapData, ModuleRange> =
                Array::try_from(self.map_mut(maps::MODULE_RANGES)?)?;
            for (i, range) in ranges.iter().enumerate() {
                table.set(module_table::slot(half, i as u32), range, 0)?;
            }
        }
        let generation = self.modules.generation.wrapping_add(1);
        self.modules = ModuleTable {
            ranges: ranges.to_vec(),
            half,
            generation,
        };
        self.set_switch(
            maps::MODULE_TABLE,
            module_table::pack(ranges.len() as u32, half, generation),
        )
    }
}
