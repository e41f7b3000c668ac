//! Files in a plugin's mounts: paths the model gives refused the same way
//! whether they climb out with `..` or are absolute ([`in_mount`]), file
//! errors as typed tool errors ([`file_error`], [`read_to_string`]), and
//! replacing a file so that an interruption leaves its old content or its
//! new, never a mix ([`write_atomic`]).
//!
//! A mount `docs` is the directory `/docs` for `std::fs`. The sandbox
//! refuses a path climbing out of it with `PermissionDenied`, but an
//! absolute path outside every mount with `NotFound`: the guest's C library
//! resolves absolute paths against the mounts itself, so the host never
//! sees the request. [`in_mount`] makes both a `denied` tool error before
//! any file is touched.
//!
//! `std::fs::write` truncates the file and then writes it. A lease cut
//! short in between (its deadline, its fuel, the host process killed, a
//! worker losing its run) leaves the file truncated or empty, and the old
//! content is gone. [`write_atomic`] writes a temporary file beside the
//! target instead, syncs it, gives it the target's permission bits, renames
//! it over the target (one atomic step) and syncs the directory, so the
//! rename itself survives a power cut.
//!
//! ```no_run
//! use warden_guest::fs;
//!
//! fs::write_atomic("/workspace/notes.md", "# Notes\n")?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use crate::types::ToolError;

/// The path `path` (relative to the mount) inside `/<mount>`, or a `denied`
/// tool error for an absolute path or one with a `..` component, and an
/// `invalid-arguments` error for an empty one.
pub fn in_mount(mount: &str, path: &str) -> Result<PathBuf, ToolError> {
    if path.is_empty() {
        return Err(ToolError::invalid_arguments("the path is empty"));
    }
    let relative = Path::new(path);
    if relative.has_root() {
        return Err(ToolError::denied(format!(
            "`{path}` is absolute: paths are relative to the `{mount}` mount"
        )));
    }
    if relative.components().any(|c| c == Component::ParentDir) {
        return Err(ToolError::denied(format!(
            "`{path}` climbs out of the `{mount}` mount"
        )));
    }
    Ok(Path::new("/").join(mount).join(relative))
}

/// The tool error for `error`, raised while touching `path`: a refusal
/// (`PermissionDenied`, `ReadOnlyFilesystem`) is `denied`, a missing file
/// `failed` saying it may be outside every mount, anything else `failed`.
pub fn file_error(error: &io::Error, path: &str) -> ToolError {
    match error.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            ToolError::denied(format!("`{path}`: not permitted by the sandbox ({error})"))
        }
        io::ErrorKind::NotFound => ToolError::failed(format!(
            "`{path}` does not exist (or is outside every mount)"
        )),
        io::ErrorKind::IsADirectory => ToolError::failed(format!("`{path}` is a directory")),
        _ => ToolError::failed(format!("`{path}`: {error}")),
    }
}

/// The UTF-8 text of `path` inside `mount`, or a tool error: [`in_mount`],
/// then the read, its error through [`file_error`].
pub fn read_to_string(mount: &str, path: &str) -> Result<String, ToolError> {
    let full = in_mount(mount, path)?;
    fs::read_to_string(&full).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => ToolError::failed(format!("`{path}` is not UTF-8 text")),
        _ => file_error(&e, path),
    })
}

/// How many symbolic links [`write_atomic`] follows before giving up.
const MAX_LINKS: usize = 32;

/// How many names a temporary file is tried under before giving up.
const TEMP_ATTEMPTS: usize = 16;

/// The suffix of every temporary file [`write_atomic`] creates: a file
/// named `.<name>.<hex>.warden-tmp` that outlived its write is debris of an
/// interrupted one, never the only copy of anything.
pub const TEMP_SUFFIX: &str = ".warden-tmp";

