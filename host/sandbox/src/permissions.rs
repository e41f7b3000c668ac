//! The `keep-permissions` host import: a file written beside a target and
//! renamed over it takes the target's permission bits, which WASI 0.2 can
//! neither read nor set. It is what makes an atomic replacement
//! (`warden_guest::fs::write_atomic`) keep a file's permissions.
//!
//! Confined like the guest's own file access: both paths are resolved
//! under the mounts' held directory handles through `cap-std` (no `..`, no
//! escape through a link), neither may be excluded from its mount, both
//! must name regular files (not symlinks: the guest resolves those), and the
//! file whose permissions change must be on a read-write mount, so a
//! read-only mount (and every narrowed lease, whose mounts are all
//! read-only) refuses it. Only the read, write and execute bits are copied:
//! never setuid, setgid or sticky, which no guest could set otherwise.

use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;

use super::capabilities::{Access, Mount};

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
    let (_, from_dir, from_rel) = open(mounts, original)?;
    let (to_mount, to_dir, to_rel) = open(mounts, replacement)?;
    if to_mount.access != Access::ReadWrite {
        return Err(format!(
            "`{replacement}` is on read-only mount `{}`: its permissions cannot change",
            to_mount.name
        ));
    }
    let source = regular_file(&from_dir, &from_rel, original)?;
    regular_file(&to_dir, &to_rel, replacement)?;
    set_bits(&to_dir, &to_rel, &source, replacement)
}

/// The mount holding guest path `path`, that mount's directory, and the
/// path relative to it.
fn open<'m>(mounts: &'m [Mount], path: &str) -> Result<(&'m Mount, Dir, PathBuf), String> {
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
    if let Some(pattern) = mount.exclude.excluding(&shown.join("/")) {
        return Err(format!(
            "`{path}` is excluded from mount `{}` (`{pattern}`)",
            mount.name
        ));
    }
    // The mount's held handle, never a reopen by path (see `fs.rs`).
    let dir = mount
        .root
        .cap_dir()
        .map_err(|e| format!("cannot open mount `{}`: {e}", mount.name))?;
    Ok((mount, dir, rel))
}

fn regular_file(dir: &Dir, rel: &Path, shown: &str) -> Result<cap_std::fs::Metadata, String> {
    let meta = dir
        .symlink_metadata(rel)
        .map_err(|e| format!("cannot inspect `{shown}`: {e}"))?;
    if !meta.is_file() {
        return Err(format!("`{shown}` is not a regular file"));
    }
    Ok(meta)
}

#[cfg(unix)]
fn set_bits(
    dir: &Dir,
    rel: &Path,
    source: &cap_std::fs::Metadata,
    shown: &str,
) -> Result<(), String> {
    use cap_std::fs::{Permissions, PermissionsExt};
    let mode = source.permissions().mode() & COPIED_BITS;
    dir.set_permissions(rel, Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the permissions of `{shown}`: {e}"))
}

/// Elsewhere only the read-only flag exists, and it is copied.
#[cfg(not(unix))]
fn set_bits(
    dir: &Dir,
    rel: &Path,
    source: &cap_std::fs::Metadata,
    shown: &str,
) -> Result<(), String> {
    let _ = COPIED_BITS;
    dir.set_permissions(rel, source.permissions())
        .map_err(|e| format!("cannot set the permissions of `{shown}`: {e}"))
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
        let host_dir = dir.canonicalize().unwrap();
        Mount {
            name: name.into(),
            root: super::super::fs::MountRoot::open(&host_dir).unwrap(),
            host_dir,
            access,
            exclude: crate::Exclusions::new(&["*.pem"]).unwrap(),
        }
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
