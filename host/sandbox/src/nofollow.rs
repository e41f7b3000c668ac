//! Opening a path the operator wrote, or a path a guest named inside a
//! mount, without following a symbolic link in any of its components: the
//! one rule every host call that takes a path applies (a mount's directory
//! when its grant is built, an MCP server's bound directories, the
//! `keep-permissions` import).
//!
//! Why: a directory is named by a path, and a path is re-resolved by every
//! process that opens it. A plugin with write access above a granted
//! directory can rename it and put a symlink in its place (`docs ->
//! ../secrets`); the next process that resolved the path would hand the
//! symlink's target to whoever was granted `docs`. Walked component by
//! component with `O_NOFOLLOW`, such a path is refused, naming the link,
//! instead of followed. The only symlinks followed are those of the
//! directory a relative path is written against (the agent or
//! configuration file's directory, or the working directory): that is
//! where the operator chose to keep their files, not something a plugin
//! wrote.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Why a path could not be opened without following a symlink.
#[derive(Debug, thiserror::Error)]
pub enum NoFollowError {
    /// A component of the path is a symbolic link.
    #[error(
        "`{link}` is a symbolic link (to `{target}`), and a granted path is never followed through one (a plugin with write access above it could have swapped it in): name the directory itself"
    )]
    Symlink {
        /// The path up to and including the link.
        link: PathBuf,
        /// What the link points to, as written in it.
        target: PathBuf,
    },
    /// A component of the path is not a directory where one is needed.
    #[error("`{path}` is not a directory")]
    NotADirectory {
        /// The path up to and including that component.
        path: PathBuf,
    },
    /// Any other failure, such as a missing component.
    #[error("cannot open `{path}`: {error}")]
    Io {
        /// The path up to and including the component that failed.
        path: PathBuf,
        /// The system's error.
        #[source]
        error: io::Error,
    },
}

/// A directory opened without following a symlink: its handle and its
/// real path (which holds no symlink).
#[derive(Debug)]
pub struct OpenedDir {
    /// The open directory.
    pub fd: OwnedFd,
    /// Its absolute path, every component a real directory.
    pub path: PathBuf,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `dir`, relative to `base` unless it is absolute,
/// following no symbolic link in any component of `dir`. `base` (empty
/// for the working directory) is resolved first, its own symlinks
/// followed: it is where the operator's file is.
pub fn open_dir(base: &Path, dir: &Path) -> Result<OpenedDir, NoFollowError> {
    let (start, path) = if dir.is_absolute() {
        root()?
    } else {
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        let real = base.canonicalize().map_err(|error| NoFollowError::Io {
            path: base.to_owned(),
            error,
        })?;
        // The resolved base holds no symlink, so walking it refuses a swap
        // made between resolving and opening it.
        let (root, at) = root()?;
        walk(root, at, &real)?
    };
    let (fd, path) = walk(start, path, dir)?;
    Ok(OpenedDir { fd, path })
}

/// `/`, opened.
fn root() -> Result<(OwnedFd, PathBuf), NoFollowError> {
    let fd = rustix::fs::open("/", DIR_FLAGS, Mode::empty()).map_err(|e| NoFollowError::Io {
        path: "/".into(),
        error: e.into(),
    })?;
    Ok((fd, PathBuf::from("/")))
}

/// Walks `rel` down from the directory `start` (at `path`), one component
/// at a time, never following a symlink; `..` goes to the real parent.
fn walk(
    mut at: OwnedFd,
    mut path: PathBuf,
    rel: &Path,
) -> Result<(OwnedFd, PathBuf), NoFollowError> {
    for component in rel.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                at = rustix::fs::openat(&at, "..", DIR_FLAGS, Mode::empty()).map_err(|e| {
                    NoFollowError::Io {
                        path: path.join(".."),
                        error: e.into(),
                    }
                })?;
                path.pop();
            }
            Component::Normal(name) => {
                path.push(name);
                at = open_child_dir(&at, name, &path)?;
            }
        }
    }
    Ok((at, path))
}

/// Opens the directory `name` in `at` (whose path with it is `path`),
/// refusing a symlink with the error that names it.
fn open_child_dir(at: &OwnedFd, name: &OsStr, path: &Path) -> Result<OwnedFd, NoFollowError> {
    rustix::fs::openat(at, name, DIR_FLAGS, Mode::empty())
        .map_err(|e| refusal(at, name, path, e.into()))
}

