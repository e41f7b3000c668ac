//! Canonical JSON: one byte string per value (object keys sorted by their
//! bytes, no whitespace, serde_json's number and string forms), so digests
//! over it do not depend on field order, map implementation or formatting.
//! Used for the agent digest and the model request hash
//! ([`super::request_hash`]).

use serde_json::Value;

/// Writes `value` canonically.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            out.push_str(&value.to_string());
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write(item, out);
            }
            out.push('}');
        }
    }
}

/// `value` without object members that are `null`, empty arrays or empty
/// objects (recursively), so a configuration that gains an optional key
/// keeps its digest while the key is unset.
pub fn without_empty(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(without_empty).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), without_empty(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_dropped() {
        let value: Value =
            serde_json::from_str(r#"{ "b": [1, {"z": null, "a": "x\"y"}], "a": 1.5, "é": true }"#)
                .unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"a":1.5,"b":[1,{"a":"x\"y","z":null}],"é":true}"#
        );
    }

    #[test]
    fn empty_members_are_dropped_recursively() {
        let value = json!({"a": null, "b": {}, "c": [], "d": {"e": null}, "f": [null, 0], "g": ""});
        assert_eq!(without_empty(&value), json!({"f": [null, 0], "g": ""}));
    }
}
