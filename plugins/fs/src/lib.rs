//! `fs`: Warden's first-party tool plugin to read, search and edit files
//! under one granted directory.
//!
//! The manifest (`plugin.toml`) requests one read-write mount named
//! `workspace`, which the component sees at [`MOUNT_ROOT`]. Every `path`
//! argument is relative to that mount: absolute paths and `..` components
//! are refused as `denied`, naming the path (the sandbox blocks escapes
//! anyway; this gives the model a clear error). Outputs are JSON objects;
//! every path in them is relative to the mount, `/`-separated.
//!
//! | tool | effect | arguments | output |
//! | --- | --- | --- | --- |
//! | `read_file` | read | `path`, `offset?` (first line, from 1), `limit?` (lines, default 2000) | `path`, `content`, `start_line`, `end_line`, `total_lines`, `total_bytes`, `truncated` |
//! | `list_dir` | read | `path?` (default the mount) | `path`, `entries` (`name`, `kind`: file / dir / symlink / other, `size` for files), `truncated` |
//! | `search` | read | `pattern` (regex), `path?`, `glob?`, `max_results?` (default 100, at most 1000) | `matches` (`path`, `line`, `text`), `truncated`, `files_searched`, `files_skipped` |
//! | `write_file` | write | `path`, `content`, `create_dirs?` | `path`, `bytes_written`, `created` |
//! | `edit_file` | write | `path`, `old`, `new`, `replace_all?` | `path`, `replacements` |
//!
//! `read_file` is line-based and returns at most 256 KiB of text; `truncated`
//! says the file goes on after `end_line`. `write_file` and `edit_file` have
//! a preflight that runs the same checks and returns a summary line and a
//! unified diff, touching nothing.
//!
//! Code map: [`mount`] resolves paths, [`error`] holds [`FsError`] and its
//! mapping to the WIT tool errors, `read`, `search` (with the SDK's `glob`) and `edit`
//! (with `diff`) implement the tools. [`toolbox`] takes the mount root as a
//! parameter so that native unit tests run the tools against a temporary
//! directory; the component passes [`MOUNT_ROOT`]. The doc comments of the
//! argument structs' fields become the schema descriptions the model reads,
//! so each stays on one line (schemars keeps line breaks).
#![forbid(unsafe_code)]

pub mod error;
pub mod mount;

mod diff;
mod edit;
mod read;
mod search;

use std::path::PathBuf;

use warden_guest::{Call, Effect, Tool, ToolError, ToolPlugin, Toolbox};

pub use edit::{EditFileArgs, EditFileOutput, WriteFileArgs, WriteFileOutput};
pub use error::FsError;
pub use mount::Mount;
pub use read::{DirEntry, EntryKind, ListDirArgs, ListDirOutput, ReadFileArgs, ReadFileOutput};
pub use search::{Match, SearchArgs, SearchOutput};

/// Where the component sees the `workspace` mount.
pub const MOUNT_ROOT: &str = "/workspace";

/// The five tools, working under `root`.
pub fn toolbox(root: impl Into<PathBuf>) -> Toolbox {
    let mount = Mount::new(root);
    Toolbox::new()
        .tool(Tool::new(
            "read_file",
            "Read a UTF-8 text file in the workspace, by lines: `offset` is the first line \
             (from 1), `limit` the number of lines (default 2000, at most 256 KiB). Reports \
             the file's total lines and bytes and whether the content was truncated.",
            Effect::Read,
            on(&mount, read::read_file),
        ))
        .tool(Tool::new(
            "list_dir",
            "List a directory of the workspace: each entry's name, kind (file, dir, symlink) \
             and size for files, sorted by name.",
            Effect::Read,
            on(&mount, read::list_dir),
        ))
        .tool(Tool::new(
            "search",
            "Search the text files under a path of the workspace for a regular expression, \
             line by line, optionally only files matching a glob. Returns each match's path, \
             line number and text, at most `max_results` (default 100); `truncated` says \
             there may be more. Skips .git, binary and very large files.",
            Effect::Read,
            on(&mount, search::search),
        ))
        .tool(
            Tool::new(
                "write_file",
                "Write a whole file in the workspace, replacing it if it exists. Set \
                 `create_dirs` to create missing parent directories.",
                Effect::Write,
                on(&mount, edit::write_file),
            )
            .with_preflight(on(&mount, edit::preview_write)),
        )
        .tool(
            Tool::new(
                "edit_file",
                "Replace exact text in a file of the workspace. `old` must occur exactly once \
                 (include surrounding lines to make it unique) unless `replace_all` is set.",
                Effect::Write,
                on(&mount, edit::edit_file),
            )
            .with_preflight(on(&mount, edit::preview_edit)),
        )
}

