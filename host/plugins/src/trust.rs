//! Who built a plugin: the bundle statement a publisher signs with the
//! `minisign` tool, the operator's trusted keys per publisher, and the check
//! [`PluginHost`](crate::PluginHost) makes before a component is compiled.
//!
//! A plugin from a `plugin.toml` is a bundle: the manifest (the component's
//! pin and everything the plugin requests: worlds, mounts, environment
//! variables, hosts, secrets, limits) and the component. What a publisher
//! signs is the bundle statement, the file `plugin.bundle` next to the
//! manifest (`warden plugin bundle` writes it), exactly these five lines:
//!
//! ```text
//! warden-plugin-bundle v1
//! name greeter
//! version 0.1.0
//! manifest-sha256 <sha256 of plugin.toml's bytes, 64 lowercase hex digits>
//! component-sha256 <sha256 of the component's bytes>
//! ```
//!
//! `minisign -Sm plugin.bundle` signs it into `plugin.bundle.minisig`.
//! Changing a byte of the manifest or of the component changes a digest the
//! signature covers, so either is caught, and named. The bundle's digest is
//! the sha256 of the statement: what the lock file pins and every receipt
//! records.
//!
//! The check is fail-closed. A signature that is present is always
//! verified, and any failure refuses the plugin: a key no publisher entry
//! trusts, a signature that does not verify, a statement that does not
//! match the files. A plugin with no signature loads only where the
//! operator allowed unsigned plugins: from the directories `[trust]
//! allow_unsigned` lists, or anywhere when the operator configured no
//! `[trust]` at all (development: [`TrustPolicy::development`]), and then
//! its receipts say `unsigned`. A built-in plugin is trusted by being
//! compiled into the binary; its receipts say `builtin`.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::Digest as _;

pub use warden_sandbox::Provenance;

/// The statement file, next to `plugin.toml`.
pub const STATEMENT_FILE: &str = "plugin.bundle";
/// The signature file `minisign -Sm plugin.bundle` writes.
pub const SIGNATURE_FILE: &str = "plugin.bundle.minisig";
/// The statement's first line: its format and version.
const HEADER: &str = "warden-plugin-bundle v1";
/// The most a statement or signature file may hold: both are a few lines.
const MAX_FILE_BYTES: u64 = 4096;

/// What a publisher signs: a plugin's name and version and the sha256 of
/// its manifest's and its component's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    /// The manifest's `name`.
    pub name: String,
    /// The manifest's `version`.
    pub version: String,
    /// sha256 of the manifest file's bytes, lowercase hex.
    pub manifest_sha256: String,
    /// sha256 of the component's bytes, lowercase hex.
    pub component_sha256: String,
}

impl Statement {
    /// The statement of a manifest and a component as they are.
    pub fn of(name: &str, version: &str, manifest: &[u8], component_sha256: &str) -> Statement {
        Statement {
            name: name.to_owned(),
            version: version.to_owned(),
            manifest_sha256: hex::encode(sha2::Sha256::digest(manifest)),
            component_sha256: component_sha256.to_ascii_lowercase(),
        }
    }

    /// The exact bytes signed: five lines, each ending in `\n`.
    pub fn text(&self) -> String {
        format!(
            "{HEADER}\nname {}\nversion {}\nmanifest-sha256 {}\ncomponent-sha256 {}\n",
            self.name, self.version, self.manifest_sha256, self.component_sha256
        )
    }

    /// The bundle's digest: sha256 of [`text`](Self::text), lowercase hex.
    pub fn digest(&self) -> String {
        hex::encode(sha2::Sha256::digest(self.text().as_bytes()))
    }

