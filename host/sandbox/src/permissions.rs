//! The `keep-permissions` host import: a file written beside a target and
//! renamed over it takes the target's permission bits, which WASI 0.2 can
//! neither read nor set. It is what makes an atomic replacement
//! (`warden_guest::fs::write_atomic`) keep a file's permissions.
//!
//! Confined like the guest's own file access and stricter: both paths are
//! walked under the mounts' held directory handles without following a
//! symbolic link in any component (`nofollow.rs`; no `..`), so the path as
//! written is where the file is and its exclusion check holds; neither may
//! be excluded from its mount, both must name regular files (not symlinks:
//! the guest resolves those), and the
//! file whose permissions change must be on a read-write mount, so a
//! read-only mount (and every narrowed lease, whose mounts are all
//! read-only) refuses it. Only the read, write and execute bits are copied:
//! never setuid, setgid or sticky, which no guest could set otherwise.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::capabilities::{Access, Mount};
use super::nofollow::{NoFollowError, parent_beneath};

/// The permission bits copied: read, write and execute for owner, group
/// and others.
const COPIED_BITS: u32 = 0o777;

/// Gives `replacement` the permission bits of `original`, both guest paths
/// inside `mounts`. The error names the path and what was refused.
pub(crate) fn keep_permissions(
    mounts: &[Mount],
    original: &str,
    replacement: &str,
) -> Result<(), String> {
    let (_, from_root, from_rel) = open(mounts, original)?;
    let (to_mount, to_root, to_rel) = open(mounts, replacement)?;
    if to_mount.access != Access::ReadWrite {
        return Err(format!(
            "`{replacement}` is on read-only mount `{}`: its permissions cannot change",
            to_mount.name
        ));
    }
    let mode = source_bits(from_root, &from_rel, original)?;
    set_bits(to_root, &to_rel, mode, replacement)
}

/// The mount holding guest path `path`, that mount's held directory, and
/// the path relative to it.
fn open<'m>(
    mounts: &'m [Mount],
    path: &str,
) -> Result<(&'m Mount, &'m std::fs::File, PathBuf), String> {
    let mut components = Path::new(path).components();
    if components.next() != Some(Component::RootDir) {
        return Err(format!(
            "`{path}` is not absolute: name files by their path in a mount, such as /workspace/a.txt"
        ));
    }
    let name = match components.next() {
        Some(Component::Normal(name)) => name.to_string_lossy(),
        _ => return Err(format!("`{path}` names no file in a mount")),
    };
    let mount = mounts
        .iter()
        .find(|m| *m.name == *name)
        .ok_or_else(|| format!("`{path}` is not in a mount of this plugin"))?;
    let mut rel = PathBuf::new();
    let mut shown = Vec::new();
    for component in components {
        match component {
            Component::Normal(part) => {
                rel.push(part);
                shown.push(part.to_string_lossy());
            }
            Component::CurDir => {}
            _ => return Err(format!("`{path}` contains `..`")),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(format!("`{path}` is a mount, not a file"));
    }
    // Checked as written: the walk below follows no symlink, so the path
    // as written is where the file is.
    if let Some(pattern) = mount.exclude.excluding(&shown.join("/")) {
        return Err(format!(
            "`{path}` is excluded from mount `{}` (`{pattern}`)",
            mount.name
        ));
    }
    // The mount's held handle, never a reopen by path (see `fs.rs`).
    Ok((mount, mount.root.handle(), rel))
}

/// The directory holding `rel` under `root` and its last name, walked
/// without following a symlink (`nofollow.rs`): a symlinked parent could
/// lead to an excluded file the path as written does not name.
fn parent<'r>(
    root: &std::fs::File,
    rel: &'r Path,
    shown: &str,
) -> Result<(OwnedFd, &'r std::ffi::OsStr), String> {
    parent_beneath(root, rel, Path::new(shown)).map_err(|e| match e {
        NoFollowError::Symlink { link, .. } => format!(
            "`{shown}` passes through symbolic link `{}`: permissions are kept only on a path without one",
            link.display()
        ),
        other => format!("cannot inspect `{shown}`: {other}"),
    })
}

