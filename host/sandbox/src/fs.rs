//! The host's filesystem layer: what a guest's `wasi:filesystem` calls
//! reach of its mounts. It sits in front of wasmtime-wasi's implementation,
//! which does the sandboxed path resolution and the I/O.
//!
//! - **Identity.** A mount is the directory the operator granted, by
//!   identity, for the life of the grant: [`MountRoot`] holds it, opened
//!   once when the grant is built without following a symlink in any
//!   component of the configured path (`nofollow.rs`, so a new process
//!   refuses a path a plugin swapped for a symlink rather than follow it),
//!   and every lease's preopen is a duplicate of that handle, never a reopen
//!   by path. Renaming the directory, or swapping its path for a symlink
//!   (which a plugin with a read-write mount above it could do), changes
//!   nothing for the grant.
//! - **On the lease's own thread.** A lease with mounts runs on a lease
//!   thread (`lease_threads.rs`), never on the runtime's, so every
//!   filesystem operation runs inline there: wasmtime-wasi's (each
//!   descriptor is made with `allow_blocking_current_thread`) and the
//!   host's own below. No call is handed to a shared pool: a call that
//!   blocks holds its lease's thread and nothing else, the caller gives up
//!   on it at the lease's deadline, and the lease threads account for it.
//!   Not handing each call to another thread and waiting for it is also
//!   most of what a short filesystem lease used to cost.
//! - **Regular files only, non-blocking.** [`FsView::open_at`] opens
//!   non-blocking, looks at what it opened and refuses anything that is
//!   neither a regular file nor a directory (FIFOs, character and block
//!   devices, sockets) with `unsupported`: an open cannot hang on a FIFO,
//!   and a read cannot wait on a device. A regular file stays non-blocking:
//!   the kernel ignores the flag for files on disk, and a file that honours
//!   it (`/proc/kmsg`) answers a read that would wait with `would-block`
//!   instead of holding the lease's thread.
//! - **Exclusions.** For a mount with [`Exclusions`], every path a call
//!   names is checked as written and with its parent directory resolved
//!   (symlinks included), and every opened file by where it really is
//!   (`/proc/self/fd`): an excluded path cannot be opened, created, changed,
//!   renamed or removed (`access`), and directory listings leave it out.
//!   Each directory descriptor of such a mount remembers its place in it.
//! - **Names that are not UTF-8.** A WASI name is a string, so an entry
//!   whose name is not UTF-8 cannot be handed to a guest, and wasmtime-wasi
//!   yields an error in its place, which ends a guest's `std::fs::read_dir`
//!   there. The listing leaves such an entry out instead, so the guest sees
//!   every other entry, and the lease reports it: named with its bytes
//!   escaped (`caf\xe9.txt`) in the receipt's `unlisted`, and in a warning.
//!   No stand-in name is made up: one could be another file's real name.
//! - **Validity.** Every call that changes something (an open for writing,
//!   each write to a file or its stream, resizing, setting times, creating,
//!   linking, renaming and removing) first checks the lease's
//!   [`ValidUntil`](super::ValidUntil) and traps once it has passed
//!   (`validity.rs`); reads do not, and the epoch check stops those. Writes
//!   (`write`, and the file output streams, which are the host's own for
//!   this) check again right before each syscall.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::{HasData, Resource, ResourceTable};
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, WasiFilesystemCtx, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{FsError, FsResult};
use wasmtime_wasi::{FsPerms, OpenMode};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{
    DynInputStream, DynOutputStream, OutputStream, StreamError, StreamResult,
};

use super::capabilities::Access;
use super::exclusions::Exclusions;
use super::receipt::Unlisted;
use super::validity::{Expired, LeaseFence};

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
    /// Opens the directory at `path` without following a symlink in any
    /// component (`nofollow.rs`): a path that is, or passes through, a
    /// symlink is refused, not followed.
    #[cfg(test)]
    pub(crate) fn open(path: &Path) -> io::Result<MountRoot> {
        let opened = super::nofollow::open_dir(Path::new(""), path).map_err(io::Error::other)?;
        MountRoot::from_fd(opened.fd)
    }

    /// Holds the directory `fd`, opened without following a symlink.
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd) -> io::Result<MountRoot> {
        let stat = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
        Ok(MountRoot {
            dir: Arc::new(std::fs::File::from(fd)),
            device: stat.st_dev as u64,
            inode: stat.st_ino as u64,
        })
    }

    /// Which directory it is: device and inode.
    pub(crate) fn identity(&self) -> (u64, u64) {
        (self.device, self.inode)
    }

    /// The held handle, for host calls that walk beneath it.
    pub(crate) fn handle(&self) -> &std::fs::File {
        &self.dir
    }

    /// What the checks need of a mount with `exclusions`: none when there
    /// are none.
    pub(crate) fn scope(&self, exclusions: &Exclusions) -> Option<Arc<Scope>> {
        (!exclusions.is_empty()).then(|| {
            Arc::new(Scope {
                root: Arc::clone(&self.dir),
                exclusions: exclusions.clone(),
            })
        })
    }

    /// A preopen for one lease: a duplicate of the held handle, with the
    /// access the lease gets. Everything under it runs inline, on the lease's
    /// own thread ([`INLINE`]).
    pub(crate) fn preopen(&self, access: Access) -> io::Result<Dir> {
        let (perms, mode) = match access {
            Access::ReadOnly => (FsPerms::ReadOnly, OpenMode::READ),
            Access::ReadWrite => (FsPerms::ReadWrite, OpenMode::READ | OpenMode::WRITE),
        };
        Ok(Dir::new(self.dir.try_clone()?, perms, mode, INLINE))
    }
}

