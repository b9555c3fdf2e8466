//! The records userspace reads straight out of maps (`aya::Pod`, with the
//! `user` feature).
use crate::*;

// SAFETY: plain #[repr(C)] data, every bit pattern valid, padding explicit.
unsafe impl aya::Pod for AllocSite {}
unsafe impl aya::Pod for PendingCall {}
unsafe impl aya::Pod for LiveAlloc {}
unsafe impl aya::Pod for GcEvent {}
unsafe impl aya::Pod for KindLive {}
unsafe impl aya::Pod for SiteTotals {}
unsafe impl aya::Pod for UnwindRow {}
unsafe impl aya::Pod for ModuleRange {}
unsafe impl aya::Pod for DwarfStack {}
unsafe impl aya::Pod for Predict {}
unsafe impl aya::Pod for HostEvent {}
unsafe impl aya::Pod for KernelMarks {}
unsafe impl aya::Pod for Refill {}
unsafe impl aya::Pod for KernelCounters {}
unsafe impl aya::Pod for host::FileKey {}
unsafe impl aya::Pod for host::KnownFile {}
unsafe impl aya::Pod for host::KernelLayout {}
