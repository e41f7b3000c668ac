//! `notes-memory`: Warden's first-party durable memory. One component
//! exports two worlds: tools the agent calls to write notes, and a context
//! source that resolves the notes into the prompts of later runs. Notes are
//! JSON files in one read-write mount, `notes` (seen at [`MOUNT_ROOT`]).
//!
//! | tool | effect | arguments | output |
//! | --- | --- | --- | --- |
//! | `remember` | write | `text` (at most 16 KiB), `topic?` | `id`, `topic`, `created_ms`, `bytes` |
//! | `forget` | write | `id` | `id`, `forgotten` (whether it existed) |
//!
//! A note's id is derived from the call's idempotency key, so a `remember`
//! that is retried with the same key rewrites the same file instead of
//! adding a duplicate. Both tools have previews.
//!
//! The context source's `resolve` returns the newest notes first, one item
//! each: `source` is `notes/<id>` (with the topic, if any, in brackets),
//! `content` the text, `modified_ms` when it was remembered. The request's
//! `query` may be blank or `{"topic": "...", "limit": n}`. Config:
//! `max_notes` (default 50), `max_bytes` per note's content (default 4096).
//! A file in the mount that is not a note is skipped with a warning.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warden_guest::{
    Call, ContextError, ContextItem, ContextPlugin, ContextRequest, Effect, Preview, SourceSpec,
    Tool, ToolError, ToolPlugin, Toolbox, log,
};

/// Where the component sees the `notes` mount.
pub const MOUNT_ROOT: &str = "/notes";
/// Longest note text, in bytes.
pub const MAX_TEXT: usize = 16 << 10;
/// Default of the `max_notes` config value.
pub const DEFAULT_MAX_NOTES: usize = 50;
/// Default of the `max_bytes` config value.
pub const DEFAULT_MAX_BYTES: usize = 4096;

/// A note as stored: `<id>.json` in the mount.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Note {
    /// Derived from the idempotency key of the call that wrote it.
    pub id: String,
    /// What it is about, if the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The text.
    pub text: String,
    /// When it was remembered, milliseconds since the Unix epoch.
    pub created_ms: u64,
}

/// Arguments of `remember`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    /// What to remember, in plain words (at most 16 KiB).
    pub text: String,
    /// A short topic, so later runs can ask for notes about it.
    #[serde(default)]
    pub topic: Option<String>,
}

/// What `remember` returns.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Remembered {
    /// The note's id, for `forget`.
    pub id: String,
    /// Its topic.
    pub topic: Option<String>,
    /// When it was remembered.
    pub created_ms: u64,
    /// Bytes of text kept.
    pub bytes: usize,
}

/// Arguments of `forget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    /// The id `remember` returned.
    pub id: String,
}

/// What `forget` returns.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Forgotten {
    /// The id.
    pub id: String,
    /// Whether there was such a note.
    pub forgotten: bool,
}

/// A context request's optional JSON query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Only notes with this topic (case-insensitive).
    #[serde(default)]
    pub topic: Option<String>,
    /// At most this many notes (and never more than `max_notes`).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The notes in one directory.
#[derive(Clone, Debug)]
pub struct Notebook {
    root: PathBuf,
}