/// Replaces the file at `path` with `contents`, or creates it, atomically:
/// whatever interrupts the call, the file afterwards holds its old content
/// or `contents`, never a mix or nothing. The file keeps its permission
/// bits (read, write, execute; the host copies them, since WASI 0.2 cannot).
/// A symbolic link at `path` is followed: the file it names is replaced and
/// the link stays.
///
/// What it does not keep: the file's owner (the replacement belongs to the
/// host process's user), hard links (they keep the old content), extended
/// attributes and ACLs. An interrupted call may leave its temporary file
/// (ending in [`TEMP_SUFFIX`]) beside the target.
///
/// In the component the directory must be on a read-write mount; natively
/// (unit tests) it is a plain directory.
///
/// # Errors
/// Any I/O error, with the target unchanged: the directory is not writable,
/// `path` names a directory or no file at all, the disk is full.
pub fn write_atomic(path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let target = follow_links(path.as_ref())?;
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` names no file", target.display()),
        )
    })?;
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let existing = match fs::metadata(&target) {
        Ok(meta) if meta.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("`{}` is a directory", target.display()),
            ));
        }
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    let (temp, file) = create_temp(&dir, name)?;
    let replaced = replace(file, &temp, &target, existing, contents.as_ref());
    if let Err(e) = replaced {
        // Best effort: the target is untouched either way.
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    // Without this the rename may be lost to a power cut after the call
    // returned, and the completion recorded for content the disk lacks.
    File::open(&dir)?.sync_all()
}

/// Writes and syncs the temporary file, gives it the target's permissions
/// and renames it over the target.
fn replace(
    mut file: File,
    temp: &Path,
    target: &Path,
    existing: bool,
    contents: &[u8],
) -> io::Result<()> {
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    if existing {
        crate::host::keep_permissions(target, temp)?;
    }
    fs::rename(temp, target)
}

/// `path` with every symbolic link at its end followed.
fn follow_links(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = fs::read_link(&path)?;
                path = match path.parent() {
                    Some(parent) => parent.join(link),
                    None => link,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("`{}`: more than {MAX_LINKS} symbolic links", path.display()),
    ))
}

/// Creates a new temporary file in `dir` for the target `name`.
fn create_temp(dir: &Path, name: &OsStr) -> io::Result<(PathBuf, File)> {
    let name = name.to_string_lossy();
    // Room for the dot, the random part and the suffix in a 255-byte name.
    let mut keep = name.len().min(200);
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        // `RandomState` is seeded from the platform's randomness (in the
        // component, `wasi:random`), so names differ between calls.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let temp = dir.join(format!(".{}.{random:016x}{TEMP_SUFFIX}", &name[..keep]));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt was made"))
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn paths_out_of_a_mount_are_denied_the_same_way() {
        assert_eq!(
            in_mount("docs", "a/b.txt").unwrap(),
            PathBuf::from("/docs/a/b.txt")
        );
        for path in ["../x", "a/../../x", "/etc/passwd"] {
            let err = in_mount("docs", path).unwrap_err();
            assert!(matches!(err, ToolError::Denied(_)), "{path}: {err:?}");
        }
        let missing = read_to_string("docs", "absent.txt").unwrap_err();
        assert!(matches!(missing, ToolError::Failed(_)), "{missing:?}");
        let refused = file_error(&io::Error::from(io::ErrorKind::PermissionDenied), "a");
        assert!(matches!(refused, ToolError::Denied(_)), "{refused:?}");
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_keeping_permissions_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run.sh");
        fs::write(&file, "old").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o4750)).unwrap();
        write_atomic(&file, "new").unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "new");
        assert_eq!(mode(&file), 0o750, "kept, without setuid");
        write_atomic(dir.path().join("fresh.txt"), b"x").unwrap();
        assert_eq!(names(dir.path()), ["fresh.txt", "run.sh"]);
    }

    #[test]
    fn a_link_is_followed_and_stays_a_link() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        fs::write(dir.path().join("real/a.txt"), "old").unwrap();
        std::os::unix::fs::symlink("real/a.txt", dir.path().join("link")).unwrap();
        write_atomic(dir.path().join("link"), "new").unwrap();
        assert!(
            fs::symlink_metadata(dir.path().join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("real/a.txt")).unwrap(),
            "new"
        );
        assert_eq!(names(&dir.path().join("real")), ["a.txt"]);
    }

    #[test]
    fn a_refusal_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        let err = write_atomic(dir.path().join("d"), "x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::IsADirectory);
        let err = write_atomic(dir.path().join("missing/a.txt"), "x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(names(dir.path()), ["d"]);
    }
}
