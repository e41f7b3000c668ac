//! The `search` tool: a regex over the text files under a path of the
//! workspace, with an optional glob filter and a cap on matches.
//!
//! The walk is depth-first in name order, so results are stable. It does not
//! follow symlinks, skips `.git` directories, files over 8 MiB and files that
//! are not UTF-8 text. Regexes use the `regex-lite` syntax: Perl-style, with
//! ASCII-only classes (`\w`, `\d`, `\s`, case folding).

use std::fs;
use std::path::Path;

use regex_lite::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::mount::Mount;
use crate::read::join;
use warden_guest::glob::Glob;

/// Matches `search` returns when `max_results` is not given.
pub(crate) const DEFAULT_MAX_RESULTS: u64 = 100;
/// Most matches `search` returns, whatever `max_results` says.
pub(crate) const MAX_RESULTS: u64 = 1_000;
/// Longest line text a match carries, in bytes.
pub(crate) const MAX_LINE_BYTES: usize = 500;
/// Files larger than this are skipped.
pub(crate) const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Arguments of `search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Regular expression to find in each line, Perl-style syntax with ASCII-only classes; prefix with `(?i)` to ignore case.
    pub pattern: String,
    /// File or directory to search, relative to the workspace. Default: the whole workspace.
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files matching this glob, for example `*.rs` (matched against the file name) or `src/**/*.{ts,tsx}` (matched against the path relative to the workspace).
    #[serde(default)]
    pub glob: Option<String>,
    /// Most matches to return. Default 100, at most 1000.
    #[schemars(range(min = 1, max = 1000))]
    pub max_results: Option<u64>,
}

/// One matching line.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Match {
    /// The file, relative to the workspace.
    pub path: String,
    /// The line number, counting from 1.
    pub line: u64,
    /// The line, without its line ending, cut to 500 bytes.
    pub text: String,
    /// Whether `text` was cut.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub text_truncated: bool,
}

/// Output of `search`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct SearchOutput {
    /// The matches, in walk order.
    pub matches: Vec<Match>,
    /// Whether the search stopped at `max_results`: there may be more.
    pub truncated: bool,
    /// Text files searched.
    pub files_searched: u64,
    /// Files skipped as too large or not UTF-8 text.
    pub files_skipped: u64,
}

/// Searches the files under `path` for `pattern`.
pub(crate) fn search(mount: &Mount, args: SearchArgs) -> Result<SearchOutput, FsError> {
    let regex = Regex::new(&args.pattern).map_err(|e| FsError::BadPattern {
        pattern: args.pattern.clone(),
        reason: first_line_lowercase(&e.to_string()),
    })?;
    let glob = args.glob.as_deref().map(Glob::new).transpose()?;
    let max_results = args.max_results.unwrap_or(DEFAULT_MAX_RESULTS);
    if !(1..=MAX_RESULTS).contains(&max_results) {
        return Err(FsError::OutOfRange {
            name: "max_results",
            value: max_results,
            expected: "expected 1 to 1000",
        });
    }
    let target = mount.resolve(args.path.as_deref().unwrap_or("."))?;
    let mut search = Search {
        regex,
        glob,
        max_results: max_results as usize,
        out: SearchOutput {
            matches: Vec::new(),
            truncated: false,
            files_searched: 0,
            files_skipped: 0,
        },
    };
    let meta = fs::metadata(&target.full).map_err(|e| FsError::io("search", &target.shown, e))?;
    if meta.is_dir() {
        search.dir(&target.full, &target.shown)?;
    } else if meta.is_file() {
        search.file(&target.full, &target.shown, meta.len(), true)?;
    } else {
        return Err(FsError::NotAFile { path: target.shown });
    }
    Ok(search.out)
}

struct Search {
    regex: Regex,
    glob: Option<Glob>,
    max_results: usize,
    out: SearchOutput,
}

impl Search {
    fn done(&self) -> bool {
        self.out.truncated
    }

    fn dir(&mut self, full: &Path, shown: &str) -> Result<(), FsError> {
        let mut entries = Vec::new();
        for entry in fs::read_dir(full).map_err(|e| FsError::io("search", shown, e))? {
            let entry = entry.map_err(|e| FsError::io("search", shown, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let file_type = entry
                .file_type()
                .map_err(|e| FsError::io("inspect", &join(shown, &name), e))?;
            entries.push((name, file_type));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, file_type) in entries {
            if self.done() {
                break;
            }
            let child = join(shown, &name);
            let child_full = full.join(&name);
            if file_type.is_dir() {
                if name != ".git" {
                    self.dir(&child_full, &child)?;
                }
            } else if file_type.is_file() {
                if self.glob.as_ref().is_some_and(|g| !g.matches(&child)) {
                    continue;
                }
                let size = fs::metadata(&child_full)
                    .map_err(|e| FsError::io("inspect", &child, e))?
                    .len();
                self.file(&child_full, &child, size, false)?;
            }
        }
        Ok(())
    }

    /// Searches one file. Files named directly (`named`) are searched
    /// whatever the glob says.
    fn file(&mut self, full: &Path, shown: &str, size: u64, named: bool) -> Result<(), FsError> {
        if !named && size > MAX_FILE_BYTES {
            self.out.files_skipped += 1;
            return Ok(());
        }
        let bytes = fs::read(full).map_err(|e| FsError::io("read", shown, e))?;
        let Ok(text) = String::from_utf8(bytes) else {
            self.out.files_skipped += 1;
            return Ok(());
        };
        self.out.files_searched += 1;
        for (index, line) in text.lines().enumerate() {
            if !self.regex.is_match(line) {
                continue;
            }
            if self.out.matches.len() == self.max_results {
                self.out.truncated = true;
                return Ok(());
            }
            let (text, text_truncated) = cut(line, MAX_LINE_BYTES);
            self.out.matches.push(Match {
                path: shown.to_string(),
                line: index as u64 + 1,
                text: text.to_string(),
                text_truncated,
            });
        }
        Ok(())
    }
}

/// `text` cut to at most `max` bytes at a character boundary, and whether it
/// was cut.
fn cut(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

fn first_line_lowercase(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text)
        .trim();
    let mut chars = line.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    fn workspace() -> (TempDir, Mount) {
        let dir = tempfile::tempdir().unwrap();
        let files: &[(&str, &[u8])] = &[
            ("README.md", b"# demo\nTODO: write docs\n"),
            (
                "src/lib.rs",
                b"fn a() {}\n// TODO one\nfn b() {}\n// todo two\n",
            ),
            ("src/deep/mod.rs", b"// TODO deep\n"),
            ("src/deep/data.bin", b"TODO \xff\xfe\n"),
            (".git/config", b"TODO in git\n"),
            ("notes.txt", b"nothing here\n"),
        ];
        for (path, content) in files {
            let full = dir.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, content).unwrap();
        }
        let mount = Mount::new(dir.path());
        (dir, mount)
    }

    fn args(pattern: &str) -> SearchArgs {
        SearchArgs {
            pattern: pattern.into(),
            path: None,
            glob: None,
            max_results: None,
        }
    }

    fn found(out: &SearchOutput) -> Vec<(String, u64)> {
        out.matches
            .iter()
            .map(|m| (m.path.clone(), m.line))
            .collect()
    }

    fn pairs(items: &[(&str, u64)]) -> Vec<(String, u64)> {
        items.iter().map(|(p, l)| (p.to_string(), *l)).collect()
    }

    #[test]
    fn finds_matches_in_walk_order_skipping_git_and_binaries() {
        let (_dir, mount) = workspace();
        let out = search(&mount, args("TODO")).unwrap();
        assert_eq!(
            found(&out),
            pairs(&[("README.md", 2), ("src/deep/mod.rs", 1), ("src/lib.rs", 2)])
        );
        assert_eq!(out.matches[2].text, "// TODO one");
        assert!(!out.truncated);
        assert_eq!((out.files_searched, out.files_skipped), (4, 1));
    }

    #[test]
    fn filters_by_path_and_glob() {
        let (_dir, mount) = workspace();
        // (path, glob, pattern) -> matches
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            Vec<(String, u64)>,
        );
        let cases: [Case<'_>; 5] = [
            (
                Some("src"),
                None,
                "(?i)todo",
                pairs(&[("src/deep/mod.rs", 1), ("src/lib.rs", 2), ("src/lib.rs", 4)]),
            ),
            (None, Some("*.md"), "TODO", pairs(&[("README.md", 2)])),
            (None, Some("src/*.rs"), "TODO", pairs(&[("src/lib.rs", 2)])),
            (
                None,
                Some("**/*.{rs,md}"),
                "deep|docs",
                pairs(&[("README.md", 2), ("src/deep/mod.rs", 1)]),
            ),
            (
                Some("notes.txt"),
                Some("*.rs"),
                "nothing",
                pairs(&[("notes.txt", 1)]),
            ),
        ];
        for (path, glob, pattern, expected) in cases {
            let out = search(
                &mount,
                SearchArgs {
                    pattern: pattern.into(),
                    path: path.map(Into::into),
                    glob: glob.map(Into::into),
                    max_results: None,
                },
            )
            .unwrap();
            assert_eq!(found(&out), expected, "{path:?} {glob:?} {pattern}");
        }
    }

    #[test]
    fn caps_results_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("many.txt"), "hit\n".repeat(150)).unwrap();
        let mount = Mount::new(dir.path());
        let out = search(&mount, args("hit")).unwrap();
        assert_eq!(out.matches.len(), DEFAULT_MAX_RESULTS as usize);
        assert!(out.truncated);
        let mut a = args("hit");
        a.max_results = Some(150);
        let out = search(&mount, a).unwrap();
        assert_eq!((out.matches.len(), out.truncated), (150, false));
    }

    #[test]
    fn cuts_long_lines() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("min.js"),
            format!("{}needle\n", "é".repeat(400)),
        )
        .unwrap();
        let out = search(&Mount::new(dir.path()), args("needle")).unwrap();
        let m = &out.matches[0];
        assert!(m.text_truncated);
        assert_eq!(m.text.len(), MAX_LINE_BYTES);
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["matches"][0]["text_truncated"], true);
    }

    #[test]
    fn search_errors_name_the_value() {
        let (_dir, mount) = workspace();
        let err = |a: SearchArgs| search(&mount, a).unwrap_err().to_string();
        assert!(
            err(args("(")).starts_with("invalid regex `(`: "),
            "{}",
            err(args("("))
        );
        let mut a = args("x");
        a.path = Some("missing".into());
        assert_eq!(err(a), "cannot search `missing`: not found");
        let mut a = args("x");
        a.path = Some("../..".into());
        assert!(err(a).starts_with("path `../..` contains `..`"));
        let mut a = args("x");
        a.max_results = Some(0);
        assert_eq!(err(a), "`max_results` is 0, expected 1 to 1000");
        let mut a = args("x");
        a.glob = Some("[x".into());
        assert_eq!(err(a), "invalid glob `[x`: unclosed `[`");
    }
}
