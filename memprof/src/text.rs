//! Text from a target — its command line, its files' names, its symbol
//! and type names — as shown to a person: data, never commands to their
//! terminal. Any user's process can name itself `\e]0;…\a` (a terminal
//! title) or `\e[2J` (clear the screen); root reads memprof's output.
//!
//! Control characters (C0 with ESC and BEL, DEL, C1) are shown as Rust
//! escapes (`\u{1b}`, `\u{7}`, `\n`), bytes that are not UTF-8 as `\xe9`:
//! a Latin-1 file name is shown, not refused, and two names differing in
//! such a byte stay two.
//!
//! ```text
//! "ev\x1b]0;pwned\x07" (bytes)  →  ev\u{1b}]0;pwned\u{7}
//! "caf\xe9" (bytes)             →  caf\xe9
//! ```
use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `text` with its control characters escaped (borrowed when it has none).
pub fn visible(text: &str) -> Cow<'_, str> {
    visible_but(text, &[])
}

/// `text` with its control characters escaped, but for those of `kept`.
fn visible_but<'a>(text: &'a str, kept: &[char]) -> Cow<'a, str> {
    let hidden = |c: char| c.is_control() && !kept.contains(&c);
    if !text.contains(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            // `\u{1b}`, `\u{7}`, `\n`, `\t`, `\u{9b}`.
            let _ = write!(out, "{}", c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Bytes a target named something with (a command-line word, a file
/// name) as text to keep: bytes that are not UTF-8 as `\xNN`, the rest
/// as it is (shown later through [`visible`]).
pub fn lossy(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A path as [`lossy`] keeps its bytes.
pub fn lossy_path(path: &Path) -> String {
    lossy(path.as_os_str().as_bytes())
}

/// Bytes as [`lossy`] keeps them, shown [`visible`].
pub fn visible_bytes(bytes: &[u8]) -> String {
    visible(&lossy(bytes)).into_owned()
}

/// A path as [`visible_bytes`] shows its bytes.
pub fn visible_path(path: &Path) -> String {
    visible_bytes(path.as_os_str().as_bytes())
}

/// Writes one message line on stderr with the control characters of what
/// it quotes escaped; its own line breaks and tabs stay. Every
/// `eprintln!` of the crate comes here (see `lib.rs`).
pub fn to_stderr(message: std::fmt::Arguments<'_>) {
    let line = match message.as_str() {
        Some(fixed) => Cow::Borrowed(fixed),
        None => Cow::Owned(message.to_string()),
    };
    let line = visible_but(&line, &['\n', '\t']);
    // As `eprintln!`: one write of the whole line; a closed stderr is no error.
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(format!("{line}\n").as_bytes());
}

/// Bytes in B, KiB, MiB or GiB, one decimal.
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = b.abs();
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// For HTML: `<`, `>`, `&` and quotes as entities, control characters
/// as escapes ([`visible`]).
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in visible(text).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            visible("ev\x1b]0;pwned\x07\x1b[2J|x"),
            r"ev\u{1b}]0;pwned\u{7}\u{1b}[2J|x"
        );
        assert_eq!(visible("a\nb\tc\x7f\u{9b}"), r"a\nb\tc\u{7f}\u{9b}");
        assert!(matches!(visible("plain 'name' é"), Cow::Borrowed(_)));
    }

    #[test]
    fn bytes_not_utf8_are_shown_as_hex() {
        assert_eq!(visible_bytes(b"caf\xe9\x1b[2J"), r"caf\xe9\u{1b}[2J");
        assert_eq!(visible_bytes("café".as_bytes()), "café");
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xe9\x07"));
        assert_eq!(visible_path(path), r"/tmp/\xe9\u{7}");
    }

    #[test]
    fn stderr_lines_keep_their_own_breaks() {
        assert_eq!(visible_but("a\n\tb\x1bc", &['\n', '\t']), "a\n\tb\\u{1b}c");
    }
}
