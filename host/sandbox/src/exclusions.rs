//! [`Exclusions`]: paths inside a mount that the operator takes out of the
//! grant (`exclude = [".env", "*.pem", "secrets/**"]`). The filesystem layer
//! (`fs.rs`) enforces them for every plugin: an excluded path cannot be
//! opened, created, changed or removed, and is left out of directory
//! listings, so no tool can read, list or search it.
//!
//! Patterns, over `/`-separated paths relative to the mount root:
//! - without a `/`, a pattern matches a name at any depth (`.env`, `*.pem`);
//! - with a `/`, it matches the path from the root (`secrets/**`,
//!   `config/prod.toml`; a leading `/` is ignored);
//! - `*` matches any run of characters within a name, `?` one character,
//!   and a `**` segment any number of names, none included.
//!
//! A path is excluded when it or any directory above it matches: excluding
//! a directory excludes everything under it.

use std::fmt;

/// A pattern that is not a valid exclusion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid exclusion `{pattern}`: {reason}")]
pub struct ExclusionError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// One parsed pattern.
#[derive(Clone, PartialEq, Eq)]
struct Pattern {
    text: String,
    /// Matches a name at any depth rather than a path from the root.
    by_name: bool,
    segments: Vec<String>,
}

/// The excluded paths of one mount. By default, none.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    patterns: Vec<Pattern>,
}

impl fmt::Debug for Exclusions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.patterns.iter().map(|p| &p.text))
            .finish()
    }
}

impl serde::Serialize for Exclusions {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.patterns())
    }
}

impl Exclusions {
    /// Parses `patterns`; the first invalid one is an error naming it.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Exclusions, ExclusionError> {
        let mut parsed = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            let text = pattern.as_ref();
            let error = |reason| ExclusionError {
                pattern: text.to_owned(),
                reason,
            };
            let trimmed = text.trim_start_matches('/');
            if trimmed.is_empty() {
                return Err(error("it is empty"));
            }
            let segments: Vec<String> = trimmed
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if segments.iter().any(|s| s == "." || s == "..") {
                return Err(error("`.` and `..` are not allowed"));
            }
            if segments
                .iter()
                .any(|s| s.contains("**") && s.as_str() != "**")
            {
                return Err(error("`**` must be a whole path segment"));
            }
            parsed.push(Pattern {
                text: text.to_owned(),
                by_name: !trimmed.contains('/'),
                segments,
            });
        }
        Ok(Exclusions { patterns: parsed })
    }

    /// Whether there is nothing excluded.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns, as given.
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|p| p.text.as_str())
    }

    /// Whether `path` (relative to the mount root, `/`-separated, already
    /// free of `.` and `..`) or a directory above it is excluded.
    pub fn excludes(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        (1..=names.len()).any(|end| self.matches(&names[..end]))
    }

    /// The pattern that excludes `path`, if one does.
    pub fn excluding(&self, path: &str) -> Option<&str> {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        self.patterns
            .iter()
            .find(|p| (1..=names.len()).any(|end| p.matches(&names[..end])))
            .map(|p| p.text.as_str())
    }

    /// Whether moving the directory at `path` could carry an excluded path
    /// out from under a pattern anchored at the root (renaming `config`
    /// would free `config/prod.toml`).
    pub fn anchors_below(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        self.patterns.iter().filter(|p| !p.by_name).any(|p| {
            p.segments.len() > names.len()
                && names
                    .iter()
                    .zip(&p.segments)
                    .all(|(name, segment)| segment == "**" || name_matches(segment, name))
        })
    }

    fn matches(&self, names: &[&str]) -> bool {
        self.patterns.iter().any(|p| p.matches(names))
    }
}

impl Pattern {
    fn matches(&self, names: &[&str]) -> bool {
        if self.by_name {
            names
                .last()
                .is_some_and(|name| name_matches(&self.segments[0], name))
        } else {
            path_matches(&self.segments, names)
        }
    }
}

/// Whether `segments` (with `**` for any number of names) match `names`.
fn path_matches(segments: &[String], names: &[&str]) -> bool {
    match segments.split_first() {
        None => names.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=names.len()).any(|skip| path_matches(rest, &names[skip..]))
        }
        Some((first, rest)) => names
            .split_first()
            .is_some_and(|(name, more)| name_matches(first, name) && path_matches(rest, more)),
    }
}

/// Whether one name matches a pattern segment with `*` and `?`.
fn name_matches(segment: &str, name: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) =
        (segment.chars().collect(), name.chars().collect());
    // Greedy matching with backtracking to the last `*`.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(patterns: &[&str]) -> Exclusions {
        Exclusions::new(patterns).unwrap()
    }

    #[test]
    fn names_match_at_any_depth_and_paths_from_the_root() {
        let e = ex(&[".env", "*.pem", "secrets/**", "/config/prod.toml"]);
        for excluded in [
            ".env",
            "app/.env",
            "key.pem",
            "deep/in/there/key.pem",
            "secrets",
            "secrets/key",
            "secrets/a/b/c",
            "config/prod.toml",
            ".env/inside",
        ] {
            assert!(e.excludes(excluded), "{excluded}");
        }
        for allowed in [
            "env",
            ".envrc",
            "key.pem.txt",
            "app/secrets/key",
            "config/dev.toml",
            "config",
            "",
        ] {
            assert!(!e.excludes(allowed), "{allowed}");
        }
        assert_eq!(e.excluding("a/b.pem"), Some("*.pem"));
        assert_eq!(e.excluding("readme"), None);
    }

    #[test]
    fn wildcards_match_within_a_name() {
        assert!(name_matches("*", ""));
        assert!(name_matches("a*b*c", "aXXbYYc"));
        assert!(name_matches("a?c", "abc"));
        assert!(!name_matches("a?c", "ac"));
        assert!(!name_matches("*.pem", "pem"));
        assert!(name_matches("**", "x"));
        let e = ex(&["src/**/*.key"]);
        assert!(e.excludes("src/a.key"));
        assert!(e.excludes("src/x/y/a.key"));
        assert!(!e.excludes("a.key"));
    }

    #[test]
    fn renaming_a_directory_above_an_anchored_pattern_is_caught() {
        let e = ex(&["config/prod.toml", "*.pem"]);
        assert!(e.anchors_below("config"));
        assert!(!e.anchors_below("other"));
        assert!(!e.anchors_below("config/prod.toml"));
    }

    #[test]
    fn bad_patterns_are_refused_naming_them() {
        for bad in ["", "/", "a/../b", "./x", "a**b"] {
            let err = Exclusions::new(&[bad]).unwrap_err();
            assert_eq!(err.pattern, bad);
        }
    }
}
