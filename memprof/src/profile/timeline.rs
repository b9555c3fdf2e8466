//! Live memory over time ([`Timeline`]), sampled while the target ran.
use serde::{Deserialize, Serialize};

/// Live memory over time, sampled by the daemon at a fixed period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The period asked for, seconds. Samples can be further apart when one
    /// sample takes long (a huge live table): memprof keeps its own reading
    /// of the kernel tables under a tenth of the time.
    pub period_s: f64,
    pub samples: Vec<Sample>,
    /// The longest a reading of the live table took, seconds.
    #[serde(default)]
    pub longest_read_s: f64,
}

/// One reading of the kernel's live table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since profiling started.
    pub t_s: f64,
    /// Per kind (`libc`, `mmap`, `gc`, `gc_atomic`): `[live blocks, live bytes]`.
    pub live: std::collections::BTreeMap<String, [u64; 2]>,
    /// The Boehm GC's heap size (`GC_get_heap_size`) at that time, where known.
    #[serde(default)]
    pub gc_heap_bytes: Option<u64>,
    /// Read from the per-site totals (the live table was too big to read
    /// at this rate): counts exact, bytes of freed blocks estimated from
    /// their site's mean allocation size.
    #[serde(default)]
    pub estimated: bool,
}
