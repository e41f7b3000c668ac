//! Who may call the API: named tokens, each with a [`Role`], kept in a
//! TOML file that holds only each token's SHA-256 (a stolen file lets no
//! one in). A token is 32 random bytes, shown once when it is made
//! ([`add`]); the server hashes what a request presents and compares the
//! digest with every entry in constant time.
//!
//! ```toml
//! [[token]]
//! name = "alice"
//! role = "approver"
//! sha256 = "9f86d0…"
//! expires_ms = 1767225600000   # optional: refused from then on
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// What a token may do. Each role may do what the ones before it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads runs, events, sessions and keys.
    Viewer,
    /// And approves or denies calls.
    Approver,
    /// And resumes, resolves, cancels and abandons runs.
    Operator,
}

impl Role {
    /// Its name in the file and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Approver => "approver",
            Role::Operator => "operator",
        }
    }

    /// The role named `text`.
    pub fn parse(text: &str) -> Result<Role, TokenError> {
        match text {
            "viewer" => Ok(Role::Viewer),
            "approver" => Ok(Role::Approver),
            "operator" => Ok(Role::Operator),
            other => Err(TokenError::UnknownRole {
                role: other.to_owned(),
            }),
        }
    }
}

/// One token of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who holds it: recorded as `api:<name>` on every decision it makes.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The token's SHA-256, lowercase hex.
    pub sha256: String,
    /// When the token stops being accepted, in milliseconds since the Unix
    /// epoch; never, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
}

impl TokenEntry {
    /// Whether the token is past its expiry at `now_ms`.
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_ms.is_some_and(|at| now_ms >= at)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// There is no file: the server refuses to start without credentials.
    #[error(
        "no API tokens at `{}`: `warden serve` refuses to start without credentials; make one with `warden serve tokens add NAME --role viewer|approver|operator`",
        file.display()
    )]
    Missing {
        /// The file looked at.
        file: PathBuf,
    },
    /// The file names no token.
    #[error(
        "the token file `{}` holds no token: `warden serve` refuses to start without credentials; add one with `warden serve tokens add NAME --role ROLE`",
        file.display()
    )]
    Empty {
        /// The file.
        file: PathBuf,
    },
    /// The file is not a token file.
    #[error("the token file `{}` is invalid: {reason}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file cannot be read or written.
    #[error("cannot use the token file `{}`: {error}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A role that is not viewer, approver or operator.
    #[error("unknown role `{role}`: a token is a viewer, an approver or an operator")]
    UnknownRole {
        /// The role given.
        role: String,
    },
    /// A token of that name exists.
    #[error("the token file `{}` already has a token named `{name}`", file.display())]
    Exists {
        /// The file.
        file: PathBuf,
        /// The name.
        name: String,
    },
}

impl TokenError {
    /// The stable code of the error (docs/json-output.md).
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Missing { .. } | TokenError::Empty { .. } => "no_credentials",
            TokenError::Invalid { .. } => "tokens_invalid",
            TokenError::Io { .. } => "io_failed",
            TokenError::UnknownRole { .. } => "usage",
            TokenError::Exists { .. } => "token_exists",
        }
    }
}

/// The tokens the server accepts.
#[derive(Clone, Debug)]
pub struct Tokens {
    entries: Vec<TokenEntry>,
}

impl Tokens {
    /// The tokens of `file`; refused when it is missing, invalid or empty.
    pub fn read(file: &Path) -> Result<Tokens, TokenError> {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenError::Missing {
                    file: file.to_owned(),
                });
            }
            Err(error) => {
                return Err(TokenError::Io {
                    file: file.to_owned(),
                    error,
                });
            }
        };
        let tokens = Tokens {
            entries: parse(file, &text)?.token,
        };
        if tokens.entries.is_empty() {
            return Err(TokenError::Empty {
                file: file.to_owned(),
            });
        }
        Ok(tokens)
    }

    /// Tokens from entries (an embedder's own).
    pub fn from_entries(entries: Vec<TokenEntry>) -> Tokens {
        Tokens { entries }
    }

    /// The entry of `token`, if it is one of them. Every entry is compared,
    /// in constant time, whichever matches.
    pub fn identify(&self, token: &str) -> Option<&TokenEntry> {
        let presented = digest(token);
        let mut found = None;
        for entry in &self.entries {
            if constant_time_eq(presented.as_bytes(), entry.sha256.as_bytes()) {
                found = Some(entry);
            }
        }
        found
    }

    /// The entries, without their tokens (there are none to show).
    pub fn entries(&self) -> &[TokenEntry] {
        &self.entries
    }
}

