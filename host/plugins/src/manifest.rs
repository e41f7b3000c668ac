//! `plugin.toml`: what a plugin is and what it requests. Parsed strictly
//! (unknown keys are errors), then validated as a separate step, with errors
//! that name the file and the key.
//!
//! ```toml
//! name = "fs"                      # [a-z][a-z0-9-]*, at most 64 bytes
//! version = "0.1.0"
//! kind = "tool"                    # tool | context | channel | policy, or a list
//!                                  # such as ["tool", "context"]
//! description = "Read and edit files under one directory"
//! component = "fs.wasm"            # relative to this file; with sha256
//! sha256 = "9f86d0…"               # hex digest of the component
//! env = ["API_TOKEN"]              # environment variables it requests
//! hosts = ["api.example.com"]      # outbound hosts it requests
//! secrets = ["api_token"]          # secrets it uses by handle, or ["*"] for any
//!
//! [mounts.workspace]               # seen by the guest at /workspace
//! access = "read-write"            # read-only | read-write
//! description = "The directory the tools operate on"
//!
//! [limits]                         # defaults; the operator may override
//! fuel = 5_000_000_000             # or "unmetered"
//! memory = "64MiB"
//! tables = 20000
//! timeout = "10s"
//! output = "1MiB"
//! stdio = "64KiB"
//! http_requests = 64               # outbound requests per lease
//! http_response = "16MiB"          # response body bytes per lease
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use warden_sandbox::{Access, Limits, PluginKind, is_valid_mount_name};
use warden_syntax::units::{ByteSize, HumanDuration};

/// A parsed and validated `plugin.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Manifest {
    /// The plugin's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The first (or only) world it exports; checked against the component
    /// at load.
    pub kind: PluginKind,
    /// Every world it exports, `kind` first: a plugin may be, say, a tool
    /// and a context source at once (`kind = ["tool", "context"]`).
    pub kinds: Vec<PluginKind>,
    /// What it is, for operators.
    pub description: String,
    /// The component file, resolved against the manifest's directory.
    /// `None` for plugins built into the `warden` binary.
    pub component: Option<PathBuf>,
    /// The pinned sha256 of the component, lowercase hex.
    pub sha256: Option<String>,
    /// Requested mounts, by name.
    pub mounts: BTreeMap<String, MountRequest>,
    /// Requested environment variables.
    pub env: Vec<String>,
    /// Requested outbound hosts.
    pub hosts: Vec<String>,
    /// Requested secrets, by name; `"*"` for any the operator grants.
    pub secrets: Vec<String>,
    /// Default limits.
    pub limits: Limits,
}

/// A mount the plugin asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountRequest {
    /// `read-only` or `read-write`.
    pub access: Access,
    /// What the plugin uses it for.
    #[serde(default)]
    pub description: String,
}

/// A manifest that cannot be read, parsed or accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file cannot be read.
    #[error("cannot read plugin manifest `{path}`: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown or mistyped keys.
    #[error("plugin manifest `{path}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said, with line and key.
        message: String,
    },
    /// A key has a value the manifest does not accept.
    #[error("plugin manifest `{path}`: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, dotted.
        key: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: String,
    version: String,
    kind: KindSetting,
    #[serde(default)]
    description: String,
    component: Option<PathBuf>,
    sha256: Option<String>,
    #[serde(default)]
    mounts: BTreeMap<String, MountRequest>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    limits: LimitSettings,
}

/// `kind = "tool"` or `kind = ["tool", "context"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum KindSetting {
    One(PluginKind),
    Many(Vec<PluginKind>),
}

/// Limits as written in a manifest or a grant: every field optional, unset
/// fields keep the value beneath them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Fuel per lease: an integer, or `"unmetered"` for none.
    pub fuel: Option<FuelSetting>,
    /// Linear memory, for example `"64MiB"`.
    pub memory: Option<ByteSize>,
    /// Table elements.
    pub tables: Option<u64>,
    /// Wall-clock deadline, for example `"10s"`.
    pub timeout: Option<HumanDuration>,
    /// Output bytes, for example `"1MiB"`.
    pub output: Option<ByteSize>,
    /// Captured stdout/stderr/log bytes, for example `"64KiB"`.
    pub stdio: Option<ByteSize>,
    /// Outbound HTTP requests per lease.
    pub http_requests: Option<u64>,
    /// Outbound HTTP response body bytes per lease, for example `"16MiB"`.
    pub http_response: Option<ByteSize>,
}