/// Binds a tool function to the mount, converting its error. A failure
/// with no mount at all is reported as the missing grant it is.
fn on<A: 'static, O: 'static>(
    mount: &Mount,
    tool: fn(&Mount, A) -> Result<O, FsError>,
) -> impl Fn(A, &Call) -> Result<O, ToolError> + 'static {
    let mount = mount.clone();
    move |args, _call| {
        tool(&mount, args).map_err(|e| {
            if mount.is_missing() {
                FsError::MountNotGranted.into()
            } else {
                ToolError::from(e)
            }
        })
    }
}

/// The plugin as the component exports it: the tools under [`MOUNT_ROOT`].
pub struct FsPlugin;

impl ToolPlugin for FsPlugin {
    fn toolbox() -> Toolbox {
        toolbox(MOUNT_ROOT)
    }
}

warden_guest::export_tool_plugin!(FsPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::fs;
    use warden_guest::testing::call;

    fn invoke(toolbox: &Toolbox, tool: &str, args: Value) -> Result<Value, ToolError> {
        toolbox
            .invoke(&call(tool, args))
            .map(|out| serde_json::from_str(&out.content).unwrap())
    }

    #[test]
    fn describes_five_tools_with_schemas() {
        let specs = FsPlugin::toolbox().describe();
        let names: Vec<(&str, Effect)> =
            specs.iter().map(|s| (s.name.as_str(), s.effect)).collect();
        assert_eq!(
            names,
            [
                ("read_file", Effect::Read),
                ("list_dir", Effect::Read),
                ("search", Effect::Read),
                ("write_file", Effect::Write),
                ("edit_file", Effect::Write),
            ]
        );
        let required: Vec<Value> = specs
            .iter()
            .map(|s| serde_json::from_str::<Value>(&s.input_schema).unwrap()["required"].clone())
            .collect();
        assert_eq!(
            required,
            [
                json!(["path"]),
                Value::Null,
                json!(["pattern"]),
                json!(["path", "content"]),
                json!(["path", "old", "new"]),
            ]
        );
        for spec in &specs {
            let schema: Value = serde_json::from_str(&spec.input_schema).unwrap();
            assert_eq!(schema["additionalProperties"], false, "{}", spec.name);
            assert_eq!(schema["type"], "object", "{}", spec.name);
            // Field docs are the model's only guide: each documented, on one line.
            for (field, property) in schema["properties"].as_object().unwrap() {
                let description = property["description"].as_str().unwrap_or_default();
                assert!(
                    !description.is_empty(),
                    "{}.{field} is undocumented",
                    spec.name
                );
                assert!(
                    !description.contains('\n'),
                    "{}.{field}: {description:?}",
                    spec.name
                );
            }
        }
    }

    #[test]
    fn tools_work_end_to_end_through_dispatch() {
        let dir = tempfile::tempdir().unwrap();
        let tools = toolbox(dir.path());
        let written = invoke(
            &tools,
            "write_file",
            json!({"path": "src/main.rs", "content": "fn main() {\n    println!(\"hi\");\n}\n", "create_dirs": true}),
        )
        .unwrap();
        assert_eq!(
            written,
            json!({"path": "src/main.rs", "bytes_written": 34, "created": true})
        );
        let edited = invoke(
            &tools,
            "edit_file",
            json!({"path": "src/main.rs", "old": "\"hi\"", "new": "\"hello\""}),
        )
        .unwrap();
        assert_eq!(edited, json!({"path": "src/main.rs", "replacements": 1}));
        let read = invoke(
            &tools,
            "read_file",
            json!({"path": "src/main.rs", "offset": 2, "limit": 1}),
        )
        .unwrap();
        assert_eq!(read["content"], "    println!(\"hello\");\n");
        assert_eq!(
            (read["total_lines"].as_u64(), read["truncated"].as_bool()),
            (Some(3), Some(true))
        );
        let found = invoke(
            &tools,
            "search",
            json!({"pattern": "print(ln)?!", "glob": "*.rs"}),
        )
        .unwrap();
        assert_eq!(
            found,
            json!({
                "matches": [{"path": "src/main.rs", "line": 2, "text": "    println!(\"hello\");"}],
                "truncated": false, "files_searched": 1, "files_skipped": 0
            })
        );
        let listed = invoke(&tools, "list_dir", json!({})).unwrap();
        assert_eq!(
            listed,
            json!({"path": ".", "entries": [{"name": "src", "kind": "dir"}], "truncated": false})
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("src/main.rs")).unwrap(),
            "fn main() {\n    println!(\"hello\");\n}\n"
        );
    }

    #[test]
    fn preflight_previews_writes_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.txt"), "x\n").unwrap();
        let tools = toolbox(dir.path());
        let preview = tools
            .preflight(&call(
                "edit_file",
                json!({"path": "a.txt", "old": "x", "new": "y"}),
            ))
            .unwrap();
        assert_eq!(preview.summary, "edit `a.txt`: 1 replacement, +1 -1 lines");
        assert!(preview.detail.contains("-x\n+y\n"));
        let preview = tools
            .preflight(&call(
                "write_file",
                json!({"path": "b.txt", "content": "b\n"}),
            ))
            .unwrap();
        assert_eq!(preview.summary, "create `b.txt`: 1 lines, 2 bytes");
        assert_eq!(fs::read_to_string(dir.path().join("a.txt")).unwrap(), "x\n");
        assert!(!dir.path().join("b.txt").exists());
    }

    #[test]
    fn errors_reach_the_host_as_the_right_variant() {
        let dir = tempfile::tempdir().unwrap();
        let tools = toolbox(dir.path());
        let cases = [
            (
                "read_file",
                json!({"path": "/etc/passwd"}),
                ToolError::denied(
                    "path `/etc/passwd` is absolute; paths are relative to the workspace mount",
                ),
            ),
            (
                "list_dir",
                json!({"path": "../.."}),
                ToolError::denied(
                    "path `../..` contains `..`; paths must stay inside the workspace mount",
                ),
            ),
            (
                "read_file",
                json!({"path": "gone.txt"}),
                ToolError::failed("cannot read `gone.txt`: not found"),
            ),
            (
                "search",
                json!({"pattern": "a", "max_results": 5000}),
                ToolError::invalid_arguments("`max_results` is 5000, expected 1 to 1000"),
            ),
        ];
        for (tool, args, expected) in cases {
            assert_eq!(
                invoke(&tools, tool, args.clone()).unwrap_err(),
                expected,
                "{tool} {args}"
            );
        }
        let err = invoke(&tools, "read_file", json!({"path": "a", "offset": "first"})).unwrap_err();
        assert!(
            matches!(&err, ToolError::InvalidArguments(m)
                if m.starts_with("invalid arguments for tool `read_file`: field `offset`: invalid type")),
            "{err:?}"
        );
        let err = invoke(&tools, "edit_file", json!({"path": "a", "old": "x"})).unwrap_err();
        assert!(err.message().contains("missing field `new`"), "{err:?}");
    }

    #[test]
    fn a_fifo_is_refused_by_every_tool_before_it_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("pipe"))
            .status()
            .unwrap();
        assert!(made.success());
        let tools = toolbox(dir.path());
        let refused = ToolError::denied(
            "`pipe` is not a regular file (a FIFO, device or socket); the tools only read and write regular files",
        );
        for (tool, args) in [
            ("read_file", json!({"path": "pipe"})),
            ("write_file", json!({"path": "pipe", "content": "x"})),
            ("edit_file", json!({"path": "pipe", "old": "a", "new": "b"})),
            ("search", json!({"pattern": "a", "path": "pipe"})),
        ] {
            assert_eq!(invoke(&tools, tool, args).unwrap_err(), refused, "{tool}");
        }
    }
}
