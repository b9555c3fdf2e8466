static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memprof-probes"));
fn main() { println!("{}", OBJ.len()); }
