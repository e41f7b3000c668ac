//! [`Capabilities`]: the effective grants one plugin runs with, as typed
//! values built once and turned into a fresh WASI context for every lease.
//!
//! By default nothing is granted: no directory is mounted, no environment
//! variable is visible, no network is reachable, stdin is closed and stdout /
//! stderr are captured, never inherited.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::exclusions::Exclusions;
use super::fs::MountRoot;
use super::nofollow::NoFollowError;
use super::secrets::Secret;

/// Whether a mounted directory may be changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Files and directories may be read, never created, changed or removed.
    ReadOnly,
    /// Files and directories may also be created, changed and removed.
    ReadWrite,
}

impl Access {
    /// The narrower of two accesses.
    pub fn narrowest(self, other: Access) -> Access {
        if self == Access::ReadOnly || other == Access::ReadOnly {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Access::ReadOnly => "read-only",
            Access::ReadWrite => "read-write",
        })
    }
}

/// A host directory visible to the guest at `/<name>`: the directory
/// `host_dir` named when the grant was built, held open by identity; a later
/// rename or symlink swap of that path does not redirect it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// The mount's name, as requested in the manifest.
    pub name: String,
    /// The host directory's real path (no component a symlink), as it was
    /// when granted.
    pub host_dir: PathBuf,
    /// What the guest may do there.
    pub access: Access,
    /// Paths under the directory taken out of the grant: never opened,
    /// changed or listed, by any tool. Default: none.
    pub exclude: Exclusions,
    /// The directory itself, opened once; every lease's preopen is made
    /// from it.
    #[serde(skip)]
    pub(crate) root: MountRoot,
}

impl Mount {
    /// The absolute path the guest sees the directory at.
    pub fn guest_path(&self) -> String {
        format!("/{}", self.name)
    }
}

/// A granted directory that cannot be mounted.
#[derive(Debug, thiserror::Error)]
#[error("mount `{mount}`: directory `{dir}` {reason}")]
pub struct MountError {
    /// The mount's name.
    pub mount: String,
    /// The directory as given.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The effective capabilities of one plugin: what it requested, narrowed by
/// what the operator granted. Built with [`Capabilities::none`] and the
/// builder methods, each of which adds exactly one grant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    mounts: Vec<Mount>,
    env: Vec<(String, String)>,
    hosts: Vec<String>,
    config: Arc<BTreeMap<String, String>>,
    secrets: Arc<[Secret]>,
}

impl Capabilities {
    /// No capabilities at all: no mount, no environment, no network, no
    /// configuration.
    pub fn none() -> Self {
        Capabilities::default()
    }

    /// Mounts `dir` at `/<name>` with `access`; a relative `dir` is taken
    /// from the working directory. See [`Capabilities::mount_at`].
    pub fn mount(
        self,
        name: &str,
        dir: impl AsRef<Path>,
        access: Access,
    ) -> Result<Self, MountError> {
        self.mount_at(name, Path::new(""), dir, access)
    }

    /// Mounts `dir` at `/<name>` with `access`, a relative `dir` being
    /// relative to `base` (the directory of the file that grants it; empty
    /// for the working directory). The directory must exist. It is opened
    /// now without following a symlink in any component of `dir` (`base`'s
    /// own are followed: it is where the operator keeps the file), and the
    /// grant holds that handle: a path swapped for a symlink (`docs ->
    /// ../secrets`, which a plugin with write access above it could plant)
    /// is refused with an error naming the mount and the link, in this
    /// process and in every later one, and a swap after the grant is built
    /// cannot redirect it.
    pub fn mount_at(
        mut self,
        name: &str,
        base: &Path,
        dir: impl AsRef<Path>,
        access: Access,
    ) -> Result<Self, MountError> {
        let dir = dir.as_ref();
        let shown = base.join(dir);
        let error = |reason: String| MountError {
            mount: name.to_owned(),
            dir: shown.clone(),
            reason,
        };
        if !is_valid_mount_name(name) {
            return Err(error(
                "has an invalid mount name (use [a-z][a-z0-9_-]*, at most 64 bytes)".into(),
            ));
        }
        if self.mounts.iter().any(|m| m.name == name) {
            return Err(error("is mounted twice".into()));
        }
        let opened = super::nofollow::open_dir(base, dir).map_err(|e| match e {
            NoFollowError::NotADirectory { .. } => error("is not a directory".into()),
            other => error(format!("cannot be used: {other}")),
        })?;
        let host_dir = opened.path;
        let root = MountRoot::from_fd(opened.fd)
            .map_err(|e| error(format!("cannot be opened as a directory: {e}")))?;
        self.mounts.push(Mount {
            name: name.to_owned(),
            host_dir,
            access,
            exclude: Exclusions::default(),
            root,
        });
        Ok(self)
    }

    /// Excludes `patterns` (see [`Exclusions`]) from the mount `name`, added
    /// before: the host's filesystem layer refuses to open, change or list
    /// what they match, whatever tool asks.
    pub fn exclude<S: AsRef<str>>(
        mut self,
        name: &str,
        patterns: &[S],
    ) -> Result<Self, MountError> {
        let Some(mount) = self.mounts.iter_mut().find(|m| m.name == name) else {
            return Err(MountError {
                mount: name.to_owned(),
                dir: PathBuf::new(),
                reason: "is not mounted, so nothing can be excluded from it".into(),
            });
        };
        let mut all: Vec<String> = mount.exclude.patterns().map(str::to_owned).collect();
        all.extend(patterns.iter().map(|p| p.as_ref().to_owned()));
        mount.exclude = Exclusions::new(&all).map_err(|e| MountError {
            mount: name.to_owned(),
            dir: mount.host_dir.clone(),
            reason: format!("has an {e}"),
        })?;
        Ok(self)
    }

