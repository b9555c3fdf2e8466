//! Builds the eBPF programs (`memprof-ebpf`, for `bpfel-unknown-none`, with
//! the nightly toolchain and `bpf-linker`) and leaves the object in OUT_DIR,
//! where `src/probes.rs` embeds it: users get one binary.
fn main() -> anyhow::Result<()> {
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("../memprof-ebpf");
    let ebpf_dir = ebpf_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "memprof-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .map_err(|e| anyhow::anyhow!("building the eBPF programs failed: {e:#}\nhint: run `cargo xtask setup` (needs the nightly rust-src component and bpf-linker 0.10.4)"))
}
