//! Where a store lives, as operators write it: one parser for every surface
//! that opens a store by text (the command line, its configuration file and
//! environment, the Python package), so the same text opens the same store
//! everywhere.

use std::fmt;
use std::path::{Path, PathBuf};

/// A store named by text: a SQLite file or a PostgreSQL database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by URL (password included; [`fmt::Display`]
    /// hides it).
    Postgres(String),
}

/// Text that names no store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidStoreLocation {
    /// A `scheme://` other than `sqlite`, `postgres` or `postgresql`.
    #[error(
        "unknown store scheme `{0}`: use a SQLite file path, sqlite:PATH or postgres://USER@HOST/DB"
    )]
    UnknownScheme(String),
    /// Nothing after the scheme, or nothing at all.
    #[error("the store path is empty: give a SQLite file path or a postgres:// URL")]
    Empty,
}

impl StoreLocation {
    /// Reads `text`: `postgres://…` (or `postgresql://…`), `sqlite:PATH`,
    /// `sqlite://PATH` or a bare path; a relative path is resolved against
    /// `base`.
    pub fn parse(text: &str, base: &Path) -> Result<StoreLocation, InvalidStoreLocation> {
        let path = if let Some(rest) = text.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = text.strip_prefix("sqlite:") {
            rest
        } else if let Some((scheme, _)) = text.split_once("://") {
            return match scheme {
                "postgres" | "postgresql" => Ok(StoreLocation::Postgres(text.to_owned())),
                other => Err(InvalidStoreLocation::UnknownScheme(other.to_owned())),
            };
        } else {
            text
        };
        if path.trim().is_empty() {
            return Err(InvalidStoreLocation::Empty);
        }
        Ok(StoreLocation::Sqlite(base.join(path)))
    }
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreLocation::Postgres(url) => f.write_str(&without_password(url)),
        }
    }
}

/// `url` with the password of its user info, if any, replaced by `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_sqlite_file_names_the_same_file() {
        let base = Path::new("/srv/app");
        for text in ["x.db", "sqlite:x.db", "sqlite://x.db"] {
            assert_eq!(
                StoreLocation::parse(text, base).unwrap(),
                StoreLocation::Sqlite(PathBuf::from("/srv/app/x.db")),
                "{text}"
            );
        }
        assert_eq!(
            StoreLocation::parse("sqlite:///var/w.db", base).unwrap(),
            StoreLocation::Sqlite(PathBuf::from("/var/w.db"))
        );
    }

    #[test]
    fn urls_keep_their_text_and_hide_their_password() {
        let base = Path::new("/");
        let location = StoreLocation::parse("postgresql://u:pw@h:5432/db?schema=s", base).unwrap();
        assert_eq!(
            location,
            StoreLocation::Postgres("postgresql://u:pw@h:5432/db?schema=s".into())
        );
        assert_eq!(
            location.to_string(),
            "postgresql://u:***@h:5432/db?schema=s"
        );
        assert_eq!(without_password("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn bad_text_says_what_to_write_instead() {
        let base = Path::new("/");
        assert_eq!(
            StoreLocation::parse("mysql://h/db", base),
            Err(InvalidStoreLocation::UnknownScheme("mysql".into()))
        );
        for empty in ["", "sqlite:", "sqlite://", "  "] {
            assert_eq!(
                StoreLocation::parse(empty, base),
                Err(InvalidStoreLocation::Empty),
                "{empty:?}"
            );
        }
    }
}
