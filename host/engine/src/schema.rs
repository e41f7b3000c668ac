//! JSON Schema checks for values handed to the engine: the input that
//! resumes a suspended run (against the schema recorded in the log), and
//! the schemas an agent file declares.
//!
//! One rule on top of JSON Schema: a schema that names `properties` or
//! `required` without a `type` is treated as `"type": "object"`, so a bare
//! `null` or a string cannot satisfy a schema that plainly describes an
//! object. References to other documents (files, URLs) are not resolved.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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
    validate(&compile(schema)?, value)
}

fn compile(schema: &Value) -> Result<jsonschema::Validator, SchemaError> {
    jsonschema::validator_for(&effective_schema(schema)).map_err(|e| SchemaError::InvalidSchema {
        message: e.to_string(),
    })
}

fn validate(validator: &jsonschema::Validator, value: &Value) -> Result<(), SchemaError> {
    validator
        .validate(value)
        .map_err(|e| SchemaError::Violation {
            path: e.instance_path().as_str().to_owned(),
            message: e.to_string(),
        })
}

/// Schemas by name (a tool's), each compiled the first time a value is
/// checked against it and kept while the schema it was compiled from is
/// the one asked for. Compiling a schema costs far more than checking a
/// value, and every call of a tool is checked against the same schema: in
/// a checked replay, compiling at each call was a fifth of the time.
/// Shared by clones; not part of what a view is, so every two compare
/// equal.
#[derive(Clone, Default)]
pub struct CompiledSchemas(Arc<Mutex<HashMap<String, Compiled>>>);

/// A schema and what compiling it gave.
type Compiled = (Value, Result<Arc<jsonschema::Validator>, SchemaError>);

impl CompiledSchemas {
    /// [`check`] of `value` against `schema`, the schema of `name`.
    pub fn check(&self, name: &str, schema: &Value, value: &Value) -> Result<(), SchemaError> {
        let compiled = {
            let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match cache.get(name) {
                Some((kept, compiled)) if kept == schema => compiled.clone(),
                _ => {
                    let compiled = compile(schema).map(Arc::new);
                    cache.insert(name.to_owned(), (schema.clone(), compiled.clone()));
                    compiled
                }
            }
        };
        let validator: Arc<jsonschema::Validator> = compiled?;
        validate(&validator, value)
    }
}

impl std::fmt::Debug for CompiledSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledSchemas")
    }
}

impl PartialEq for CompiledSchemas {
    fn eq(&self, _: &Self) -> bool {
        true
    }
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

    #[test]
    fn a_compiled_schema_is_used_while_its_schema_is_unchanged() {
        let schemas = CompiledSchemas::default();
        let integer = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert_eq!(schemas.check("t", &integer, &json!({"n": 1})), Ok(()));
        assert!(schemas.check("t", &integer, &json!({"n": "one"})).is_err());
        // The same name with another schema is compiled anew, not answered
        // from the first.
        let string = json!({"type": "object", "properties": {"n": {"type": "string"}}});
        assert_eq!(schemas.check("t", &string, &json!({"n": "one"})), Ok(()));
        assert!(schemas.check("t", &string, &json!({"n": 1})).is_err());
        // An unusable schema stays unusable, with the error `check` gives.
        let broken = json!({"type": 12});
        assert_eq!(
            schemas.check("u", &broken, &json!({})),
            check(&broken, &json!({}))
        );
        assert!(matches!(
            schemas.check("u", &broken, &json!({})),
            Err(SchemaError::InvalidSchema { .. })
        ));
    }
}
