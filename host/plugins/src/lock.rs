//! The lock file: the exact bundle (digest and signer) of each plugin an
//! agent uses, with what each asks for, so a run refuses a plugin that
//! changed and an upgrade shows the operator what the new version asks for
//! more (or less) than the locked one.
//!
//! `warden plugin lock AGENT.toml` writes `AGENT.lock` next to the agent
//! file; the plugin host compares each plugin's verified bundle against it
//! before compiling ([`LockedPlugin::check`]). `warden plugin upgrade`
//! replaces one entry after showing the [`PermissionDiff`]: a diff that
//! only narrows is taken, one that widens needs the operator's acceptance,
//! recorded in the entry ([`Acceptance`]: who, when, the diff's digest).
//!
//! ```toml
//! version = 1
//!
//! [plugins.fs]                       # the plugin's key in the agent
//! source = "builtin:fs"
//! name = "fs"
//! version = "0.1.0"
//! bundle = "5f0c…"                   # sha256 of the bundle statement
//! signer = "builtin"                 # or minisign:<KEY ID>, or unsigned
//!
//! [plugins.fs.permissions]           # what the bundle asks for
//! worlds = ["tool"]
//! hosts = []
//! env = []
//! secrets = []
//! tools = { read_file = "read", write_file = "write" }
//! mounts = { workspace = "read-write" }
//! limits = { fuel = 10000000000, timeout_ms = 10000, … }   # -1: unmetered
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::grant::EffectClass;
use crate::trust::{Provenance, TrustError};
use crate::{LoadedPlugin, Manifest};
use warden_sandbox::{Access, Limits};

/// The lock file's format version.
const VERSION: u32 = 1;

/// An agent's lock file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// The format version, 1.
    pub version: u32,
    /// Each plugin by its key in the agent.
    #[serde(default)]
    pub plugins: BTreeMap<String, LockedPlugin>,
}

/// One locked plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    /// Where the agent names it from, as the agent writes it.
    pub source: String,
    /// Its manifest's name.
    pub name: String,
    /// Its manifest's version.
    pub version: String,
    /// The bundle digest (sha256 of its statement).
    pub bundle: String,
    /// Who signed it: `minisign:<KEY ID>`, `builtin` or `unsigned`.
    pub signer: String,
    /// The configured publisher whose key signed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// What it asks for.
    pub permissions: Permissions,
    /// The operator's acceptance of the widening that led to this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<Acceptance>,
}

/// An operator's acceptance of a widening upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acceptance {
    /// Who accepted (`--by`, else the login name).
    pub by: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The digest of the diff accepted ([`PermissionDiff::digest`]).
    pub diff: String,
    /// The bundle it upgraded from.
    pub from: String,
}

/// What a plugin bundle asks for: its worlds, its tools with the effect
/// class each claims, mounts, hosts, environment variables, secrets and
/// limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// The worlds it exports (`tool`, `context`, `channel`, `policy`).
    pub worlds: Vec<String>,
    /// Its tools and the effect class each claims.
    #[serde(default)]
    pub tools: BTreeMap<String, EffectClass>,
    /// Requested mounts and their access.
    #[serde(default)]
    pub mounts: BTreeMap<String, Access>,
    /// Requested outbound hosts.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Requested environment variables.
    #[serde(default)]
    pub env: Vec<String>,
    /// Requested secrets.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Its default limits: `fuel` (-1 for unmetered), `timeout_ms`,
    /// `memory`, `tables`, `output`, `stdio`, `http_requests`,
    /// `http_response` (bytes).
    #[serde(default)]
    pub limits: BTreeMap<String, i64>,
}

impl Permissions {
    /// What `manifest` asks for, with `tools` (each with its claimed
    /// effect) from the component's `describe`.
    pub fn of(manifest: &Manifest, tools: &BTreeMap<String, EffectClass>) -> Permissions {
        Permissions {
            worlds: manifest.kinds.iter().map(ToString::to_string).collect(),
            tools: tools.clone(),
            mounts: manifest
                .mounts
                .iter()
                .map(|(name, m)| (name.clone(), m.access))
                .collect(),
            hosts: sorted(&manifest.hosts),
            env: sorted(&manifest.env),
            secrets: sorted(&manifest.secrets),
            limits: limits_map(&manifest.limits),
        }
    }