/// A fuel budget or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FuelSetting {
    /// At most this much fuel.
    Limit(u64),
    /// The word `unmetered`: no fuel budget (the deadline still applies).
    Unmetered(Unmetered),
}

/// The word `unmetered`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmetered {
    /// No fuel budget.
    Unmetered,
}

impl LimitSettings {
    /// `base` with every field this sets replaced.
    pub fn apply_to(&self, base: &Limits) -> Limits {
        Limits {
            fuel: match self.fuel {
                Some(FuelSetting::Limit(n)) => Some(n),
                Some(FuelSetting::Unmetered(_)) => None,
                None => base.fuel,
            },
            timeout: self.timeout.map_or(base.timeout, |d| d.0),
            memory_bytes: self.memory.map_or(base.memory_bytes, |b| b.0),
            table_elements: self.tables.unwrap_or(base.table_elements),
            output_bytes: self.output.map_or(base.output_bytes, |b| b.0),
            stdio_bytes: self.stdio.map_or(base.stdio_bytes, |b| b.0),
            http_requests: self.http_requests.unwrap_or(base.http_requests),
            http_response_bytes: self.http_response.map_or(base.http_response_bytes, |b| b.0),
        }
    }

    /// Checks the values set, naming the key under `prefix` (for example
    /// `limits`).
    pub fn validate(&self, prefix: &str) -> Result<(), (String, String)> {
        let key = |k: &str| format!("{prefix}.{k}");
        if let Some(t) = self.timeout {
            if t.0.is_zero() {
                return Err((key("timeout"), "must be more than zero".into()));
            }
            if t.0 > std::time::Duration::from_secs(3600) {
                return Err((key("timeout"), "must be at most 1h".into()));
            }
        }
        if let Some(FuelSetting::Limit(0)) = self.fuel {
            return Err((
                key("fuel"),
                "must be more than zero (or \"unmetered\")".into(),
            ));
        }
        if let Some(m) = self.memory
            && m.0 < (1 << 20)
        {
            return Err((key("memory"), "must be at least 1MiB".into()));
        }
        Ok(())
    }
}

