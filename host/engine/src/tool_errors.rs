//! Tool errors as the model is shown them: a long error cut to its head
//! and tail, a repeated one collapsed to one line with a count
//! ([`compact_tool_error`]). Deterministic, so the folded conversation and
//! the request hash are the same on replay; the log keeps errors whole.

/// Tool errors longer than this many bytes are cut for the model.
pub const MAX_TOOL_ERROR_BYTES: usize = 2048;
/// Bytes kept from the start of a cut error.
const ERROR_HEAD_BYTES: usize = 1536;
/// Bytes kept from the end of a cut error.
const ERROR_TAIL_BYTES: usize = 384;
/// Bytes of a repeated error quoted on its one line.
const REPEAT_QUOTE_BYTES: usize = 160;

/// A tool error as the model is shown it, deterministically: the
/// `repeats`-th identical error in a row is one line with the count;
/// otherwise an error over [`MAX_TOOL_ERROR_BYTES`] keeps its head and tail
/// around a marker saying how many bytes were cut.
pub fn compact_tool_error(error: &str, repeats: u32) -> String {
    if repeats > 1 {
        let first_line = error.lines().next().unwrap_or("");
        let quoted = head(first_line, REPEAT_QUOTE_BYTES);
        let ellipsis = if quoted.len() < error.len() {
            "…"
        } else {
            ""
        };
        return format!(
            "the same error as the previous call ({repeats} times in a row): {quoted}{ellipsis}"
        );
    }
    if error.len() <= MAX_TOOL_ERROR_BYTES {
        return error.to_owned();
    }
    let start = head(error, ERROR_HEAD_BYTES);
    let end = tail(error, ERROR_TAIL_BYTES);
    let cut = error.len() - start.len() - end.len();
    format!("{start}\n[… {cut} bytes of this error cut …]\n{end}")
}

/// The longest prefix of `text` of at most `max` bytes, at a char boundary.
fn head(text: &str, max: usize) -> &str {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// The longest suffix of `text` of at most `max` bytes, at a char boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut cut = text.len().saturating_sub(max);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_errors_are_shown_whole() {
        assert_eq!(compact_tool_error("failed: busy", 1), "failed: busy");
        let exactly = "x".repeat(MAX_TOOL_ERROR_BYTES);
        assert_eq!(compact_tool_error(&exactly, 1), exactly);
    }

    #[test]
    fn long_errors_keep_head_and_tail_with_what_was_cut() {
        let error = format!("{}{}{}", "h".repeat(3000), "MIDDLE", "t".repeat(1000));
        let shown = compact_tool_error(&error, 1);
        let cut = error.len() - ERROR_HEAD_BYTES - ERROR_TAIL_BYTES;
        assert_eq!(
            shown,
            format!(
                "{}\n[… {cut} bytes of this error cut …]\n{}",
                "h".repeat(ERROR_HEAD_BYTES),
                "t".repeat(ERROR_TAIL_BYTES)
            )
        );
        assert!(!shown.contains("MIDDLE"));
        assert!(shown.len() < MAX_TOOL_ERROR_BYTES + 64);
        // Deterministic.
        assert_eq!(compact_tool_error(&error, 1), shown);
    }

    #[test]
    fn cuts_fall_on_char_boundaries() {
        let error = "é".repeat(2000); // 4000 bytes
        let shown = compact_tool_error(&error, 1);
        let (start, rest) = shown.split_once('\n').unwrap();
        let end = rest.rsplit_once('\n').unwrap().1;
        assert!(start.chars().all(|c| c == 'é'));
        assert!(end.chars().all(|c| c == 'é'));
        let marker = rest.rsplit_once('\n').unwrap().0;
        let cut: usize = marker
            .trim_start_matches("[… ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(start.len() + cut + end.len(), error.len());
        assert!(start.len() <= ERROR_HEAD_BYTES && end.len() <= ERROR_TAIL_BYTES);
    }

    #[test]
    fn repeated_errors_collapse_to_one_line_with_a_count() {
        let error = format!(
            "invalid arguments: missing `path`\n{}",
            "detail ".repeat(50)
        );
        let shown = compact_tool_error(&error, 3);
        assert_eq!(
            shown,
            "the same error as the previous call (3 times in a row): invalid arguments: missing `path`…"
        );
        assert!(!shown.contains('\n'));
        let long = "y".repeat(500);
        let shown = compact_tool_error(&long, 2);
        assert!(shown.ends_with(&format!("{}…", "y".repeat(REPEAT_QUOTE_BYTES))));
        assert_eq!(
            compact_tool_error("denied by the tool: no", 2),
            "the same error as the previous call (2 times in a row): denied by the tool: no"
        );
    }
}
