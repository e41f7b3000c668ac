//! The encrypted secrets file: named values in one file sealed with
//! ChaCha20-Poly1305 (RFC 8439, through `ring`) under the secrets key,
//! which `warden secrets set/list/rotate/remove` manages and grants name as
//! `store = "<name>"`.
//!
//! - **Where**: the file `WARDEN_SECRETS_FILE` names, by default
//!   `.warden/secrets.enc` (from the working directory, beside the default
//!   store). Written whole to a temporary file beside it (mode 0600),
//!   synced, then renamed over it, so a crash leaves the old file or the
//!   new one.
//! - **The key**: 32 random bytes as 64 hex digits, in
//!   `WARDEN_SECRETS_KEY`, or in the file `WARDEN_SECRETS_KEY_FILE` names,
//!   which must be private to its owner. `warden secrets keygen` writes one.
//!   The encryption key and the version digests' key (`secrets.rs`) are
//!   each derived from it apart.
//! - **The format**: `WARDEN-SECRETS-1\n`, a random 12-byte nonce drawn
//!   for each write, then the sealed JSON document; the first line is the
//!   additional data, so a file of another version is refused, not
//!   misread.
//! - **What the plaintext holds**: per name, the value and when it was set
//!   and rotated. Listing shows names, times and version digests, never a
//!   value.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::secrets::{KEY_FILE_VAR, KEY_VAR, is_valid_secret_name, key_text, version_digest};

/// The environment variable naming the secrets file.
pub const FILE_VAR: &str = "WARDEN_SECRETS_FILE";
/// The secrets file when [`FILE_VAR`] is not set.
pub const DEFAULT_FILE: &str = ".warden/secrets.enc";

/// The largest secrets file read, in bytes.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The first line of every secrets file, also sealed as additional data.
const MAGIC: &[u8] = b"WARDEN-SECRETS-1\n";

/// A secrets file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretStoreError {
    /// No key is set.
    #[error(
        "no secrets key: set {KEY_FILE_VAR} to a key file (`warden secrets keygen --out FILE` makes one) or {KEY_VAR} to the key"
    )]
    NoKey,
    /// The key is not 64 hex digits, or its file cannot be read.
    #[error("the secrets key is unusable: {0}")]
    BadKey(String),
    /// The file cannot be read, written or decrypted.
    #[error("secrets file `{path}`: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// No secret of that name is in the file.
    #[error(
        "secrets file `{path}` holds no secret `{name}` (`warden secrets list` shows the names)"
    )]
    Missing {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// `set` of a name that is already there.
    #[error("secret `{name}` is already set; `warden secrets rotate {name}` replaces its value")]
    Exists {
        /// The name.
        name: String,
    },
    /// The name is not a secret name.
    #[error("`{name}` is not a secret name (use [A-Za-z][A-Za-z0-9_-]*, at most 64 bytes)")]
    BadName {
        /// The name.
        name: String,
    },
}

impl SecretStoreError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            SecretStoreError::NoKey | SecretStoreError::BadKey(_) => "secrets_key_invalid",
            SecretStoreError::File { .. } => "secrets_file_invalid",
            SecretStoreError::Missing { .. } => "secret_unknown",
            SecretStoreError::Exists { .. } => "secret_exists",
            SecretStoreError::BadName { .. } => "secret_name_invalid",
        }
    }
}

/// One value in the file.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    value: String,
    /// When it was first set, milliseconds since the Unix epoch.
    created_ms: u64,
    /// When its value last changed.
    updated_ms: u64,
    /// How many times it was rotated.
    rotations: u64,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plaintext {
    version: u32,
    secrets: BTreeMap<String, Entry>,
}

/// What `list` shows of one secret: never its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretListing {
    /// The name.
    pub name: String,
    /// Its version digest (keyed).
    pub version: String,
    /// When it was first set, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When its value last changed.
    pub updated_ms: u64,
    /// How many times it was rotated.
    pub rotations: u64,
}

