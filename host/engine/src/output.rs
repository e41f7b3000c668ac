//! Typed results: an agent that declares the JSON Schema of its final output
//! (`output_schema` or `output_schema_file` in `agent.toml`) gets its final
//! answer parsed as JSON and checked against that schema here.
//!
//! The rules, all deterministic so replay decides the same:
//! - the answer is the final turn's text, trimmed; one surrounding Markdown
//!   code fence (```` ``` ```` or ```` ```json ````) is taken off, since
//!   models often wrap JSON in one;
//! - what remains must be one JSON value satisfying the schema
//!   ([`super::schema::check`]);
//! - a violation is sent back to the model once
//!   ([`super::events::OutputRejected`], folded into the conversation as a
//!   user message built by [`rejection_feedback`]); a second violation ends
//!   the run with [`super::events::RunError::OutputInvalid`].
//!
//! The schema is also stated in the instructions the model receives
//! ([`output_contract`]), so the first answer has a fair chance.

use serde_json::Value;

use super::schema::{self, SchemaError};
use warden_syntax::json_limits;

/// How many times a final answer that violates the output schema is sent
/// back to the model before the run fails.
pub const MAX_OUTPUT_REJECTIONS: u32 = 1;

/// The final answer `text` as a value satisfying `schema`, or the violation
/// as one line naming what is wrong.
pub fn check_final_answer(schema: &Value, text: &str) -> Result<Value, String> {
    let body = strip_code_fence(text.trim());
    let value = json_limits::parse(body).map_err(|e| match e {
        json_limits::ParseError::Syntax(e) => format!("the final answer is not a JSON value: {e}"),
        e @ json_limits::ParseError::TooDeep(_) => format!("the final answer is {e}"),
    })?;
    check_output(schema, &value)?;
    Ok(value)
}

/// Checks an output `value` against `schema`; the violation as one line.
pub fn check_output(schema: &Value, value: &Value) -> Result<(), String> {
    schema::check(schema, value).map_err(|e| match e {
        e @ SchemaError::Violation { .. } => format!("the output does not satisfy the schema: {e}"),
        e @ SchemaError::InvalidSchema { .. } => format!("the output schema is unusable: {e}"),
    })
}

/// What the model is told when its final answer is sent back.
pub fn rejection_feedback(violation: &str) -> String {
    format!(
        "Your final answer was rejected: {violation}. Reply again with only a JSON value that satisfies the required output schema, and nothing else."
    )
}

/// The instructions with the output schema stated after them.
pub fn output_contract(instructions: &str, schema: &Value) -> String {
    format!(
        "{instructions}\n\nYour final answer (the reply in which you call no tool) must be only a JSON value that satisfies this JSON Schema:\n{schema}"
    )
}

fn strip_code_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = rest.strip_suffix("```") else {
        return text;
    };
    // The info string (`json`, …) runs to the end of the first line.
    match inner.split_once('\n') {
        Some((info, body)) if !info.trim().contains(char::is_whitespace) => body.trim(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {"title": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["title", "count"],
            "additionalProperties": false
        })
    }

    #[test]
    fn a_valid_answer_is_its_json_value_fenced_or_not() {
        let expected = json!({"title": "notes", "count": 3});
        for text in [
            r#"{"title": "notes", "count": 3}"#,
            "  {\"title\": \"notes\", \"count\": 3}\n",
            "```json\n{\"title\": \"notes\", \"count\": 3}\n```",
            "```\n{\"title\": \"notes\", \"count\": 3}\n```",
        ] {
            assert_eq!(
                check_final_answer(&schema(), text),
                Ok(expected.clone()),
                "{text}"
            );
        }
    }

    #[test]
    fn violations_name_what_is_wrong() {
        let err = check_final_answer(&schema(), "Here are your notes.").unwrap_err();
        assert!(
            err.starts_with("the final answer is not a JSON value: "),
            "{err}"
        );
        let err =
            check_final_answer(&schema(), r#"{"title": "notes", "count": "three"}"#).unwrap_err();
        assert!(
            err.starts_with("the output does not satisfy the schema: at `/count`: "),
            "{err}"
        );
        let err = check_final_answer(&schema(), r#"{"title": "notes"}"#).unwrap_err();
        assert!(err.contains("\"count\" is a required property"), "{err}");
        // A fence with prose after the info string is not a code fence.
        assert!(check_final_answer(&schema(), "```json please\n{}\n```").is_err());
    }

    #[test]
    fn feedback_and_contract_carry_the_violation_and_the_schema() {
        let feedback = rejection_feedback("at `/count`: \"three\" is not of type \"integer\"");
        assert!(feedback.contains("at `/count`"), "{feedback}");
        let contract = output_contract("Summarise.", &json!({"type": "string"}));
        assert!(contract.starts_with("Summarise.\n\n"), "{contract}");
        assert!(contract.ends_with(r#"{"type":"string"}"#), "{contract}");
    }
}
