//! The tool adapter: turns what a tool plugin's `describe` returned into
//! checked [`ToolDescriptor`]s, with the operator's overrides and the
//! effective effect class applied.
//!
//! Tool descriptions and schemas reach the model's prompt, so they are
//! untrusted text: sizes are capped, names are checked, and the operator may
//! replace any of them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::grant::{EffectClass, ToolOverride, effective_effect};
use warden_sandbox::{Capabilities, wit};
use warden_syntax::json_limits;

/// Most tools one plugin may offer.
pub const MAX_TOOLS: usize = 128;
/// Longest tool description accepted, in bytes.
pub const MAX_DESCRIPTION: usize = 4096;
/// Longest argument schema accepted, in bytes.
pub const MAX_SCHEMA: usize = 64 << 10;

/// One tool, as the agent and the dispatcher see it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDescriptor {
    /// The plugin's name (from its manifest).
    pub plugin: String,
    /// The tool's name within its plugin.
    pub name: String,
    /// What it does, for the model (the operator's override if set).
    pub description: String,
    /// JSON Schema of its arguments (the operator's override if set).
    pub input_schema: serde_json::Value,
    /// The effect class the plugin claims.
    pub claimed_effect: EffectClass,
    /// The effect class it runs with (see [`effective_effect`]).
    pub effect: EffectClass,
    /// The argument the operator named as the call's idempotency key across
    /// runs, if any.
    pub idempotency_key: Option<String>,
    /// Why the tool is not offered to the model, if it is not: its effect
    /// is one the grant forbids (a `write` or `idempotent` tool of a plugin
    /// with no read-write mount and no outbound host, unless the operator
    /// set its effect class). Such a call could only fail, after asking a
    /// human to approve an effect that cannot happen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub withheld: Option<String>,
}

/// A tool spec the host does not accept, with the tool's name.
#[derive(Debug)]
pub(crate) struct SpecError {
    pub(crate) tool: String,
    pub(crate) message: String,
}

/// Checks `specs` and applies `overrides`. Every override must name a tool
/// the plugin offers. `ungranted` names what the plugin requested that
/// would let it cause effects and the grant does not give (`read-write
/// mount \`notes\``, `host \`api.example.com\``): a withheld tool's reason
/// says what to grant.
pub(crate) fn descriptors(
    plugin: &str,
    specs: &[wit::ToolSpec],
    overrides: &BTreeMap<String, ToolOverride>,
    capabilities: &Capabilities,
    ungranted: &[String],
) -> Result<Vec<ToolDescriptor>, SpecError> {
    if specs.len() > MAX_TOOLS {
        return Err(SpecError {
            tool: String::new(),
            message: format!("offers {} tools, more than {MAX_TOOLS}", specs.len()),
        });
    }
    let mut seen = BTreeSet::new();
    let mut tools = Vec::with_capacity(specs.len());
    for spec in specs {
        let error = |message: String| SpecError {
            tool: spec.name.clone(),
            message,
        };
        if !is_valid_tool_name(&spec.name) {
            return Err(error(
                "invalid tool name (use [a-z][a-z0-9_]*, at most 64 bytes)".into(),
            ));
        }
        if !seen.insert(spec.name.as_str()) {
            return Err(error("offered twice".into()));
        }
        let o = overrides.get(&spec.name).cloned().unwrap_or_default();
        let description = o.description.unwrap_or_else(|| spec.description.clone());
        if description.len() > MAX_DESCRIPTION {
            return Err(error(format!(
                "description is {} bytes, more than {MAX_DESCRIPTION}",
                description.len()
            )));
        }
        let schema_text = o.input_schema.as_deref().unwrap_or(&spec.input_schema);
        if schema_text.len() > MAX_SCHEMA {
            return Err(error(format!(
                "input schema is {} bytes, more than {MAX_SCHEMA}",
                schema_text.len()
            )));
        }
        let input_schema = match json_limits::parse(schema_text) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => return Err(error("input schema is not a JSON object".into())),
            Err(e) => return Err(error(format!("input schema is {e}"))),
        };
        let claimed_effect = EffectClass::from(spec.effect);
        let withheld = (o.effect.is_none()
            && claimed_effect != EffectClass::Read
            && !capabilities.can_cause_effects())
        .then(|| {
            let remedy = if ungranted.is_empty() {
                "the plugin requests neither, so only an operator's `effect` for the tool offers it".to_owned()
            } else {
                format!("not granted: {}", ungranted.join(", "))
            };
            format!(
                "its effect is `{claimed_effect}` and the grant allows no change (no read-write mount, no outbound host); {remedy}"
            )
        });
        tools.push(ToolDescriptor {
            plugin: plugin.to_owned(),
            name: spec.name.clone(),
            description,
            input_schema,
            claimed_effect,
            effect: effective_effect(claimed_effect, o.effect, capabilities),
            idempotency_key: o.idempotency_key.clone(),
            withheld,
        });
    }
    if let Some(unknown) = overrides.keys().find(|k| !seen.contains(k.as_str())) {
        return Err(SpecError {
            tool: unknown.clone(),
            message: "the grant overrides a tool the plugin does not offer".into(),
        });
    }
    Ok(tools)
}