impl Notebook {
    /// The notes kept in `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Notebook { root: root.into() }
    }

    /// Writes a note for the call with `key`, at `now_ms`.
    pub fn remember(
        &self,
        args: RememberArgs,
        key: &str,
        now_ms: u64,
    ) -> Result<Remembered, ToolError> {
        let text = checked_text(&args.text)?;
        let topic = checked_topic(args.topic)?;
        let note = Note {
            id: note_id(key, &text),
            topic,
            text,
            created_ms: now_ms,
        };
        let path = self.path(&note.id);
        let json = serde_json::to_string_pretty(&note).expect("a note serializes");
        // A reader never sees half a note, and a crash leaves the note
        // whole or absent (synced, the rename included).
        warden_guest::fs::write_atomic(&path, json).map_err(|e| io_error("write", &note.id, e))?;
        Ok(Remembered {
            bytes: note.text.len(),
            id: note.id,
            topic: note.topic,
            created_ms: note.created_ms,
        })
    }

    /// Removes the note `id`.
    pub fn forget(&self, args: ForgetArgs) -> Result<Forgotten, ToolError> {
        check_id(&args.id)?;
        match std::fs::remove_file(self.path(&args.id)) {
            Ok(()) => Ok(Forgotten {
                id: args.id,
                forgotten: true,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Forgotten {
                id: args.id,
                forgotten: false,
            }),
            Err(e) => Err(io_error("remove", &args.id, e)),
        }
    }

    /// Every note, newest first (ties by id).
    pub fn notes(&self) -> Result<Vec<Note>, String> {
        let entries = std::fs::read_dir(&self.root)
            .map_err(|e| format!("cannot list the notes mount: {e}"))?;
        let mut notes = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let parsed = std::fs::read_to_string(entry.path())
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Note>(&t).map_err(|e| e.to_string()));
            match parsed {
                Ok(note) => notes.push(note),
                Err(e) => log::warn!("notes-memory: skipping `{name}`: {e}"),
            }
        }
        notes.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(a.id.cmp(&b.id)));
        Ok(notes)
    }

    /// The context items for `query`.
    pub fn resolve(
        &self,
        query: Query,
        max_notes: usize,
        max_bytes: usize,
    ) -> Result<Vec<ContextItem>, ContextError> {
        let limit = query.limit.unwrap_or(max_notes).min(max_notes);
        let notes = self.notes().map_err(ContextError::failed)?;
        Ok(notes
            .into_iter()
            .filter(|n| match (&query.topic, &n.topic) {
                (None, _) => true,
                (Some(want), Some(topic)) => want.eq_ignore_ascii_case(topic),
                (Some(_), None) => false,
            })
            .take(limit)
            .map(|n| {
                let source = match &n.topic {
                    Some(topic) => format!("notes/{} [{topic}]", n.id),
                    None => format!("notes/{}", n.id),
                };
                ContextItem::new(source, n.text)
                    .modified_ms(n.created_ms)
                    .truncate_to(max_bytes)
            })
            .collect())
    }

    fn path(&self, id: &str) -> PathBuf {
        self.root.join(format!("{id}.json"))
    }
}

fn checked_text(text: &str) -> Result<String, ToolError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ToolError::invalid_arguments("`text` is empty"));
    }
    if text.len() > MAX_TEXT {
        return Err(ToolError::invalid_arguments(format!(
            "`text` is {} bytes, more than {MAX_TEXT}",
            text.len()
        )));
    }
    Ok(text.to_owned())
}

fn checked_topic(topic: Option<String>) -> Result<Option<String>, ToolError> {
    match topic.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) if t.len() > 64 || t.contains(['\n', '[', ']']) => {
            Err(ToolError::invalid_arguments(format!(
                "`topic` `{t}` must be one line of at most 64 bytes without brackets"
            )))
        }
        Some(t) => Ok(Some(t.to_owned())),
    }
}

fn check_id(id: &str) -> Result<(), ToolError> {
    if id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ToolError::invalid_arguments(format!(
            "`{id}` is not a note id (16 hex digits, as `remember` returns)"
        )))
    }
}

/// A stable id for a note: FNV-1a of the idempotency key, or of the text
/// when there is no key (outside a run).
pub fn note_id(key: &str, text: &str) -> String {
    let seed = if key.is_empty() { text } else { key };
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seed.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn io_error(action: &str, id: &str, e: std::io::Error) -> ToolError {
    let message = format!("cannot {action} note `{id}`: {e}");
    match e.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            ToolError::denied(message)
        }
        _ => ToolError::failed(message),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The tools, keeping notes in `root`.
pub fn toolbox(root: impl Into<PathBuf>) -> Toolbox {
    let book = Notebook::new(root);
    let remember = book.clone();
    let forget = book.clone();
    Toolbox::new()
        .tool(
            Tool::new(
                "remember",
                "Remember a note for later runs: a fact, a decision, a preference. Later runs \
                 see remembered notes as context, newest first. Give a short `topic` to group \
                 related notes.",
                Effect::Write,
                move |args: RememberArgs, call: &Call| {
                    remember.remember(args, &call.idempotency_key, now_ms())
                },
            )
            .with_preflight(|args: RememberArgs, _call: &Call| {
                let text = checked_text(&args.text)?;
                let topic = checked_topic(args.topic)?;
                Ok(Preview::new(
                    match &topic {
                        Some(t) => format!("remember a note about `{t}` ({} bytes)", text.len()),
                        None => format!("remember a note ({} bytes)", text.len()),
                    },
                    text,
                ))
            }),
        )
        .tool(
            Tool::new(
                "forget",
                "Forget a note by the id `remember` returned.",
                Effect::Write,
                move |args: ForgetArgs, _call: &Call| forget.forget(args),
            )
            .with_preflight(|args: ForgetArgs, _call: &Call| {
                check_id(&args.id)?;
                Ok(Preview::new(format!("forget note `{}`", args.id), ""))
            }),
        )
}

/// The plugin as the component exports it, both worlds.
pub struct NotesMemory;

impl ToolPlugin for NotesMemory {
    fn toolbox() -> Toolbox {
        toolbox(MOUNT_ROOT)
    }
}

impl ContextPlugin for NotesMemory {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "notes-memory",
            "Notes the agent remembered in earlier runs, newest first",
        )
    }

    fn resolve(request: ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
        let query: Query = request.query_as()?;
        let number = |key: &str, default: usize| -> Result<usize, ContextError> {
            match warden_guest::config(key) {
                None => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    ContextError::invalid_request(format!(
                        "config `{key}` is `{v}`, expected a number"
                    ))
                }),
            }
        };
        Notebook::new(Path::new(MOUNT_ROOT)).resolve(
            query,
            number("max_notes", DEFAULT_MAX_NOTES)?,
            number("max_bytes", DEFAULT_MAX_BYTES)?,
        )
    }
}

