//! The kernel's BTF as memprof reads it for the offsets of members of
//! `task_struct`, `vm_area_struct`, … (`memprof::fuzzing::btf_member_offsets`,
//! `probes/btf.rs`): any bytes, each query answered or refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memprof::fuzzing::btf_member_offsets(data);
});
