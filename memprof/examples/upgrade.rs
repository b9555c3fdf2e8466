//! Rewrites a profile of an older version in the current one:
//! `cargo run --release -p memprof --example upgrade -- OLD.mprof NEW.mprof`.
use anyhow::{Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [from, to] = &args[..] else {
        anyhow::bail!("usage: upgrade OLD.mprof NEW.mprof");
    };
    let profile = memprof::profile::load(from.as_ref())?;
    memprof::profile::save(&profile, to.as_ref()).with_context(|| format!("cannot write {to}"))
}
