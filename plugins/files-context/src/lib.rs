//! `files-context`: Warden's first-party context source that turns named
//! files and glob patterns under one read-only mount (`files`, seen at
//! [`MOUNT_ROOT`]) into context items.
//!
//! Each item's `source` is the file's path relative to the mount, `size` its
//! size in bytes, `modified_ms` its modification time (for staleness) and
//! `content` its text (invalid UTF-8 replaced), cut at `max_bytes` with
//! `truncated` set. Items are sorted by path, each file once.
//!
//! Configuration (the host `config` import), all optional:
//!
//! | key | meaning | default |
//! | --- | --- | --- |
//! | `paths` | files and globs relative to the mount, separated by commas or newlines | `**/*.md` |
//! | `max_bytes` | content bytes per item | 32768 |
//! | `max_items` | items per resolve; more matches are dropped, with a warning | 32 |
//!
//! A request's `query` may be blank, or a JSON object `{"paths": [...],
//! "max_bytes": n}` that replaces the configured paths or cap for that
//! request. Globs use [`warden_guest::glob`]; a pattern without `/`
//! matches file names anywhere. A named file that does not exist is
//! skipped with a warning; an absolute path or one with `..` is `denied`;
//! the walk skips dot-directories such as `.git` and does not follow
//! symbolic links.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::Deserialize;
use warden_guest::glob::Glob;
use warden_guest::{ContextError, ContextItem, ContextPlugin, ContextRequest, SourceSpec, log};

/// Where the component sees the `files` mount.
pub const MOUNT_ROOT: &str = "/files";
/// Default of the `paths` config value.
pub const DEFAULT_PATHS: &str = "**/*.md";
/// Default of the `max_bytes` config value.
pub const DEFAULT_MAX_BYTES: usize = 32 << 10;
/// Default of the `max_items` config value.
pub const DEFAULT_MAX_ITEMS: usize = 32;
/// Most directory entries one resolve looks at.
const MAX_WALKED: usize = 20_000;

/// A request's optional JSON query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Files and globs, replacing the configured `paths`.
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Content bytes per item, replacing the configured `max_bytes`.
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// What one resolve reads: from the config, then the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Files and globs.
    pub paths: Vec<String>,
    /// Content bytes per item.
    pub max_bytes: usize,
    /// Items per resolve.
    pub max_items: usize,
}

impl Settings {
    /// The settings from `config` (a lookup such as
    /// [`warden_guest::config`]) and the request's query.
    pub fn new(
        config: impl Fn(&str) -> Option<String>,
        query: Query,
    ) -> Result<Settings, ContextError> {
        let number = |key: &str, default: usize| match config(key) {
            None => Ok(default),
            Some(v) => v.trim().parse::<usize>().map_err(|_| {
                ContextError::invalid_request(format!("config `{key}` is `{v}`, expected a number"))
            }),
        };
        let paths = match query.paths {
            Some(paths) => paths,
            None => config("paths")
                .unwrap_or_else(|| DEFAULT_PATHS.to_owned())
                .split([',', '\n'])
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        };
        Ok(Settings {
            paths,
            max_bytes: match query.max_bytes {
                Some(n) => n,
                None => number("max_bytes", DEFAULT_MAX_BYTES)?,
            },
            max_items: number("max_items", DEFAULT_MAX_ITEMS)?,
        })
    }
}

