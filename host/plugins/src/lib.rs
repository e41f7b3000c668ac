//! Plugins: manifests, the plugins built into the binary, and the
//! [`PluginHost`] that loads a plugin under an operator's grant and calls it.
//!
//! Loading a plugin: read its manifest, apply the grant
//! ([`crate::grant::effective`]), load the component through the sandbox
//! (integrity, cache, import allow-list), check that it exports every world
//! the manifest declares, and ask `describe` of each (tools, context source,
//! channel, policy) once per component hash, under a tight lease with no
//! capabilities, and keep the answers.
//!
//! A [`LoadedPlugin`] is the adapter for every kind: [`LoadedPlugin::invoke`]
//! and [`LoadedPlugin::preflight`] for tools, [`LoadedPlugin::resolve`] for
//! context sources, [`LoadedPlugin::deliver`] for channels,
//! [`LoadedPlugin::decide`] for policies; each is one lease
//! with the plugin's limits, a receipt and typed errors. A plugin may be
//! several kinds at once (`kind = ["tool", "context"]`). Calls made before
//! or instead of an approved effect (preflight, and unless the grant says
//! `widened`, resolve and decide) run under the narrowed grant: mounts
//! read-only, no outbound host.
//!
//! Before a component is compiled, the bundle (manifest and component) is
//! checked against the operator's [`trust::TrustPolicy`] (its minisign
//! signature, fail-closed) and, when the agent has one, its lock file
//! ([`lock::LockPin`]); the verified [`Provenance`] is stamped on every
//! receipt of the plugin's leases.
//!
//! The component file is read before anything else is done with it: it
//! must be a regular file (a device or a FIFO could block the load or never
//! end) of at most [`MAX_COMPONENT_BYTES`], inside the plugin's directory
//! (the manifest's, after symlinks; opened beneath it, so no `..` or symlink
//! leads out) unless the operator's grant names the file as `component`,
//! which is then the only file the manifest may name.

pub mod builtin;
mod codes;
pub mod grant;
pub mod lock;
pub mod manifest;
pub mod secret_store;
pub mod secrets;
pub mod tool;
pub mod trust;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

pub use manifest::{Manifest, ManifestError};
pub use tool::ToolDescriptor;
pub use trust::{Provenance, TrustError, TrustPolicy};

use crate::grant::{Grant, GrantError};
use warden_sandbox::{
    Capabilities, GrantedComponent, LeaseError, Leased, PluginComponent, PluginKind, RunBound,
    Sandbox, SandboxError, ValidUntil, wit,
};

/// Where a plugin comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PluginSource {
    /// A `plugin.toml` on disk.
    Manifest(PathBuf),
    /// A plugin built into the `warden` binary, written `builtin:<name>`.
    Builtin(String),
}

impl FromStr for PluginSource {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.strip_prefix("builtin:") {
            Some(name) => PluginSource::Builtin(name.to_owned()),
            None => PluginSource::Manifest(PathBuf::from(s)),
        })
    }
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Manifest(p) => write!(f, "{}", p.display()),
            PluginSource::Builtin(n) => write!(f, "builtin:{n}"),
        }
    }
}