/// wasmtime-wasi's `allow_blocking_current_thread` for every descriptor of
/// a lease: its calls run on the thread that polls the lease. Only a lease
/// with mounts has descriptors, and such a lease runs on a lease thread
/// (`lease.rs`, `lease_threads.rs`), never on one of the runtime's.
const INLINE: bool = true;

/// The preopens of one lease, made from its mounts' held handles.
#[derive(Default)]
pub(crate) struct Preopens(Vec<(Dir, String, Option<Arc<Scope>>)>);

impl Preopens {
    /// Whether the lease has no mount, so no descriptor at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds the mount at `guest_path`, with its exclusions' scope if any.
    pub(crate) fn push(&mut self, dir: Dir, guest_path: String, scope: Option<Arc<Scope>>) {
        self.0.push((dir, guest_path, scope));
    }
}

/// A mount with exclusions: its root and what is excluded under it.
pub(crate) struct Scope {
    root: Arc<std::fs::File>,
    exclusions: Exclusions,
}

/// Where a directory descriptor (or a listing of one) of a mount with
/// exclusions is: its path relative to the mount root.
#[derive(Clone)]
struct Place {
    scope: Arc<Scope>,
    rel: String,
}

/// The host's filesystem state of one lease.
pub(crate) struct LeaseFs {
    plugin: Arc<str>,
    preopens: Preopens,
    /// Directory descriptors under mounts with exclusions, by handle.
    places: HashMap<u32, Place>,
    /// Directory listings under mounts with exclusions, by handle.
    listings: HashMap<u32, Place>,
    fence: LeaseFence,
    /// Every directory listing's directory, by handle, to name an entry
    /// left out of it.
    listed: HashMap<u32, Listed>,
    /// The entries left out of listings because their names are not UTF-8.
    unlisted: Unlisted,
    /// The temporary files ([`TEMP_SUFFIX`]) this lease created.
    temps: Vec<Temp>,
}

/// The suffix of the temporary file an atomic replacement writes beside its
/// target (`warden_guest::fs::TEMP_SUFFIX`, the same): one this lease
/// created and left behind is removed when the lease ends.
pub(crate) const TEMP_SUFFIX: &str = ".warden-tmp";

/// A temporary file a lease created: the directory it was named under, its
/// path there, and which file it is (device and inode), so that only that
/// very file is ever removed.
pub(crate) struct Temp {
    dir: Arc<std::fs::File>,
    path: String,
    device: u64,
    inode: u64,
}

/// The temporary files a lease left behind, removed once it has ended.
#[derive(Default)]
pub(crate) struct Debris(Vec<Temp>);

impl Debris {
    /// Removes each file still under its name (an atomic replacement that
    /// completed renamed its file away; one cut short by the deadline, or
    /// refused by the lease's fence, could not remove its own). Inline, on
    /// the lease's thread.
    pub(crate) fn clear(self) {
        for temp in self.0 {
            temp.remove();
        }
    }
}

impl Temp {
    /// Unlinks the file if its path, walked without following a symlink,
    /// still names it.
    fn remove(&self) {
        use rustix::fs::AtFlags;
        let rel = Path::new(&self.path);
        let Ok((dir, name)) = super::nofollow::parent_beneath(&self.dir, rel, rel) else {
            return;
        };
        let same = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| (s.st_dev, s.st_ino) == (self.device, self.inode));
        if same && rustix::fs::unlinkat(&dir, name, AtFlags::empty()).is_ok() {
            tracing::debug!(path = %self.path, "removed a temporary file its lease left behind");
        }
    }
}

/// The directory a listing reads, and the names (escaped) of its entries
/// that are not UTF-8, once one was met.
struct Listed {
    dir: Arc<std::fs::File>,
    pending: Option<VecDeque<String>>,
}

impl LeaseFs {
    pub(crate) fn new(plugin: Arc<str>, preopens: Preopens, fence: LeaseFence) -> LeaseFs {
        LeaseFs {
            plugin,
            preopens,
            places: HashMap::new(),
            listings: HashMap::new(),
            listed: HashMap::new(),
            unlisted: Unlisted::default(),
            fence,
            temps: Vec::new(),
        }
    }