/// The secrets file and its key.
pub struct SecretStore {
    path: PathBuf,
    /// The key's text, for the version digests.
    key: String,
    /// The encryption key, derived from it.
    sealing: ring::aead::LessSafeKey,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SecretStore {
    /// The secrets file and key the environment `env` names.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, SecretStoreError> {
        let key = key_text(env)
            .map_err(SecretStoreError::BadKey)?
            .ok_or(SecretStoreError::NoKey)?;
        let key = key
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap_or_default()
            .to_owned();
        let bytes = hex::decode(&key)
            .ok()
            .filter(|b| b.len() == 32)
            .ok_or_else(|| {
                SecretStoreError::BadKey(
                    "not 64 hex digits (`warden secrets keygen` makes a key)".into(),
                )
            })?;
        let derived = Sha256::new()
            .chain_update(b"warden secrets file\0")
            .chain_update(&bytes)
            .finalize();
        let sealing = ring::aead::LessSafeKey::new(
            ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &derived)
                .expect("a 32-byte key fits ChaCha20-Poly1305"),
        );
        let path = env(FILE_VAR).map_or_else(|| PathBuf::from(DEFAULT_FILE), PathBuf::from);
        Ok(SecretStore { path, key, sealing })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, reason: impl std::fmt::Display) -> SecretStoreError {
        SecretStoreError::File {
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    fn load(&self) -> Result<Plaintext, SecretStoreError> {
        use std::io::Read;
        let file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Plaintext {
                    version: 1,
                    ..Plaintext::default()
                });
            }
            Err(e) => return Err(self.error(e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.error(e))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(self.error(format!("is over {MAX_FILE_BYTES} bytes")));
        }
        let plain = self.open(bytes)?;
        let text: Plaintext = serde_json::from_slice(&plain)
            .map_err(|e| self.error(format!("decrypts to an unreadable document: {e}")))?;
        if text.version != 1 {
            return Err(self.error(format!(
                "is of version {}, which this warden does not read",
                text.version
            )));
        }
        Ok(text)
    }

    /// The document sealed bytes hold, or why they do not.
    fn open(&self, mut bytes: Vec<u8>) -> Result<Vec<u8>, SecretStoreError> {
        use ring::aead::{Aad, NONCE_LEN, Nonce};
        let Some(rest) = bytes.strip_prefix(MAGIC) else {
            return Err(
                self.error("is not a warden secrets file (its first line is not WARDEN-SECRETS-1)")
            );
        };
        if rest.len() < NONCE_LEN {
            return Err(self.error("is cut short"));
        }
        let nonce =
            Nonce::try_assume_unique_for_key(&rest[..NONCE_LEN]).expect("the nonce has its length");
        let start = MAGIC.len() + NONCE_LEN;
        let plain = self
            .sealing
            .open_in_place(nonce, Aad::from(MAGIC), &mut bytes[start..])
            .map_err(|_| {
                self.error(format!(
                    "cannot be decrypted with this key (or was changed); is {KEY_VAR} or {KEY_FILE_VAR} the key it was written with?"
                ))
            })?;
        Ok(plain.to_vec())
    }

    fn save(&self, text: &Plaintext) -> Result<(), SecretStoreError> {
        use ring::aead::{Aad, NONCE_LEN, Nonce};
        use ring::rand::SecureRandom as _;
        let mut nonce = [0u8; NONCE_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| self.error("no randomness for the nonce"))?;
        let mut sealed = serde_json::to_vec(text).expect("the document serializes");
        self.sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(MAGIC),
                &mut sealed,
            )
            .map_err(|_| self.error("cannot be sealed"))?;
        let sealed = [MAGIC, &nonce, &sealed].concat();
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| self.error(e))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".secrets-")
            .permissions(private())
            .tempfile_in(&dir)
            .map_err(|e| self.error(e))?;
        tmp.write_all(&sealed).map_err(|e| self.error(e))?;
        tmp.as_file().sync_all().map_err(|e| self.error(e))?;
        tmp.persist(&self.path).map_err(|e| self.error(e.error))?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Result<String, SecretStoreError> {
        self.load()?
            .secrets
            .remove(name)
            .map(|e| e.value)
            .ok_or_else(|| SecretStoreError::Missing {
                path: self.path.clone(),
                name: name.to_owned(),
            })
    }

    /// Adds `name` with `value`; refuses a name already there.
    pub fn set(&self, name: &str, value: &str, now_ms: u64) -> Result<(), SecretStoreError> {
        check_name(name)?;
        let mut text = self.load()?;
        if text.secrets.contains_key(name) {
            return Err(SecretStoreError::Exists {
                name: name.to_owned(),
            });
        }
        text.secrets.insert(
            name.to_owned(),
            Entry {
                value: value.to_owned(),
                created_ms: now_ms,
                updated_ms: now_ms,
                rotations: 0,
            },
        );
        self.save(&text)
    }

    /// Replaces the value of `name`, which must be there.
    pub fn rotate(&self, name: &str, value: &str, now_ms: u64) -> Result<(), SecretStoreError> {
        let mut text = self.load()?;
        let Some(entry) = text.secrets.get_mut(name) else {
            return Err(SecretStoreError::Missing {
                path: self.path.clone(),
                name: name.to_owned(),
            });
        };
        entry.value = value.to_owned();
        entry.updated_ms = now_ms;
        entry.rotations += 1;
        self.save(&text)
    }

    /// Removes `name`, which must be there.
    pub fn remove(&self, name: &str) -> Result<(), SecretStoreError> {
        let mut text = self.load()?;
        if text.secrets.remove(name).is_none() {
            return Err(SecretStoreError::Missing {
                path: self.path.clone(),
                name: name.to_owned(),
            });
        }
        self.save(&text)
    }

    /// Every secret's name, version digest and times, by name.
    pub fn list(&self) -> Result<Vec<SecretListing>, SecretStoreError> {
        Ok(self
            .load()?
            .secrets
            .into_iter()
            .map(|(name, e)| SecretListing {
                version: version_digest(&self.key, &name, &e.value),
                name,
                created_ms: e.created_ms,
                updated_ms: e.updated_ms,
                rotations: e.rotations,
            })
            .collect())
    }
}