/// A plugin that cannot be loaded or called.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The manifest is unreadable or invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The grant cannot be applied.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The component cannot be loaded.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// No built-in plugin has this name.
    #[error("no built-in plugin `{name}` (built in: {available})")]
    UnknownBuiltin {
        /// The name asked for.
        name: String,
        /// The names there are.
        available: String,
    },
    /// The manifest names no component file.
    #[error(
        "plugin manifest `{path}` has no `component`: set `component` and `sha256`, or use a built-in plugin as `builtin:<name>`"
    )]
    NoComponent {
        /// The manifest.
        path: PathBuf,
    },
    /// The component file named by the manifest is refused before it is
    /// read: not a regular file, too large, or unreadable.
    #[error("plugin manifest `{manifest}`: component `{path}` {problem}")]
    ComponentFile {
        /// The manifest.
        manifest: PathBuf,
        /// The component file it names.
        path: PathBuf,
        /// What is wrong with it.
        problem: ComponentFileError,
    },
    /// The bundle's signature or lock refuses it (checked before compiling;
    /// boxed: the error stays small on the happy path).
    #[error(transparent)]
    Trust(Box<TrustError>),
    /// The component does not export the world the manifest declares.
    #[error(
        "plugin `{plugin}`: the manifest says kind `{declared}`, but the component exports {exported}"
    )]
    KindMismatch {
        /// The plugin.
        plugin: String,
        /// The manifest's kind.
        declared: PluginKind,
        /// What the component exports.
        exported: String,
    },
    /// `describe` failed.
    #[error("plugin `{plugin}`: describe failed: {error}")]
    Describe {
        /// The plugin.
        plugin: String,
        /// Why.
        error: LeaseError,
    },
    /// A tool spec is unacceptable.
    #[error("plugin `{plugin}`: tool `{tool}`: {message}")]
    InvalidToolSpec {
        /// The plugin.
        plugin: String,
        /// The tool.
        tool: String,
        /// What is wrong.
        message: String,
    },
    /// A call named a tool the plugin does not offer.
    #[error("plugin `{plugin}` has no tool `{tool}` (it offers: {offered})")]
    UnknownTool {
        /// The plugin.
        plugin: String,
        /// The tool asked for.
        tool: String,
        /// The tools it offers.
        offered: String,
    },
    /// The plugin is not of the kind the call needs.
    #[error("plugin `{plugin}` is not a {needed} plugin")]
    WrongKind {
        /// The plugin.
        plugin: String,
        /// The kind the call needs.
        needed: PluginKind,
    },
}

impl From<TrustError> for PluginError {
    fn from(error: TrustError) -> Self {
        PluginError::Trust(Box::new(error))
    }
}

/// The largest component file read: 256 MiB.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// Why a component file is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ComponentFileError {
    /// A device, FIFO, socket or directory: reading it could block or never
    /// end.
    #[error("is a {kind}, not a regular file")]
    NotARegularFile {
        /// What it is.
        kind: &'static str,
    },
    /// Larger than [`MAX_COMPONENT_BYTES`].
    #[error("is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// It cannot be opened or read.
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
    /// It is outside the plugin's directory (after symlinks), and the
    /// operator's grant does not name it.
    #[error(
        "is outside the plugin's directory `{}` (after following symlinks): move it into that directory, or allow this one file by naming it in the plugin's grant as `component = {:?}`",
        dir.display(),
        resolved.display()
    )]
    OutsidePluginDir {
        /// The plugin's directory.
        dir: PathBuf,
        /// Where the component path leads.
        resolved: PathBuf,
    },
    /// The operator's grant names a different component file, the only one
    /// the manifest may name.
    #[error(
        "is not the component the grant allows (`{}`): the grant's `component` is the only file this plugin may load",
        granted.display()
    )]
    NotGranted {
        /// The file the grant names.
        granted: PathBuf,
    },
}

/// Reads the component file `component` that a manifest in `plugin_dir`
/// names. Without `granted` it must resolve (after symlinks) inside
/// `plugin_dir`, and is opened beneath it, so a `..` or symlink swapped in
/// after the check still cannot lead out; with `granted` (the file the
/// operator's grant names) it must be that file. Either way it is opened
/// without blocking (a FIFO never blocks the load), checked to be a regular
/// file through the open handle, and read up to [`MAX_COMPONENT_BYTES`] (an
/// endless file cannot grow memory).
fn read_component(
    plugin_dir: &Path,
    component: &Path,
    granted: Option<&Path>,
) -> Result<Vec<u8>, ComponentFileError> {
    use std::io::Read as _;
    let resolved = std::fs::canonicalize(component).map_err(ComponentFileError::Unreadable)?;
    let file = match granted {
        Some(granted) => {
            if std::fs::canonicalize(granted).ok().as_ref() != Some(&resolved) {
                return Err(ComponentFileError::NotGranted {
                    granted: granted.to_owned(),
                });
            }
            open_granted(&resolved)?
        }
        None => {
            let dir = std::fs::canonicalize(plugin_dir).map_err(ComponentFileError::Unreadable)?;
            let Ok(rel) = resolved.strip_prefix(&dir) else {
                return Err(ComponentFileError::OutsidePluginDir { dir, resolved });
            };
            let rel = if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            };
            open_beneath(&dir, rel)?
        }
    };
    let meta = file.metadata().map_err(ComponentFileError::Unreadable)?;
    regular(&meta)?;
    let mut wasm = Vec::with_capacity(meta.len().min(MAX_COMPONENT_BYTES) as usize);
    file.take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut wasm)
        .map_err(ComponentFileError::Unreadable)?;
    if wasm.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(ComponentFileError::TooLarge {
            limit: MAX_COMPONENT_BYTES,
        });
    }
    Ok(wasm)
}

