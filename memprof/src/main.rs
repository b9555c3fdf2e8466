//! The `memprof` binary: parses the command line and runs one subcommand
//! ([`memprof::commands::run_cli`]). Errors end the process with one line on stderr
//! and exit code 1.
use std::process::ExitCode;

use clap::Parser;
use memprof::commands::{cli::Cli, run_cli};

/// Not libc's malloc: `attach --all` and `run`'s family probe it in every
/// process, memprof's own included (each of its allocations would trap).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // anyhow captures a backtrace with every error when RUST_BACKTRACE is
    // set (an operator's shell, a unit file). Under the agent errors are
    // everyday (a process gone before it was read), and one resolved read
    // memprof's own debug info: 155 MB resident after one big program,
    // 87 MB without. Panics keep theirs (RUST_BACKTRACE).
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // Before any thread starts: nothing else reads the environment.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    memprof::memory::configure();
    let cli = Cli::parse();
    match run_cli(cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            // One line: the outermost context and the root cause.
            let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
            let mut line = chain.join(": ");
            line.retain(|c| c != '\n');
            // It may quote a target's file name or command line.
            eprintln!("memprof: error: {}", memprof::text::visible(&line));
            ExitCode::from(1)
        }
    }
}