/// Resolves `settings` into items under `root`.
pub fn resolve(root: &Path, settings: &Settings) -> Result<Vec<ContextItem>, ContextError> {
    // No root at all: the operator did not grant the mount. Said as such,
    // not as files that happen to be missing.
    if !root.is_dir() {
        return Err(ContextError::denied(
            "mount `files` was requested and not granted, so this source sees no files; grant \
             it: `--mount files=DIR` with `warden plugin resolve`, or \
             `[plugins.<key>.grant.mounts.files]` in the agent file",
        ));
    }
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut globs = Vec::new();
    for path in &settings.paths {
        check_relative(path)?;
        if path.contains(['*', '?', '[', '{']) {
            globs.push(Glob::new(path).map_err(|e| ContextError::invalid_request(e.to_string()))?);
        } else {
            let full = root.join(path);
            if full.is_file() {
                files.insert(normalize(path), full);
            } else {
                log::warn!("files-context: `{path}` is not a file in the mount; skipped");
            }
        }
    }
    if !globs.is_empty() {
        let mut walked = 0;
        walk(root, "", &globs, &mut files, &mut walked)?;
    }
    if files.len() > settings.max_items {
        log::warn!(
            "files-context: {} files match, keeping the first {} by path",
            files.len(),
            settings.max_items
        );
    }
    files
        .into_iter()
        .take(settings.max_items)
        .map(|(shown, full)| item(&shown, &full, settings.max_bytes))
        .collect()
}

fn check_relative(path: &str) -> Result<(), ContextError> {
    let p = Path::new(path);
    if path.starts_with('/') || p.is_absolute() {
        return Err(ContextError::denied(format!(
            "path `{path}` is absolute; paths are relative to the files mount"
        )));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(ContextError::denied(format!(
            "path `{path}` contains `..`; paths must stay inside the files mount"
        )));
    }
    Ok(())
}

fn normalize(path: &str) -> String {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn walk(
    dir: &Path,
    prefix: &str,
    globs: &[Glob],
    files: &mut BTreeMap<String, PathBuf>,
    walked: &mut usize,
) -> Result<(), ContextError> {
    let listing = std::fs::read_dir(dir).map_err(|e| {
        ContextError::failed(format!(
            "cannot list `{}`: {e}",
            if prefix.is_empty() { "." } else { prefix }
        ))
    })?;
    // An entry that cannot be read ends the listing (the host already
    // leaves out names that are not UTF-8, reporting them): say so rather
    // than drop the rest silently.
    let mut entries = Vec::new();
    for entry in listing {
        match entry {
            Ok(entry) => entries.push(entry),
            Err(e) => {
                log::warn!(
                    "files-context: listing `{}` stopped early: {e}",
                    if prefix.is_empty() { "." } else { prefix }
                );
                break;
            }
        }
    }
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        *walked += 1;
        if *walked > MAX_WALKED {
            log::warn!("files-context: stopped after {MAX_WALKED} directory entries");
            return Ok(());
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let shown = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && !name.starts_with('.') {
            walk(&entry.path(), &shown, globs, files, walked)?;
        } else if kind.is_file() && globs.iter().any(|g| g.matches(&shown)) {
            files.insert(shown, entry.path());
        }
    }
    Ok(())
}

fn item(shown: &str, full: &Path, max_bytes: usize) -> Result<ContextItem, ContextError> {
    let io = |e: std::io::Error| {
        let message = format!("cannot read `{shown}`: {e}");
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            ContextError::denied(message)
        } else {
            ContextError::failed(message)
        }
    };
    let bytes = std::fs::read(full).map_err(io)?;
    let modified = std::fs::metadata(full)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    let size = bytes.len() as u64;
    let mut item = ContextItem::new(shown, String::from_utf8_lossy(&bytes)).truncate_to(max_bytes);
    item.size = size;
    if let Some(ms) = modified {
        item = item.modified_ms(ms);
    }
    Ok(item)
}

/// The plugin as the component exports it.
pub struct FilesContext;

impl ContextPlugin for FilesContext {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "files-context",
            "Files from a granted directory, by name or glob, with path, size and modification time",
        )
    }

    fn resolve(request: ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
        let query: Query = request.query_as()?;
        let settings = Settings::new(warden_guest::config, query)?;
        resolve(Path::new(MOUNT_ROOT), &settings)
    }
}

