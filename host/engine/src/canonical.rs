//! Canonical JSON: one byte string per value (object keys sorted by their
//! bytes, no whitespace, serde_json's number and string forms), so digests
//! over it do not depend on field order, map implementation or formatting.
//! Used for the agent digest and the model request hash
//! ([`super::request_hash`]), which writes it straight into a buffer
//! (`write_value`, `write_str`) without building a [`Value`] first.

use serde_json::Value;

/// Writes `value` canonically.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(value, &mut out);
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// Appends `value`'s canonical JSON to `out`.
pub(crate) fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // serde_json's own forms, as `Value::to_string` writes them.
        Value::Number(n) => serde_json::to_writer(&mut *out, n).expect("writing to a Vec"),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // serde_json's default map is ordered by key bytes already; a
            // build whose map keeps insertion order (its `preserve_order`
            // feature, switched on by any crate in the graph) is sorted here.
            let sorted = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            out.push(b'{');
            if sorted {
                write_members(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_members(entries.into_iter(), out);
            }
            out.push(b'}');
        }
    }
}

fn write_members<'a>(members: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (key, item)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(key, out);
        out.push(b':');
        write_value(item, out);
    }
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
pub(crate) fn write_str(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec");
}

/// Whether `a` and `b` have the same canonical form, found without writing
/// it. Not `==`: serde_json holds `0.0` and `-0.0` equal, and writes them
/// apart.
pub(crate) fn same_form(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            _ if x.is_f64() != y.is_f64() => false,
            (Some(x), Some(y)) if x.to_bits() != y.to_bits() => false,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_form(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_form(x, y)))
        }
        _ => a == b,
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

/// The canonical form as first written, over a [`Value`] and its
/// `to_string`: what every recorded digest and request hash was made
/// with, kept for the tests to hold the writers above to it byte for byte.
#[cfg(test)]
pub(crate) fn reference(value: &Value) -> String {
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
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// Values that exercise every form canonical JSON has: escapes, control
/// characters, non-ASCII keys (sorted by bytes, not characters), every
/// kind of number, nesting, empty containers.
#[cfg(test)]
pub(crate) fn awkward_values() -> Vec<Value> {
    let parsed: Value = serde_json::from_str(
        r#"{"z": 1E5, "é": -0.0, "e": 1e-7, "big": 18446744073709551615, "neg": -9223372036854775808,
            "f": [0.1, 2.5e300, -1.0, 3], "s": "\u0000\u001f\u007f\"\\/\n\r\t\u2028\ud83d\ude00"}"#,
    )
    .unwrap();
    vec![
        Value::Null,
        Value::Bool(true),
        Value::Bool(false),
        serde_json::json!(0),
        serde_json::json!(-17),
        serde_json::json!(1.5),
        serde_json::json!(u64::MAX),
        serde_json::json!(i64::MIN),
        serde_json::json!(f64::MAX),
        serde_json::json!(f64::MIN_POSITIVE),
        serde_json::json!(""),
        serde_json::json!("plain"),
        serde_json::json!("quote \" backslash \\ slash / \u{7} bell \u{1b} esc \u{0} nul"),
        serde_json::json!("ünïcödé 日本語 😀 \u{2028} \u{feff}"),
        serde_json::json!([]),
        serde_json::json!({}),
        serde_json::json!([[], {}, [[]], [{}]]),
        serde_json::json!({"b": [1, {"z": null, "a": "x\"y"}], "a": 1.5, "é": true, "z": {}, "Z": [], "": ""}),
        serde_json::json!({"path": "/tmp/a b", "deep": {"x": {"y": {"z": [1, [2, [3, {"k": "v"}]]]}}}}),
        serde_json::json!({"ä": 1, "a": 2, "b": 3, "aa": 4, "a\u{0}": 5, "😀": 6, "\u{7f}": 7}),
        parsed,
    ]
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
    fn the_writer_is_the_first_form_byte_for_byte() {
        for value in awkward_values() {
            assert_eq!(canonical_json(&value), reference(&value), "{value:?}");
            // Inside arrays and objects too.
            let wrapped = json!({"v": [value.clone()], "w": {"x": value}});
            assert_eq!(canonical_json(&wrapped), reference(&wrapped));
        }
    }

    #[test]
    fn the_same_form_is_the_same_bytes() {
        let mut values = awkward_values();
        values.extend([
            json!(0.0),
            json!(-0.0),
            json!(1),
            json!(1.0),
            json!({"a": -0.0}),
        ]);
        values.push(json!({"a": 0.0}));
        for a in &values {
            for b in &values {
                assert_eq!(
                    same_form(a, b),
                    canonical_json(a) == canonical_json(b),
                    "{a:?} against {b:?}"
                );
            }
        }
        // The case `==` gets wrong.
        assert_eq!(json!(0.0), json!(-0.0));
        assert!(!same_form(&json!(0.0), &json!(-0.0)));
    }

    #[test]
    fn empty_members_are_dropped_recursively() {
        let value = json!({"a": null, "b": {}, "c": [], "d": {"e": null}, "f": [null, 0], "g": ""});
        assert_eq!(without_empty(&value), json!({"f": [null, 0], "g": ""}));
    }
}
