//! Parsing the JSON texts the host sends (tool arguments, context queries,
//! delivery payloads) into typed values, with errors that name the field.

use serde::de::DeserializeOwned;

/// Parses `text` as a `T`. Empty or blank text counts as `{}`, so a type
/// whose fields are all optional accepts it.
///
/// The error is serde's reason, prefixed with the path of the offending
/// field when it is not the top level, for example
/// ``field `limit`: invalid type: string "x", expected u64 at line 1 column 13``.
pub(crate) fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let text = if text.trim().is_empty() { "{}" } else { text };
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut path = e.path().to_string();
        let reason = e.into_inner();
        // A syntax error has no field to name (its path would be `?`).
        if reason.classify() != serde_json::error::Category::Data {
            return reason.to_string();
        }
        // An unknown field's path ends in that field, which the reason names.
        if reason.to_string().starts_with("unknown field") {
            path = path
                .rsplit_once('.')
                .map_or(".", |(parent, _)| parent)
                .to_string();
        }
        if path == "." {
            reason.to_string()
        } else {
            format!("field `{path}`: {reason}")
        }
    })?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::parse;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Args {
        path: String,
        limit: Option<u64>,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        depth: u8,
    }

    fn err(text: &str) -> String {
        parse::<Args>(text).unwrap_err()
    }

    #[test]
    fn parses_a_matching_object() {
        let args: Args = parse(r#"{"path":"a.txt","limit":3}"#).unwrap();
        assert_eq!(
            args,
            Args {
                path: "a.txt".into(),
                limit: Some(3),
                inner: None
            }
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{}"#, "missing field `path`"),
            (r#"{"path":1}"#, "field `path`: invalid type: integer `1`"),
            (
                r#"{"path":"a","limit":"x"}"#,
                "field `limit`: invalid type: string",
            ),
            (
                r#"{"path":"a","inner":{"depth":300}}"#,
                "field `inner.depth`: invalid value",
            ),
            (r#"{"path":"a","bogus":1}"#, "unknown field `bogus`"),
            (
                r#"{"path":"a","inner":{"depth":1,"x":0}}"#,
                "field `inner`: unknown field `x`",
            ),
            (
                r#""a.txt""#,
                "invalid type: string \"a.txt\", expected struct Args",
            ),
            (r#"{"path":"a"} x"#, "trailing characters"),
            (
                r#"{"path":"a","limit":"#,
                "EOF while parsing a value at line 1 column 20",
            ),
        ];
        for (text, expected) in cases {
            let message = err(text);
            assert!(
                message.starts_with(expected) || message.contains(expected),
                "{text}: got {message:?}, want {expected:?}"
            );
            assert!(!message.contains('?'), "{text}: {message}");
        }
    }

    #[test]
    fn blank_text_is_an_empty_object() {
        #[derive(Deserialize)]
        struct AllOptional {
            #[allow(dead_code)]
            limit: Option<u64>,
        }
        assert!(parse::<AllOptional>("  ").is_ok());
        assert_eq!(err(""), "missing field `path` at line 1 column 2");
    }
}