/// The error for `name` in `at` that could not be opened as wanted: a
/// symlink names its target, a file that is not a directory says so.
fn refusal(at: &OwnedFd, name: &OsStr, path: &Path, error: io::Error) -> NoFollowError {
    match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink => {
            let target = rustix::fs::readlinkat(at, name, Vec::new())
                .map(|t| PathBuf::from(OsString::from_vec(t.into_bytes())))
                .unwrap_or_default();
            NoFollowError::Symlink {
                link: path.to_owned(),
                target,
            }
        }
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) != FileType::Directory => {
            NoFollowError::NotADirectory {
                path: path.to_owned(),
            }
        }
        _ => NoFollowError::Io {
            path: path.to_owned(),
            error,
        },
    }
}

/// The directory that holds the last component of `rel` beneath `dir`,
/// opened without following a symlink in any directory on the way, and
/// that last component's name. `rel` is relative, of plain names only
/// (the caller refuses `..`); `shown` is how errors name the path.
pub(crate) fn parent_beneath<'r>(
    dir: &std::fs::File,
    rel: &'r Path,
    shown: &Path,
) -> Result<(OwnedFd, &'r OsStr), NoFollowError> {
    let mut names: Vec<&OsStr> = Vec::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            _ => {
                return Err(NoFollowError::Io {
                    path: shown.to_owned(),
                    error: io::Error::new(io::ErrorKind::InvalidInput, "not a plain relative path"),
                });
            }
        }
    }
    let Some((last, parents)) = names.split_last() else {
        return Err(NoFollowError::Io {
            path: shown.to_owned(),
            error: io::Error::new(io::ErrorKind::InvalidInput, "names no file"),
        });
    };
    let mut at = rustix::io::fcntl_dupfd_cloexec(dir, 0).map_err(|e| NoFollowError::Io {
        path: shown.to_owned(),
        error: e.into(),
    })?;
    let mut path = PathBuf::new();
    for name in parents {
        path.push(name);
        at = open_child_dir(&at, name, &path)?;
    }
    Ok((at, *last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_in_any_component_is_refused_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("work/docs")).unwrap();
        std::fs::create_dir(base.join("secrets")).unwrap();
        let opened = open_dir(&base, Path::new("work/./docs")).unwrap();
        assert_eq!(opened.path, base.join("work/docs"));
        let opened = open_dir(&base, Path::new("work/../secrets")).unwrap();
        assert_eq!(opened.path, base.join("secrets"));
        let opened = open_dir(Path::new("/ignored"), &base.join("work")).unwrap();
        assert_eq!(opened.path, base.join("work"));

        // The swap: the directory moved away, a relative link in its place.
        std::fs::rename(base.join("work/docs"), base.join("work/moved")).unwrap();
        std::os::unix::fs::symlink("../secrets", base.join("work/docs")).unwrap();
        let err = open_dir(&base, Path::new("work/docs")).unwrap_err();
        assert!(
            matches!(&err, NoFollowError::Symlink { link, target }
                if *link == base.join("work/docs") && *target == Path::new("../secrets")),
            "{err:?}"
        );
        // A link above, and a link in an absolute path, are refused too.
        std::os::unix::fs::symlink("work", base.join("above")).unwrap();
        let err = open_dir(&base, Path::new("above/moved")).unwrap_err();
        assert!(matches!(err, NoFollowError::Symlink { .. }), "{err:?}");
        let err = open_dir(Path::new(""), &base.join("above/moved")).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        // The base itself may be reached through a link: the operator's.
        let opened = open_dir(&base.join("above"), Path::new("moved")).unwrap();
        assert_eq!(opened.path, base.join("work/moved"));
        // A file is not a directory; a missing one says so.
        std::fs::write(base.join("file"), "x").unwrap();
        let err = open_dir(&base, Path::new("file")).unwrap_err();
        assert!(
            matches!(err, NoFollowError::NotADirectory { .. }),
            "{err:?}"
        );
        let err = open_dir(&base, Path::new("absent")).unwrap_err();
        assert!(matches!(err, NoFollowError::Io { .. }), "{err:?}");
    }
}