    /// What a loaded plugin asks for.
    pub fn of_loaded(plugin: &LoadedPlugin) -> Permissions {
        let tools = plugin
            .tools()
            .iter()
            .map(|t| (t.name.clone(), t.claimed_effect))
            .collect();
        Permissions::of(plugin.manifest(), &tools)
    }
}

fn sorted(items: &[String]) -> Vec<String> {
    let set: BTreeSet<&String> = items.iter().collect();
    set.into_iter().cloned().collect()
}

fn limits_map(limits: &Limits) -> BTreeMap<String, i64> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    BTreeMap::from([
        ("fuel".into(), limits.fuel.map_or(-1, n)),
        (
            "timeout_ms".into(),
            n(limits.timeout.as_millis().try_into().unwrap_or(u64::MAX)),
        ),
        ("memory".into(), n(limits.memory_bytes)),
        ("tables".into(), n(limits.table_elements)),
        ("output".into(), n(limits.output_bytes)),
        ("stdio".into(), n(limits.stdio_bytes)),
        ("http_requests".into(), n(limits.http_requests)),
        ("http_response".into(), n(limits.http_response_bytes)),
    ])
}

/// One difference between a locked plugin's permissions and a new
/// version's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// What changed: `tool \`x\``, `mount \`w\``, `host \`h\``, `env
    /// \`V\``, `secret \`s\``, `world \`context\``, `limit \`fuel\``.
    pub what: String,
    /// Before (`None`: not asked for).
    pub from: Option<String>,
    /// After (`None`: no longer asked for).
    pub to: Option<String>,
    /// Whether it gives the plugin more than before.
    pub widens: bool,
}

/// What a new version asks for compared with the locked one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PermissionDiff {
    /// Each difference, in the order of the permissions' fields.
    pub changes: Vec<Change>,
}

impl PermissionDiff {
    /// The differences from `old` to `new`.
    pub fn between(old: &Permissions, new: &Permissions) -> PermissionDiff {
        let mut changes = Vec::new();
        set_changes(&mut changes, "world", &old.worlds, &new.worlds);
        map_changes(&mut changes, "tool", &old.tools, &new.tools, |a, b| {
            effect_rank(b) > effect_rank(a)
        });
        map_changes(&mut changes, "mount", &old.mounts, &new.mounts, |a, b| {
            *a == Access::ReadOnly && *b == Access::ReadWrite
        });
        set_changes(&mut changes, "host", &old.hosts, &new.hosts);
        set_changes(&mut changes, "env", &old.env, &new.env);
        set_changes(&mut changes, "secret", &old.secrets, &new.secrets);
        for key in old
            .limits
            .keys()
            .chain(new.limits.keys())
            .collect::<BTreeSet<_>>()
        {
            let (a, b) = (old.limits.get(key), new.limits.get(key));
            if a == b {
                continue;
            }
            // -1 is unmetered: more than any number.
            let rank = |v: Option<&i64>| {
                v.map_or(i128::MAX, |&v| if v < 0 { i128::MAX } else { v.into() })
            };
            let show = |v: Option<&i64>| {
                v.map(|&v| {
                    if v < 0 {
                        "unmetered".to_owned()
                    } else {
                        v.to_string()
                    }
                })
            };
            changes.push(Change {
                what: format!("limit `{key}`"),
                from: show(a),
                to: show(b),
                widens: rank(b) > rank(a),
            });
        }
        PermissionDiff { changes }
    }

    /// Whether any change gives the plugin more.
    pub fn widens(&self) -> bool {
        self.changes.iter().any(|c| c.widens)
    }

    /// The digest an acceptance names: sha256 of the canonical JSON of the
    /// two bundle digests and the changes, lowercase hex.
    pub fn digest(&self, from_bundle: &str, to_bundle: &str) -> String {
        use sha2::Digest as _;
        let value = serde_json::json!({
            "from": from_bundle,
            "to": to_bundle,
            "changes": self.changes,
        });
        hex::encode(sha2::Sha256::digest(value.to_string().as_bytes()))
    }

    /// One line per change, `+` widening, `-` narrowing or unchanged in
    /// reach.
    pub fn lines(&self) -> Vec<String> {
        self.changes
            .iter()
            .map(|c| {
                let mark = if c.widens { "+" } else { "-" };
                match (&c.from, &c.to) {
                    (None, Some(to)) => format!("{mark} {} added ({to})", c.what),
                    (Some(from), None) => format!("{mark} {} removed (was {from})", c.what),
                    (Some(from), Some(to)) => format!("{mark} {}: {from} → {to}", c.what),
                    (None, None) => format!("{mark} {}", c.what),
                }
            })
            .collect()
    }
}

