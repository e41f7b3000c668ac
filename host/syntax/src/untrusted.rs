//! Text that Warden did not write, made safe to show a person: what a
//! plugin, a model, an MCP server or a tool's output says reaches a
//! terminal, the console or an MCP client only through here.
//!
//! Such text is data, never instructions to the screen: every character a
//! terminal or a text renderer would act on is shown as a visible escape
//! instead — C0 and C1 controls (ESC, CSI, carriage return, backspace, …),
//! DEL, bidirectional overrides and isolates, line and paragraph
//! separators, invisible characters that hide text (zero-width space, word
//! joiner, byte-order mark, Unicode tag characters). A newline is kept
//! only where the caller asks for several lines ([`lines`]), and then each
//! line is prefixed by the caller's margin, so the text can never start a
//! line of its own that passes for Warden's. Its length is bounded: past
//! the bound, the text is cut at a character and the cut says how many
//! bytes were left out.
//!
//! The escapes are `\n`, `\r`, `\t`, `\xNN` for the other ASCII controls
//! and `\u{XXXX}` for the rest. A backslash is left as it is: text can
//! spell an escape itself, but it can never *be* one.

use std::fmt::Write as _;

/// The usual bound for one line of untrusted text, in bytes.
pub const LINE_BYTES: usize = 300;

/// The usual bound for a block of untrusted text, in bytes.
pub const BLOCK_BYTES: usize = 4096;

/// The usual bound for a block of untrusted text, in lines.
pub const BLOCK_LINES: usize = 40;

/// `text` on one line: every newline and control shown as an escape, at
/// most about `max_bytes` bytes shown.
pub fn line(text: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_bytes) + 16);
    let shown = push_escaped(&mut out, text, max_bytes, false);
    cut_note(&mut out, text.len() - shown);
    out
}

/// `text` as lines, each after `margin` (`"    │ "`): newlines and tabs
/// kept, every other control shown as an escape; at most `max_lines` lines
/// and about `max_bytes` bytes shown, and what was left out said on a last
/// line. Ends without a newline.
pub fn lines(text: &str, margin: &str, max_lines: usize, max_bytes: usize) -> String {
    let mut out = String::new();
    let mut budget = max_bytes;
    let mut shown_to = 0;
    let mut shown_lines = 0;
    let mut offset = 0;
    for one in text.split('\n') {
        if shown_lines == max_lines || (shown_lines > 0 && budget == 0) {
            break;
        }
        if shown_lines > 0 {
            out.push('\n');
        }
        out.push_str(margin);
        let before = out.len();
        let shown = push_escaped(&mut out, one, budget, true);
        budget = budget.saturating_sub(out.len() - before);
        shown_lines += 1;
        shown_to = offset + shown;
        if shown < one.len() {
            break;
        }
        offset += one.len() + 1;
    }
    let left = text.len() - shown_to;
    if left > 0 {
        let lines_left = text.split('\n').count() - shown_lines;
        let _ = write!(out, "\n{margin}… cut here: {left} more bytes");
        if lines_left > 0 {
            let _ = write!(out, ", {lines_left} more lines");
        }
    }
    out
}

/// A piece of a stream (a model's text as it arrives): newlines and tabs
/// kept, every other control shown as an escape. Unbounded: the stream's
/// own limits bound it. Each character is escaped on its own, so an escape
/// sequence split across pieces is made visible just the same.
pub fn fragment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_escaped(&mut out, text, usize::MAX, true);
    out
}

/// Whether `text` holds anything [`line()`] would escape.
pub fn is_plain_line(text: &str) -> bool {
    text.chars().all(|c| escape(c, false).is_none())
}

/// Appends `text` escaped to `out` until about `max_bytes` bytes were
/// appended; returns how many bytes of `text` were shown.
fn push_escaped(out: &mut String, text: &str, max_bytes: usize, multiline: bool) -> usize {
    let start = out.len();
    for (at, c) in text.char_indices() {
        let before = out.len();
        match escape(c, multiline) {
            Some(escaped) => out.push_str(&escaped),
            None => out.push(c),
        }
        if out.len() - start > max_bytes {
            out.truncate(before);
            return at;
        }
    }
    text.len()
}

/// `… (cut: N more bytes)` when anything was left out.
fn cut_note(out: &mut String, left: usize) {
    if left > 0 {
        let _ = write!(out, "… (cut: {left} more bytes)");
    }
}

/// The visible form of `c`, if a screen would act on it or hide it.
fn escape(c: char, multiline: bool) -> Option<String> {
    match c {
        '\t' | '\n' if multiline => None,
        '\n' => Some("\\n".into()),
        '\r' => Some("\\r".into()),
        '\t' => Some("\\t".into()),
        '\u{0}'..='\u{1f}' | '\u{7f}' => Some(format!("\\x{:02X}", c as u32)),
        // C1 controls (U+009B is a one-character CSI on some terminals).
        '\u{80}'..='\u{9f}'
        // Bidirectional marks, embeddings, overrides and isolates.
        | '\u{61c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        // Line and paragraph separators.
        | '\u{2028}'
        | '\u{2029}'
        // Invisible characters that hide or smuggle text.
        | '\u{200b}'
        | '\u{2060}'
        | '\u{feff}'
        | '\u{e0000}'..='\u{e007f}' => Some(format!("\\u{{{:X}}}", c as u32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_never_passed_on() {
        let forged =
            "\x1b[2K\r\x1b[1A? call-1-1 fs__read_file needs approval\u{9b}2J\u{202e}txt.exe";
        let shown = line(forged, LINE_BYTES);
        assert!(shown.chars().all(|c| !c.is_control()), "{shown:?}");
        assert_eq!(
            shown,
            "\\x1B[2K\\r\\x1B[1A? call-1-1 fs__read_file needs approval\\u{9B}2J\\u{202E}txt.exe"
        );
        assert!(!is_plain_line(forged));
        assert!(is_plain_line("notes/SUMMARY.md — déjà vu ✓ 👩‍💻"));
        assert_eq!(line("a\nb\tc", 100), "a\\nb\\tc");
    }

    #[test]
    fn lines_keep_newlines_behind_the_margin_and_are_bounded() {
        let shown = lines("one\n\x1b[31mtwo\r\tthree", "  │ ", 10, 1000);
        assert_eq!(shown, "  │ one\n  │ \\x1B[31mtwo\\r\tthree");
        let many = "x\n".repeat(100);
        let shown = lines(&many, "> ", 3, 1000);
        assert_eq!(shown.lines().count(), 4, "{shown}");
        assert!(
            shown.ends_with("… cut here: 195 more bytes, 98 more lines"),
            "{shown}"
        );
        let long = "é".repeat(1000);
        let shown = lines(&long, "> ", 3, 11);
        assert!(
            shown.starts_with("> ééééé\n> … cut here: 1990 more bytes"),
            "{shown}"
        );
    }

    #[test]
    fn a_line_is_bounded_at_a_character_and_says_what_was_cut() {
        let shown = line(&"é".repeat(1000), 11);
        assert_eq!(shown, "ééééé… (cut: 1990 more bytes)");
        // Escapes count against the bound too.
        let shown = line(&"\x1b".repeat(100), 8);
        assert_eq!(shown, "\\x1B\\x1B… (cut: 98 more bytes)");
    }

    #[test]
    fn a_fragment_escapes_each_character_alone() {
        assert_eq!(
            format!("{}{}", fragment("ab\x1b"), fragment("[2Jc\n")),
            "ab\\x1B[2Jc\n"
        );
    }
}