    /// Reads a statement, which must be exactly what [`text`](Self::text)
    /// writes: nothing else is accepted, so what was signed is what is
    /// compared.
    pub fn parse(text: &str) -> Result<Statement, String> {
        let mut lines = text.split_inclusive('\n');
        if lines.next() != Some(&format!("{HEADER}\n")) {
            return Err(format!("does not begin with the line `{HEADER}`"));
        }
        let mut field = |key: &str| -> Result<String, String> {
            let line = lines
                .next()
                .ok_or_else(|| format!("ends before its `{key}` line"))?;
            line.strip_suffix('\n')
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(' '))
                .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
                .map(str::to_owned)
                .ok_or_else(|| {
                    format!(
                        "has `{}` where its `{key} VALUE` line belongs",
                        line.trim_end()
                    )
                })
        };
        let statement = Statement {
            name: field("name")?,
            version: field("version")?,
            manifest_sha256: field("manifest-sha256")?,
            component_sha256: field("component-sha256")?,
        };
        if lines.next().is_some() {
            return Err("has lines after `component-sha256`".into());
        }
        for digest in [&statement.manifest_sha256, &statement.component_sha256] {
            if digest.len() != 64
                || !digest
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                return Err(format!("`{digest}` is not 64 lowercase hex digits"));
            }
        }
        Ok(statement)
    }
}

/// A publisher the operator trusts: a name and the minisign public keys
/// whose signatures count as theirs.
#[derive(Clone, Debug)]
struct Publisher {
    name: String,
    keys: Vec<TrustedKey>,
}

#[derive(Clone, Debug)]
struct TrustedKey {
    /// The key ID as minisign prints it (16 uppercase hex digits).
    id: String,
    key: minisign_verify::PublicKey,
}

/// The operator's trust: which publishers' keys are trusted, and where
/// unsigned plugins may load from. Built from `[trust]` in warden.toml.
#[derive(Clone, Debug, Default)]
pub struct TrustPolicy {
    /// Whether the operator configured trust at all; without it unsigned
    /// plugins load from anywhere.
    configured: bool,
    publishers: Vec<Publisher>,
    allow_unsigned: Vec<PathBuf>,
}

/// A `[trust]` setting that cannot be accepted.
#[derive(Debug, thiserror::Error)]
#[error(
    "publisher `{publisher}`: key `{key}` is not a minisign public key (the second line of a `minisign.pub` file, `RW…`): {message}"
)]
pub struct TrustConfigError {
    /// The publisher.
    pub publisher: String,
    /// The key as written.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// A plugin the trust check refuses, named with the reason and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// No signature, and unsigned plugins are not allowed from there.
    #[error(
        "plugin `{plugin}` (`{}`) is not signed (no `plugin.bundle.minisig` next to it), and the operator allows unsigned plugins only from {allowed}: have its publisher sign its `plugin.bundle` with minisign, or add its directory to `[trust] allow_unsigned` in warden.toml",
        manifest.display()
    )]
    Unsigned {
        /// The plugin.
        plugin: String,
        /// Its manifest.
        manifest: PathBuf,
        /// Where unsigned plugins may load from, for the message.
        allowed: String,
    },
    /// Signed by a key no configured publisher has.
    #[error(
        "plugin `{plugin}` (`{}`) is signed by minisign key {key_id}, which no `[trust.publishers]` entry in warden.toml trusts: add the publisher's public key if you trust them",
        manifest.display()
    )]
    UntrustedKey {
        /// The plugin.
        plugin: String,
        /// Its manifest.
        manifest: PathBuf,
        /// The key ID the signature names.
        key_id: String,
    },
    /// The signature does not verify over the statement with the key it
    /// names.
    #[error(
        "plugin `{plugin}` (`{}`): the signature by key {key_id} (publisher `{publisher}`) does not verify: `plugin.bundle` or `plugin.bundle.minisig` was changed after signing ({reason})",
        manifest.display()
    )]
    BadSignature {
        /// The plugin.
        plugin: String,
        /// Its manifest.
        manifest: PathBuf,
        /// The key ID.
        key_id: String,
        /// Whose key it is.
        publisher: String,
        /// What the verifier said.
        reason: String,
    },
    /// The signed statement names another manifest or component than the
    /// ones on disk.
    #[error(
        "plugin `{plugin}` (`{}`): the {part} is not the one its publisher signed (signed {signed}, found {found}): it was changed after signing; get the bundle again from its publisher",
        manifest.display()
    )]
    Tampered {
        /// The plugin.
        plugin: String,
        /// Its manifest.
        manifest: PathBuf,
        /// `component`, `manifest`, `name` or `version`.
        part: &'static str,
        /// What the signed statement says.
        signed: String,
        /// What the files are.
        found: String,
    },
    /// The statement or the signature file cannot be read or parsed.
    #[error("plugin `{plugin}`: `{}` {problem}", file.display())]
    Unreadable {
        /// The plugin.
        plugin: String,
        /// The file.
        file: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The bundle is not the one the agent's lock file pins.
    #[error(
        "plugin `{plugin}`: its {field} is {found}, but `{}` locks {locked}: the plugin changed since it was locked; review and accept the change with `warden plugin upgrade {key} --agent AGENT`",
        lock.display()
    )]
    LockMismatch {
        /// The plugin.
        plugin: String,
        /// Its key in the agent.
        key: Box<str>,
        /// The lock file (boxed: the error stays small on the happy path).
        lock: Box<Path>,
        /// `bundle digest` or `signer`.
        field: &'static str,
        /// What the lock says.
        locked: String,
        /// What was found.
        found: String,
    },
    /// The agent has a lock file that does not list this plugin.
    #[error(
        "plugin `{key}`: the lock file `{}` does not list it: run `warden plugin lock AGENT` to pin it",
        lock.display()
    )]
    NotLocked {
        /// Its key in the agent.
        key: String,
        /// The lock file.
        lock: PathBuf,
    },
}