    /// Makes environment variable `name` visible with `value`. Its value is
    /// redacted from everything the plugin returns or prints.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Allows outbound HTTP requests to `host`, a
    /// [`HostPattern`](super::HostPattern): `name`, `name:port`, `*.domain`,
    /// `*`, optionally with `http://` or `https://`. A pattern that does not
    /// parse allows nothing.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.hosts.push(host.into());
        self
    }

    /// Grants `secret`, which the plugin uses by handle (the host puts it
    /// into requests for the secret's hosts only) or, when the secret says
    /// so, reads. Its value is redacted from everything the plugin returns
    /// or prints. A secret of the same name granted before is replaced.
    pub fn secret(mut self, secret: Secret) -> Self {
        let mut all: Vec<Secret> = self
            .secrets
            .iter()
            .filter(|s| s.name() != secret.name())
            .cloned()
            .collect();
        all.push(secret);
        self.secrets = all.into();
        self
    }

    /// The granted secrets.
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    pub(crate) fn shared_secrets(&self) -> Arc<[Secret]> {
        Arc::clone(&self.secrets)
    }

    /// Sets a configuration value the plugin can read with the host `config`
    /// import.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.config).insert(key.into(), value.into());
        self
    }

    /// The mounts.
    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// The environment variables, with their values.
    pub fn env_vars(&self) -> &[(String, String)] {
        &self.env
    }

    /// The allowed outbound hosts.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The configuration values.
    pub fn config_values(&self) -> &BTreeMap<String, String> {
        &self.config
    }

    pub(crate) fn shared_config(&self) -> Arc<BTreeMap<String, String>> {
        Arc::clone(&self.config)
    }

    /// The narrowed grant every call ahead of an approved effect runs under
    /// (preflight, describe, and by default context sources and policies):
    /// the same mounts read-only, no outbound host; environment,
    /// configuration and secrets as granted (with no host, a handle is
    /// never filled).
    pub fn narrowed(&self) -> Capabilities {
        let mut narrowed = self.clone();
        for mount in &mut narrowed.mounts {
            mount.access = Access::ReadOnly;
        }
        narrowed.hosts.clear();
        narrowed
    }

    /// Whether the plugin can change anything outside itself: a read-write
    /// mount or any outbound host.
    pub fn can_cause_effects(&self) -> bool {
        !self.hosts.is_empty() || self.mounts.iter().any(|m| m.access == Access::ReadWrite)
    }
}

/// Whether `name` is a valid mount name: `[a-z][a-z0-9_-]*`, 1 to 64 bytes.
pub fn is_valid_mount_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_granted_by_default() {
        let caps = Capabilities::none();
        assert!(caps.mounts().is_empty());
        assert!(caps.env_vars().is_empty());
        assert!(caps.hosts().is_empty());
        assert!(caps.config_values().is_empty());
        assert!(caps.secrets().is_empty());
        assert!(!caps.can_cause_effects());
    }

    #[test]
    fn a_missing_directory_is_a_setup_error_naming_it() {
        let err = Capabilities::none()
            .mount("workspace", "/no/such/dir", Access::ReadOnly)
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("workspace"), "{text}");
        assert!(text.contains("/no/such/dir"), "{text}");
    }

    #[test]
    fn a_file_is_not_a_mountable_directory() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = Capabilities::none()
            .mount("workspace", file.path(), Access::ReadOnly)
            .unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }

    #[test]
    fn mount_names_are_checked_and_unique() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Capabilities::none()
                .mount("../etc", dir.path(), Access::ReadOnly)
                .is_err()
        );
        let caps = Capabilities::none()
            .mount("data", dir.path(), Access::ReadWrite)
            .unwrap();
        assert!(caps.can_cause_effects());
        assert_eq!(caps.mounts()[0].guest_path(), "/data");
        assert!(caps.mount("data", dir.path(), Access::ReadOnly).is_err());
    }

    #[test]
    fn the_narrowed_grant_is_read_only_without_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let caps = Capabilities::none()
            .mount("data", dir.path(), Access::ReadWrite)
            .unwrap()
            .host("api.example.com")
            .env("TOKEN", "value")
            .config("k", "v");
        let narrowed = caps.narrowed();
        assert!(!narrowed.can_cause_effects());
        assert_eq!(narrowed.mounts()[0].access, Access::ReadOnly);
        assert_eq!(narrowed.mounts()[0].host_dir, caps.mounts()[0].host_dir);
        assert!(narrowed.hosts().is_empty());
        assert_eq!(narrowed.env_vars(), caps.env_vars());
        assert_eq!(narrowed.config_values(), caps.config_values());
    }

    #[test]
    fn read_only_is_narrower_than_read_write() {
        assert_eq!(
            Access::ReadWrite.narrowest(Access::ReadOnly),
            Access::ReadOnly
        );
        assert_eq!(
            Access::ReadWrite.narrowest(Access::ReadWrite),
            Access::ReadWrite
        );
    }
}