/// Whether `name` is a valid tool name: `[a-z][a-z0-9_]*`, 1 to 64 bytes.
pub fn is_valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, effect: wit::Effect) -> wit::ToolSpec {
        wit::ToolSpec {
            name: name.into(),
            description: format!("does {name}"),
            input_schema: r#"{"type":"object"}"#.into(),
            effect,
        }
    }

    #[test]
    fn specs_become_descriptors_with_overrides_applied() {
        let specs = [
            spec("read", wit::Effect::Read),
            spec("write", wit::Effect::Write),
        ];
        let overrides = BTreeMap::from([(
            "write".to_owned(),
            ToolOverride {
                effect: Some(EffectClass::Idempotent),
                description: Some("operator text".into()),
                input_schema: Some(r#"{"type":"object","required":["x"]}"#.into()),
                idempotency_key: Some("x".into()),
            },
        )]);
        let tools = descriptors("p", &specs, &overrides, &Capabilities::none(), &[]).unwrap();
        assert_eq!(tools[0].effect, EffectClass::Read);
        assert_eq!(tools[1].claimed_effect, EffectClass::Write);
        assert_eq!(tools[1].effect, EffectClass::Idempotent);
        assert_eq!(tools[1].description, "operator text");
        assert_eq!(tools[1].input_schema["required"][0], "x");
    }

    #[test]
    fn bad_specs_are_refused_naming_the_tool() {
        let none = Capabilities::none();
        let cases: Vec<(Vec<wit::ToolSpec>, &str, &str)> = vec![
            (
                vec![spec("Bad-Name", wit::Effect::Read)],
                "Bad-Name",
                "invalid tool name",
            ),
            (
                vec![
                    spec("twice", wit::Effect::Read),
                    spec("twice", wit::Effect::Read),
                ],
                "twice",
                "offered twice",
            ),
            (
                vec![wit::ToolSpec {
                    input_schema: "[1]".into(),
                    ..spec("s", wit::Effect::Read)
                }],
                "s",
                "not a JSON object",
            ),
            (
                vec![wit::ToolSpec {
                    input_schema: "{".into(),
                    ..spec("s", wit::Effect::Read)
                }],
                "s",
                "not valid JSON",
            ),
            (
                vec![wit::ToolSpec {
                    description: "x".repeat(MAX_DESCRIPTION + 1),
                    ..spec("d", wit::Effect::Read)
                }],
                "d",
                "description is",
            ),
        ];
        for (specs, tool, message) in cases {
            let err = descriptors("p", &specs, &BTreeMap::new(), &none, &[]).unwrap_err();
            assert_eq!(err.tool, tool);
            assert!(err.message.contains(message), "{}", err.message);
        }
        let err = descriptors(
            "p",
            &[spec("a", wit::Effect::Read)],
            &BTreeMap::from([("ghost".to_owned(), ToolOverride::default())]),
            &none,
            &[],
        )
        .unwrap_err();
        assert_eq!(err.tool, "ghost");
    }
}
