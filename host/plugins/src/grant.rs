//! Grants: what the operator grants a plugin, how that meets what
//! the plugin requests, and which effect class each tool ends up with.
//!
//! Effective capability = requested ∩ granted. A grant for something the
//! plugin did not request is an error (it would widen the plugin); whatever
//! was requested and not granted is reported, never silently added. Deny by
//! default: an empty [`Grant`] gives no mount, no environment variable and no
//! network.
//!
//! A grant in TOML (in `warden.toml` under `[plugins.<name>]`, in an agent
//! file, or a grant file of its own):
//!
//! ```toml
//! env = ["API_TOKEN"]              # values come from the host's environment
//! hosts = ["api.example.com", "127.0.0.1:8080"]  # see `HostPattern`
//! widened = false                  # context sources and policies only: resolve /
//!                                  # decide with this whole grant, not the narrowed
//!                                  # one (read-only mounts, no hosts)
//! component = "/opt/wasm/x.wasm"   # optional: the one component file this plugin
//!                                  # may load from outside its directory
//!
//! [mounts.workspace]
//! dir = "./project"                # relative to the file the grant is in
//! access = "read-only"             # optional; may only narrow
//! exclude = [".env", "*.pem", "secrets/**"]  # optional; never opened or listed
//!
//! [limits]                         # optional; overrides the manifest's
//! timeout = "5s"
//!
//! [config]                         # read by the plugin's `config` import
//! greeting = "hello"
//!
//! [secrets.api_token]              # used by handle; see `crate::secrets`
//! env = "API_TOKEN"                # or file = "…", or store = "…"
//! hosts = ["api.example.com"]      # the only hosts it is attached for
//! reveal = false                   # true lets the plugin read it
//!
//! [tools.write_file]               # optional per-tool overrides
//! effect = "write"                 # read | idempotent | write; wins
//! description = "Write one file"
//! input_schema = '{"type": "object"}'
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::manifest::{LimitSettings, Manifest};
pub use crate::secrets::SecretGrant;
pub use warden_sandbox::HostPattern;
use warden_sandbox::{Access, Capabilities, Limits, MountError, Secret, wit};

/// What the operator grants one plugin. By default, nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Directories bound to the plugin's requested mounts, by mount name.
    /// Default: none.
    #[serde(default)]
    pub mounts: BTreeMap<String, MountGrant>,
    /// Environment variables passed through from the host. Default: none.
    #[serde(default)]
    pub env: Vec<String>,
    /// Outbound hosts allowed. Default: none.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Secrets the plugin uses by handle (or reads, with `reveal`), by
    /// name. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, SecretGrant>,
    /// Limit overrides. Default: the manifest's limits.
    #[serde(default)]
    pub limits: LimitSettings,
    /// Values for the plugin's `config` import. Default: none.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Per-tool overrides of effect class, description and schema.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
    /// For a context source or a policy: run `resolve` and `decide` with
    /// this whole grant instead of the narrowed one (mounts read-only, no
    /// outbound host) every call ahead of an approved effect gets by
    /// default. Preflight and describe are never widened. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub widened: bool,
    /// The component file the plugin's manifest may name, relative to the
    /// file the grant is in. Without it, a manifest's component must be
    /// inside the plugin's directory (after symlinks); with it, this file is
    /// the only one allowed, wherever it is. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<PathBuf>,
}

/// A directory bound to a requested mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountGrant {
    /// The host directory; relative paths are resolved against the directory
    /// of the file the grant was read from.
    pub dir: PathBuf,
    /// Narrows the requested access (`read-only` where `read-write` was
    /// asked). Default: the requested access.
    pub access: Option<Access>,
    /// Paths under `dir` taken out of the grant (`[".env", "*.pem",
    /// "secrets/**"]`, see [`Exclusions`](warden_sandbox::Exclusions)): the
    /// host refuses to open, change or list them for every tool. Default:
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