fn effect_rank(e: &EffectClass) -> u8 {
    match e {
        EffectClass::Read => 0,
        EffectClass::Idempotent => 1,
        EffectClass::Write => 2,
    }
}

fn set_changes(changes: &mut Vec<Change>, what: &str, old: &[String], new: &[String]) {
    for item in new.iter().filter(|i| !old.contains(i)) {
        changes.push(Change {
            what: format!("{what} `{item}`"),
            from: None,
            to: Some("requested".into()),
            widens: true,
        });
    }
    for item in old.iter().filter(|i| !new.contains(i)) {
        changes.push(Change {
            what: format!("{what} `{item}`"),
            from: Some("requested".into()),
            to: None,
            widens: false,
        });
    }
}

fn map_changes<V: PartialEq + Serialize>(
    changes: &mut Vec<Change>,
    what: &str,
    old: &BTreeMap<String, V>,
    new: &BTreeMap<String, V>,
    widens: impl Fn(&V, &V) -> bool,
) {
    let show = |v: &V| match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    };
    for (key, b) in new {
        match old.get(key) {
            None => changes.push(Change {
                what: format!("{what} `{key}`"),
                from: None,
                to: Some(show(b)),
                widens: true,
            }),
            Some(a) if a != b => changes.push(Change {
                what: format!("{what} `{key}`"),
                from: Some(show(a)),
                to: Some(show(b)),
                widens: widens(a, b),
            }),
            Some(_) => {}
        }
    }
    for (key, a) in old {
        if !new.contains_key(key) {
            changes.push(Change {
                what: format!("{what} `{key}`"),
                from: Some(show(a)),
                to: None,
                widens: false,
            });
        }
    }
}

/// A lock file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// It cannot be read or written.
    #[error("lock file `{}`: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// It is not a lock file this version reads.
    #[error("lock file `{}`: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl LockError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            LockError::Io { .. } => "lock_unreadable",
            LockError::Invalid { .. } => "lock_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> serde_json::Value {
        match self {
            LockError::Io { path, .. } | LockError::Invalid { path, .. } => {
                serde_json::json!({ "file": warden_syntax::evidence::path(path) })
            }
        }
    }
}

impl Lock {
    /// The lock file of the agent file `agent`: the same name with the
    /// extension `.lock`, next to it.
    pub fn path_for(agent: &Path) -> PathBuf {
        agent.with_extension("lock")
    }

    /// An empty lock.
    pub fn new() -> Lock {
        Lock {
            version: VERSION,
            plugins: BTreeMap::new(),
        }
    }

    /// Reads the lock at `path`; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<Lock>, LockError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(LockError::Io {
                    path: path.to_owned(),
                    error,
                });
            }
        };
        let lock: Lock = toml::from_str(&text).map_err(|e| LockError::Invalid {
            path: path.to_owned(),
            message: warden_syntax::toml_errors::one_line(&text, &e),
        })?;
        if lock.version != VERSION {
            return Err(LockError::Invalid {
                path: path.to_owned(),
                message: format!(
                    "version {} is not one this warden reads ({VERSION})",
                    lock.version
                ),
            });
        }
        Ok(Some(lock))
    }

    /// Writes the lock to `path` whole: a temporary file beside it, synced,
    /// then renamed over it, so a reader sees the old lock or the new one.
    pub fn write(&self, path: &Path) -> Result<(), LockError> {
        use std::io::Write as _;
        let io = |error| LockError::Io {
            path: path.to_owned(),
            error,
        };
        let body = toml::to_string(self).map_err(|e| LockError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let text = format!(
            "# Written by `warden plugin lock`: the exact plugin bundles this agent runs.\n\
             # A run refuses a plugin whose bundle differs; `warden plugin upgrade KEY --agent AGENT`\n\
             # shows what a new version asks for and changes its entry.\n{body}"
        );
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
        tmp.write_all(text.as_bytes()).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }
}

