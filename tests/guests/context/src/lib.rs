//! Test guest `context`: a minimal context source, for the host's context
//! adapter tests. `describe` names it `test-context`; `resolve` takes its
//! instructions from the request's `query`, a JSON object (empty text counts
//! as `{}`):
//!
//! ```json
//! {
//!   "items": [{"source": "a", "content": "text", "modified_ms": 1700000000000}],
//!   "read": ["/docs/notes.md"],
//!   "max_bytes": 1024,
//!   "error": {"kind": "invalid" | "denied" | "failed", "message": "why", "retryable": false},
//!   "count": "/state/resolves.log"
//! }
//! ```
//!
//! - `count`, if present, names a file (in a read-write mount) that gets one
//!   line, the request's run id, per resolve, before anything else: tests
//!   count how often the host resolved the source.
//! - `items` are returned as given (`modified_ms` optional), then one item per
//!   file in `read`, read through WASI (source = the path, modified time from
//!   the file). A file that cannot be read is a `denied` error when WASI says
//!   permission denied, else `failed`.
//! - `max_bytes` cuts every content to at most that many bytes (at a char
//!   boundary) and marks it `truncated`; `size` is always the original size.
//! - `error`, if present, is returned instead of any item.
//!
//! Each resolve logs `resolved <n> items` at `debug` through the host.

mod bindings {
    //! wit-bindgen glue for the `context-plugin` world, and the export of
    //! [`Context`](super::Context): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({ path: "../../../wit", world: "context-plugin" });
    use super::Context;
    export!(Context with_types_in crate::bindings);
}

use std::time::UNIX_EPOCH;

use bindings::exports::warden::plugin::context_source::Guest;
use bindings::warden::plugin::host;
use bindings::warden::plugin::types::{
    ContextError, ContextItem, ContextRequest, Failure, LogLevel, SourceSpec,
};
use serde_json::Value;

struct Context;

impl Guest for Context {
    fn describe() -> SourceSpec {
        SourceSpec {
            name: "test-context".into(),
            description: "Returns the items its query names, and files it is told to read.".into(),
        }
    }

    fn resolve(request: ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
        let query = parse_query(&request.query)?;
        if let Some(path) = query.get("count") {
            let path = path
                .as_str()
                .ok_or_else(|| invalid("`count` must be a path"))?;
            count(path, &request.run_id)?;
        }
        if let Some(error) = query.get("error") {
            return Err(requested_error(error));
        }
        let max_bytes = match query.get("max_bytes") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| invalid("max_bytes must be a non-negative integer"))?,
            ),
        };
        let mut items = Vec::new();
        for item in array(&query, "items")? {
            let source = item.get("source").and_then(Value::as_str);
            let content = item.get("content").and_then(Value::as_str);
            let (Some(source), Some(content)) = (source, content) else {
                return Err(invalid("each item needs string `source` and `content`"));
            };
            let modified_ms = item.get("modified_ms").and_then(Value::as_u64);
            items.push(make_item(
                source,
                content.to_owned(),
                modified_ms,
                max_bytes,
            ));
        }
        for path in array(&query, "read")? {
            let path = path
                .as_str()
                .ok_or_else(|| invalid("`read` must list paths"))?;
            items.push(read_item(path, max_bytes)?);
        }
        host::log(LogLevel::Debug, &format!("resolved {} items", items.len()));
        Ok(items)
    }
}

/// One item, cut to `max_bytes` if given.
fn make_item(
    source: &str,
    mut content: String,
    modified_ms: Option<u64>,
    max_bytes: Option<usize>,
) -> ContextItem {
    let size = content.len() as u64;
    let mut truncated = false;
    if let Some(max) = max_bytes.filter(|&max| max < content.len()) {
        let mut cut = max;
        while !content.is_char_boundary(cut) {
            cut -= 1;
        }
        content.truncate(cut);
        truncated = true;
    }
    ContextItem {
        source: source.to_owned(),
        content,
        size,
        modified_ms,
        truncated,
    }
}

/// A file read through WASI, as an item.
fn read_item(path: &str, max_bytes: Option<usize>) -> Result<ContextItem, ContextError> {
    let io_error = |e: std::io::Error| {
        let message = format!("read {path}: {e}");
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            ContextError::Denied(message)
        } else {
            ContextError::Failed(Failure {
                message,
                retryable: false,
            })
        }
    };
    let bytes = std::fs::read(path).map_err(io_error)?;
    let modified_ms = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    let content = String::from_utf8_lossy(&bytes).into_owned();
    let mut item = make_item(path, content, modified_ms, max_bytes);
    item.size = bytes.len() as u64;
    Ok(item)
}

/// Appends `run_id` as a line to the file at `path`.
fn count(path: &str, run_id: &str) -> Result<(), ContextError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| writeln!(file, "{run_id}"))
        .map_err(|e| {
            ContextError::Failed(Failure {
                message: format!("count in {path}: {e}"),
                retryable: false,
            })
        })
}

/// The error the query asks for.
fn requested_error(error: &Value) -> ContextError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("requested error")
        .to_owned();
    match error.get("kind").and_then(Value::as_str) {
        Some("invalid") => ContextError::InvalidRequest(message),
        Some("denied") => ContextError::Denied(message),
        _ => ContextError::Failed(Failure {
            message,
            retryable: error
                .get("retryable")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }),
    }
}

fn parse_query(text: &str) -> Result<Value, ContextError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(invalid("the query must be a JSON object")),
        Err(e) => Err(invalid(&format!("the query is not JSON: {e}"))),
    }
}

fn array<'a>(query: &'a Value, key: &str) -> Result<&'a [Value], ContextError> {
    match query.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(values)) => Ok(values),
        Some(_) => Err(invalid(&format!("`{key}` must be an array"))),
    }
}

fn invalid(message: &str) -> ContextError {
    ContextError::InvalidRequest(message.to_owned())
}