/// The operator's word on one tool. Set fields win over the plugin's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// The tool's effect class.
    pub effect: Option<EffectClass>,
    /// The description shown to the model.
    pub description: Option<String>,
    /// The JSON Schema of the arguments, as JSON text.
    pub input_schema: Option<String>,
    /// The argument whose value is the call's idempotency key across runs
    /// (for example `claim_id`): a call without it is refused, and every run
    /// making the call with the same value shares one commitment, so the
    /// tool runs once. Default: none (each call's key is its own).
    pub idempotency_key: Option<String>,
}

/// How repeatable a tool's effect is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// Safe to run again.
    Read,
    /// Safe to run again with the same idempotency key.
    Idempotent,
    /// Must never run twice.
    Write,
}

impl std::fmt::Display for EffectClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EffectClass::Read => "read",
            EffectClass::Idempotent => "idempotent",
            EffectClass::Write => "write",
        })
    }
}

impl From<wit::Effect> for EffectClass {
    fn from(e: wit::Effect) -> Self {
        match e {
            wit::Effect::Read => EffectClass::Read,
            wit::Effect::Idempotent => EffectClass::Idempotent,
            wit::Effect::Write => EffectClass::Write,
        }
    }
}

/// The effect class a tool runs with: the operator's setting if any;
/// otherwise `write` for a plugin that can cause effects (a read-write mount
/// or any outbound host), whatever it claims; otherwise the plugin's claim.
/// A plugin cannot talk its way out of approvals.
pub fn effective_effect(
    claimed: EffectClass,
    operator: Option<EffectClass>,
    capabilities: &Capabilities,
) -> EffectClass {
    match operator {
        Some(effect) => effect,
        None if capabilities.can_cause_effects() => EffectClass::Write,
        None => claimed,
    }
}