impl Manifest {
    /// Reads, parses and validates the manifest at `path`.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        Manifest::read(path).map(|(manifest, _)| manifest)
    }

    /// Like [`load`](Self::load), also returning the file's bytes: what the
    /// bundle statement's `manifest-sha256` digests.
    pub fn read(path: &Path) -> Result<(Manifest, Vec<u8>), ManifestError> {
        let bytes = std::fs::read(path).map_err(|error| ManifestError::Read {
            path: path.to_owned(),
            error,
        })?;
        // A component where a manifest belongs: say so, not "invalid UTF-8".
        if bytes.starts_with(b"\0asm") {
            let next_to = path.with_file_name("plugin.toml");
            let hint = if next_to.is_file() {
                format!(" (`{}` is next to it)", next_to.display())
            } else {
                String::new()
            };
            return Err(ManifestError::Parse {
                path: path.to_owned(),
                message: format!(
                    "is a WebAssembly component, not a manifest: name the plugin.toml that \
                     pins it, with its mounts, limits and tool effects{hint}; \
                     `warden plugin inspect` shows what a bare component exports"
                ),
            });
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| ManifestError::Read {
            path: path.to_owned(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let manifest = Manifest::parse(text, path, base)?;
        Ok((manifest, bytes))
    }

    /// Parses and validates manifest text. `path` names the file in errors;
    /// `base_dir` is what `component` is relative to.
    pub fn parse(text: &str, path: &Path, base_dir: &Path) -> Result<Manifest, ManifestError> {
        let raw: RawManifest = toml::from_str(text).map_err(|e| ManifestError::Parse {
            path: path.to_owned(),
            message: warden_syntax::toml_errors::one_line(text, &e),
        })?;
        let invalid = |key: &str, message: String| ManifestError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        if !is_valid_plugin_name(&raw.name) {
            return Err(invalid(
                "name",
                format!(
                    "`{}` is not a valid plugin name (use [a-z][a-z0-9-]*, at most 64 bytes)",
                    raw.name
                ),
            ));
        }
        if raw.version.is_empty()
            || !raw
                .version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
        {
            return Err(invalid(
                "version",
                format!("`{}` is not a version such as 0.1.0", raw.version),
            ));
        }
        let sha256 = match (&raw.component, raw.sha256) {
            (Some(_), None) => {
                return Err(invalid(
                    "sha256",
                    "is required when `component` is set: pin the component's digest".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "component",
                    "is required when `sha256` is set".into(),
                ));
            }
            (_, Some(hex)) => {
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(invalid(
                        "sha256",
                        format!("`{hex}` is not a 64-digit hex sha256"),
                    ));
                }
                Some(hex.to_ascii_lowercase())
            }
            (None, None) => None,
        };
        let kinds = match raw.kind {
            KindSetting::One(kind) => vec![kind],
            KindSetting::Many(kinds) => kinds,
        };
        let Some(&kind) = kinds.first() else {
            return Err(invalid("kind", "lists no kind".into()));
        };
        if let Some(dup) = kinds
            .iter()
            .enumerate()
            .find_map(|(i, k)| kinds[..i].contains(k).then_some(k))
        {
            return Err(invalid("kind", format!("lists `{dup}` twice")));
        }
        for name in raw.mounts.keys() {
            if !is_valid_mount_name(name) {
                return Err(invalid(
                    &format!("mounts.{name}"),
                    "is not a valid mount name (use [a-z][a-z0-9_-]*, at most 64 bytes)".into(),
                ));
            }
        }
        for (i, var) in raw.env.iter().enumerate() {
            if !is_valid_env_name(var) {
                return Err(invalid(
                    &format!("env[{i}]"),
                    format!("`{var}` is not a valid environment variable name"),
                ));
            }
        }
        for (i, host) in raw.hosts.iter().enumerate() {
            if let Err(message) = crate::grant::validate_host_pattern(host) {
                return Err(invalid(&format!("hosts[{i}]"), message));
            }
        }
        for (i, name) in raw.secrets.iter().enumerate() {
            if name != "*" && !crate::secrets::is_valid_secret_name(name) {
                return Err(invalid(
                    &format!("secrets[{i}]"),
                    format!("`{name}` is not a secret name (use [A-Za-z][A-Za-z0-9_-]*, or \"*\")"),
                ));
            }
        }
        raw.limits
            .validate("limits")
            .map_err(|(key, message)| invalid(&key, message))?;
        Ok(Manifest {
            name: raw.name,
            version: raw.version,
            kind,
            kinds,
            description: raw.description,
            component: raw.component.map(|c| base_dir.join(c)),
            sha256,
            mounts: raw.mounts,
            env: raw.env,
            hosts: raw.hosts,
            secrets: raw.secrets,
            limits: raw.limits.apply_to(&Limits::default()),
        })
    }
}

/// Whether `name` is a valid plugin name: `[a-z][a-z0-9-]*`, 1 to 64 bytes.
pub fn is_valid_plugin_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Whether `name` is a valid environment variable name.
pub fn is_valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("plugin.toml"), Path::new("/plugins/x"))
    }

    const FULL: &str = r#"
        name = "fs"
        version = "0.1.0"
        kind = "tool"
        description = "files"
        component = "fs.wasm"
        sha256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
        env = ["API_TOKEN"]
        hosts = ["api.example.com", "*.example.org:8443"]

        [mounts.workspace]
        access = "read-write"
        description = "where files live"

        [limits]
        fuel = "unmetered"
        memory = "32MiB"
        timeout = "2s"
        output = "1MiB"
        stdio = "4KiB"
        tables = 5000
        http_requests = 3
        http_response = "2MiB"
    "#;

    #[test]
    fn a_full_manifest_parses() {
        let m = parse(FULL).unwrap();
        assert_eq!(m.name, "fs");
        assert_eq!(m.kind, PluginKind::Tool);
        assert_eq!(m.component, Some(PathBuf::from("/plugins/x/fs.wasm")));
        assert_eq!(
            m.sha256.as_deref(),
            Some("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
        );
        assert_eq!(m.mounts["workspace"].access, Access::ReadWrite);
        assert_eq!(m.limits.fuel, None);
        assert_eq!(m.limits.memory_bytes, 32 << 20);
        assert_eq!(m.limits.timeout, Duration::from_secs(2));
        assert_eq!(m.limits.stdio_bytes, 4096);
        assert_eq!(m.limits.table_elements, 5000);
        assert_eq!(m.limits.http_requests, 3);
        assert_eq!(m.limits.http_response_bytes, 2 << 20);
        assert_eq!(m.kinds, [PluginKind::Tool]);
    }

    #[test]
    fn a_plugin_may_declare_several_kinds() {
        let m = parse("name = \"x\"\nversion = \"1\"\nkind = [\"tool\", \"context\"]\n").unwrap();
        assert_eq!(m.kind, PluginKind::Tool);
        assert_eq!(m.kinds, [PluginKind::Tool, PluginKind::Context]);
        for kinds in ["[]", "[\"tool\", \"tool\"]"] {
            let text = format!("name = \"x\"\nversion = \"1\"\nkind = {kinds}\n");
            match parse(&text).unwrap_err() {
                ManifestError::Invalid { key, .. } => assert_eq!(key, "kind", "{text}"),
                other => panic!("{text}: {other}"),
            }
        }
    }

    #[test]
    fn defaults_deny_everything() {
        let m = parse("name = \"x\"\nversion = \"1\"\nkind = \"channel\"\n").unwrap();
        assert!(m.mounts.is_empty() && m.env.is_empty() && m.hosts.is_empty());
        assert_eq!(m.component, None);
        assert_eq!(m.limits, Limits::default());
    }

    /// Each bad manifest and the key its error must name.
    #[test]
    fn errors_name_the_key() {
        let base = "version = \"1\"\nkind = \"tool\"\n";
        let cases: &[(&str, &str)] = &[
            ("name = \"Bad_Name\"\n", "name"),
            ("name = \"x\"\ncomponent = \"x.wasm\"\n", "sha256"),
            (
                "name = \"x\"\nsha256 = \"abcd\"\ncomponent = \"x.wasm\"\n",
                "sha256",
            ),
            ("name = \"x\"\nsha256 = \"abcd\"\n", "component"),
            ("name = \"x\"\nenv = [\"1BAD\"]\n", "env[0]"),
            ("name = \"x\"\nhosts = [\"x/path\"]\n", "hosts[0]"),
            (
                "name = \"x\"\n[mounts.\"A B\"]\naccess = \"read-only\"\n",
                "mounts.A B",
            ),
            (
                "name = \"x\"\n[limits]\ntimeout = \"0s\"\n",
                "limits.timeout",
            ),
            ("name = \"x\"\n[limits]\nfuel = 0\n", "limits.fuel"),
            (
                "name = \"x\"\n[limits]\nmemory = \"1KiB\"\n",
                "limits.memory",
            ),
        ];
        for (extra, key) in cases {
            let text = format!("{base}{extra}");
            let err = parse(&text).unwrap_err();
            match &err {
                ManifestError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: expected an invalid-key error, got {other}"),
            }
            assert!(err.to_string().contains("plugin.toml"), "{err}");
        }
    }

    #[test]
    fn unknown_and_mistyped_keys_are_parse_errors() {
        for text in [
            "name = \"x\"\nversion = \"1\"\nkind = \"tool\"\nsurprise = 1\n",
            "name = \"x\"\nversion = \"1\"\nkind = \"gadget\"\n",
            "name = \"x\"\nversion = \"1\"\nkind = \"tool\"\n[limits]\nmemory = \"12XB\"\n",
            "name = \"x\"\nversion = \"1\"\nkind = \"tool\"\n[limits]\ntimeout = \"10\"\n",
            "name = \"x\"\nversion = \"1\"\nkind = \"tool\"\n[mounts.w]\naccess = \"everything\"\n",
        ] {
            let err = parse(text).unwrap_err();
            assert!(matches!(err, ManifestError::Parse { .. }), "{text}: {err}");
        }
    }
}