/// Refuses what is not a regular file of at most [`MAX_COMPONENT_BYTES`].
fn regular(meta: &std::fs::Metadata) -> Result<(), ComponentFileError> {
    if !meta.is_file() {
        return Err(ComponentFileError::NotARegularFile {
            kind: file_kind(meta),
        });
    }
    if meta.len() > MAX_COMPONENT_BYTES {
        return Err(ComponentFileError::TooLarge {
            limit: MAX_COMPONENT_BYTES,
        });
    }
    Ok(())
}

/// Opens `rel` beneath `dir` for reading, without blocking. cap-primitives
/// resolves every step under `dir`, so nothing leads out of it (a symlink
/// swapped in after the check included).
fn open_beneath(dir: &Path, rel: &Path) -> Result<std::fs::File, ComponentFileError> {
    let root = std::fs::File::open(dir).map_err(ComponentFileError::Unreadable)?;
    // Looked at before it is opened, so a device is never opened at all.
    let meta = cap_primitives::fs::stat(&root, rel, cap_primitives::fs::FollowSymlinks::Yes)
        .map_err(ComponentFileError::Unreadable)?;
    if !meta.is_file() {
        return Err(ComponentFileError::NotARegularFile {
            kind: cap_file_kind(&meta),
        });
    }
    let mut options = cap_primitives::fs::OpenOptions::new();
    options.read(true);
    options._cap_fs_ext_nonblock(true);
    cap_primitives::fs::open(&root, rel, &options).map_err(ComponentFileError::Unreadable)
}

/// Opens the file the operator's grant names: anywhere, so checked to be a
/// regular file before it is opened (a device is never opened at all), then
/// opened without blocking.
fn open_granted(path: &Path) -> Result<std::fs::File, ComponentFileError> {
    regular(&std::fs::metadata(path).map_err(ComponentFileError::Unreadable)?)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path).map_err(ComponentFileError::Unreadable)
}

/// What a file that is not a regular file is, for the refusal.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        kind_of_mode(meta.mode())
    }
    #[cfg(not(unix))]
    if meta.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// The same for a file looked at beneath a directory.
fn cap_file_kind(meta: &cap_primitives::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use cap_primitives::fs::MetadataExt as _;
        kind_of_mode(meta.mode())
    }
    #[cfg(not(unix))]
    if meta.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

#[cfg(unix)]
fn kind_of_mode(mode: u32) -> &'static str {
    use rustix::fs::FileType;
    match FileType::from_raw_mode(mode as _) {
        FileType::Directory => "directory",
        FileType::Fifo => "FIFO",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Socket => "socket",
        _ => "special file",
    }
}

/// Loads plugins into one sandbox, sharing compiled components and the
/// answers of `describe` between plugins with the same component. Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct PluginHost {
    sandbox: Sandbox,
    shared: Arc<Mutex<Shared>>,
    /// Whose signatures are trusted, and where unsigned plugins may load.
    trust: Arc<TrustPolicy>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Loaded components, by sha256.
    components: HashMap<String, PluginComponent>,
    /// What `describe` returned, by component sha256.
    tool_specs: HashMap<String, Arc<Vec<wit::ToolSpec>>>,
    /// What the context source's, channel's or policy's `describe`
    /// returned, by component sha256 and kind.
    specs: HashMap<(String, PluginKind), wit::SourceSpec>,
}

