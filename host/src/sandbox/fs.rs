//! The host's filesystem layer: what a guest's `wasi:filesystem` calls
//! reach of its mounts.
//!
//! A mount is the directory the operator granted, by identity, for the life
//! of the grant: [`MountRoot`] opens it once, when the grant is built
//! (`O_DIRECTORY | O_NOFOLLOW`, after canonicalizing), and every lease's
//! preopen is a duplicate of that handle, never a reopen by path. Renaming
//! the directory, or swapping its path for a symlink (which a plugin with a
//! read-write mount above it could do), changes nothing for the grant.

use std::io;
use std::path::Path;
use std::sync::Arc;

use wasmtime::component::{HasData, Resource, ResourceTable};
use wasmtime_wasi::filesystem::{Descriptor, Dir};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::{FsPerms, OpenMode};

use super::capabilities::Access;

/// The directory handle of one mount, opened when the grant was built.
/// Cheap to clone; equal when it is the same directory (device and inode).
#[derive(Clone)]
pub(crate) struct MountRoot {
    dir: Arc<std::fs::File>,
    device: u64,
    inode: u64,
}

impl std::fmt::Debug for MountRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountRoot")
            .field("device", &self.device)
            .field("inode", &self.inode)
            .finish()
    }
}

impl PartialEq for MountRoot {
    fn eq(&self, other: &Self) -> bool {
        (self.device, self.inode) == (other.device, other.inode)
    }
}

impl Eq for MountRoot {}

impl MountRoot {
    /// Opens the directory at `path` without following a symlink in its last
    /// component: a path that is (or was just swapped for) a symlink is
    /// refused, not followed.
    pub(crate) fn open(path: &Path) -> io::Result<MountRoot> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        let stat = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
        Ok(MountRoot {
            dir: Arc::new(std::fs::File::from(fd)),
            device: stat.st_dev as u64,
            inode: stat.st_ino as u64,
        })
    }

    /// A preopen for one lease: a duplicate of the held handle, with the
    /// access the lease gets. Everything under it runs on the blocking pool,
    /// never inline on the runtime's thread.
    pub(crate) fn preopen(&self, access: Access) -> io::Result<Dir> {
        let (perms, mode) = match access {
            Access::ReadOnly => (FsPerms::ReadOnly, OpenMode::READ),
            Access::ReadWrite => (FsPerms::ReadWrite, OpenMode::READ | OpenMode::WRITE),
        };
        Ok(Dir::new(self.dir.try_clone()?, perms, mode, false))
    }
}

/// The preopens of one lease, made from its mounts' held handles.
#[derive(Default)]
pub(crate) struct Preopens(Vec<(Dir, String)>);

impl Preopens {
    /// Adds the mount at `guest_path`.
    pub(crate) fn push(&mut self, dir: Dir, guest_path: String) {
        self.0.push((dir, guest_path));
    }
}

/// The `wasi:filesystem/preopens` view of a lease.
pub(crate) struct PreopensView<'a> {
    pub(crate) preopens: &'a Preopens,
    pub(crate) table: &'a mut ResourceTable,
}

/// [`HasData`] for the host's `wasi:filesystem/preopens`.
pub(crate) struct WardenPreopens;

impl HasData for WardenPreopens {
    type Data<'a> = PreopensView<'a>;
}

impl preopens::Host for PreopensView<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let mut out = Vec::with_capacity(self.preopens.0.len());
        for (dir, name) in &self.preopens.0 {
            let fd = self.table.push(Descriptor::Dir(dir.clone()))?;
            out.push((fd, name.clone()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_root_is_a_directory_opened_without_following_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        let opened = MountRoot::open(&real).unwrap();
        assert!(MountRoot::open(&dir.path().join("link")).is_err());
        std::fs::write(dir.path().join("file"), "x").unwrap();
        assert!(MountRoot::open(&dir.path().join("file")).is_err());
        // Identity survives a rename of the path.
        std::fs::rename(&real, dir.path().join("moved")).unwrap();
        assert_eq!(
            MountRoot::open(&dir.path().join("moved")).unwrap(),
            opened
        );
    }
}
