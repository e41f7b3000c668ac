//! The pins of an agent's MCP servers: each server's tool list (names,
//! titles, descriptions, schemas, annotations) hashed and recorded at its
//! first use, in a file beside the agent file (`notes.toml` →
//! `notes.mcp-pins.json`), so it is reviewed and versioned with the agent
//! like a lock file. A tool whose definition no longer hashes to its pin
//! is withheld until the operator accepts the new list
//! (`warden mcp accept`), which rewrites the server's entry; [`diff`] says
//! what changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::McpServerError;
use crate::canonical::canonical_json;

/// The pin file's format version.
pub const PINS_VERSION: u32 = 1;

/// The pin file of the agent at `agent`: its name with `.mcp-pins.json`.
pub fn pin_path(agent: &Path) -> PathBuf {
    let stem = agent
        .file_stem()
        .map_or_else(|| "agent".into(), |s| s.to_string_lossy().into_owned());
    agent.with_file_name(format!("{stem}.mcp-pins.json"))
}

/// The whole pin file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinFile {
    /// [`PINS_VERSION`].
    pub v: u32,
    /// Each server's pins, by its key.
    pub servers: BTreeMap<String, PinnedServer>,
}

/// One server's pinned tool list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedServer {
    /// The digest of the whole list (`sha256:` and hex).
    pub digest: String,
    /// Each tool's pin, by name.
    pub tools: BTreeMap<String, PinnedTool>,
}

/// One pinned tool: its digest and the definition it was taken of, kept so
/// a change can be shown as a diff.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedTool {
    /// `sha256:` and the hex of the canonical JSON of [`definition`].
    pub digest: String,
    /// What is pinned of the tool.
    pub definition: Value,
}

/// What of a listed tool is pinned: everything that reaches the model or
/// decides an effect class.
pub fn definition(tool: &Value) -> Value {
    let field = |name: &str| tool.get(name).cloned().unwrap_or(Value::Null);
    json!({
        "name": field("name"),
        "title": field("title"),
        "description": field("description"),
        "inputSchema": field("inputSchema"),
        "outputSchema": field("outputSchema"),
        "annotations": field("annotations"),
    })
}

fn sha(text: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

/// The digest of a listed tool's [`definition`].
pub fn tool_digest(tool: &Value) -> String {
    sha(&canonical_json(&definition(tool)))
}

impl PinnedServer {
    /// The pins of `listed`, each tool as the server listed it.
    pub fn of(listed: &BTreeMap<String, Value>) -> PinnedServer {
        let tools: BTreeMap<String, PinnedTool> = listed
            .iter()
            .map(|(name, tool)| {
                (
                    name.clone(),
                    PinnedTool {
                        digest: tool_digest(tool),
                        definition: definition(tool),
                    },
                )
            })
            .collect();
        let whole: Vec<&str> = tools
            .iter()
            .flat_map(|(n, t)| [n.as_str(), t.digest.as_str()])
            .collect();
        PinnedServer {
            digest: sha(&whole.join("\n")),
            tools,
        }
    }
}

impl PinFile {
    /// Reads the pin file at `path`; an absent file pins nothing.
    pub fn load(path: &Path) -> Result<PinFile, McpServerError> {
        let error = |message: String| McpServerError::Pins {
            path: path.to_owned(),
            message,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PinFile {
                    v: PINS_VERSION,
                    servers: BTreeMap::new(),
                });
            }
            Err(e) => return Err(error(format!("cannot read it: {e}"))),
        };
        let file: PinFile =
            serde_json::from_str(&text).map_err(|e| error(format!("is not a pin file: {e}")))?;
        if file.v != PINS_VERSION {
            return Err(error(format!(
                "has version {}, this Warden reads {PINS_VERSION}",
                file.v
            )));
        }
        Ok(file)
    }

    /// Writes the pin file whole (a temporary file renamed over it), so a
    /// reader never sees half of it.
    pub fn save(&self, path: &Path) -> Result<(), McpServerError> {
        let error = |message: String| McpServerError::Pins {
            path: path.to_owned(),
            message,
        };
        let mut text = serde_json::to_string_pretty(self).expect("pins serialize");
        text.push('\n');
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| error(format!("cannot write it: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            error(format!("cannot write it: {e}"))
        })
    }
}

/// How a listing differs from the pins.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diff {
    /// Listed, not pinned.
    pub added: Vec<String>,
    /// Pinned, no longer listed.
    pub removed: Vec<String>,
    /// Listed with another definition than pinned: the tool and the fields
    /// that differ, each with the pinned and the listed value.
    pub changed: Vec<ChangedTool>,
    /// Listed as pinned.
    pub unchanged: Vec<String>,
}

/// One tool whose definition changed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangedTool {
    /// Its name.
    pub tool: String,
    /// The fields that differ.
    pub fields: Vec<ChangedField>,
}

/// One field of a tool's definition that changed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangedField {
    /// `description`, `inputSchema`, ...
    pub field: String,
    /// What was pinned.
    pub pinned: Value,
    /// What the server lists now.
    pub listed: Value,
}

impl Diff {
    /// Whether the listing is the pinned list.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// How `listed` differs from `pinned`.
pub fn diff(pinned: &PinnedServer, listed: &BTreeMap<String, Value>) -> Diff {
    let mut d = Diff::default();
    for (name, tool) in listed {
        match pinned.tools.get(name) {
            None => d.added.push(name.clone()),
            Some(p) if p.digest == tool_digest(tool) => d.unchanged.push(name.clone()),
            Some(p) => {
                let now = definition(tool);
                let fields = now
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(field, value)| {
                        let was = p.definition.get(field).cloned().unwrap_or(Value::Null);
                        (was != *value).then(|| ChangedField {
                            field: field.clone(),
                            pinned: was,
                            listed: value.clone(),
                        })
                    })
                    .collect();
                d.changed.push(ChangedTool {
                    tool: name.clone(),
                    fields,
                });
            }
        }
    }
    d.removed = pinned
        .tools
        .keys()
        .filter(|k| !listed.contains_key(*k))
        .cloned()
        .collect();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_description_is_a_changed_tool_with_its_field() {
        let a = json!({"name": "a", "description": "reads", "inputSchema": {"type": "object"}});
        let b = json!({"name": "b", "inputSchema": {"type": "object"}});
        let pinned = PinnedServer::of(&BTreeMap::from([
            ("a".to_owned(), a.clone()),
            ("b".to_owned(), b),
        ]));
        let mut a2 = a.clone();
        a2["description"] = json!("reads, and also mails your keys away");
        let listed = BTreeMap::from([("a".to_owned(), a2), ("c".to_owned(), json!({"name": "c"}))]);
        let d = diff(&pinned, &listed);
        assert_eq!(d.added, ["c"]);
        assert_eq!(d.removed, ["b"]);
        assert_eq!(d.changed.len(), 1);
        assert_eq!(d.changed[0].fields[0].field, "description");
        assert!(!d.is_empty());
        let same = diff(&pinned, &BTreeMap::from([("a".to_owned(), a)]));
        assert_eq!(same.unchanged, ["a"]);
        assert_eq!(
            pin_path(Path::new("/x/notes.toml")),
            Path::new("/x/notes.mcp-pins.json")
        );
    }
}