impl TrustError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            TrustError::Unsigned { .. } => "plugin_unsigned",
            TrustError::UntrustedKey { .. } => "plugin_untrusted_key",
            TrustError::BadSignature { .. } => "plugin_bad_signature",
            TrustError::Tampered { .. } => "plugin_tampered",
            TrustError::Unreadable { .. } => "plugin_signature_unreadable",
            TrustError::LockMismatch { .. } | TrustError::NotLocked { .. } => {
                "plugin_lock_mismatch"
            }
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> serde_json::Value {
        use serde_json::json;
        use warden_syntax::evidence;
        match self {
            TrustError::Unsigned {
                plugin, manifest, ..
            } => {
                json!({ "plugin": plugin, "manifest": evidence::path(manifest) })
            }
            TrustError::UntrustedKey {
                plugin,
                manifest,
                key_id,
            } => {
                json!({ "plugin": plugin, "manifest": evidence::path(manifest), "key_id": key_id })
            }
            TrustError::BadSignature {
                plugin,
                manifest,
                key_id,
                publisher,
                ..
            } => json!({
                "plugin": plugin, "manifest": evidence::path(manifest),
                "key_id": key_id, "publisher": publisher,
            }),
            TrustError::Tampered {
                plugin,
                manifest,
                part,
                signed,
                found,
            } => json!({
                "plugin": plugin, "manifest": evidence::path(manifest),
                "part": part, "signed": signed, "found": found,
            }),
            TrustError::Unreadable { plugin, file, .. } => {
                json!({ "plugin": plugin, "file": evidence::path(file) })
            }
            TrustError::LockMismatch {
                plugin,
                key,
                lock,
                field,
                locked,
                found,
            } => json!({
                "plugin": plugin, "key": key, "file": evidence::path(lock),
                "field": field, "locked": locked, "found": found,
            }),
            TrustError::NotLocked { key, lock } => {
                json!({ "key": key, "file": evidence::path(lock) })
            }
        }
    }
}

impl TrustPolicy {
    /// No `[trust]` configured: unsigned plugins load from anywhere (each
    /// receipt says `unsigned`); a signature present is still verified, and
    /// with no trusted key it is refused.
    pub fn development() -> TrustPolicy {
        TrustPolicy::default()
    }

    /// Fail-closed: unsigned plugins load only from beneath the directories
    /// of `allow_unsigned`; every other plugin must be signed by a key of a
    /// publisher added with [`with_publisher`](Self::with_publisher).
    pub fn enforcing(allow_unsigned: Vec<PathBuf>) -> TrustPolicy {
        TrustPolicy {
            configured: true,
            publishers: Vec::new(),
            allow_unsigned,
        }
    }