warden_guest::export_tool_plugin!(NotesMemory);
warden_guest::export_context_plugin!(NotesMemory);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warden_guest::testing::call;

    fn args(text: &str, topic: Option<&str>) -> RememberArgs {
        RememberArgs {
            text: text.into(),
            topic: topic.map(Into::into),
        }
    }

    #[test]
    fn remembered_notes_resolve_newest_first_and_filter_by_topic() {
        let dir = tempfile::tempdir().unwrap();
        let book = Notebook::new(dir.path());
        let a = book
            .remember(args("use tabs", Some("style")), "run-1/call-1", 1_000)
            .unwrap();
        book.remember(
            args("deploy on fridays is fine", None),
            "run-1/call-2",
            2_000,
        )
        .unwrap();
        std::fs::write(dir.path().join("junk.json"), "not a note").unwrap();
        let items = book.resolve(Query::default(), 10, 100).unwrap();
        let sources: Vec<&str> = items.iter().map(|i| i.source.as_str()).collect();
        assert_eq!(
            sources,
            [
                format!("notes/{}", note_id("run-1/call-2", "")),
                format!("notes/{} [style]", a.id)
            ]
        );
        assert_eq!(items[1].modified_ms, Some(1_000));
        let style = book
            .resolve(
                Query {
                    topic: Some("STYLE".into()),
                    limit: None,
                },
                10,
                4,
            )
            .unwrap();
        assert_eq!(style.len(), 1);
        assert_eq!(
            (style[0].content.as_str(), style[0].truncated),
            ("use ", true)
        );
    }

    #[test]
    fn a_retried_call_rewrites_the_same_note() {
        let dir = tempfile::tempdir().unwrap();
        let book = Notebook::new(dir.path());
        let first = book.remember(args("x", None), "run-1/call-1", 1).unwrap();
        let again = book.remember(args("x", None), "run-1/call-1", 2).unwrap();
        assert_eq!(first.id, again.id);
        assert_eq!(book.notes().unwrap().len(), 1);
        let forgotten = book
            .forget(ForgetArgs {
                id: first.id.clone(),
            })
            .unwrap();
        assert!(forgotten.forgotten);
        assert!(!book.forget(ForgetArgs { id: first.id }).unwrap().forgotten);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tools = toolbox(dir.path());
        for (tool, a, needle) in [
            ("remember", json!({"text": "  "}), "`text` is empty"),
            (
                "remember",
                json!({"text": "x".repeat(MAX_TEXT + 1)}),
                "more than 16384",
            ),
            ("remember", json!({"text": "x", "topic": "a\nb"}), "`topic`"),
            ("forget", json!({"id": "../../etc/passwd"}), "not a note id"),
        ] {
            match tools.invoke(&call(tool, a.clone())) {
                Err(ToolError::InvalidArguments(m)) => assert!(m.contains(needle), "{a}: {m}"),
                other => panic!("{a}: {other:?}"),
            }
        }
        let preview = tools
            .preflight(&call(
                "remember",
                json!({"text": "tea, not coffee", "topic": "prefs"}),
            ))
            .unwrap();
        assert_eq!(preview.summary, "remember a note about `prefs` (15 bytes)");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }
}
