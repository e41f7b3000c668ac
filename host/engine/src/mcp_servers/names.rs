//! The names an MCP server's tools are offered to the model by.
//!
//! MCP allows tool names of 1 to 128 characters of `A-Z a-z 0-9 _ - .`
//! (revision 2025-11-25): hyphens and capitals are common (the reference
//! `server-everything`'s `get-sum`, FastMCP's camelCase functions). The
//! model APIs Warden speaks accept `[A-Za-z0-9_-]`, at most
//! [`MAX_MODEL_TOOL_NAME`] bytes, beginning with a letter (the strictest of
//! them). A tool is offered as `<key>__<suffix>`, the key beginning with a
//! letter, where the suffix is, in order:
//!
//! 1. the operator's `rename` for it, when set (checked with the agent);
//! 2. its own name, when that fits as it is;
//! 3. else its name with every other character made `_`, cut to fit, and
//!    `_` with 8 hex digits of the SHA-256 of the whole name appended, so
//!    two names never map to one and a mapping does not depend on what
//!    else the server lists.
//!
//! Everything the operator writes about a tool (its settings, its pins, its
//! approval rule) names it by the server's name; the model, the run's log
//! and the approvals by the offered one; [`McpConnection`](super::McpConnection)
//! calls the server by its own.

use sha2::{Digest as _, Sha256};

use super::McpServer;
use crate::view::MAX_MODEL_TOOL_NAME;

/// The longest tool name MCP allows.
pub const MAX_MCP_TOOL_NAME: usize = 128;

/// Whether `name` is a tool name MCP allows: 1 to 128 characters of
/// `A-Z a-z 0-9 _ - .`.
pub fn is_mcp_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MCP_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether `suffix` may follow `<key>__` in a name every model API accepts.
fn fits(key: &str, suffix: &str) -> bool {
    !suffix.is_empty()
        && key.len() + 2 + suffix.len() <= MAX_MODEL_TOOL_NAME
        && suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Why `rename` cannot be the offered name of a tool of server `key`, if it
/// cannot.
pub(crate) fn check_rename(key: &str, rename: &str) -> Option<String> {
    (!fits(key, rename)).then(|| {
        format!(
            "must be 1 or more of A-Z a-z 0-9 _ - and `{key}__` with it at most {MAX_MODEL_TOOL_NAME} bytes, got `{rename}`"
        )
    })
}

/// What follows `<key>__` in the name the model calls `server`'s tool
/// `name` by (see the module's doc).
pub fn model_suffix(server: &McpServer, name: &str) -> String {
    if let Some(rename) = server.tools.get(name).and_then(|t| t.rename.as_ref()) {
        return rename.clone();
    }
    if fits(&server.key, name) {
        return name.to_owned();
    }
    let hash = &hex::encode(Sha256::digest(name.as_bytes()))[..8];
    let room = MAX_MODEL_TOOL_NAME.saturating_sub(server.key.len() + 2 + 1 + hash.len());
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(room)
        .collect();
    format!("{mapped}_{hash}")
}

/// The name the model calls `server`'s tool `name` by: `<key>__<suffix>`.
pub fn model_name(server: &McpServer, name: &str) -> String {
    format!("{}__{}", server.key, model_suffix(server, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp_servers::{McpToolSettings, McpTransport, RemoteServer};
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn server(key: &str, renames: &[(&str, &str)]) -> McpServer {
        McpServer {
            key: key.into(),
            transport: McpTransport::Remote(RemoteServer {
                url: "http://127.0.0.1:1/mcp".into(),
                header_env: BTreeMap::new(),
                hosts: vec![],
            }),
            timeout: super::super::DEFAULT_TIMEOUT,
            max_output: super::super::DEFAULT_MAX_OUTPUT,
            tools: renames
                .iter()
                .map(|(name, rename)| {
                    (
                        (*name).to_owned(),
                        McpToolSettings {
                            rename: Some((*rename).to_owned()),
                            ..McpToolSettings::default()
                        },
                    )
                })
                .collect(),
            approval: BTreeMap::new(),
            pins: PathBuf::from("p.json"),
        }
    }

    #[test]
    fn hyphens_and_capitals_are_offered_as_they_are() {
        let s = server("ev", &[]);
        for name in ["get-sum", "getWeather", "read_file", "A-b_C"] {
            assert_eq!(model_name(&s, name), format!("ev__{name}"));
        }
    }

    #[test]
    fn other_names_are_mapped_to_distinct_names_every_model_api_accepts() {
        let s = server("ev", &[]);
        let long = "x".repeat(MAX_MCP_TOOL_NAME);
        let names = ["files.read", "files_read", "files-read", "a.b.c", &long];
        let mapped: Vec<String> = names.iter().map(|n| model_name(&s, n)).collect();
        for (name, m) in names.iter().zip(&mapped) {
            assert!(is_mcp_tool_name(name), "{name}");
            assert!(m.len() <= MAX_MODEL_TOOL_NAME, "{m}");
            assert!(
                m.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{m}"
            );
            assert!(m.starts_with("ev__"), "{m}");
        }
        assert!(mapped[0].starts_with("ev__files_read_"), "{}", mapped[0]);
        assert_eq!(mapped[1], "ev__files_read");
        let distinct: std::collections::BTreeSet<_> = mapped.iter().collect();
        assert_eq!(distinct.len(), mapped.len(), "{mapped:?}");
        // The same name maps the same way every time.
        assert_eq!(model_name(&s, "files.read"), mapped[0]);
    }

    #[test]
    fn the_operators_rename_wins_and_is_checked() {
        let s = server("ev", &[("files.read", "read_files")]);
        assert_eq!(model_name(&s, "files.read"), "ev__read_files");
        assert!(check_rename("ev", "read_files").is_none());
        for bad in ["", "a.b", "has space", &"x".repeat(61)] {
            assert!(check_rename("ev", bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn mcp_names_are_its_characters_up_to_128() {
        for good in ["a", "get-sum", "getSum", "a.b", "_x", &"x".repeat(128)] {
            assert!(is_mcp_tool_name(good), "{good}");
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(129)] {
            assert!(!is_mcp_tool_name(bad), "{bad}");
        }
    }
}