/// A new secrets key, as the text a key file holds.
pub fn generate_key() -> String {
    use ring::rand::SecureRandom as _;
    let mut key = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .expect("the system has randomness");
    format!("# warden secrets key\n{}\n", hex::encode(key))
}

fn check_name(name: &str) -> Result<(), SecretStoreError> {
    if is_valid_secret_name(name) {
        Ok(())
    } else {
        Err(SecretStoreError::BadName {
            name: name.to_owned(),
        })
    }
}

#[cfg(unix)]
fn private() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(0o600)
}

#[cfg(not(unix))]
fn private() -> std::fs::Permissions {
    std::fs::metadata(".")
        .map(|m| m.permissions())
        .expect("the working directory has metadata")
}

/// The value of `name` in the secrets file the environment names, for a
/// grant's `store = "<name>"`. The error never holds a value.
pub(crate) fn read(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    SecretStore::from_env(env)
        .and_then(|store| store.get(name))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_for(dir: &Path, key: &str) -> impl Fn(&str) -> Option<String> + use<> {
        let file = dir.join("s.enc").display().to_string();
        let key = key.to_owned();
        move |k: &str| match k {
            FILE_VAR => Some(file.clone()),
            KEY_VAR => Some(key.clone()),
            _ => None,
        }
    }

    #[test]
    fn values_round_trip_encrypted_and_listing_shows_no_value() {
        let dir = tempfile::tempdir().unwrap();
        let key = generate_key();
        let env = env_for(dir.path(), &key);
        let store = SecretStore::from_env(&env).unwrap();
        store.set("api", "first-value-123", 1).unwrap();
        assert!(matches!(
            store.set("api", "x", 2),
            Err(SecretStoreError::Exists { .. })
        ));
        let raw = std::fs::read(dir.path().join("s.enc")).unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains("first-value-123"));
        assert_eq!(read("api", &env).unwrap(), "first-value-123");
        let before = store.list().unwrap();
        store.rotate("api", "second-value-456", 3).unwrap();
        let after = store.list().unwrap();
        assert_ne!(before[0].version, after[0].version);
        assert_eq!((after[0].rotations, after[0].updated_ms), (1, 3));
        assert!(!format!("{after:?}").contains("second-value"));
        store.remove("api").unwrap();
        assert!(
            read("api", &env)
                .unwrap_err()
                .contains("holds no secret `api`")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("s.enc"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn another_key_cannot_read_it_and_no_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::from_env(&env_for(dir.path(), &generate_key())).unwrap();
        store.set("api", "v", 1).unwrap();
        let other = env_for(dir.path(), &generate_key());
        let err = read("api", &other).unwrap_err();
        assert!(err.contains("cannot be decrypted"), "{err}");
        let err = read("api", &|_: &str| None).unwrap_err();
        assert!(err.contains("no secrets key"), "{err}");
        let bad = env_for(dir.path(), "not a key");
        assert!(read("api", &bad).unwrap_err().contains("unusable"));
        // A changed byte anywhere is refused, never misread.
        let path = dir.path().join("s.enc");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(
            store
                .get("api")
                .unwrap_err()
                .to_string()
                .contains("cannot be decrypted")
        );
    }
}
