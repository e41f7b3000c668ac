//! Granted secrets: the `[secrets.<name>]` table of a grant, where each
//! value comes from (an environment variable, a file only its owner can
//! read, or the encrypted secrets file `warden secrets` manages), and the
//! keyed version digest receipts record instead of the value.
//!
//! ```toml
//! [secrets.api_token]
//! env = "API_TOKEN"              # exactly one source: env, file or store
//! # file = "./token.txt"         # relative to the grant's file; mode 0600 or 0400
//! # store = "api_token"          # a name in the encrypted secrets file
//! hosts = ["api.example.com"]    # where the host may attach it; each among `hosts`
//! reveal = false                 # true lets the plugin read the value
//! ```
//!
//! The version digest is an HMAC-SHA256 of the name and value, keyed with
//! the secrets key (`WARDEN_SECRETS_KEY`, or the file `WARDEN_SECRETS_KEY_FILE`
//! names): a value's plain hash could be checked against guesses by anyone
//! who reads the log, a keyed one only by whoever holds the key. Without a
//! key, no version is recorded.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest secret file read, in bytes.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;

/// The environment variable holding the secrets key itself.
pub const KEY_VAR: &str = "WARDEN_SECRETS_KEY";
/// The environment variable naming a file holding the secrets key.
pub const KEY_FILE_VAR: &str = "WARDEN_SECRETS_KEY_FILE";

/// One secret granted to a plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretGrant {
    /// The host environment variable holding the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// A file holding the value (one trailing newline is dropped), relative
    /// to the file the grant is in. It must be a regular file that neither
    /// its group nor others can read or write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The name of the value in the encrypted secrets file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The hosts the secret may be attached to (host patterns, each
    /// covered by one of the grant's `hosts`). Default: none, so it can
    /// only be revealed.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Whether the plugin may read the value. Default: false (use by
    /// handle only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reveal: bool,
}

/// Whether `name` is a valid secret name: `[A-Za-z][A-Za-z0-9_-]*`, at most
/// 64 bytes.
pub fn is_valid_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Reads the value `grant` names. The error says what is wrong and what to
/// do; it never holds the value.
pub(crate) fn read_value(
    grant: &SecretGrant,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    match (&grant.env, &grant.file, &grant.store) {
        (Some(var), None, None) => {
            env(var).ok_or_else(|| format!("environment variable `{var}` is not set on the host"))
        }
        (None, Some(file), None) => read_file(&base_dir.join(file)),
        (None, None, Some(name)) => crate::secret_store::read(name, env),
        (None, None, None) => Err("names no source: set one of `env`, `file` or `store`".into()),
        _ => Err("names more than one source: set one of `env`, `file` or `store`".into()),
    }
}

/// A secret file's value: a regular file, neither group- nor
/// other-accessible, at most [`MAX_SECRET_FILE_BYTES`].
fn read_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("file `{shown}`: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("file `{shown}`: {e}"))?;
    if !meta.is_file() {
        return Err(format!("file `{shown}` is not a regular file"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "file `{shown}` has mode {mode:04o}: others could read it; `chmod 600` it"
            ));
        }
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "file `{shown}` is over {MAX_SECRET_FILE_BYTES} bytes"
        ));
    }
    let mut text = String::new();
    file.take(MAX_SECRET_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("file `{shown}`: {e}"))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// The secrets key's text, from [`KEY_VAR`] or the file [`KEY_FILE_VAR`]
/// names (surrounding whitespace dropped), if either is set.
pub(crate) fn key_text(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    if let Some(key) = env(KEY_VAR) {
        return Ok(Some(key.trim().to_owned()));
    }
    match env(KEY_FILE_VAR) {
        Some(path) => read_file(Path::new(&path))
            .map(|k| Some(k.trim().to_owned()))
            .map_err(|e| format!("the secrets key ({KEY_FILE_VAR}): {e}")),
        None => Ok(None),
    }
}

/// The version digest of `value` under `key`: `hmac-sha256:` and the first
/// 16 bytes of the MAC, hex. Changes when the value changes; says nothing
/// of the value to whoever lacks the key.
pub fn version_digest(key: &str, name: &str, value: &str) -> String {
    // Its own key, derived from the secrets key, so a digest never doubles
    // as anything the encryption uses.
    let key = Sha256::new()
        .chain_update(b"warden secret version\0")
        .chain_update(key.as_bytes())
        .finalize();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let mut mac = ring::hmac::Context::with_key(&key);
    mac.update(name.as_bytes());
    mac.update(b"\0");
    mac.update(value.as_bytes());
    let tag = mac.sign();
    format!("hmac-sha256:{}", hex::encode(&tag.as_ref()[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn exactly_one_source_is_named() {
        let both = SecretGrant {
            env: Some("A".into()),
            store: Some("a".into()),
            ..SecretGrant::default()
        };
        assert!(
            read_value(&both, Path::new("."), &no_env)
                .unwrap_err()
                .contains("more than one")
        );
        assert!(
            read_value(&SecretGrant::default(), Path::new("."), &no_env)
                .unwrap_err()
                .contains("no source")
        );
        let env = SecretGrant {
            env: Some("TOKEN".into()),
            ..SecretGrant::default()
        };
        assert!(
            read_value(&env, Path::new("."), &no_env)
                .unwrap_err()
                .contains("`TOKEN` is not set")
        );
        assert_eq!(
            read_value(&env, Path::new("."), &|k: &str| (k == "TOKEN")
                .then(|| "v".to_owned()))
            .unwrap(),
            "v"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let grant = SecretGrant {
            file: Some("token".into()),
            ..SecretGrant::default()
        };
        let err = read_value(&grant, dir.path(), &no_env).unwrap_err();
        assert!(err.contains("0644") && err.contains("chmod 600"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_value(&grant, dir.path(), &no_env).unwrap(), "s3cr3t");
        let dir_grant = SecretGrant {
            file: Some(".".into()),
            ..SecretGrant::default()
        };
        assert!(read_value(&dir_grant, dir.path(), &no_env).is_err());
    }

    #[test]
    fn the_version_is_keyed_and_changes_with_the_value() {
        let a = version_digest("key-1", "token", "value-1");
        assert!(a.starts_with("hmac-sha256:") && a.len() == 12 + 32, "{a}");
        assert_eq!(a, version_digest("key-1", "token", "value-1"));
        assert_ne!(a, version_digest("key-1", "token", "value-2"));
        assert_ne!(a, version_digest("key-2", "token", "value-1"));
        let plain = hex::encode(Sha256::digest(b"value-1"));
        assert!(!plain.contains(&a["hmac-sha256:".len()..]));
    }

    #[test]
    fn names_are_checked() {
        assert!(is_valid_secret_name("api_token-2"));
        assert!(!is_valid_secret_name("2x"));
        assert!(!is_valid_secret_name("a.b"));
        assert!(!is_valid_secret_name(""));
    }
}