impl PluginHost {
    /// A plugin host over `sandbox`, trusting as
    /// [`TrustPolicy::development`] does until
    /// [`with_trust`](Self::with_trust).
    pub fn new(sandbox: Sandbox) -> Self {
        PluginHost {
            sandbox,
            shared: Arc::default(),
            trust: Arc::default(),
        }
    }

    /// The same host, checking every plugin it loads from a manifest
    /// against `trust` before compiling it.
    pub fn with_trust(mut self, trust: TrustPolicy) -> Self {
        self.trust = Arc::new(trust);
        self
    }

    /// The trust policy plugins are checked against.
    pub fn trust(&self) -> &TrustPolicy {
        &self.trust
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Loads the plugin at `source` with `grant`. Relative directories in the
    /// grant resolve against `grant_base`; environment variables come from the
    /// host's environment.
    pub async fn load(
        &self,
        source: &PluginSource,
        grant: &Grant,
        grant_base: &Path,
    ) -> Result<LoadedPlugin, PluginError> {
        self.load_with_env(source, grant, grant_base, |k| std::env::var(k).ok())
            .await
    }

    /// Like [`load`](Self::load), with granted environment variables looked
    /// up by `env` instead of in the host's environment.
    pub async fn load_with_env(
        &self,
        source: &PluginSource,
        grant: &Grant,
        grant_base: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<LoadedPlugin, PluginError> {
        self.load_pinned(source, grant, grant_base, env, None).await
    }

    /// Like [`load_with_env`](Self::load_with_env), also refusing a bundle
    /// that is not the one `pin` (the agent's lock file) names.
    pub async fn load_pinned(
        &self,
        source: &PluginSource,
        grant: &Grant,
        grant_base: &Path,
        env: impl Fn(&str) -> Option<String>,
        pin: Option<&lock::LockPin>,
    ) -> Result<LoadedPlugin, PluginError> {
        let (manifest, wasm, expected, bundle) = match source {
            PluginSource::Manifest(path) => {
                let (manifest, manifest_bytes) = Manifest::read(path)?;
                let component = manifest
                    .component
                    .clone()
                    .ok_or_else(|| PluginError::NoComponent { path: path.clone() })?;
                let plugin_dir = match path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
                    _ => PathBuf::from("."),
                };
                let granted = grant.component.as_ref().map(|c| grant_base.join(c));
                let wasm = tokio::task::spawn_blocking({
                    let component = component.clone();
                    move || read_component(&plugin_dir, &component, granted.as_deref())
                })
                .await
                .expect("reading a component does not panic")
                .map_err(|problem| PluginError::ComponentFile {
                    manifest: path.clone(),
                    path: component.clone(),
                    problem,
                })?;
                let expected = manifest.sha256.clone();
                // The bundle's signature, before anything is compiled.
                let found = trust::Statement::of(
                    &manifest.name,
                    &manifest.version,
                    &manifest_bytes,
                    &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm)),
                );
                let bundle = self.trust.verify(&manifest.name, path, &found)?;
                (manifest, Cow::Owned(wasm), expected, bundle)
            }
            PluginSource::Builtin(name) => {
                let builtin = builtin::find(name).ok_or_else(|| PluginError::UnknownBuiltin {
                    name: name.clone(),
                    available: builtin::names().join(", "),
                })?;
                let manifest = builtin.manifest()?;
                if grant.component.is_some() {
                    return Err(GrantError::Invalid {
                        plugin: manifest.name,
                        key: "component".into(),
                        message: "a built-in plugin's component is inside the binary; only a plugin.toml's component file can be granted".into(),
                    }
                    .into());
                }
                let statement = trust::Statement::of(
                    &manifest.name,
                    &manifest.version,
                    builtin.manifest_text.as_bytes(),
                    builtin.sha256,
                );
                (
                    manifest,
                    Cow::Borrowed(builtin.wasm),
                    Some(builtin.sha256.to_owned()),
                    TrustPolicy::builtin(&statement),
                )
            }
        };
        if let Some(pin) = pin {
            pin.check(&manifest.name, &bundle)?;
        }
        tracing::info!(
            plugin = %manifest.name,
            source = %source,
            bundle = %bundle.digest,
            signer = %bundle.signer,
            publisher = bundle.publisher.as_deref().unwrap_or(""),
            "plugin bundle verified"
        );
        self.load_verified(
            source.clone(),
            manifest,
            wasm,
            expected.as_deref(),
            grant,
            grant_base,
            env,
            Some(bundle),
        )
        .await
    }

    /// Loads `wasm` as the component of `manifest` (both already read, as
    /// the testkit has them), pinned to `expected` when given. No signature
    /// is checked (the caller holds the parts, and vouches for them), and
    /// the receipts name no bundle.
    #[allow(clippy::too_many_arguments)]
    pub async fn load_parts(
        &self,
        source: PluginSource,
        manifest: Manifest,
        wasm: Cow<'static, [u8]>,
        expected: Option<&str>,
        grant: &Grant,
        grant_base: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<LoadedPlugin, PluginError> {
        self.load_verified(
            source, manifest, wasm, expected, grant, grant_base, env, None,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn load_verified(
        &self,
        source: PluginSource,
        manifest: Manifest,
        wasm: Cow<'static, [u8]>,
        expected: Option<&str>,
        grant: &Grant,
        grant_base: &Path,
        env: impl Fn(&str) -> Option<String>,
        bundle: Option<Provenance>,
    ) -> Result<LoadedPlugin, PluginError> {
        let effective = grant::effective(&manifest, grant, grant_base, env)?;
        let component = self.component(&manifest.name, wasm, expected).await?;
        if let Some(&missing) = manifest
            .kinds
            .iter()
            .find(|k| !component.kinds().contains(k))
        {
            let exported = component
                .kinds()
                .iter()
                .map(PluginKind::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(PluginError::KindMismatch {
                plugin: manifest.name.clone(),
                declared: missing,
                exported: if exported.is_empty() {
                    "no plugin world".into()
                } else {
                    exported
                },
            });
        }
        if grant.widened
            && !manifest
                .kinds
                .iter()
                .any(|k| matches!(k, PluginKind::Context | PluginKind::Policy))
        {
            return Err(GrantError::Invalid {
                plugin: manifest.name.clone(),
                key: "widened".into(),
                message:
                    "only a context source or a policy can be widened (a tool's preflight never is)"
                        .into(),
            }
            .into());
        }
        warn_of_secret_with_egress(&manifest.name, &effective.capabilities);
        let granted = self.sandbox.grant(
            &component,
            effective.capabilities.clone(),
            effective.limits.clone(),
        );
        let granted = if grant.widened {
            granted.widened()
        } else {
            granted
        };
        let granted = match bundle {
            Some(bundle) => granted.with_bundle(bundle),
            None => granted,
        };
        let tools = if manifest.kinds.contains(&PluginKind::Tool) {
            let specs = self.tool_specs(&component, &granted).await?;
            tool::descriptors(
                &manifest.name,
                &specs,
                &grant.tools,
                &effective.capabilities,
                &ungranted_effects(&manifest, &effective.capabilities),
            )
            .map_err(|e| PluginError::InvalidToolSpec {
                plugin: manifest.name.clone(),
                tool: e.tool,
                message: e.message,
            })?
        } else {
            Vec::new()
        };
        let source_spec = if manifest.kinds.contains(&PluginKind::Context) {
            Some(self.spec(&component, &granted, PluginKind::Context).await?)
        } else {
            None
        };
        let channel_spec = if manifest.kinds.contains(&PluginKind::Channel) {
            Some(self.spec(&component, &granted, PluginKind::Channel).await?)
        } else {
            None
        };
        let policy_spec = if manifest.kinds.contains(&PluginKind::Policy) {
            Some(self.spec(&component, &granted, PluginKind::Policy).await?)
        } else {
            None
        };
        Ok(LoadedPlugin {
            inner: Arc::new(LoadedInner {
                source,
                manifest,
                granted,
                tools,
                source_spec,
                channel_spec,
                policy_spec,
                not_granted: effective.not_granted,
            }),
        })
    }

    /// What a context source's, channel's or policy's `describe` says,
    /// asked once per component hash with no capabilities.
    async fn spec(
        &self,
        component: &PluginComponent,
        granted: &GrantedComponent,
        kind: PluginKind,
    ) -> Result<wit::SourceSpec, PluginError> {
        let key = (component.sha256().to_owned(), kind);
        if let Some(spec) = self.lock().specs.get(&key) {
            return Ok(spec.clone());
        }
        let bare = self
            .sandbox
            .grant(component, Capabilities::none(), granted.limits().clone());
        let leased = match kind {
            PluginKind::Channel => bare.describe_channel().await,
            PluginKind::Policy => bare.describe_policy().await,
            PluginKind::Context | PluginKind::Tool => bare.describe_source().await,
        };
        let spec = leased.result.map_err(|error| PluginError::Describe {
            plugin: component.name().to_owned(),
            error,
        })?;
        self.lock().specs.insert(key, spec.clone());
        Ok(spec)
    }

    async fn component(
        &self,
        name: &str,
        wasm: Cow<'static, [u8]>,
        expected: Option<&str>,
    ) -> Result<PluginComponent, PluginError> {
        use sha2::Digest;
        let sha256 = hex::encode(sha2::Sha256::digest(&wasm));
        if let Some(found) = self.lock().components.get(&sha256) {
            if let Some(expected) = expected
                && !expected.eq_ignore_ascii_case(&sha256)
            {
                return Err(SandboxError::IntegrityMismatch {
                    plugin: name.to_owned(),
                    expected: expected.to_owned(),
                    actual: sha256,
                }
                .into());
            }
            return Ok(found.clone());
        }
        let sandbox = self.sandbox.clone();
        let name_owned = name.to_owned();
        let expected = expected.map(str::to_owned);
        let component = tokio::task::spawn_blocking(move || {
            sandbox.load(&name_owned, &wasm, expected.as_deref())
        })
        .await
        .expect("component loading does not panic")?;
        self.lock().components.insert(sha256, component.clone());
        Ok(component)
    }

    async fn tool_specs(
        &self,
        component: &PluginComponent,
        granted: &GrantedComponent,
    ) -> Result<Arc<Vec<wit::ToolSpec>>, PluginError> {
        if let Some(specs) = self.lock().tool_specs.get(component.sha256()) {
            return Ok(Arc::clone(specs));
        }
        // Describe runs with no capabilities at all, so its answer depends
        // on the component alone and can be shared by hash.
        let bare = self
            .sandbox
            .grant(component, Capabilities::none(), granted.limits().clone());
        let specs = bare
            .describe_tools()
            .await
            .result
            .map_err(|error| PluginError::Describe {
                plugin: component.name().to_owned(),
                error,
            })?;
        let specs = Arc::new(specs);
        self.lock()
            .tool_specs
            .insert(component.sha256().to_owned(), Arc::clone(&specs));
        Ok(specs)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What `manifest` requested that would let the plugin cause effects (a
/// read-write mount, an outbound host) and `capabilities` do not give it,
/// as `read-write mount \`notes\``, `host \`api.example.com\``: what a
/// withheld tool's reason tells the operator to grant.
fn ungranted_effects(manifest: &Manifest, capabilities: &Capabilities) -> Vec<String> {
    let mounts = manifest
        .mounts
        .iter()
        .filter(|(name, m)| {
            m.access == warden_sandbox::Access::ReadWrite
                && !capabilities
                    .mounts()
                    .iter()
                    .any(|g| &g.name == *name && g.access == warden_sandbox::Access::ReadWrite)
        })
        .map(|(name, _)| format!("read-write mount `{name}`"));
    let hosts = manifest
        .hosts
        .iter()
        .filter(|h| !capabilities.hosts().contains(h))
        .map(|h| format!("host `{h}`"));
    mounts.chain(hosts).collect()
}

/// Warns when a plugin holds a granted secret and a way to send it out (an
/// outbound host, a read-write mount): redaction catches a secret only in
/// the forms the host itself decodes, and a plugin that encodes it first
/// (base64, reversed, split) gets it past any redactor. The real defence is
/// not to grant both; this makes the combination visible.
fn warn_of_secret_with_egress(plugin: &str, capabilities: &Capabilities) {
    // What the guest can read: its environment and the secrets granted
    // with `reveal`. A secret used by handle never enters the guest.
    let mut secrets: Vec<&str> = capabilities
        .env_vars()
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    secrets.extend(
        capabilities
            .secrets()
            .iter()
            .filter(|s| s.is_revealed())
            .map(|s| s.name()),
    );
    if secrets.is_empty() {
        return;
    }
    let mut egress: Vec<String> = capabilities
        .hosts()
        .iter()
        .map(|h| format!("host `{h}`"))
        .collect();
    egress.extend(
        capabilities
            .mounts()
            .iter()
            .filter(|m| m.access == warden_sandbox::Access::ReadWrite)
            .map(|m| format!("read-write mount `{}`", m.name)),
    );
    if egress.is_empty() {
        return;
    }
    tracing::warn!(
        plugin,
        secrets = %secrets.join(", "),
        egress = %egress.join(", "),
        "plugin `{plugin}` can read a secret and has a way out: redaction cannot catch a secret the plugin encodes itself; grant the secret by handle (`[secrets.<name>]` without `reveal`) or take the way out away"
    );
}

/// A plugin loaded under its grant. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LoadedPlugin {
    inner: Arc<LoadedInner>,
}

#[derive(Clone, Debug)]
struct LoadedInner {
    source: PluginSource,
    manifest: Manifest,
    granted: GrantedComponent,
    tools: Vec<ToolDescriptor>,
    source_spec: Option<wit::SourceSpec>,
    channel_spec: Option<wit::SourceSpec>,
    policy_spec: Option<wit::SourceSpec>,
    not_granted: Vec<String>,
}

impl LoadedPlugin {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.inner.manifest.name
    }

    /// Where it was loaded from.
    pub fn source(&self) -> &PluginSource {
        &self.inner.source
    }

    /// Its manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// The component with its effective capabilities and limits.
    pub fn granted(&self) -> &GrantedComponent {
        &self.inner.granted
    }

    /// The verified bundle it runs (digest and signer), which every
    /// receipt of its leases names; `None` when loaded from parts.
    pub fn bundle(&self) -> Option<&Provenance> {
        self.inner.granted.bundle()
    }

    /// The same plugin, each of whose leases also fits in what is left of a
    /// run's budgets (see [`GrantedComponent::bounded`]).
    pub fn bounded(&self, bound: &RunBound) -> LoadedPlugin {
        let mut inner = (*self.inner).clone();
        inner.granted = inner.granted.bounded(bound);
        LoadedPlugin {
            inner: Arc::new(inner),
        }
    }

    /// The same plugin, whose leases make no further effect once `valid`
    /// has passed (see [`GrantedComponent::valid_until`]).
    pub fn valid_until(&self, valid: ValidUntil) -> LoadedPlugin {
        let mut inner = (*self.inner).clone();
        inner.granted = inner.granted.valid_until(valid);
        LoadedPlugin {
            inner: Arc::new(inner),
        }
    }

    /// The tools it offers (empty unless it is a tool plugin).
    pub fn tools(&self) -> &[ToolDescriptor] {
        &self.inner.tools
    }

    /// One tool by name.
    pub fn tool(&self, name: &str) -> Option<&ToolDescriptor> {
        self.inner.tools.iter().find(|t| t.name == name)
    }

    /// What it requested and was not granted, one line each.
    pub fn not_granted(&self) -> &[String] {
        &self.inner.not_granted
    }

    /// The kinds it is, as its manifest declares and its component exports.
    pub fn kinds(&self) -> &[PluginKind] {
        &self.inner.manifest.kinds
    }

    /// What its context source's `describe` said (`None` unless it is a
    /// context source).
    pub fn source_spec(&self) -> Option<&wit::SourceSpec> {
        self.inner.source_spec.as_ref()
    }

    /// What its channel's `describe` said (`None` unless it is a channel).
    pub fn channel_spec(&self) -> Option<&wit::SourceSpec> {
        self.inner.channel_spec.as_ref()
    }

    /// What its policy's `describe` said (`None` unless it is a policy).
    pub fn policy_spec(&self) -> Option<&wit::SourceSpec> {
        self.inner.policy_spec.as_ref()
    }

    fn check_kind(&self, needed: PluginKind) -> Result<(), PluginError> {
        if !self.kinds().contains(&needed) {
            return Err(PluginError::WrongKind {
                plugin: self.name().to_owned(),
                needed,
            });
        }
        Ok(())
    }

    fn check_tool(&self, tool: &str) -> Result<(), PluginError> {
        self.check_kind(PluginKind::Tool)?;
        if self.tool(tool).is_none() {
            return Err(PluginError::UnknownTool {
                plugin: self.name().to_owned(),
                tool: tool.to_owned(),
                offered: self
                    .inner
                    .tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(())
    }

    /// Invokes a tool in a fresh lease.
    pub async fn invoke(
        &self,
        call: &wit::Call,
        cancel: Option<&CancellationToken>,
    ) -> Result<Leased<Result<wit::ToolOutput, wit::ToolError>>, PluginError> {
        self.check_tool(&call.tool)?;
        Ok(self.inner.granted.invoke(call, cancel).await)
    }

    /// Asks a tool for a side-effect-free preview of a call.
    pub async fn preflight(
        &self,
        call: &wit::Call,
        cancel: Option<&CancellationToken>,
    ) -> Result<Leased<Result<wit::Preview, wit::ToolError>>, PluginError> {
        self.check_tool(&call.tool)?;
        Ok(self.inner.granted.preflight(call, cancel).await)
    }

    /// Resolves a context request in a fresh lease.
    pub async fn resolve(
        &self,
        request: &wit::ContextRequest,
        cancel: Option<&CancellationToken>,
    ) -> Result<Leased<Result<Vec<wit::ContextItem>, wit::ContextError>>, PluginError> {
        self.check_kind(PluginKind::Context)?;
        Ok(self.inner.granted.resolve(request, cancel).await)
    }

    /// Delivers one message through the channel in a fresh lease.
    pub async fn deliver(
        &self,
        delivery: &wit::Delivery,
        cancel: Option<&CancellationToken>,
    ) -> Result<Leased<Result<(), wit::DeliveryError>>, PluginError> {
        self.check_kind(PluginKind::Channel)?;
        Ok(self.inner.granted.deliver(delivery, cancel).await)
    }

    /// Asks the policy for its decision in a fresh lease.
    pub async fn decide(
        &self,
        request: &wit::PolicyRequest,
        cancel: Option<&CancellationToken>,
    ) -> Result<Leased<Result<wit::Decision, wit::PolicyError>>, PluginError> {
        self.check_kind(PluginKind::Policy)?;
        Ok(self.inner.granted.decide(request, cancel).await)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The second line of defence: should a path that resolved inside the
    /// plugin's directory become a way out before it is opened (a
    /// directory swapped for a symlink), the open beneath the directory
    /// still refuses it.
    #[test]
    fn a_symlink_swapped_in_after_the_check_does_not_lead_out() {
        let root = tempfile::tempdir().unwrap();
        let (plugin, outside) = (root.path().join("plugin"), root.path().join("outside"));
        std::fs::create_dir_all(plugin.join("lib")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(plugin.join("lib/c.wasm"), b"inside").unwrap();
        std::fs::write(outside.join("c.wasm"), b"outside").unwrap();
        let dir = std::fs::canonicalize(&plugin).unwrap();
        let mut inside = open_beneath(&dir, Path::new("lib/c.wasm")).unwrap();
        let mut read = String::new();
        std::io::Read::read_to_string(&mut inside, &mut read).unwrap();
        assert_eq!(read, "inside");
        // The swap, between the containment check and the open.
        std::fs::remove_dir_all(plugin.join("lib")).unwrap();
        std::os::unix::fs::symlink("../outside", plugin.join("lib")).unwrap();
        match open_beneath(&dir, Path::new("lib/c.wasm")) {
            Err(ComponentFileError::Unreadable(_)) => {}
            other => panic!("the open left the directory: {other:?}"),
        }
        std::os::unix::fs::symlink(outside.join("c.wasm"), plugin.join("abs.wasm")).unwrap();
        assert!(open_beneath(&dir, Path::new("abs.wasm")).is_err());
    }
}