    /// Trusts `keys` (minisign public keys, base64, `RW…`) as `publisher`'s.
    pub fn with_publisher(
        mut self,
        publisher: &str,
        keys: &[String],
    ) -> Result<TrustPolicy, TrustConfigError> {
        let mut trusted = Vec::with_capacity(keys.len());
        for text in keys {
            let error = |message: &str| TrustConfigError {
                publisher: publisher.to_owned(),
                key: text.clone(),
                message: message.to_owned(),
            };
            let key = minisign_verify::PublicKey::from_base64(text.trim())
                .map_err(|e| error(&e.to_string()))?;
            let id = key_id(text.trim()).ok_or_else(|| error("no key ID"))?;
            trusted.push(TrustedKey { id, key });
        }
        self.publishers.push(Publisher {
            name: publisher.to_owned(),
            keys: trusted,
        });
        Ok(self)
    }

    /// Whether the operator configured `[trust]` (fail-closed).
    pub fn is_enforcing(&self) -> bool {
        self.configured
    }

    /// Each trusted publisher with the IDs of its keys.
    pub fn publishers(&self) -> impl Iterator<Item = (&str, Vec<&str>)> {
        self.publishers.iter().map(|p| {
            (
                p.name.as_str(),
                p.keys.iter().map(|k| k.id.as_str()).collect(),
            )
        })
    }

    /// The directories unsigned plugins may load from (none listed and not
    /// enforcing: anywhere).
    pub fn allow_unsigned(&self) -> &[PathBuf] {
        &self.allow_unsigned
    }

    /// The provenance of a built-in plugin: trusted by being compiled in.
    pub fn builtin(statement: &Statement) -> Provenance {
        Provenance {
            digest: statement.digest(),
            signer: "builtin".into(),
            publisher: None,
        }
    }

    /// Checks the plugin whose manifest is `manifest`, whose files are as
    /// `found` says, against its signature and this policy. Reads only the
    /// small statement and signature files; compiles nothing.
    pub fn verify(
        &self,
        plugin: &str,
        manifest: &Path,
        found: &Statement,
    ) -> Result<Provenance, TrustError> {
        let dir = match manifest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let unreadable = |file: &Path, problem: String| TrustError::Unreadable {
            plugin: plugin.to_owned(),
            file: file.to_owned(),
            problem,
        };
        let sig_path = dir.join(SIGNATURE_FILE);
        let sig_text = match read_small(&sig_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return self.unsigned(plugin, manifest, &dir, found);
            }
            Err(e) => return Err(unreadable(&sig_path, format!("cannot be read: {e}"))),
        };
        let signature = minisign_verify::Signature::decode(&sig_text)
            .map_err(|e| unreadable(&sig_path, format!("is not a minisign signature: {e}")))?;
        let key_id = signature_key_id(&sig_text)
            .ok_or_else(|| unreadable(&sig_path, "names no key ID".into()))?;
        let Some((publisher, key)) = self.publishers.iter().find_map(|p| {
            p.keys
                .iter()
                .find(|k| k.id == key_id)
                .map(|k| (p.name.as_str(), &k.key))
        }) else {
            return Err(TrustError::UntrustedKey {
                plugin: plugin.to_owned(),
                manifest: manifest.to_owned(),
                key_id,
            });
        };
        let statement_path = dir.join(STATEMENT_FILE);
        let statement_text = read_small(&statement_path).map_err(|e| {
            unreadable(
                &statement_path,
                format!(
                    "cannot be read ({e}): the signature signs this file; ship it with the plugin"
                ),
            )
        })?;
        key.verify(statement_text.as_bytes(), &signature, false)
            .map_err(|e| TrustError::BadSignature {
                plugin: plugin.to_owned(),
                manifest: manifest.to_owned(),
                key_id: key_id.clone(),
                publisher: publisher.to_owned(),
                reason: match e {
                    minisign_verify::Error::UnexpectedAlgorithm => {
                        "a legacy signature: sign with a current minisign, which prehashes".into()
                    }
                    other => other.to_string(),
                },
            })?;
        let signed = Statement::parse(&statement_text)
            .map_err(|problem| unreadable(&statement_path, problem))?;
        let tampered = |part: &'static str, signed: &str, found: &str| TrustError::Tampered {
            plugin: plugin.to_owned(),
            manifest: manifest.to_owned(),
            part,
            signed: signed.to_owned(),
            found: found.to_owned(),
        };
        // The component first: a component swapped under an unchanged
        // manifest is the likelier tampering, and the one to name.
        if signed.component_sha256 != found.component_sha256 {
            return Err(tampered(
                "component",
                &signed.component_sha256,
                &found.component_sha256,
            ));
        }
        if signed.manifest_sha256 != found.manifest_sha256 {
            return Err(tampered(
                "manifest",
                &signed.manifest_sha256,
                &found.manifest_sha256,
            ));
        }
        if signed.name != found.name {
            return Err(tampered("name", &signed.name, &found.name));
        }
        if signed.version != found.version {
            return Err(tampered("version", &signed.version, &found.version));
        }
        Ok(Provenance {
            digest: signed.digest(),
            signer: format!("minisign:{key_id}"),
            publisher: Some(publisher.to_owned()),
        })
    }

    /// An unsigned plugin: loaded only where the operator allows it.
    fn unsigned(
        &self,
        plugin: &str,
        manifest: &Path,
        dir: &Path,
        found: &Statement,
    ) -> Result<Provenance, TrustError> {
        let allowed = !self.configured || {
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
            self.allow_unsigned
                .iter()
                .any(|a| std::fs::canonicalize(a).is_ok_and(|a| dir.starts_with(a)))
        };
        if !allowed {
            return Err(TrustError::Unsigned {
                plugin: plugin.to_owned(),
                manifest: manifest.to_owned(),
                allowed: if self.allow_unsigned.is_empty() {
                    "no directory".into()
                } else {
                    self.allow_unsigned
                        .iter()
                        .map(|p| format!("`{}`", p.display()))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            });
        }
        tracing::info!(
            plugin,
            manifest = %manifest.display(),
            bundle = %found.digest(),
            "plugin `{plugin}` is unsigned, allowed from its directory{}",
            if self.configured { " by [trust] allow_unsigned" } else { " (no [trust] configured)" }
        );
        Ok(Provenance {
            digest: found.digest(),
            signer: "unsigned".into(),
            publisher: None,
        })
    }
}

