//! `jsonl-channel`: Warden's first-party channel that appends each delivery
//! as one JSON line to a file in one read-write mount (`outbox`, seen at
//! [`MOUNT_ROOT`]) and fsyncs it before reporting success.
//!
//! Each line is `{"id", "run_id", "kind", "payload", "delivered_ms"}`, with
//! the payload as a JSON value. The line is written with one `write` on a
//! file opened for appending, then the file is synced, so a delivery that
//! returned `ok` is on disk and lines never interleave. The file is the
//! config value `file` (default [`DEFAULT_FILE`]), relative to the mount.
//!
//! Errors: a payload that is not JSON is `invalid-delivery`; a `file` that
//! leaves the mount, or a read-only mount, is `denied`; other I/O errors are
//! `failed` and retryable. A retried delivery is appended again: readers
//! drop duplicates by `id`, which is stable across retries.
#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Component, Path};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use warden_guest::{ChannelPlugin, Delivery, DeliveryError, SourceSpec};

/// Where the component sees the `outbox` mount.
pub const MOUNT_ROOT: &str = "/outbox";
/// Default of the `file` config value.
pub const DEFAULT_FILE: &str = "deliveries.jsonl";

/// The line written for `delivery` at `now_ms`.
pub fn line(delivery: &Delivery, now_ms: u64) -> Result<String, DeliveryError> {
    let payload: Value = if delivery.payload.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&delivery.payload).map_err(|e| {
            DeliveryError::invalid_delivery(format!(
                "payload of delivery `{}` is not JSON: {e}",
                delivery.id
            ))
        })?
    };
    let mut line = json!({
        "id": delivery.id,
        "run_id": delivery.run_id,
        "kind": delivery.kind,
        "payload": payload,
        "delivered_ms": now_ms,
    })
    .to_string();
    line.push('\n');
    Ok(line)
}

/// Appends `delivery` to `file` under `root`, fsynced.
pub fn append(
    root: &Path,
    file: &str,
    delivery: &Delivery,
    now_ms: u64,
) -> Result<(), DeliveryError> {
    let relative = Path::new(file);
    if file.is_empty()
        || relative.is_absolute()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(DeliveryError::denied(format!(
            "config `file` is `{file}`; it must be a path inside the outbox mount"
        )));
    }
    let line = line(delivery, now_ms)?;
    let io = |action: &str, e: std::io::Error| {
        let message = format!("cannot {action} `{file}`: {e}");
        match e.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                DeliveryError::denied(message)
            }
            _ => DeliveryError::retryable(message),
        }
    };
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(relative))
        .map_err(|e| io("open", e))?;
    out.write_all(line.as_bytes())
        .map_err(|e| io("append to", e))?;
    out.sync_all().map_err(|e| io("sync", e))
}

/// The plugin as the component exports it.
pub struct JsonlChannel;

impl ChannelPlugin for JsonlChannel {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "jsonl-channel",
            "Appends each delivery as one JSON line to a file, fsynced",
        )
    }

    fn deliver(delivery: Delivery) -> Result<(), DeliveryError> {
        let file = warden_guest::config("file").unwrap_or_else(|| DEFAULT_FILE.to_owned());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        append(Path::new(MOUNT_ROOT), &file, &delivery, now)
    }
}

warden_guest::export_channel_plugin!(JsonlChannel);

#[cfg(test)]
mod tests {
    use super::*;
    use warden_guest::testing::delivery;

    #[test]
    fn each_delivery_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let first = delivery("completed", json!({"summary": "done\nwith newline"}));
        let mut second = delivery("failed", json!({"error": "x"}));
        second.id = "d-2".into();
        append(dir.path(), "out.jsonl", &first, 5).unwrap();
        append(dir.path(), "./out.jsonl", &second, 6).unwrap();
        let text = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            json!({"id": "test-delivery", "run_id": "", "kind": "completed",
                   "payload": {"summary": "done\nwith newline"}, "delivered_ms": 5})
        );
        assert_eq!(lines[1]["id"], "d-2");
    }

    #[test]
    fn bad_payloads_and_paths_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = delivery("completed", json!({}));
        d.payload = "{not json".into();
        assert!(matches!(
            append(dir.path(), "out.jsonl", &d, 0),
            Err(DeliveryError::InvalidDelivery(m)) if m.contains("test-delivery")
        ));
        let d = delivery("completed", json!({}));
        for file in ["../escape.jsonl", "/etc/x", ""] {
            assert!(
                matches!(
                    append(dir.path(), file, &d, 0),
                    Err(DeliveryError::Denied(_))
                ),
                "{file}"
            );
        }
        assert!(matches!(
            append(dir.path(), "missing-dir/out.jsonl", &d, 0),
            Err(DeliveryError::Failed(f)) if f.retryable
        ));
    }
}