fn parse(file: &Path, text: &str) -> Result<TokenFile, TokenError> {
    let parsed: TokenFile = toml::from_str(text).map_err(|e| TokenError::Invalid {
        file: file.to_owned(),
        reason: e.message().to_owned(),
    })?;
    for entry in &parsed.token {
        let hex_ok = entry.sha256.len() == 64
            && entry
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex_ok {
            return Err(TokenError::Invalid {
                file: file.to_owned(),
                reason: format!(
                    "token `{}`: sha256 must be 64 lowercase hex digits",
                    entry.name
                ),
            });
        }
        check_name(file, &entry.name)?;
    }
    Ok(parsed)
}

fn check_name(file: &Path, name: &str) -> Result<(), TokenError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::Invalid {
            file: file.to_owned(),
            reason: format!(
                "token name `{}` must be 1 to 64 letters, digits, `-`, `_`, `.` or `@`",
                name.escape_debug()
            ),
        })
    }
}

/// The SHA-256 of `token`, lowercase hex: what the file keeps.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Makes a token named `name` with `role`, adds its digest to `file`
/// (created, readable by its owner only, when missing), accepted until
/// `expires_ms` if given, and returns the token: the only time it is
/// shown.
pub fn add(
    file: &Path,
    name: &str,
    role: Role,
    expires_ms: Option<i64>,
) -> Result<String, TokenError> {
    check_name(file, name)?;
    let io = |error| TokenError::Io {
        file: file.to_owned(),
        error,
    };
    let mut parsed = match std::fs::read_to_string(file) {
        Ok(text) => parse(file, &text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenFile::default(),
        Err(e) => return Err(io(e)),
    };
    if parsed.token.iter().any(|t| t.name == name) {
        return Err(TokenError::Exists {
            file: file.to_owned(),
            name: name.to_owned(),
        });
    }
    let token = format!(
        "wdn_{}{}",
        hex::encode(rand::random::<u128>().to_be_bytes()),
        hex::encode(rand::random::<u128>().to_be_bytes())
    );
    parsed.token.push(TokenEntry {
        name: name.to_owned(),
        role,
        sha256: digest(&token),
        expires_ms,
    });
    let body = toml::to_string(&parsed).expect("a token file serializes");
    let text = format!(
        "# Warden API tokens (`warden serve`): each token's SHA-256, never the token.\n{body}"
    );
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Written beside and renamed over: a reader never sees half a file.
    let partial = file.with_extension("toml.partial");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut out = options.open(&partial).map_err(io)?;
    out.write_all(text.as_bytes()).map_err(io)?;
    out.sync_all().map_err(io)?;
    std::fs::rename(&partial, file).map_err(io)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_known_by_its_digest_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        let token = add(&file, "alice", Role::Approver, None).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&token), "the file holds the token: {text}");
        let tokens = Tokens::read(&file).unwrap();
        assert_eq!(tokens.identify(&token).unwrap().name, "alice");
        assert_eq!(tokens.identify(&token).unwrap().role, Role::Approver);
        assert!(tokens.identify("wdn_wrong").is_none());
        assert!(matches!(
            add(&file, "alice", Role::Viewer, None),
            Err(TokenError::Exists { .. })
        ));
    }

    #[test]
    fn an_expiry_is_kept_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        let token = add(&file, "temp", Role::Viewer, Some(1_000)).unwrap();
        add(&file, "kept", Role::Viewer, None).unwrap();
        let tokens = Tokens::read(&file).unwrap();
        let entry = tokens.identify(&token).unwrap();
        assert_eq!(entry.expires_ms, Some(1_000));
        assert!(!entry.is_expired(999));
        assert!(entry.is_expired(1_000));
        assert!(!tokens.entries()[1].is_expired(i64::MAX));
    }

    #[test]
    fn no_file_or_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        assert_eq!(Tokens::read(&file).unwrap_err().code(), "no_credentials");
        std::fs::write(&file, "").unwrap();
        assert_eq!(Tokens::read(&file).unwrap_err().code(), "no_credentials");
        std::fs::write(
            &file,
            "[[token]]\nname = \"a\"\nrole = \"viewer\"\nsha256 = \"x\"\n",
        )
        .unwrap();
        assert_eq!(Tokens::read(&file).unwrap_err().code(), "tokens_invalid");
    }
}
