//! Batched map writes, which aya 0.14 does not wrap: one `bpf(2)` syscall
//! for thousands of entries instead of one each. The CFI rows (30,000 for
//! libc alone) are written at load, before the target may run: one syscall
//! each took 1.4 s. A raw syscall through `libc`, not a crate: the
//! attribute struct is six fields.
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, bail, Result};
use aya::maps::Map;

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// Entries per call.
const CHUNK: usize = 65536;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid `bpf_attr` prefix of the size passed; the
    // kernel reads the key and value arrays it points to (alive for the call).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `values` at indices `0..values.len()` of the array `map`.
pub fn fill_array<T: aya::Pod>(map: &Map, values: &[T]) -> Result<()> {
    fill_array_at(map, 0, values)
}

/// Writes `values` at indices `start..start + values.len()` of the array `map`.
pub fn fill_array_at<T: aya::Pod>(map: &Map, start: u32, values: &[T]) -> Result<()> {
    let Map::Array(data) = map else {
        bail!("expected an array map");
    };
    fill_at(data, start, values)
}

/// [`fill_array_at`] of an array map's data.
pub fn fill_at<T: aya::Pod>(data: &aya::maps::MapData, start: u32, values: &[T]) -> Result<()> {
    let fd = data.fd().as_fd().as_raw_fd();
    for (n, chunk) in values.chunks(CHUNK).enumerate() {
        let first = start + (n * CHUNK) as u32;
        let keys: Vec<u32> = (first..first + chunk.len() as u32).collect();
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: chunk.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        bpf(BPF_MAP_UPDATE_BATCH, &mut attr)
            .map_err(|e| anyhow!("writing {} entries into an array map: {e}", chunk.len()))?;
    }
    Ok(())
}
