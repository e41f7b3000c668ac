//! [`Glob`]: a small glob dialect for paths inside a mount. `*` and `?`
//! match within one path segment, `**` across segments (`**/` also matches
//! no directory at all), `[abc]`, `[a-z]` and `[!a-z]` match one character,
//! and `{rs,toml}` matches either alternative. A glob without `/` matches a
//! file's name; one with `/` matches its path relative to the mount.
//!
//! ```
//! use warden_guest::glob::Glob;
//!
//! let glob = Glob::new("docs/**/*.{md,txt}").unwrap();
//! assert!(glob.matches("docs/a/b/notes.md"));
//! assert!(!glob.matches("src/notes.md"));
//! ```

use std::collections::HashSet;
use std::fmt;

/// A glob that cannot be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobError {
    /// The glob.
    pub glob: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for GlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid glob `{}`: {}", self.glob, self.reason)
    }
}

impl std::error::Error for GlobError {}

/// Most alternatives a glob's braces may expand to.
const MAX_ALTERNATIVES: usize = 64;

/// A compiled glob.
#[derive(Debug, Clone)]
pub struct Glob {
    alternatives: Vec<Vec<Token>>,
    whole_path: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Char(char),
    /// `?`
    One,
    /// `*`
    Star,
    /// `**`
    AnyPath,
    /// `**/`
    AnyDirs,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    /// Compiles `glob`.
    ///
    /// # Errors
    /// [`GlobError`] naming the glob, for an empty glob, an unclosed `[` or
    /// `{`, or too many alternatives.
    pub fn new(glob: &str) -> Result<Self, GlobError> {
        let bad = |reason| GlobError {
            glob: glob.to_string(),
            reason,
        };
        if glob.is_empty() {
            return Err(bad("it is empty"));
        }
        let chars: Vec<char> = glob.chars().collect();
        let expanded = expand_braces(&chars).map_err(bad)?;
        let alternatives = expanded
            .iter()
            .map(|alt| tokenize(alt))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        Ok(Glob {
            alternatives,
            whole_path: glob.contains('/'),
        })
    }

    /// Whether the file at `path` (relative to the mount, `/`-separated)
    /// matches.
    pub fn matches(&self, path: &str) -> bool {
        let subject = if self.whole_path {
            path
        } else {
            path.rsplit('/').next().unwrap_or(path)
        };
        let subject: Vec<char> = subject.chars().collect();
        self.alternatives
            .iter()
            .any(|tokens| Matcher::new(tokens, &subject).run(0, 0))
    }
}

fn expand_braces(chars: &[char]) -> Result<Vec<Vec<char>>, &'static str> {
    let Some(open) = chars.iter().position(|&c| c == '{') else {
        return Ok(vec![chars.to_vec()]);
    };
    let mut depth = 0;
    let mut close = None;
    let mut commas = Vec::new();
    for (i, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(i),
            _ => {}
        }
    }
    let close = close.ok_or("unclosed `{`")?;
    let mut bounds = vec![open];
    bounds.extend(commas);
    bounds.push(close);
    let mut out = Vec::new();
    for pair in bounds.windows(2) {
        let mut alt = chars[..open].to_vec();
        alt.extend_from_slice(&chars[pair[0] + 1..pair[1]]);
        alt.extend_from_slice(&chars[close + 1..]);
        out.extend(expand_braces(&alt)?);
        if out.len() > MAX_ALTERNATIVES {
            return Err("its braces expand to more than 64 alternatives");
        }
    }
    Ok(out)
}

fn tokenize(chars: &[char]) -> Result<Vec<Token>, &'static str> {
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                if chars.get(i + 2) == Some(&'/') {
                    tokens.push(Token::AnyDirs);
                    i += 3;
                } else {
                    tokens.push(Token::AnyPath);
                    i += 2;
                }
            }
            '*' => {
                tokens.push(Token::Star);
                i += 1;
            }
            '?' => {
                tokens.push(Token::One);
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                let negated = matches!(chars.get(j), Some('!' | '^'));
                if negated {
                    j += 1;
                }
                let mut ranges = Vec::new();
                let mut first = true;
                loop {
                    let Some(&c) = chars.get(j) else {
                        return Err("unclosed `[`");
                    };
                    if c == ']' && !first {
                        break;
                    }
                    first = false;
                    if chars.get(j + 1) == Some(&'-') && chars.get(j + 2).is_some_and(|&e| e != ']')
                    {
                        ranges.push((c, chars[j + 2]));
                        j += 3;
                    } else {
                        ranges.push((c, c));
                        j += 1;
                    }
                }
                tokens.push(Token::Class { negated, ranges });
                i = j + 1;
            }
            '\\' if i + 1 < chars.len() => {
                tokens.push(Token::Char(chars[i + 1]));
                i += 2;
            }
            c => {
                tokens.push(Token::Char(c));
                i += 1;
            }
        }
    }
    Ok(tokens)
}

