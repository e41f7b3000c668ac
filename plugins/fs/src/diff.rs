//! Unified diffs for the previews of the write tools.

use std::time::Duration;

use similar::{Algorithm, ChangeTag, TextDiff};

/// Longest diff a preview carries, in bytes; the rest is summarized.
pub(crate) const MAX_DIFF_BYTES: usize = 64 * 1024;

/// A diff of `old` to `new` for the file `path`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Diff {
    /// Lines added.
    pub added: usize,
    /// Lines removed.
    pub removed: usize,
    /// A unified diff with three lines of context, `a/PATH` and `b/PATH`
    /// headers, cut to 64 KiB.
    pub text: String,
}

/// Diffs `old` against `new` line by line.
pub(crate) fn unified(path: &str, old: &str, new: &str) -> Diff {
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Myers)
        .timeout(Duration::from_secs(1))
        .diff_lines(old, new);
    let mut added = 0;
    let mut removed = 0;
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => added += 1,
            ChangeTag::Delete => removed += 1,
            ChangeTag::Equal => {}
        }
    }
    let mut text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    if text.len() > MAX_DIFF_BYTES {
        let mut end = MAX_DIFF_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let end = text[..end].rfind('\n').map_or(end, |at| at + 1);
        let omitted = text[end..].lines().count();
        text.truncate(end);
        text.push_str(&format!("... diff cut here: {omitted} more lines\n"));
    }
    Diff {
        added,
        removed,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_lines_with_headers_and_counts() {
        let diff = unified("a.txt", "one\ntwo\nthree\n", "one\n2\nthree\nfour\n");
        assert_eq!((diff.added, diff.removed), (2, 1));
        assert_eq!(
            diff.text,
            "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,4 @@\n one\n-two\n+2\n three\n+four\n"
        );
    }

    #[test]
    fn a_new_file_is_all_additions() {
        let diff = unified("n.txt", "", "x\ny\n");
        assert_eq!((diff.added, diff.removed), (2, 0));
        assert!(
            diff.text.contains("@@ -0,0 +1,2 @@\n+x\n+y\n"),
            "{}",
            diff.text
        );
    }

    #[test]
    fn identical_texts_have_an_empty_diff() {
        assert_eq!(
            unified("a", "same\n", "same\n"),
            Diff {
                added: 0,
                removed: 0,
                text: String::new()
            }
        );
    }

    #[test]
    fn long_diffs_are_cut_at_a_line() {
        let new: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let diff = unified("big", "", &new);
        assert!(diff.text.len() <= MAX_DIFF_BYTES + 64);
        assert!(
            diff.text.ends_with(" more lines\n"),
            "{}",
            &diff.text[diff.text.len() - 80..]
        );
        assert_eq!(diff.added, 20_000);
    }
}
