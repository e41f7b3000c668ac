//! Reads the dep-info (`.d`) files cargo writes next to each artifact: the
//! Makefile-style list of every source file rustc read, so a build script can
//! re-run exactly when one of them changes.
//!
//! Format: lines `target: dep dep ...`, where a space inside a path is written
//! `\ ` (see cargo's "dep-info files" documentation).

use std::path::PathBuf;

/// The dependencies named in a dep-info file's text, in order, without
/// duplicates.
pub(crate) fn parse(text: &str) -> Vec<PathBuf> {
    let mut deps: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        // The target is separated by ": "; a Windows drive letter's colon is
        // followed by a backslash, not a space.
        let Some((_, rest)) = line.split_once(": ") else {
            continue;
        };
        for dep in split_escaped(rest) {
            let dep = PathBuf::from(dep);
            if !deps.contains(&dep) {
                deps.push(dep);
            }
        }
    }
    deps
}

/// Splits on unescaped whitespace, turning `\ ` into a space.
fn split_escaped(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                word.push(' ');
                chars.next();
            }
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dep_info() {
        let cases: [(&str, &[&str]); 4] = [
            ("", &[]),
            (
                "/t/a.wasm: /src/lib.rs /wit/types.wit\n",
                &["/src/lib.rs", "/wit/types.wit"],
            ),
            (
                "/t/a.wasm: /my\\ dir/lib.rs  /b.rs\n/t/a.d: /b.rs\n",
                &["/my dir/lib.rs", "/b.rs"],
            ),
            ("C:\\t\\a.wasm: C:\\src\\lib.rs\n", &["C:\\src\\lib.rs"]),
        ];
        for (text, expected) in cases {
            let expected: Vec<PathBuf> = expected.iter().map(PathBuf::from).collect();
            assert_eq!(parse(text), expected, "{text:?}");
        }
    }
}