/// Reads a statement or signature file: a regular file of a few lines.
fn read_small(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a regular file of at most {MAX_FILE_BYTES} bytes"),
        ));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

/// The key ID of a minisign public key (base64: algorithm, 8-byte ID, key)
/// as minisign prints it: the ID's bytes as a little-endian number in hex.
fn key_id(public_key: &str) -> Option<String> {
    id_of(public_key)
}

/// The key ID a signature file names (its second line: algorithm, 8-byte
/// key ID, signature).
fn signature_key_id(signature: &str) -> Option<String> {
    id_of(signature.lines().nth(1)?)
}

fn id_of(base64_line: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64_line.trim())
        .ok()?;
    let id = bytes.get(2..10)?;
    Some(id.iter().rev().map(|b| format!("{b:02X}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement() -> Statement {
        Statement::of(
            "greeter",
            "0.1.0",
            b"name = \"greeter\"\n",
            &"ab".repeat(32),
        )
    }

    #[test]
    fn a_statement_reads_back_exactly_and_nothing_else_is_accepted() {
        let s = statement();
        assert_eq!(Statement::parse(&s.text()).unwrap(), s);
        let text = s.text();
        for bad in [
            text.replace("v1", "v2"),
            text.replace("name greeter", "name  greeter"),
            format!("{text}extra\n"),
            text.trim_end().to_owned(),
            text.replace(&"ab".repeat(32), &"AB".repeat(32)),
            text.replace("version 0.1.0\n", ""),
        ] {
            assert!(Statement::parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_ids_read_as_minisign_prints_them() {
        // `minisign -G` printed this key as ID FFD45257468EBD77.
        assert_eq!(
            key_id("RWR3vY5GV1LU/3U8Y+3C6OfBcWycWuIZGbt0bZfsthbEUbN6L7/WpJt8").as_deref(),
            Some("FFD45257468EBD77")
        );
    }
}