/// Backtracking matcher with a memo of failed positions, so that it runs in
/// time proportional to pattern length times subject length.
struct Matcher<'a> {
    tokens: &'a [Token],
    subject: &'a [char],
    failed: HashSet<(usize, usize)>,
}

impl<'a> Matcher<'a> {
    fn new(tokens: &'a [Token], subject: &'a [char]) -> Self {
        Matcher {
            tokens,
            subject,
            failed: HashSet::new(),
        }
    }

    fn run(&mut self, t: usize, s: usize) -> bool {
        if self.failed.contains(&(t, s)) {
            return false;
        }
        let matched = self.step(t, s);
        if !matched {
            self.failed.insert((t, s));
        }
        matched
    }

    fn step(&mut self, t: usize, s: usize) -> bool {
        let Some(token) = self.tokens.get(t) else {
            return s == self.subject.len();
        };
        let here = self.subject.get(s).copied();
        match token {
            Token::Char(c) => here == Some(*c) && self.run(t + 1, s + 1),
            Token::One => here.is_some_and(|c| c != '/') && self.run(t + 1, s + 1),
            Token::Class { negated, ranges } => {
                here.is_some_and(|c| {
                    c != '/' && ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
                }) && self.run(t + 1, s + 1)
            }
            Token::Star => {
                let mut end = s;
                loop {
                    if self.run(t + 1, end) {
                        return true;
                    }
                    match self.subject.get(end) {
                        Some(&c) if c != '/' => end += 1,
                        _ => return false,
                    }
                }
            }
            Token::AnyPath => (s..=self.subject.len()).any(|end| self.run(t + 1, end)),
            Token::AnyDirs => {
                // No directory, or anything up to and including a `/`.
                self.run(t + 1, s)
                    || (s..self.subject.len())
                        .filter(|&i| self.subject[i] == '/')
                        .any(|i| self.run(t + 1, i + 1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_names_and_paths() {
        let cases = [
            ("*.rs", "src/lib.rs", true),
            ("*.rs", "lib.rs", true),
            ("*.rs", "src/lib.rsx", false),
            ("lib.?s", "a/lib.rs", true),
            ("*.{rs,toml}", "Cargo.toml", true),
            ("*.{rs,toml}", "Cargo.lock", false),
            ("src/*.rs", "src/lib.rs", true),
            ("src/*.rs", "src/a/lib.rs", false),
            ("src/**/*.rs", "src/lib.rs", true),
            ("src/**/*.rs", "src/a/b/lib.rs", true),
            ("src/**", "src/a/b", true),
            ("**/test_*.py", "test_a.py", true),
            ("**/test_*.py", "x/y/test_a.py", true),
            ("[abc]*", "bob", true),
            ("[!abc]*", "bob", false),
            ("[a-c]x", "cx", true),
            ("[a-c]x", "dx", false),
            ("[]]", "]", true),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("a{b,{c,d}}e", "ade", true),
        ];
        for (glob, path, expected) in cases {
            assert_eq!(
                Glob::new(glob).unwrap().matches(path),
                expected,
                "{glob} vs {path}"
            );
        }
    }

    #[test]
    fn malformed_globs_are_refused_naming_the_glob() {
        let cases = [
            ("", "invalid glob ``: it is empty"),
            ("[ab", "invalid glob `[ab`: unclosed `[`"),
            ("{a,b", "invalid glob `{a,b`: unclosed `{`"),
        ];
        for (glob, expected) in cases {
            assert_eq!(Glob::new(glob).unwrap_err().to_string(), expected);
        }
        let many = "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}";
        assert!(
            Glob::new(many)
                .unwrap_err()
                .to_string()
                .contains("more than 64")
        );
    }

    #[test]
    fn pathological_globs_stay_fast() {
        let glob = Glob::new(&"*a".repeat(30)).unwrap();
        let subject = "a".repeat(29) + "b";
        assert!(!glob.matches(&subject));
    }
}