/// A grant that cannot be applied to a plugin.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The grant binds a mount the plugin does not request.
    #[error(
        "plugin `{plugin}`: grant for mount `{mount}`, which the plugin does not request (it requests: {requested})"
    )]
    UnrequestedMount {
        /// The plugin.
        plugin: String,
        /// The mount named by the grant.
        mount: String,
        /// The mounts the plugin requests.
        requested: String,
    },
    /// The grant passes an environment variable the plugin does not request.
    #[error(
        "plugin `{plugin}`: grant for environment variable `{var}`, which the plugin does not request"
    )]
    UnrequestedEnv {
        /// The plugin.
        plugin: String,
        /// The variable.
        var: String,
    },
    /// The grant allows a host no requested host pattern covers.
    #[error("plugin `{plugin}`: grant for host `{host}`, which the plugin does not request")]
    UnrequestedHost {
        /// The plugin.
        plugin: String,
        /// The host.
        host: String,
    },
    /// The grant names a secret the plugin does not request.
    #[error(
        "plugin `{plugin}`: grant for secret `{secret}`, which the plugin does not request (its manifest's `secrets`)"
    )]
    UnrequestedSecret {
        /// The plugin.
        plugin: String,
        /// The secret.
        secret: String,
    },
    /// A granted secret's value cannot be read from its source.
    #[error("plugin `{plugin}`: secret `{secret}`: {reason}")]
    SecretUnavailable {
        /// The plugin.
        plugin: String,
        /// The secret.
        secret: String,
        /// What is wrong, never the value.
        reason: String,
    },
    /// A granted environment variable is not set on the host.
    #[error("plugin `{plugin}`: granted environment variable `{var}` is not set on the host")]
    EnvMissing {
        /// The plugin.
        plugin: String,
        /// The variable.
        var: String,
    },
    /// A granted directory cannot be mounted.
    #[error("plugin `{plugin}`: {error}")]
    Mount {
        /// The plugin.
        plugin: String,
        /// What is wrong with the directory.
        error: MountError,
    },
    /// A value in the grant is invalid.
    #[error("plugin `{plugin}`: grant key `{key}`: {message}")]
    Invalid {
        /// The plugin.
        plugin: String,
        /// The key, dotted.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// What a plugin runs with once its grant is applied.
#[derive(Clone, Debug)]
pub struct Effective {
    /// Requested ∩ granted.
    pub capabilities: Capabilities,
    /// The manifest's limits with the grant's overrides.
    pub limits: Limits,
    /// Everything requested and not granted, one line each.
    pub not_granted: Vec<String>,
}

/// Applies `grant` to what `manifest` requests. `base_dir` resolves relative
/// mount directories; `env` looks up host environment variables.
pub fn effective(
    manifest: &Manifest,
    grant: &Grant,
    base_dir: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Effective, GrantError> {
    let plugin = &manifest.name;
    let mut capabilities = Capabilities::none();
    let mut not_granted = Vec::new();

    for (mount, bound) in &grant.mounts {
        let Some(request) = manifest.mounts.get(mount) else {
            let requested = if manifest.mounts.is_empty() {
                "none".to_owned()
            } else {
                manifest
                    .mounts
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(GrantError::UnrequestedMount {
                plugin: plugin.clone(),
                mount: mount.clone(),
                requested,
            });
        };
        let access = request
            .access
            .narrowest(bound.access.unwrap_or(request.access));
        if access != request.access {
            not_granted.push(format!(
                "mount `{mount}`: {} requested, {access} granted",
                request.access
            ));
        }
        capabilities = capabilities
            .mount_at(mount, base_dir, &bound.dir, access)
            .and_then(|c| c.exclude(mount, &bound.exclude))
            .map_err(|error| GrantError::Mount {
                plugin: plugin.clone(),
                error,
            })?;
    }
    for mount in manifest.mounts.keys() {
        if !grant.mounts.contains_key(mount) {
            not_granted.push(format!("mount `{mount}`"));
        }
    }

    for var in &grant.env {
        if !manifest.env.contains(var) {
            return Err(GrantError::UnrequestedEnv {
                plugin: plugin.clone(),
                var: var.clone(),
            });
        }
        let value = env(var).ok_or_else(|| GrantError::EnvMissing {
            plugin: plugin.clone(),
            var: var.clone(),
        })?;
        capabilities = capabilities.env(var, value);
    }
    for var in &manifest.env {
        if !grant.env.contains(var) {
            not_granted.push(format!("environment variable `{var}`"));
        }
    }

    let requested_hosts: Vec<HostPattern> = manifest
        .hosts
        .iter()
        .filter_map(|h| HostPattern::parse(h).ok())
        .collect();
    for (i, host) in grant.hosts.iter().enumerate() {
        let pattern = HostPattern::parse(host).map_err(|message| GrantError::Invalid {
            plugin: plugin.clone(),
            key: format!("hosts[{i}]"),
            message,
        })?;
        if !requested_hosts.iter().any(|r| r.covers(&pattern)) {
            return Err(GrantError::UnrequestedHost {
                plugin: plugin.clone(),
                host: host.clone(),
            });
        }
        capabilities = capabilities.host(host);
    }
    for host in &manifest.hosts {
        let granted = HostPattern::parse(host)
            .map(|r| {
                grant
                    .hosts
                    .iter()
                    .filter_map(|g| HostPattern::parse(g).ok())
                    .any(|g| r.covers(&g))
            })
            .unwrap_or(false);
        if !granted {
            not_granted.push(format!("host `{host}`"));
        }
    }

    capabilities = grant_secrets(
        manifest,
        grant,
        base_dir,
        &env,
        capabilities,
        &mut not_granted,
    )?;

    for (key, value) in &grant.config {
        capabilities = capabilities.config(key, value);
    }
    grant
        .limits
        .validate("limits")
        .map_err(|(key, message)| GrantError::Invalid {
            plugin: plugin.clone(),
            key,
            message,
        })?;
    for (tool, o) in &grant.tools {
        if let Some(field) = &o.idempotency_key
            && (field.is_empty()
                || !field
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            return Err(GrantError::Invalid {
                plugin: plugin.clone(),
                key: format!("tools.{tool}.idempotency_key"),
                message: format!("`{field}` is not an argument name"),
            });
        }
        if let Some(schema) = &o.input_schema {
            match serde_json::from_str::<serde_json::Value>(schema) {
                Ok(serde_json::Value::Object(_)) => {}
                _ => {
                    return Err(GrantError::Invalid {
                        plugin: plugin.clone(),
                        key: format!("tools.{tool}.input_schema"),
                        message: "must be a JSON object (JSON Schema) as text".into(),
                    });
                }
            }
        }
    }
    for line in &not_granted {
        tracing::info!(plugin = %plugin, "requested but not granted: {line}");
    }
    Ok(Effective {
        capabilities,
        limits: grant.limits.apply_to(&manifest.limits),
        not_granted,
    })
}

/// Adds the grant's secrets: each requested by the manifest (by name, or
/// `"*"` for any), its hosts among the grant's, its value read from its
/// source and its version digest made with the secrets key, if one is set.
fn grant_secrets(
    manifest: &Manifest,
    grant: &Grant,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    mut capabilities: Capabilities,
    not_granted: &mut Vec<String>,
) -> Result<Capabilities, GrantError> {
    let plugin = &manifest.name;
    if grant.secrets.is_empty() {
        for name in manifest.secrets.iter().filter(|n| *n != "*") {
            not_granted.push(format!("secret `{name}`"));
        }
        return Ok(capabilities);
    }
    let invalid = |key: String, message: String| GrantError::Invalid {
        plugin: plugin.clone(),
        key,
        message,
    };
    let key = crate::secrets::key_text(env).map_err(|m| invalid("secrets".into(), m))?;
    let granted_hosts: Vec<HostPattern> = grant
        .hosts
        .iter()
        .filter_map(|h| HostPattern::parse(h).ok())
        .collect();
    for (name, spec) in &grant.secrets {
        if !crate::secrets::is_valid_secret_name(name) {
            return Err(invalid(
                format!("secrets.{name}"),
                "is not a valid secret name (use [A-Za-z][A-Za-z0-9_-]*, at most 64 bytes)".into(),
            ));
        }
        if !manifest.secrets.iter().any(|s| s == name || s == "*") {
            return Err(GrantError::UnrequestedSecret {
                plugin: plugin.clone(),
                secret: name.clone(),
            });
        }
        for (i, host) in spec.hosts.iter().enumerate() {
            let pattern = HostPattern::parse(host)
                .map_err(|m| invalid(format!("secrets.{name}.hosts[{i}]"), m))?;
            if !granted_hosts.iter().any(|g| g.covers(&pattern)) {
                return Err(invalid(
                    format!("secrets.{name}.hosts[{i}]"),
                    format!(
                        "`{host}` is not among the grant's `hosts`; a secret goes only where the plugin may"
                    ),
                ));
            }
        }
        let value = crate::secrets::read_value(spec, base_dir, env).map_err(|reason| {
            GrantError::SecretUnavailable {
                plugin: plugin.clone(),
                secret: name.clone(),
                reason,
            }
        })?;
        let mut secret =
            Secret::new(name.as_str(), value.as_str(), spec.hosts.clone()).revealed(spec.reveal);
        if let Some(key) = &key {
            secret = secret.version(crate::secrets::version_digest(key, name, &value));
        }
        capabilities = capabilities.secret(secret);
    }
    for name in manifest.secrets.iter().filter(|n| *n != "*") {
        if !grant.secrets.contains_key(name) {
            not_granted.push(format!("secret `{name}`"));
        }
    }
    Ok(capabilities)
}

/// Checks the syntax of a host pattern, for manifest validation.
pub fn validate_host_pattern(text: &str) -> Result<(), String> {
    HostPattern::parse(text).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;

    fn manifest(extra: &str) -> Manifest {
        let text = format!("name = \"p\"\nversion = \"1\"\nkind = \"tool\"\n{extra}");
        Manifest::parse(&text, Path::new("plugin.toml"), Path::new(".")).unwrap()
    }

    fn grant(text: &str) -> Grant {
        toml::from_str(text).unwrap()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_empty_grant_gives_nothing_and_reports_everything_requested() {
        let m = manifest(
            "env = [\"TOKEN\"]\nhosts = [\"api.example.com\"]\n[mounts.work]\naccess = \"read-write\"\n",
        );
        let e = effective(&m, &Grant::default(), Path::new("."), no_env).unwrap();
        assert_eq!(e.capabilities, Capabilities::none());
        assert_eq!(
            e.not_granted,
            vec![
                "mount `work`".to_owned(),
                "environment variable `TOKEN`".to_owned(),
                "host `api.example.com`".to_owned(),
            ]
        );
    }

    #[test]
    fn grants_narrow_but_never_widen() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest("[mounts.work]\naccess = \"read-only\"\n");
        // Asking for read-write where read-only was requested stays read-only.
        let g = grant(&format!(
            "[mounts.work]\ndir = {:?}\naccess = \"read-write\"\n",
            dir.path()
        ));
        let e = effective(&m, &g, Path::new("."), no_env).unwrap();
        assert_eq!(e.capabilities.mounts()[0].access, Access::ReadOnly);

        let m = manifest("[mounts.work]\naccess = \"read-write\"\n");
        let g = grant(&format!(
            "[mounts.work]\ndir = {:?}\naccess = \"read-only\"\n",
            dir.path()
        ));
        let e = effective(&m, &g, Path::new("."), no_env).unwrap();
        assert_eq!(e.capabilities.mounts()[0].access, Access::ReadOnly);
        assert_eq!(
            e.not_granted,
            vec!["mount `work`: read-write requested, read-only granted".to_owned()]
        );
    }

    #[test]
    fn a_grant_for_anything_unrequested_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest("env = [\"A\"]\nhosts = [\"*.example.com\"]\n");
        let err = effective(
            &m,
            &grant(&format!("[mounts.other]\ndir = {:?}\n", dir.path())),
            Path::new("."),
            no_env,
        )
        .unwrap_err();
        assert!(
            matches!(err, GrantError::UnrequestedMount { ref mount, .. } if mount == "other"),
            "{err}"
        );
        let err = effective(&m, &grant("env = [\"B\"]\n"), Path::new("."), no_env).unwrap_err();
        assert!(
            matches!(err, GrantError::UnrequestedEnv { ref var, .. } if var == "B"),
            "{err}"
        );
        let err = effective(
            &m,
            &grant("hosts = [\"evil.com\"]\n"),
            Path::new("."),
            no_env,
        )
        .unwrap_err();
        assert!(
            matches!(err, GrantError::UnrequestedHost { ref host, .. } if host == "evil.com"),
            "{err}"
        );
        // A subdomain the wildcard covers is fine.
        let e = effective(
            &m,
            &grant("hosts = [\"api.example.com\"]\n"),
            Path::new("."),
            no_env,
        )
        .unwrap();
        assert_eq!(e.capabilities.hosts(), ["api.example.com"]);
    }

    #[test]
    fn env_values_come_from_the_host_and_must_exist() {
        let m = manifest("env = [\"TOKEN\"]\n");
        let g = grant("env = [\"TOKEN\"]\n");
        let err = effective(&m, &g, Path::new("."), no_env).unwrap_err();
        assert!(matches!(err, GrantError::EnvMissing { .. }), "{err}");
        let e = effective(&m, &g, Path::new("."), |k| {
            (k == "TOKEN").then(|| "abc123".into())
        })
        .unwrap();
        assert_eq!(
            e.capabilities.env_vars(),
            [("TOKEN".to_owned(), "abc123".to_owned())]
        );
    }

    #[test]
    fn relative_mount_dirs_resolve_against_the_grant_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let m = manifest("[mounts.work]\naccess = \"read-only\"\n");
        let e = effective(
            &m,
            &grant("[mounts.work]\ndir = \"data\"\n"),
            dir.path(),
            no_env,
        )
        .unwrap();
        assert_eq!(
            e.capabilities.mounts()[0].host_dir,
            dir.path().join("data").canonicalize().unwrap()
        );
    }

    #[test]
    fn a_mount_grant_excludes_paths_and_refuses_a_bad_pattern() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest("[mounts.work]\naccess = \"read-only\"\n");
        let e = effective(
            &m,
            &grant(&format!(
                "[mounts.work]\ndir = {:?}\nexclude = [\".env\", \"secrets/**\"]\n",
                dir.path()
            )),
            dir.path(),
            no_env,
        )
        .unwrap();
        let mount = &e.capabilities.mounts()[0];
        assert!(mount.exclude.excludes("app/.env"));
        assert!(mount.exclude.excludes("secrets/key"));
        assert!(!mount.exclude.excludes("src/main.rs"));
        // The narrowed grant keeps them.
        assert_eq!(e.capabilities.narrowed().mounts()[0].exclude, mount.exclude);
        let err = effective(
            &m,
            &grant(&format!(
                "[mounts.work]\ndir = {:?}\nexclude = [\"a/../b\"]\n",
                dir.path()
            )),
            dir.path(),
            no_env,
        )
        .unwrap_err();
        assert!(
            matches!(&err, GrantError::Mount { .. }) && err.to_string().contains("`a/../b`"),
            "{err}"
        );
    }

    #[test]
    fn the_operator_wins_and_effectful_plugins_default_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let none = Capabilities::none();
        let rw = Capabilities::none()
            .mount("w", dir.path(), Access::ReadWrite)
            .unwrap();
        let ro = Capabilities::none()
            .mount("w", dir.path(), Access::ReadOnly)
            .unwrap();
        let net = Capabilities::none().host("api.example.com");
        use EffectClass::*;
        assert_eq!(effective_effect(Read, None, &none), Read);
        assert_eq!(effective_effect(Read, None, &ro), Read);
        assert_eq!(effective_effect(Read, None, &rw), Write);
        assert_eq!(effective_effect(Idempotent, None, &net), Write);
        assert_eq!(effective_effect(Read, Some(Read), &rw), Read);
        assert_eq!(effective_effect(Read, Some(Write), &none), Write);
    }

    #[test]
    fn limits_in_a_grant_override_the_manifest() {
        let m = manifest("[limits]\ntimeout = \"3s\"\nmemory = \"16MiB\"\n");
        let e = effective(
            &m,
            &grant("[limits]\ntimeout = \"1s\"\n"),
            Path::new("."),
            no_env,
        )
        .unwrap();
        assert_eq!(e.limits.timeout, std::time::Duration::from_secs(1));
        assert_eq!(e.limits.memory_bytes, 16 << 20);
        let err = effective(
            &m,
            &grant("[limits]\ntimeout = \"0s\"\n"),
            Path::new("."),
            no_env,
        )
        .unwrap_err();
        assert!(matches!(err, GrantError::Invalid { ref key, .. } if key == "limits.timeout"));
    }

    #[test]
    fn any_host_must_be_requested_to_be_granted() {
        let m = manifest("hosts = [\"*\"]\n");
        let e = effective(
            &m,
            &grant("hosts = [\"127.0.0.1:8080\", \"api.example.com\"]\n"),
            Path::new("."),
            no_env,
        )
        .unwrap();
        assert_eq!(
            e.capabilities.hosts(),
            ["127.0.0.1:8080", "api.example.com"]
        );
        let m = manifest("hosts = [\"api.example.com\"]\n");
        let err = effective(&m, &grant("hosts = [\"*\"]\n"), Path::new("."), no_env).unwrap_err();
        assert!(
            matches!(err, GrantError::UnrequestedHost { ref host, .. } if host == "*"),
            "{err}"
        );
    }
}
