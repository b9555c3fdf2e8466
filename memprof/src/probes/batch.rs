//! Batched map writes and reads, which aya 0.14 does not wrap: one
//! `bpf(2)` syscall for thousands of entries instead of one each. The CFI
//! rows (30,000 for libc alone) are written at load, before the target may
//! run: one syscall each took 1.4 s. The live blocks and sites are read at
//! the end the same way. A raw syscall through `libc`, not a crate: the
//! attribute struct is six fields.
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, bail, Result};
use aya::maps::{Map, MapData};

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

/// `values` written into a mappable array map (`BPF_F_MMAPABLE`) from
/// entry `start`: the pages they fall in mapped, copied into, unmapped
/// (nothing stays in memprof's memory). A file's rows that way: the
/// batch update copies and checks each entry apart (a Crystal compiler's
/// rows: 27 % of the agent's CPU while it ran a `crystal build`).
pub fn copy_into_mappable<T: aya::Pod>(data: &MapData, start: u32, values: &[T]) -> Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    // An array's entries lie `value_size` rounded up to 8 bytes apart.
    let stride = std::mem::size_of::<T>().next_multiple_of(8);
    anyhow::ensure!(
        stride == std::mem::size_of::<T>(),
        "entries not 8-byte sized"
    );
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let from = start as usize * stride;
    let to = from + values.len() * stride;
    let first_page = from / page * page;
    let len = to - first_page;
    let fd = data.fd().as_fd().as_raw_fd();
    // SAFETY: a new shared mapping of the map's memory (the kernel checks
    // the range against the map's size), unmapped below; nothing else
    // refers to it.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            first_page as libc::off_t,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(anyhow!(
            "mapping an array map's entries: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `[from, to)` lies within the `len` bytes mapped at `at`
    // (from `first_page`); `T` is plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            values.as_ptr() as *const u8,
            (at as *mut u8).add(from - first_page),
            to - from,
        );
        libc::munmap(at, len);
    }
    Ok(())
}

/// [`fill_array_at`] of an array map's data.
pub fn fill_at<T: aya::Pod>(data: &MapData, start: u32, values: &[T]) -> Result<()> {
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

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries read per call.
const READ_CHUNK: usize = 4096;

/// Every entry of a hash map `data` whose keys are `key_size` bytes and
/// values `value_size` (a per-CPU map's: each CPU's, 8-byte aligned, one
/// after the other), one `bpf(2)` call per [`READ_CHUNK`] entries: a
/// key-by-key walk takes two calls per entry (207,000 live blocks of the
/// Crystal compiler: 0.7 s). Entries changed meanwhile (the probes still
/// run) are read as they are when their bucket is read.
fn read_raw(
    data: &MapData,
    key_size: usize,
    value_size: usize,
    mut each: impl FnMut(&[u8], &[u8]),
) -> Result<()> {
    let fd = data.fd().as_fd().as_raw_fd();
    let mut keys = vec![0u8; key_size * READ_CHUNK];
    let mut values = vec![0u8; value_size * READ_CHUNK];
    // Where the previous call stopped (the kernel's cursor: a bucket index).
    let mut cursor = [0u64; 1];
    let mut next = [0u64; 1];
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: READ_CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        let done = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => bail!("reading a hash map: {e}"),
        };
        for i in 0..(attr.count as usize).min(READ_CHUNK) {
            each(
                &keys[i * key_size..(i + 1) * key_size],
                &values[i * value_size..(i + 1) * value_size],
            );
        }
        if done {
            return Ok(());
        }
        cursor = next;
        first = false;
    }
}

/// A `T` from the start of `bytes` (at least `size_of::<T>()` of them).
fn read_pod<T: aya::Pod>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= std::mem::size_of::<T>());
    // SAFETY: `T` is plain data and `bytes` holds one, unaligned.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Every entry of the hash map `data` (keys `K`, values `V`), read in
/// batches ([`read_raw`]).
pub fn read_hash<K: aya::Pod, V: aya::Pod>(
    data: &MapData,
    mut each: impl FnMut(K, V),
) -> Result<()> {
    read_raw(
        data,
        std::mem::size_of::<K>(),
        std::mem::size_of::<V>(),
        |k, v| each(read_pod(k), read_pod(v)),
    )
}

/// Every entry of the per-CPU hash map `data`, with its values (one per
/// possible CPU), read in batches ([`read_raw`]).
pub fn read_per_cpu_hash<K: aya::Pod, V: aya::Pod>(
    data: &MapData,
    mut each: impl FnMut(K, &mut dyn Iterator<Item = V>),
) -> Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
    let stride = std::mem::size_of::<V>().next_multiple_of(8);
    read_raw(data, std::mem::size_of::<K>(), stride * cpus, |k, v| {
        each(
            read_pod(k),
            &mut v.chunks_exact(stride).map(|cpu| read_pod::<V>(cpu)),
        )
    })
}