    /// The temporary files this lease created, to remove once it ended.
    pub(crate) fn debris(&mut self) -> Debris {
        Debris(std::mem::take(&mut self.temps))
    }

    /// What the lease's listings left out, if anything.
    pub(crate) fn unlisted(&self) -> Option<Unlisted> {
        (self.unlisted.count > 0).then(|| self.unlisted.clone())
    }
}

/// A name's bytes as text, faithfully: UTF-8 as itself, a backslash as
/// `\\`, any other byte as `\xNN`.
pub(crate) fn escaped_name(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The entries of `dir` whose names are not UTF-8, escaped, in the order
/// the directory lists them, each under `shown` (where the guest sees
/// `dir`).
fn names_not_utf8(dir: &std::fs::File, shown: &str) -> VecDeque<String> {
    let Ok(dup) = dir.try_clone() else {
        return VecDeque::new();
    };
    let Ok(entries) = cap_std::fs::Dir::from_std_file(dup).entries() else {
        return VecDeque::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|name| name.to_str().is_none())
        .map(|name| {
            let name = escaped_name(name.as_encoded_bytes());
            match shown {
                "" => name,
                dir => format!("{}/{name}", dir.trim_end_matches('/')),
            }
        })
        .collect()
}

/// Where the guest sees `dir`: the guest path of the mount it is under,
/// joined with its place there; empty when that cannot be told.
fn guest_dir(dir: &std::fs::File, mounts: &[(Arc<std::fs::File>, String)]) -> String {
    let Some(path) = handle_path(dir) else {
        return String::new();
    };
    mounts
        .iter()
        .filter_map(|(root, guest)| {
            let rel = path.strip_prefix(handle_path(root)?).ok()?;
            Some((rel.components().count(), guest, rel.to_owned()))
        })
        .min_by_key(|(depth, ..)| *depth)
        .map(|(_, guest, rel)| match rel.to_str() {
            Some("") => guest.clone(),
            Some(rel) => format!("{}/{rel}", guest.trim_end_matches('/')),
            None => escaped_name(rel.as_os_str().as_encoded_bytes()),
        })
        .unwrap_or_default()
}

/// What a lease's `wasi:filesystem` calls see: wasmtime-wasi's view, with
/// the host's checks in front.
pub(crate) struct FsView<'a> {
    pub(crate) wasi: &'a mut WasiFilesystemCtx,
    pub(crate) table: &'a mut ResourceTable,
    pub(crate) fs: &'a mut LeaseFs,
}

impl FsView<'_> {
    /// wasmtime-wasi's own view, for the calls passed through unchanged.
    fn inner(&mut self) -> WasiFilesystemCtxView<'_> {
        WasiFilesystemCtxView {
            ctx: self.wasi,
            table: self.table,
        }
    }

    /// Refuses `path` under the directory `fd` if the mount excludes it, as
    /// written or with its parent resolved; with `moving`, also a directory
    /// whose move would carry an excluded path out from under its pattern.
    async fn check_path(
        &mut self,
        fd: &Resource<Descriptor>,
        path: &str,
        moving: bool,
    ) -> FsResult<()> {
        let Some(place) = self.fs.places.get(&fd.rep()).cloned() else {
            return Ok(());
        };
        let refused = |rel: &str| {
            let exclusions = &place.scope.exclusions;
            exclusions
                .excluding(rel)
                .or_else(|| (moving && exclusions.anchors_below(rel)).then_some("(below)"))
                .map(str::to_owned)
        };
        let lexical = lexical_join(&place.rel, path);
        if let Some(pattern) = lexical.as_deref().and_then(refused) {
            return Err(self.refuse(lexical.as_deref().unwrap_or(path), &pattern));
        }
        let dir = dir_handle(self.table.get(fd)?)?;
        let resolved = resolved_rel(&place.scope.root, &dir, path);
        if let Some(pattern) = resolved.as_deref().and_then(refused) {
            return Err(self.refuse(resolved.as_deref().unwrap_or(path), &pattern));
        }
        Ok(())
    }

    /// Records that the listing `stream` left out an entry whose name is
    /// not UTF-8, named by what a scan of its directory finds (once per
    /// listing, only when there is such an entry).
    async fn unlist(&mut self, stream: u32) {
        let mounts: Vec<(Arc<std::fs::File>, String)> = self
            .fs
            .preopens
            .0
            .iter()
            .map(|(dir, guest, _)| (Arc::clone(&dir.dir), guest.clone()))
            .collect();
        let name = match self.fs.listed.get_mut(&stream) {
            Some(listed) => {
                if listed.pending.is_none() {
                    let dir = &listed.dir;
                    listed.pending = Some(names_not_utf8(dir, &guest_dir(dir, &mounts)));
                }
                listed.pending.as_mut().and_then(VecDeque::pop_front)
            }
            None => None,
        };
        let name = name.unwrap_or_else(|| "(a name that is not UTF-8)".to_owned());
        tracing::warn!(
            target: "warden::plugin",
            plugin = &*self.fs.plugin,
            "directory entry `{name}` is left out of the plugin's listing: its name is not UTF-8"
        );
        let unlisted = &mut self.fs.unlisted;
        unlisted.count += 1;
        if unlisted.names.len() < Unlisted::NAMED {
            unlisted.names.push(name);
        }
    }

    /// Traps once the lease's validity has passed: called right before a
    /// change is made.
    fn fenced(&self) -> FsResult<()> {
        self.fs.fence.trap().map_err(FsError::trap)
    }

    /// A fenced output stream over the file of `fd` (see
    /// [`FencedFileOutput`]), in place of wasmtime-wasi's.
    fn output_stream(
        &mut self,
        fd: &Resource<Descriptor>,
        mode: OutputMode,
    ) -> FsResult<Resource<DynOutputStream>> {
        let file = file_handle(self.table.get(fd)?)?;
        if file.perms.write_not_permitted() {
            return Err(ErrorCode::NotPermitted.into());
        }
        self.fenced()?;
        let stream: DynOutputStream = Box::new(FencedFileOutput {
            file: Arc::clone(&file.file),
            mode,
            state: OutputState::Ready,
            fence: self.fs.fence.clone(),
        });
        Ok(self.table.push(stream)?)
    }

    fn refuse(&self, rel: &str, pattern: &str) -> FsError {
        tracing::debug!(
            plugin = &*self.fs.plugin,
            path = rel,
            pattern,
            "excluded path refused"
        );
        ErrorCode::Access.into()
    }
}

