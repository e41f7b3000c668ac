//! How deeply nested a JSON value the host accepts, and the check at the
//! points where a value enters a run.
//!
//! serde_json refuses to parse JSON nested 128 levels deep or more. A value
//! that parsed at depth 125 (a tool's output, a model's tool-call
//! arguments) would be stored inside an event a few levels deeper, and the
//! stored event could then never be decoded again: the run could not be
//! shown, approved or cancelled. So values are bounded where they are
//! accepted, at [`MAX_DEPTH`], well below what decoding can read back
//! wrapped in any event; and the engine refuses to append bytes nested
//! deeper than [`DECODE_DEPTH`], so whatever a store holds decodes.

use serde_json::Value;

/// The deepest nesting accepted in a value from outside (a tool, a model,
/// an operator, an embedding application): a scalar is depth 0, `[1]` and
/// `{"a": 1}` depth 1.
pub const MAX_DEPTH: usize = 64;

/// The deepest nesting an encoded event may have: what serde_json decodes
/// (its recursion limit of 128 refuses the 128th array or object opened).
pub const DECODE_DEPTH: usize = 127;

/// A value nested deeper than [`MAX_DEPTH`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("nested {depth} levels deep; at most {limit} are accepted")]
pub struct TooDeep {
    /// How deep it is (for text that did not parse, at least this deep).
    pub depth: usize,
    /// The limit, [`MAX_DEPTH`].
    pub limit: usize,
}

/// Why text was not accepted as a JSON value.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// It is not JSON.
    #[error("not valid JSON: {0}")]
    Syntax(serde_json::Error),
    /// It is JSON, nested too deeply.
    #[error(transparent)]
    TooDeep(TooDeep),
}

/// The nesting depth of `value`, without recursion (so any depth is safe to
/// measure).
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, at)) = pending.pop() {
        match value {
            Value::Array(items) => {
                deepest = deepest.max(at + 1);
                pending.extend(items.iter().map(|v| (v, at + 1)));
            }
            Value::Object(fields) => {
                deepest = deepest.max(at + 1);
                pending.extend(fields.values().map(|v| (v, at + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// Accepts `value` if it is nested at most [`MAX_DEPTH`] levels deep.
pub fn check(value: &Value) -> Result<(), TooDeep> {
    match depth(value) {
        depth if depth > MAX_DEPTH => Err(TooDeep {
            depth,
            limit: MAX_DEPTH,
        }),
        _ => Ok(()),
    }
}

/// Parses `text` as a JSON value nested at most [`MAX_DEPTH`] levels deep.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    // Measured on the text first: a value too deep for serde_json is refused
    // as too deep, not as a syntax error.
    let nested = text_depth(text.as_bytes());
    if nested > MAX_DEPTH {
        return Err(ParseError::TooDeep(TooDeep {
            depth: nested,
            limit: MAX_DEPTH,
        }));
    }
    serde_json::from_str(text).map_err(ParseError::Syntax)
}

/// The deepest nesting of arrays and objects opened in JSON text, outside
/// strings. Linear in the bytes; meaningful for any text (it only counts
/// brackets), exact for valid JSON.
pub fn text_depth(json: &[u8]) -> usize {
    let (mut open, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                open += 1;
                deepest = deepest.max(open);
            }
            b']' | b'}' => open = open.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn depth_counts_arrays_and_objects_opened() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!([1])), 1);
        assert_eq!(depth(&json!({"a": {"b": [1, {"c": []}]}})), 5);
        for levels in [0, 1, 63, 64, 65, 127, 128] {
            let text = nested(levels);
            assert_eq!(text_depth(text.as_bytes()), levels);
        }
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = r#"{"a": "[[[{{{\"]]]", "b": ["\\", "{"]}"#;
        assert_eq!(text_depth(text.as_bytes()), 2);
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(depth(&value), 2);
    }

    #[test]
    fn parse_refuses_deep_text_as_too_deep_even_past_serde_jsons_own_limit() {
        assert_eq!(depth(&parse(&nested(MAX_DEPTH)).unwrap()), MAX_DEPTH);
        for levels in [MAX_DEPTH + 1, 125, 129, 10_000] {
            match parse(&nested(levels)) {
                Err(ParseError::TooDeep(e)) => assert_eq!(e.depth, levels),
                other => panic!("{levels} levels: {other:?}"),
            }
        }
        assert!(matches!(parse("{\"a\": "), Err(ParseError::Syntax(_))));
    }

    #[test]
    fn decode_depth_is_exactly_what_serde_json_reads() {
        let at = nested(DECODE_DEPTH);
        assert!(serde_json::from_str::<Value>(&at).is_ok());
        let past = nested(DECODE_DEPTH + 1);
        assert!(serde_json::from_str::<Value>(&past).is_err());
    }

    #[test]
    fn check_measures_values_built_in_code_without_recursion() {
        let mut value = json!(1);
        for _ in 0..300 {
            value = json!([value]);
        }
        assert_eq!(check(&value).unwrap_err().depth, 300);
    }
}