impl LockedPlugin {
    /// The entry for `plugin`, loaded from `source`.
    pub fn of(source: &str, plugin: &LoadedPlugin) -> Option<LockedPlugin> {
        let bundle = plugin.bundle()?;
        Some(LockedPlugin {
            source: source.to_owned(),
            name: plugin.name().to_owned(),
            version: plugin.manifest().version.clone(),
            bundle: bundle.digest.clone(),
            signer: bundle.signer.clone(),
            publisher: bundle.publisher.clone(),
            permissions: Permissions::of_loaded(plugin),
            accepted: None,
        })
    }

    /// Refuses a bundle that is not the one locked: another digest, or
    /// another signer.
    pub fn check(
        &self,
        key: &str,
        lock: &Path,
        plugin: &str,
        found: &Provenance,
    ) -> Result<(), TrustError> {
        let mismatch = |field, locked: &str, found: &str| TrustError::LockMismatch {
            plugin: plugin.to_owned(),
            key: key.into(),
            lock: lock.into(),
            field,
            locked: locked.to_owned(),
            found: found.to_owned(),
        };
        if self.bundle != found.digest {
            return Err(mismatch("bundle digest", &self.bundle, &found.digest));
        }
        if self.signer != found.signer {
            return Err(mismatch("signer", &self.signer, &found.signer));
        }
        Ok(())
    }
}

/// What the plugin host checks a plugin against when an agent has a lock
/// file: the file, the plugin's key, and its entry (`None`: the lock does
/// not list it, which refuses it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockPin {
    /// The lock file.
    pub file: PathBuf,
    /// The plugin's key in the agent.
    pub key: String,
    /// Its entry.
    pub entry: Option<LockedPlugin>,
}

impl LockPin {
    /// Refuses `found` unless it is the locked bundle.
    pub fn check(&self, plugin: &str, found: &Provenance) -> Result<(), TrustError> {
        match &self.entry {
            None => Err(TrustError::NotLocked {
                key: self.key.clone(),
                lock: self.file.clone(),
            }),
            Some(entry) => entry.check(&self.key, &self.file, plugin, found),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perms() -> Permissions {
        Permissions {
            worlds: vec!["tool".into()],
            tools: BTreeMap::from([("get".into(), EffectClass::Read)]),
            mounts: BTreeMap::from([("data".into(), Access::ReadOnly)]),
            hosts: vec!["api.example.com".into()],
            env: vec![],
            secrets: vec![],
            limits: BTreeMap::from([("fuel".into(), 100), ("memory".into(), 1 << 20)]),
        }
    }

    #[test]
    fn widening_and_narrowing_are_told_apart() {
        let old = perms();
        assert!(PermissionDiff::between(&old, &old).changes.is_empty());

        let mut wider = old.clone();
        wider.hosts.push("evil.example".into());
        wider.tools.insert("get".into(), EffectClass::Write);
        wider.mounts.insert("data".into(), Access::ReadWrite);
        wider.limits.insert("fuel".into(), -1);
        let diff = PermissionDiff::between(&old, &wider);
        assert_eq!(diff.changes.len(), 4, "{diff:?}");
        assert!(diff.changes.iter().all(|c| c.widens), "{diff:?}");

        let mut narrower = old.clone();
        narrower.hosts.clear();
        narrower.tools.clear();
        narrower.mounts.clear();
        narrower.limits.insert("memory".into(), 1 << 19);
        let diff = PermissionDiff::between(&old, &narrower);
        assert_eq!(diff.changes.len(), 4, "{diff:?}");
        assert!(!diff.widens(), "{diff:?}");
        assert_ne!(diff.digest("a", "b"), diff.digest("a", "c"));
    }

    #[test]
    fn a_lock_reads_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.lock");
        let mut lock = Lock::new();
        lock.plugins.insert(
            "fs".into(),
            LockedPlugin {
                source: "builtin:fs".into(),
                name: "fs".into(),
                version: "0.1.0".into(),
                bundle: "ab".repeat(32),
                signer: "builtin".into(),
                publisher: None,
                permissions: perms(),
                accepted: Some(Acceptance {
                    by: "ada".into(),
                    at_ms: 1_700_000_000_000,
                    diff: "cd".repeat(32),
                    from: "ef".repeat(32),
                }),
            },
        );
        lock.write(&path).unwrap();
        assert_eq!(Lock::read(&path).unwrap(), Some(lock));
        assert_eq!(Lock::read(&dir.path().join("none.lock")).unwrap(), None);
    }
}