/// The directory handle of a descriptor.
fn dir_handle(descriptor: &Descriptor) -> Result<Arc<std::fs::File>, ErrorCode> {
    match descriptor {
        Descriptor::Dir(dir) => Ok(Arc::clone(&dir.dir)),
        Descriptor::File(_) => Err(ErrorCode::NotDirectory),
    }
}

/// `path` joined to `base` without touching the filesystem, `.` and `..`
/// folded; `None` if it climbs above the root (the open refuses that).
fn lexical_join(base: &str, path: &str) -> Option<String> {
    let mut names: Vec<&str> = base.split('/').filter(|s| !s.is_empty()).collect();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                names.pop()?;
            }
            name => names.push(name),
        }
    }
    Some(names.join("/"))
}

/// Where `path` under `dir` is, relative to the mount `root`, with its
/// parent directory resolved as the open would resolve it; `None` when the
/// parent cannot be opened (the call fails anyway) or placed.
fn resolved_rel(root: &std::fs::File, dir: &std::fs::File, path: &str) -> Option<String> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = match trimmed.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", trimmed),
    };
    let (parent, name) = match name {
        "" | "." | ".." => (trimmed, ""),
        name => (parent, name),
    };
    let opened;
    let parent_dir = if parent.is_empty() {
        dir
    } else {
        opened = cap_primitives::fs::open_dir(dir, Path::new(parent)).ok()?;
        &opened
    };
    let base = handle_rel(root, parent_dir)?;
    Some(match (base.is_empty(), name.is_empty()) {
        (_, true) => base,
        (true, false) => name.to_owned(),
        (false, false) => format!("{base}/{name}"),
    })
}

/// Where the open `file` is, relative to the mount `root`: the kernel's
/// name for each, compared at the same moment.
fn handle_rel(root: &std::fs::File, file: &std::fs::File) -> Option<String> {
    let root = handle_path(root)?;
    let file = handle_path(file)?;
    let rel = file.strip_prefix(&root).ok()?;
    rel.to_str().map(str::to_owned)
}

#[cfg(target_os = "linux")]
fn handle_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// Elsewhere the kernel's name is not read; exclusions are checked on
/// paths as written and resolved by their parents only.
#[cfg(not(target_os = "linux"))]
fn handle_path(_file: &std::fs::File) -> Option<PathBuf> {
    None
}

/// [`HasData`] for the host's `wasi:filesystem/{types,preopens}`.
pub(crate) struct WardenFilesystem;

impl HasData for WardenFilesystem {
    type Data<'a> = FsView<'a>;
}

impl preopens::Host for FsView<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let mut out = Vec::with_capacity(self.fs.preopens.0.len());
        for (dir, name, scope) in &self.fs.preopens.0 {
            let fd = self.table.push(Descriptor::Dir(dir.clone()))?;
            if let Some(scope) = scope {
                let place = Place {
                    scope: Arc::clone(scope),
                    rel: String::new(),
                };
                self.fs.places.insert(fd.rep(), place);
            }
            out.push((fd, name.clone()));
        }
        Ok(out)
    }
}