/// The copied bits of the regular file `rel` under `root`.
fn source_bits(root: &std::fs::File, rel: &Path, shown: &str) -> Result<u32, String> {
    let (dir, name) = parent(root, rel, shown)?;
    let stat = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| format!("cannot inspect `{shown}`: {}", std::io::Error::from(e)))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(format!("`{shown}` is not a regular file"));
    }
    Ok(stat.st_mode & COPIED_BITS)
}

/// Sets `mode` on the regular file `rel` under `root`: the file is opened
/// by a path handle without following a symlink, checked, and changed
/// through that handle, so nothing swapped in meanwhile is changed instead.
fn set_bits(root: &std::fs::File, rel: &Path, mode: u32, shown: &str) -> Result<(), String> {
    let (dir, name) = parent(root, rel, shown)?;
    let inspect =
        |e: rustix::io::Errno| format!("cannot inspect `{shown}`: {}", std::io::Error::from(e));
    #[cfg(target_os = "linux")]
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = rustix::fs::openat(&dir, name, flags, Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::LOOP {
            format!("`{shown}` is not a regular file")
        } else {
            inspect(e)
        }
    })?;
    let stat = rustix::fs::fstat(&file).map_err(inspect)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(format!("`{shown}` is not a regular file"));
    }
    let set = |e: rustix::io::Errno| {
        format!(
            "cannot set the permissions of `{shown}`: {}",
            std::io::Error::from(e)
        )
    };
    // A path handle cannot be changed through `fchmod`; its `/proc` link
    // names that very file.
    #[cfg(target_os = "linux")]
    rustix::fs::chmod(
        format!("/proc/self/fd/{}", file.as_raw_fd()),
        Mode::from_raw_mode(mode),
    )
    .map_err(set)?;
    #[cfg(not(target_os = "linux"))]
    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(set)?;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mount(name: &str, dir: &Path, access: Access) -> Mount {
        excluding(name, dir, access, &["*.pem"])
    }

    fn excluding(name: &str, dir: &Path, access: Access, exclude: &[&str]) -> Mount {
        let host_dir = dir.canonicalize().unwrap();
        Mount {
            name: name.into(),
            root: super::super::fs::MountRoot::open(&host_dir).unwrap(),
            host_dir,
            access,
            exclude: crate::Exclusions::new(exclude).unwrap(),
        }
    }

    /// Break 5 of issue 37: through a symlinked parent folder the path as
    /// written was not excluded, and an excluded file's mode went from
    /// 0600 to 0777. No component is followed: both ways are refused.
    #[test]
    fn a_symlinked_parent_is_never_followed() {
        let rw = tempfile::tempdir().unwrap();
        std::fs::create_dir(rw.path().join("private")).unwrap();
        std::fs::create_dir(rw.path().join("open")).unwrap();
        std::fs::write(rw.path().join("private/id"), "key").unwrap();
        std::fs::write(rw.path().join("open/loose"), "x").unwrap();
        std::fs::write(rw.path().join("a"), "x").unwrap();
        chmod(&rw.path().join("private/id"), 0o600);
        chmod(&rw.path().join("open/loose"), 0o640);
        chmod(&rw.path().join("a"), 0o777);
        std::os::unix::fs::symlink("private", rw.path().join("alias")).unwrap();
        std::os::unix::fs::symlink("open", rw.path().join("plain")).unwrap();
        let mounts = [excluding(
            "work",
            rw.path(),
            Access::ReadWrite,
            &["private"],
        )];
        for (original, replacement) in [
            ("/work/a", "/work/alias/id"),
            ("/work/alias/id", "/work/a"),
            // A link to a folder nothing excludes is refused the same way.
            ("/work/a", "/work/plain/loose"),
        ] {
            let err = keep_permissions(&mounts, original, replacement).unwrap_err();
            assert!(
                err.contains("passes through symbolic link"),
                "{original} {replacement}: {err}"
            );
        }
        assert_eq!(mode(&rw.path().join("private/id")), 0o600);
        assert_eq!(mode(&rw.path().join("open/loose")), 0o640);
        assert_eq!(mode(&rw.path().join("a")), 0o777);
        // The real folder works as before.
        keep_permissions(&mounts, "/work/a", "/work/open/loose").unwrap();
        assert_eq!(mode(&rw.path().join("open/loose")), 0o777);
    }

    #[test]
    fn the_replacement_takes_the_originals_bits_without_setuid() {
        let rw = tempfile::tempdir().unwrap();
        let ro = tempfile::tempdir().unwrap();
        for (dir, name) in [(&rw, "a.sh"), (&rw, "a.tmp"), (&ro, "b")] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        chmod(&rw.path().join("a.sh"), 0o4751);
        chmod(&rw.path().join("a.tmp"), 0o600);
        chmod(&ro.path().join("b"), 0o640);
        let mounts = [
            mount("work", rw.path(), Access::ReadWrite),
            mount("ref", ro.path(), Access::ReadOnly),
        ];
        keep_permissions(&mounts, "/work/a.sh", "/work/a.tmp").unwrap();
        assert_eq!(mode(&rw.path().join("a.tmp")), 0o751);
        // Another mount may be the original, read-only or not.
        keep_permissions(&mounts, "/ref/b", "/work/./a.tmp").unwrap();
        assert_eq!(mode(&rw.path().join("a.tmp")), 0o640);
    }

    #[test]
    fn refusals_name_the_path_and_change_nothing() {
        let rw = tempfile::tempdir().unwrap();
        let ro = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(rw.path().join("a"), "x").unwrap();
        std::fs::write(rw.path().join("key.pem"), "x").unwrap();
        std::fs::create_dir(rw.path().join("d")).unwrap();
        std::fs::write(ro.path().join("b"), "x").unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        chmod(&outside.path().join("secret"), 0o600);
        std::os::unix::fs::symlink(outside.path().join("secret"), rw.path().join("link")).unwrap();
        chmod(&rw.path().join("a"), 0o644);
        chmod(&ro.path().join("b"), 0o644);
        let mounts = [
            mount("work", rw.path(), Access::ReadWrite),
            mount("ref", ro.path(), Access::ReadOnly),
        ];
        let cases = [
            ("/work/a", "/ref/b", "`/ref/b` is on read-only mount `ref`"),
            ("/work/a", "work/a", "`work/a` is not absolute"),
            (
                "/work/a",
                "/work/../ref/b",
                "`/work/../ref/b` contains `..`",
            ),
            ("/work/a", "/other/a", "`/other/a` is not in a mount"),
            ("/work/a", "/work", "`/work` is a mount, not a file"),
            ("/work/a", "/work/d", "`/work/d` is not a regular file"),
            ("/work/nope", "/work/a", "cannot inspect `/work/nope`"),
            (
                "/work/a",
                "/work/link",
                "`/work/link` is not a regular file",
            ),
            (
                "/work/link",
                "/work/a",
                "`/work/link` is not a regular file",
            ),
            (
                "/work/key.pem",
                "/work/a",
                "`/work/key.pem` is excluded from mount `work` (`*.pem`)",
            ),
            (
                "/work/a",
                "/work/d/../key.pem",
                "`/work/d/../key.pem` contains `..`",
            ),
            ("/work/a", "/work/key.pem", "`/work/key.pem` is excluded"),
        ];
        for (original, replacement, expected) in cases {
            let err = keep_permissions(&mounts, original, replacement).unwrap_err();
            assert!(err.starts_with(expected), "{original} {replacement}: {err}");
        }
        assert_eq!(mode(&rw.path().join("a")), 0o644);
        assert_eq!(mode(&ro.path().join("b")), 0o644);
        assert_eq!(mode(&outside.path().join("secret")), 0o600);
    }
}
