//! The whole GC heap as the collector judged it at one collection: every
//! heap block its block index knows, every object in it, live when the
//! collector marked it (`memprof heap`).
//!
//! Two parts, like a mark-bit pass ([`super::pass`]):
//!
//! - held ([`HeapReader::copy`], at the end of a collection's marking, the
//!   world stopped and the collector held): the block index is walked
//!   ([`MarkLayout::every_block`]), the headers read in page runs
//!   ([`MarkLayout::read_header_pages`]) with each block's kind
//!   (`hb_obj_kind`, [`super::layout::kind_offset`]), and the memory of the
//!   blocks holding marked objects copied (a small-object block whole, the
//!   first bytes of a large object). Nothing is decoded yet;
//! - after the target runs again ([`HeapCopy::census`]): each object of
//!   each block is judged by its mark bit, live ones counted per kind, size
//!   class and first 32-bit word (a Crystal object's type id).
//!
//! Marked is the collector's verdict, with one exception the census tells
//! apart: objects on a thread's free list are marked too (libgc marks them
//! so that the sweep leaves them on the list), though nothing uses them.
//! They are recognized by their shape — the first word links to the next
//! free object of the same size and kind (or is 0), the rest is cleared
//! (kinds libgc clears) — and by nothing typed pointing into them (an
//! empty buffer has the same zeros, but its array points to it), and
//! counted apart, never as live.
//!
//! Files: `read.rs` the held part, into `heap_copy.rs`; `count.rs` the
//! census; `graph.rs` the object graph and retained bytes.
//!
//! (Example: `doc_examples::example_1` below, compiled by the tests, not run: it needs a live process.)
mod count;
mod graph;
mod heap_copy;
pub mod names;
pub(crate) mod read;

pub use self::count::{Census, LiveObject, Tally, Word};
pub use self::graph::Graph;
pub use self::heap_copy::{is_atomic, kind_name, HeapCopy};
pub use self::read::{Counters, HeapReader};

#[cfg(test)]
mod tests;

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[allow(dead_code)]
    fn example_1() -> anyhow::Result<()> {
        use crate::gc::census::HeapReader;
        use crate::modules::Module;
        let libgc = Module::open("/usr/lib/x86_64-linux-gnu/libgc.so.1".as_ref())?;
        let reader = HeapReader::new(std::sync::Arc::new(libgc))?;
        // With the collector of pid 1234 held at `GC_gc_no++`:
        let copy = reader.copy(1234, false)?; // false: large objects by their head only
        let census = copy.census(&|word, _kind, _size| (1..1000).contains(&word)); // type ids
        println!(
            "{} live objects at collection {}",
            census.live_count(),
            copy.gc_no
        );
        Ok(())
    }
}