impl types::Host for FsView<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.inner(), err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.inner(), err)
    }
}

/// What an open found.
enum Opened {
    Dir(std::fs::File),
    File(std::fs::File),
    /// Something other than a regular file or a directory.
    Refused(&'static str),
    NotDir,
}

/// An opened handle and, under a mount with exclusions, where it really is.
struct Checked {
    opened: Opened,
    rel: Option<String>,
    /// A temporary file this open created: its device and inode.
    temp: Option<(u64, u64)>,
}

/// How an `open-at` asks to open, as cap-primitives options plus the mode
/// the descriptor records. The same rules as wasmtime-wasi's own `open_at`,
/// plus `O_NONBLOCK`.
fn open_options(
    perms: FsPerms,
    path_flags: types::PathFlags,
    oflags: types::OpenFlags,
    flags: types::DescriptorFlags,
) -> Result<(cap_primitives::fs::OpenOptions, OpenMode), ErrorCode> {
    use cap_primitives::fs::FollowSymlinks;
    use types::{DescriptorFlags as D, OpenFlags as O};
    let mut opts = cap_primitives::fs::OpenOptions::new();
    opts._cap_fs_ext_maybe_dir(true);
    let mut mode = OpenMode::empty();
    let mut create = false;
    if oflags.contains(O::CREATE) {
        if oflags.contains(O::EXCLUSIVE) {
            opts.create_new(true);
        } else {
            opts.create(true);
        }
        create = true;
        opts.write(true);
        mode |= OpenMode::WRITE;
    }
    if oflags.contains(O::TRUNCATE) {
        opts.truncate(true).write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(D::READ) {
        opts.read(true);
        mode |= OpenMode::READ;
    }
    if flags.contains(D::WRITE) {
        opts.write(true);
        mode |= OpenMode::WRITE;
    } else {
        // Opened for reading at least, so the OS lets it open; the
        // descriptor's permissions refuse writes later.
        opts.read(true);
        mode |= OpenMode::READ;
    }
    opts._cap_fs_ext_follow(if path_flags.contains(types::PathFlags::SYMLINK_FOLLOW) {
        FollowSymlinks::Yes
    } else {
        FollowSymlinks::No
    });
    if flags.intersects(D::FILE_INTEGRITY_SYNC | D::DATA_INTEGRITY_SYNC | D::REQUESTED_WRITE_SYNC) {
        return Err(ErrorCode::Unsupported);
    }
    if oflags.contains(O::DIRECTORY) && oflags.intersects(O::CREATE | O::EXCLUSIVE | O::TRUNCATE) {
        return Err(ErrorCode::Invalid);
    }
    if perms.write_not_permitted() && (create || mode.contains(OpenMode::WRITE)) {
        return Err(ErrorCode::NotPermitted);
    }
    // A FIFO opened for reading would wait for a writer, one opened for
    // writing for a reader; non-blocking, neither waits.
    opts._cap_fs_ext_nonblock(true);
    Ok((opts, mode))
}

/// Opens `path` under `dir` with `opts` and sorts out what it is.
fn open_checked(
    dir: &std::fs::File,
    path: &Path,
    opts: &cap_primitives::fs::OpenOptions,
    want_dir: bool,
) -> io::Result<Opened> {
    use rustix::fs::FileType;
    let file = match cap_primitives::fs::open(dir, path, opts) {
        Ok(file) => file,
        // A FIFO without a reader opened for writing, or a socket.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            return Ok(Opened::Refused("a FIFO or socket"));
        }
        Err(e) => return Err(e),
    };
    let stat = rustix::fs::fstat(&file)?;
    Ok(match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Opened::Dir(file),
        FileType::RegularFile if want_dir => Opened::NotDir,
        // Left non-blocking: a file on disk ignores it, and a file whose
        // read would wait (`/proc/kmsg`) answers `would-block` instead.
        FileType::RegularFile => Opened::File(file),
        FileType::Fifo => Opened::Refused("a FIFO"),
        FileType::CharacterDevice => Opened::Refused("a character device"),
        FileType::BlockDevice => Opened::Refused("a block device"),
        FileType::Socket => Opened::Refused("a socket"),
        _ => Opened::Refused("not a regular file"),
    })
}

