//! The contract between the eBPF programs (`memprof-ebpf`) and the
//! userspace daemon (`memprof`): everything both sides must agree on is
//! written here once, one module per concern of the kernel side (its files
//! have the same names).
//!
//! | what | where |
//! |---|---|
//! | names of programs, maps and load-time constants | [`programs`], [`maps`], [`globals`] |
//! | an allocator call: its cookie, argument layout, the call in flight | `calls`: [`cookie`], [`layout`], [`op`], [`PendingCall`] |
//! | the core tables' records | `record`: [`AllocSite`], [`LiveAlloc`], [`SiteTotals`], [`KindLive`] |
//! | what went wrong or was dropped | `counters`: [`KernelCounters`] (one field per counter) |
//! | sampling, prediction, refill weighting | [`SAMPLE_QUANTILES`]; `prediction`: [`Predict`]; `refill`: [`Refill`] |
//! | the unwinder: CFI rows, module table, stacks | `unwind`: [`UnwindRow`], [`ModuleRange`], [`module_table`], [`cfa`], [`DwarfStack`] |
//! | Boehm GC objects: the copy's events, mark bits | `gc`: [`GcEvent`], [`gc_event`], [`KernelMarks`] |
//! | `attach --all`'s processes | [`host`], [`HostEvent`] |
//! | byte codes | [`AllocKind`] (`TryFrom<u8>`) |
//! | numbers from Linux the kernel side needs | `linux`: [`errno`], [`signal`] |
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of pointers, so the same
//! bytes mean the same thing on both sides of a BPF map. With the `user`
//! feature the types also implement `aya::Pod`, which lets userspace read
//! them straight out of maps. Userspace converts the records into its own
//! types at one boundary (`memprof::probes`).
#![cfg_attr(not(any(feature = "user", test)), no_std)]

pub mod globals;
pub mod maps;
pub mod programs;

mod calls;
mod counters;
mod gc;
pub mod host;
mod kind;
mod linux;
mod prediction;
mod record;
mod refill;
mod sampling;
mod unwind;

#[cfg(feature = "user")]
mod pod;

pub use calls::*;
pub use counters::*;
pub use gc::*;
pub use host::HostEvent;
pub use kind::*;
pub use linux::*;
pub use prediction::*;
pub use programs::SESSION_IS_RETURN;
pub use record::*;
pub use refill::*;
pub use sampling::*;
pub use unwind::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        for names in [&maps::ALL[..], &globals::ALL[..], &programs::ALL[..]] {
            let mut sorted = names.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "{names:?}");
        }
    }
}
