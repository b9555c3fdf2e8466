//! Progress bars for steps that can take more than a second on a big
//! profile (symbolizing thousands of stacks, writing pprof): drawn on
//! stderr when it is a terminal, silent otherwise (pipes, logs, tests).
//!
//! (Example: `doc_examples::example_1` below, run by the tests.)
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps named `what`; hidden unless stderr is a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("memprof: {msg} [{bar:30}] {pos}/{len} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// The examples of this file's documentation, as unit tests (the module
/// is private to the crate, so rustdoc cannot run them).
#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        let bar = crate::progress::bar(3, "symbolizing");
        bar.inc(3);
        bar.finish_and_clear();
    }
}