impl HostDescriptor for FsView<'_> {
    async fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        let perms = match self.table.get(&fd)? {
            Descriptor::Dir(dir) => dir.perms,
            Descriptor::File(_) => return Err(ErrorCode::NotDirectory.into()),
        };
        let (opts, mode) = open_options(perms, path_flags, oflags, flags)?;
        self.check_path(&fd, &path, false).await?;
        if mode.contains(OpenMode::WRITE) {
            // Creating or truncating is the change; a descriptor opened for
            // writing is checked again at each write.
            self.fenced()?;
        }
        let place = self.fs.places.get(&fd.rep()).cloned();
        let parent = dir_handle(self.table.get(&fd)?)?;
        let root = place.as_ref().map(|p| Arc::clone(&p.scope.root));
        let want_dir = oflags.contains(types::OpenFlags::DIRECTORY);
        // A new temporary file: remembered, so that the lease removes it if
        // it is still there when the lease ends.
        let temp_dir = (oflags.contains(types::OpenFlags::CREATE | types::OpenFlags::EXCLUSIVE)
            && path.ends_with(TEMP_SUFFIX))
        .then(|| Arc::clone(&parent));
        let is_temp = temp_dir.is_some();
        let opened =
            open_checked(&parent, Path::new(&path), &opts, want_dir).map_err(ErrorCode::from)?;
        let rel = match (&root, &opened) {
            (Some(root), Opened::Dir(file) | Opened::File(file)) => handle_rel(root, file),
            _ => None,
        };
        let temp = match &opened {
            Opened::File(file) if is_temp => {
                rustix::fs::fstat(file).ok().map(|s| (s.st_dev, s.st_ino))
            }
            _ => None,
        };
        let checked = Checked { opened, rel, temp };
        // Where the opened file really is (a symlink followed, say), checked
        // like the path was; where that cannot be read, the path as written.
        let child = match place {
            Some(place) => {
                let rel = checked
                    .rel
                    .or_else(|| lexical_join(&place.rel, &path))
                    .unwrap_or_default();
                if let Some(pattern) = place.scope.exclusions.excluding(&rel) {
                    return Err(self.refuse(&rel, pattern));
                }
                Some(Place {
                    scope: place.scope,
                    rel,
                })
            }
            None => None,
        };
        let descriptor = match checked.opened {
            Opened::Dir(file) => Descriptor::Dir(Dir::new(file, perms, mode, INLINE)),
            Opened::File(file) => Descriptor::File(File::new(file, perms, mode, INLINE)),
            Opened::NotDir => return Err(ErrorCode::NotDirectory.into()),
            Opened::Refused(what) => {
                tracing::debug!(
                    plugin = &*self.fs.plugin,
                    path,
                    what,
                    "open refused: not a regular file or directory"
                );
                return Err(ErrorCode::Unsupported.into());
            }
        };
        let is_dir = matches!(descriptor, Descriptor::Dir(_));
        if let (Some(dir), Some((device, inode))) = (temp_dir, checked.temp) {
            self.fs.temps.push(Temp {
                dir,
                path: path.clone(),
                device,
                inode,
            });
        }
        let opened = self.table.push(descriptor)?;
        if let Some(child) = child.filter(|_| is_dir) {
            self.fs.places.insert(opened.rep(), child);
        }
        Ok(opened)
    }

    async fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        HostDescriptor::advise(&mut self.inner(), fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync_data(&mut self.inner(), fd).await
    }

    async fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorFlags> {
        HostDescriptor::get_flags(&mut self.inner(), fd).await
    }

    async fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorType> {
        HostDescriptor::get_type(&mut self.inner(), fd).await
    }

    async fn set_size(&mut self, fd: Resource<Descriptor>, size: types::Filesize) -> FsResult<()> {
        self.fenced()?;
        HostDescriptor::set_size(&mut self.inner(), fd, size).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.fenced()?;
        HostDescriptor::set_times(&mut self.inner(), fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        HostDescriptor::read(&mut self.inner(), fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        // As wasmtime-wasi's, with the validity checked again right before
        // the syscall.
        let file = file_handle(self.table.get(&fd)?)?;
        if file.perms.write_not_permitted() {
            return Err(ErrorCode::NotPermitted.into());
        }
        self.fenced()?;
        let written = fenced_write(&self.fs.fence, &file.file, &buf, OutputMode::At(offset))
            .map_err(FsError::trap)?
            .map_err(ErrorCode::from)?;
        Ok(written as types::Filesize)
    }

    async fn read_directory(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        let place = self.fs.places.get(&fd.rep()).cloned();
        let dir = dir_handle(self.table.get(&fd)?)?;
        let listing = HostDescriptor::read_directory(&mut self.inner(), fd).await?;
        if let Some(place) = place {
            self.fs.listings.insert(listing.rep(), place);
        }
        let listed = Listed { dir, pending: None };
        self.fs.listed.insert(listing.rep(), listed);
        Ok(listing)
    }

    async fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync(&mut self.inner(), fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.check_path(&fd, &path, false).await?;
        self.fenced()?;
        HostDescriptor::create_directory_at(&mut self.inner(), fd, path).await
    }

    async fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat(&mut self.inner(), fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        self.check_path(&fd, &path, false).await?;
        HostDescriptor::stat_at(&mut self.inner(), fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.check_path(&fd, &path, false).await?;
        self.fenced()?;
        HostDescriptor::set_times_at(&mut self.inner(), fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.check_path(&fd, &old_path, false).await?;
        self.check_path(&new_descriptor, &new_path, false).await?;
        self.fenced()?;
        HostDescriptor::link_at(
            &mut self.inner(),
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
        .await
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        self.fs.places.remove(&fd.rep());
        HostDescriptor::drop(&mut self.inner(), fd)
    }

    async fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        self.check_path(&fd, &path, false).await?;
        HostDescriptor::readlink_at(&mut self.inner(), fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.check_path(&fd, &path, false).await?;
        self.fenced()?;
        HostDescriptor::remove_directory_at(&mut self.inner(), fd, path).await
    }

    async fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.check_path(&fd, &old_path, true).await?;
        self.check_path(&new_fd, &new_path, true).await?;
        self.fenced()?;
        HostDescriptor::rename_at(&mut self.inner(), fd, old_path, new_fd, new_path).await
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.check_path(&fd, &dest_path, false).await?;
        self.fenced()?;
        HostDescriptor::symlink_at(&mut self.inner(), fd, src_path, dest_path).await
    }

    async fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        self.check_path(&fd, &path, false).await?;
        self.fenced()?;
        HostDescriptor::unlink_file_at(&mut self.inner(), fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        // As wasmtime-wasi's, but each read is made inline: its stream
        // hands even a non-blocking read to tokio's blocking pool.
        let file = match self.table.get(&fd)? {
            Descriptor::File(file) => Arc::clone(&file.file),
            Descriptor::Dir(_) => return Err(ErrorCode::IsDirectory.into()),
        };
        let stream: DynInputStream = Box::new(FileInput {
            file,
            position: offset,
            closed: false,
        });
        Ok(self.table.push(stream)?)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        self.output_stream(&fd, OutputMode::At(offset))
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        self.output_stream(&fd, OutputMode::Append)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<Descriptor>,
        b: Resource<Descriptor>,
    ) -> wasmtime::Result<bool> {
        HostDescriptor::is_same_object(&mut self.inner(), a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash(&mut self.inner(), fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        self.check_path(&fd, &path, false).await?;
        HostDescriptor::metadata_hash_at(&mut self.inner(), fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for FsView<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        let place = self.fs.listings.get(&stream.rep()).cloned();
        loop {
            let again = Resource::new_borrow(stream.rep());
            let entry = match HostDirectoryEntryStream::read_directory_entry(
                &mut self.inner(),
                again,
            )
            .await
            {
                Err(e) if e.downcast_ref() == Some(&ErrorCode::IllegalByteSequence) => {
                    // An entry whose name is not UTF-8: left out and
                    // reported; the listing goes on.
                    self.unlist(stream.rep()).await;
                    continue;
                }
                other => other?,
            };
            let excluded = match (&place, &entry) {
                (Some(place), Some(entry)) => {
                    let rel = match place.rel.as_str() {
                        "" => entry.name.clone(),
                        dir => format!("{dir}/{}", entry.name),
                    };
                    place.scope.exclusions.excludes(&rel)
                }
                _ => false,
            };
            if !excluded {
                return Ok(entry);
            }
        }
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        self.fs.listings.remove(&stream.rep());
        self.fs.listed.remove(&stream.rep());
        HostDirectoryEntryStream::drop(&mut self.inner(), stream)
    }
}

/// The file of a descriptor.
fn file_handle(descriptor: &Descriptor) -> Result<&File, ErrorCode> {
    match descriptor {
        Descriptor::File(file) => Ok(file),
        Descriptor::Dir(_) => Err(ErrorCode::BadDescriptor),
    }
}

/// Where a file output stream writes.
#[derive(Clone, Copy)]
enum OutputMode {
    At(u64),
    Append,
}

/// One write to `file`: the lease's validity is checked right before each
/// syscall, so a write started just before the process was paused is
/// refused when it resumes (`Err`). Appends use
/// `RWF_APPEND` where the kernel has it, as wasmtime-wasi does.
fn fenced_write(
    fence: &LeaseFence,
    file: &std::fs::File,
    mut buf: &[u8],
    mode: OutputMode,
) -> Result<io::Result<usize>, Expired> {
    use std::os::unix::fs::FileExt as _;
    let mut total = 0;
    while !buf.is_empty() {
        fence.check()?;
        let written = match mode {
            OutputMode::At(at) => file.write_at(buf, at + total as u64),
            OutputMode::Append => append(file, buf),
        };
        match written {
            Ok(n) => {
                total += n;
                buf = &buf[n..];
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(total))
}

fn append(file: &std::fs::File, buf: &[u8]) -> io::Result<usize> {
    #[cfg(all(target_os = "linux", not(target_os = "android")))]
    {
        use rustix::io::{Errno, ReadWriteFlags, pwritev2};
        match pwritev2(file, &[io::IoSlice::new(buf)], 0, ReadWriteFlags::APPEND) {
            Err(Errno::NOSYS | Errno::NOTSUP) => {}
            otherwise => return Ok(otherwise?),
        }
    }
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(file)?;
    rustix::fs::fcntl_setfl(file, flags | OFlags::APPEND)?;
    let written = rustix::io::write(file, buf);
    rustix::fs::fcntl_setfl(file, flags)?;
    Ok(written?)
}

/// What a [`FencedFileOutput`] is doing.
enum OutputState {
    Ready,
    Failed(io::Error),
    /// A write was refused: the lease's validity had passed.
    Fenced,
    Closed,
}

/// A file's output stream (`write-via-stream`, `append-via-stream`): as
/// wasmtime-wasi's, but every write is made inline when it is accepted,
/// checking the lease's validity when it is accepted and again right
/// before each syscall.
struct FencedFileOutput {
    file: Arc<std::fs::File>,
    mode: OutputMode,
    state: OutputState,
    fence: LeaseFence,
}

/// Most bytes one write may take, as wasmtime-wasi allows.
const FILE_WRITE_CAPACITY: usize = 1 << 20;

impl FencedFileOutput {
    fn expired() -> StreamError {
        StreamError::Trap(wasmtime::Error::new(Expired))
    }

    /// The state's error, if any, for `check-write` and `flush`; a failed
    /// write closes the stream, as in wasmtime-wasi.
    fn take_error(&mut self) -> Option<StreamError> {
        match std::mem::replace(&mut self.state, OutputState::Closed) {
            OutputState::Failed(e) => Some(StreamError::LastOperationFailed(e.into())),
            OutputState::Fenced => {
                self.state = OutputState::Fenced;
                Some(Self::expired())
            }
            OutputState::Closed => Some(StreamError::Closed),
            OutputState::Ready => {
                self.state = OutputState::Ready;
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl Pollable for FencedFileOutput {
    async fn ready(&mut self) {
        // Each write is done when `write` returns.
    }
}

#[async_trait::async_trait]
impl OutputStream for FencedFileOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        match self.state {
            OutputState::Ready => {}
            OutputState::Closed => return Err(StreamError::Closed),
            OutputState::Fenced => return Err(Self::expired()),
            OutputState::Failed(_) => {
                return Err(StreamError::trap(
                    "write not permitted: check_write not called first",
                ));
            }
        }
        if self.fence.check().is_err() {
            self.state = OutputState::Fenced;
            return Err(Self::expired());
        }
        match fenced_write(&self.fence, &self.file, &bytes, self.mode) {
            Ok(Ok(written)) => {
                if let OutputMode::At(at) = &mut self.mode {
                    *at += written as u64;
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.state = OutputState::Failed(e);
                Ok(())
            }
            Err(Expired) => {
                self.state = OutputState::Fenced;
                Err(Self::expired())
            }
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Nothing is buffered here: a write is done once `write` returns.
        self.take_error().map_or(Ok(()), Err)
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if let Some(error) = self.take_error() {
            return Err(error);
        }
        Ok(FILE_WRITE_CAPACITY)
    }

    async fn cancel(&mut self) {
        self.state = OutputState::Closed;
    }
}

/// Most bytes one read of a [`FileInput`] returns, as wasmtime-wasi's.
const FILE_READ_CAPACITY: usize = 64 * 1024;

/// A file's input stream (`read-via-stream`): as wasmtime-wasi's, but each
/// read is made inline, on the lease's thread. A file that would make the
/// read wait (non-blocking, it says so) fails the read.
struct FileInput {
    file: Arc<std::fs::File>,
    position: u64,
    closed: bool,
}

#[async_trait::async_trait]
impl Pollable for FileInput {
    async fn ready(&mut self) {
        // A read is made when it is asked for.
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi_io::streams::InputStream for FileInput {
    fn read(&mut self, size: usize) -> StreamResult<bytes::Bytes> {
        use std::os::unix::fs::FileExt as _;
        if self.closed {
            return Err(StreamError::Closed);
        }
        if size == 0 {
            return Ok(bytes::Bytes::new());
        }
        let mut buf = bytes::BytesMut::zeroed(size.min(FILE_READ_CAPACITY));
        loop {
            match self.file.read_at(&mut buf, self.position) {
                Ok(0) => {
                    self.closed = true;
                    return Err(StreamError::Closed);
                }
                Ok(n) => {
                    buf.truncate(n);
                    self.position += n as u64;
                    return Ok(buf.freeze());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.closed = true;
                    return Err(StreamError::LastOperationFailed(e.into()));
                }
            }
        }
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
        assert_eq!(MountRoot::open(&dir.path().join("moved")).unwrap(), opened);
    }
}
