//! Which allocator an allocation came from.
#[cfg(doc)]
use crate::AllocSite;

/// Which allocator family an allocation came from. Stored as a `u8`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocKind {
    /// libc heap: malloc, calloc, realloc, memalign, …
    Libc = 0,
    /// anonymous or file mappings made with `mmap`.
    Mmap = 1,
    /// Boehm GC, scanned objects (`GC_malloc`).
    Gc = 2,
    /// Boehm GC, pointer-free objects (`GC_malloc_atomic`).
    GcAtomic = 3,
    /// Resident memory: a page of memory written for the first time (a
    /// page fault), whatever allocated it; given back when its range is
    /// unmapped or discarded.
    Rss = 4,
}

impl AllocKind {
    pub const ALL: [AllocKind; 5] = [
        AllocKind::Libc,
        AllocKind::Mmap,
        AllocKind::Gc,
        AllocKind::GcAtomic,
        AllocKind::Rss,
    ];
    /// How many kinds there are.
    pub const COUNT: usize = Self::ALL.len();

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::Libc => "libc",
            AllocKind::Mmap => "mmap",
            AllocKind::Gc => "gc",
            AllocKind::GcAtomic => "gc_atomic",
            AllocKind::Rss => "rss",
        }
    }
}

/// The kind byte of an [`AllocSite`] as an [`AllocKind`]: a byte no kind
/// has is an error ([`UnknownKind`]), never a guess.
impl TryFrom<u8> for AllocKind {
    type Error = UnknownKind;

    fn try_from(v: u8) -> Result<AllocKind, UnknownKind> {
        match v {
            0 => Ok(AllocKind::Libc),
            1 => Ok(AllocKind::Mmap),
            2 => Ok(AllocKind::Gc),
            3 => Ok(AllocKind::GcAtomic),
            4 => Ok(AllocKind::Rss),
            _ => Err(UnknownKind(v)),
        }
    }
}

/// A kind byte that is no [`AllocKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownKind(pub u8);

impl core::fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown allocation kind {}", self.0)
    }
}

#[cfg(any(feature = "user", test))]
impl std::error::Error for UnknownKind {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_bytes_round_trip_and_unknown_is_an_error() {
        for kind in AllocKind::ALL {
            assert_eq!(AllocKind::try_from(kind as u8), Ok(kind));
        }
        assert_eq!(AllocKind::try_from(5), Err(UnknownKind(5)));
    }
}