warden_guest::export_context_plugin!(FilesContext);

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("docs/deep")).unwrap();
        fs::create_dir_all(dir.path().join(".git")).unwrap();
        fs::write(dir.path().join("README.md"), "# Readme\n").unwrap();
        fs::write(dir.path().join("docs/a.md"), "alpha").unwrap();
        fs::write(dir.path().join("docs/deep/b.txt"), "béta béta").unwrap();
        fs::write(dir.path().join(".git/HEAD.md"), "ref").unwrap();
        dir
    }

    fn settings(paths: &[&str], max_bytes: usize) -> Settings {
        Settings {
            paths: paths.iter().map(|p| p.to_string()).collect(),
            max_bytes,
            max_items: 10,
        }
    }

    fn sources(items: &[ContextItem]) -> Vec<&str> {
        items.iter().map(|i| i.source.as_str()).collect()
    }

    #[test]
    fn globs_and_named_files_become_sorted_unique_items() {
        let dir = tree();
        let cases: &[(&[&str], &[&str])] = &[
            (&["*.md"], &["README.md", "docs/a.md"]),
            (
                &["docs/**/*.txt", "README.md"],
                &["README.md", "docs/deep/b.txt"],
            ),
            (
                &["docs/a.md", "./docs/a.md", "*.md"],
                &["README.md", "docs/a.md"],
            ),
            (&["missing.md"], &[]),
        ];
        for (paths, expected) in cases {
            let items = resolve(dir.path(), &settings(paths, 100)).unwrap();
            assert_eq!(sources(&items), *expected, "{paths:?}");
        }
    }

    #[test]
    fn items_carry_size_time_and_truncated_content() {
        let dir = tree();
        let items = resolve(dir.path(), &settings(&["docs/deep/b.txt"], 3)).unwrap();
        let b = &items[0];
        assert_eq!(b.content, "bé");
        assert!(b.truncated);
        assert_eq!(b.size, 11);
        assert!(b.modified_ms.unwrap() > 1_600_000_000_000);
    }

    #[test]
    fn paths_out_of_the_mount_are_denied() {
        let dir = tree();
        for path in ["../etc/passwd", "/etc/passwd", "docs/../../x"] {
            let err = resolve(dir.path(), &settings(&[path], 10)).unwrap_err();
            assert!(
                matches!(&err, ContextError::Denied(m) if m.contains(path)),
                "{err:?}"
            );
        }
        let err = resolve(dir.path(), &settings(&["[x"], 10)).unwrap_err();
        assert_eq!(
            err,
            ContextError::invalid_request("invalid glob `[x`: unclosed `[`")
        );
    }

    #[test]
    fn settings_come_from_config_then_query() {
        let config = |k: &str| match k {
            "paths" => Some("a.md, b/*.md\nc.txt".to_string()),
            "max_bytes" => Some("10".to_string()),
            _ => None,
        };
        let s = Settings::new(config, Query::default()).unwrap();
        assert_eq!(s.paths, ["a.md", "b/*.md", "c.txt"]);
        assert_eq!((s.max_bytes, s.max_items), (10, DEFAULT_MAX_ITEMS));
        let s = Settings::new(
            config,
            Query {
                paths: Some(vec!["x.md".into()]),
                max_bytes: Some(3),
            },
        )
        .unwrap();
        assert_eq!((s.paths, s.max_bytes), (vec!["x.md".to_string()], 3));
        let s = Settings::new(|_| None, Query::default()).unwrap();
        assert_eq!(s.paths, [DEFAULT_PATHS]);
        let err = Settings::new(|_| Some("lots".into()), Query::default()).unwrap_err();
        assert!(
            err.message().contains("config `max_bytes` is `lots`"),
            "{err:?}"
        );
    }

    #[test]
    fn max_items_keeps_the_first_by_path() {
        let dir = tree();
        let mut s = settings(&["**"], 10);
        s.max_items = 2;
        let items = resolve(dir.path(), &s).unwrap();
        assert_eq!(sources(&items), ["README.md", "docs/a.md"]);
    }
}
