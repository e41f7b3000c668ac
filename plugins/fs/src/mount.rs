//! `Mount`: the root directory the tools work under, and the resolution of a
//! tool's relative `path` argument to a real path. Absolute paths and `..`
//! components are refused here with clear errors; the sandbox would block an
//! escape anyway.

use std::path::{Component, Path, PathBuf};

use crate::error::FsError;

/// The directory the tools operate on: `/workspace` in the component, a
/// temporary directory in native tests.
#[derive(Clone, Debug)]
pub struct Mount {
    root: PathBuf,
}

/// A path argument checked against the mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The path relative to the mount, `/`-separated, without `.`
    /// components; `.` for the mount itself. Used in outputs and errors.
    pub shown: String,
    /// The path to open.
    pub full: PathBuf,
}

impl Mount {
    /// A mount rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Mount { root: root.into() }
    }

    /// Resolves `path`, relative to the mount. Empty and `.` name the mount.
    ///
    /// # Errors
    /// [`FsError::AbsolutePath`] and [`FsError::ParentComponent`].
    pub fn resolve(&self, path: &str) -> Result<Resolved, FsError> {
        if path.starts_with('/') || path.starts_with('\\') || Path::new(path).is_absolute() {
            return Err(FsError::AbsolutePath {
                path: path.to_string(),
            });
        }
        let mut parts = Vec::new();
        for component in Path::new(path).components() {
            match component {
                Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(FsError::ParentComponent {
                        path: path.to_string(),
                    });
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(FsError::AbsolutePath {
                        path: path.to_string(),
                    });
                }
            }
        }
        let full = parts
            .iter()
            .fold(self.root.clone(), |full, part| full.join(part));
        let shown = if parts.is_empty() {
            ".".to_string()
        } else {
            parts.join("/")
        };
        Ok(Resolved { shown, full })
    }

    /// Whether the mount's root is absent: in the component, the operator
    /// did not grant the mount.
    pub fn is_missing(&self) -> bool {
        !self.root.is_dir()
    }

    /// The path shown for `full`, a path under the mount found by walking
    /// it.
    pub fn shown(&self, full: &Path) -> String {
        match full.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
            Ok(rel) => rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/"),
            Err(_) => full.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(path: &str) -> Result<(String, PathBuf), String> {
        Mount::new("/workspace")
            .resolve(path)
            .map(|r| (r.shown, r.full))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn relative_paths_resolve_under_the_root() {
        let cases = [
            ("", ".", "/workspace"),
            (".", ".", "/workspace"),
            ("src", "src", "/workspace/src"),
            ("./src//lib.rs", "src/lib.rs", "/workspace/src/lib.rs"),
            ("a/./b/", "a/b", "/workspace/a/b"),
            ("..foo/bar..", "..foo/bar..", "/workspace/..foo/bar.."),
        ];
        for (path, shown, full) in cases {
            assert_eq!(
                resolve(path),
                Ok((shown.to_string(), PathBuf::from(full))),
                "{path:?}"
            );
        }
    }

    #[test]
    fn escapes_are_refused_naming_the_path() {
        let cases = [
            ("/etc/passwd", "path `/etc/passwd` is absolute"),
            ("/workspace/a", "path `/workspace/a` is absolute"),
            ("..", "path `..` contains `..`"),
            ("a/../../b", "path `a/../../b` contains `..`"),
            ("a/..", "path `a/..` contains `..`"),
        ];
        for (path, expected) in cases {
            let err = resolve(path).unwrap_err();
            assert!(err.starts_with(expected), "{path:?}: {err}");
        }
    }

    #[test]
    fn shown_is_relative_to_the_root() {
        let mount = Mount::new("/w");
        assert_eq!(mount.shown(Path::new("/w")), ".");
        assert_eq!(mount.shown(Path::new("/w/a/b.txt")), "a/b.txt");
    }
}
