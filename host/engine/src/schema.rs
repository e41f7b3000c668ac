//! JSON Schema checks for values handed to the engine: the input that
//! resumes a suspended run (against the schema recorded in the log), and
//! the schemas an agent file declares.
//!
//! One rule on top of JSON Schema: a schema that names `properties` or
//! `required` without a `type` is treated as `"type": "object"`, so a bare
//! `null` or a string cannot satisfy a schema that plainly describes an
//! object. References to other documents (files, URLs) are not resolved.

use serde_json::Value;

/// A schema that cannot be used, or a value that does not satisfy it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The schema itself is not a valid JSON Schema.
    #[error("invalid JSON Schema: {message}")]
    InvalidSchema {
        /// What is wrong with it.
        message: String,
    },
    /// The value does not satisfy the schema.
    #[error("{}{message}", if .path.is_empty() { String::new() } else { format!("at `{}`: ", .path) })]
    Violation {
        /// Where in the value (a JSON pointer; empty for the value itself).
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// `schema` as it is checked: with `"type": "object"` added when it names
/// `properties` or `required` and no `type`.
pub fn effective_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema
        && !map.contains_key("type")
        && (map.contains_key("properties") || map.contains_key("required"))
    {
        map.insert("type".into(), Value::String("object".into()));
    }
    schema
}

/// Checks that `schema` is a usable JSON Schema.
pub fn check_schema(schema: &Value) -> Result<(), SchemaError> {
    jsonschema::validator_for(&effective_schema(schema))
        .map(|_| ())
        .map_err(|e| SchemaError::InvalidSchema {
            message: e.to_string(),
        })
}

/// Checks `value` against `schema`; the error names the first violation.
pub fn check(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    let validator = jsonschema::validator_for(&effective_schema(schema)).map_err(|e| {
        SchemaError::InvalidSchema {
            message: e.to_string(),
        }
    })?;
    validator
        .validate(value)
        .map_err(|e| SchemaError::Violation {
            path: e.instance_path().as_str().to_owned(),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_checked_naming_the_violation() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert_eq!(check(&schema, &json!({"n": 1})), Ok(()));
        let err = check(&schema, &json!({"n": "one"})).unwrap_err();
        assert!(
            matches!(&err, SchemaError::Violation { path, .. } if path == "/n"),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("at `/n`: "), "{err}");
        let err = check(&schema, &json!({})).unwrap_err();
        assert!(
            err.to_string().contains("\"n\" is a required property"),
            "{err}"
        );
    }

    #[test]
    fn an_object_schema_without_a_type_still_refuses_non_objects() {
        for schema in [
            json!({"properties": {"n": {"type": "integer"}}}),
            json!({"required": ["n"]}),
        ] {
            for value in [json!(null), json!("x"), json!(3), json!([1])] {
                assert!(
                    check(&schema, &value).is_err(),
                    "{schema} let {value} through"
                );
            }
        }
        // A schema that says nothing about objects keeps its meaning.
        assert_eq!(check(&json!({}), &json!(null)), Ok(()));
        assert_eq!(
            effective_schema(&json!({"type": ["object", "null"], "required": ["n"]})),
            json!({"type": ["object", "null"], "required": ["n"]})
        );
    }

    #[test]
    fn invalid_schemas_are_reported() {
        let err = check_schema(&json!({"type": "nonsense"})).unwrap_err();
        assert!(matches!(err, SchemaError::InvalidSchema { .. }), "{err}");
        assert_eq!(check_schema(&json!({"type": "string"})), Ok(()));
    }
}
