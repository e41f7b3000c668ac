//! The tools a session serves: an agent's plugin tools, by the names its
//! runs' model calls them (`plugin__tool`), with their effect classes as
//! MCP annotations. The annotations are hints for the client; what Warden
//! enforces (approvals, budgets, the write-ahead rule) does not depend on
//! the client reading them.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

use warden::engine::view::{AgentTool, ToolTarget};
use warden::grant::EffectClass;

/// A served tool, as `tools/list` describes it.
#[derive(Clone, Debug)]
pub(crate) struct ServedTool {
    pub(crate) tool: Tool,
    /// The tool as the engine knows it: a call is checked against it before
    /// the run is offered the call.
    pub(crate) agent_tool: AgentTool,
}

/// The annotations of an effect class: `read` is read-only and safe to
/// repeat; `idempotent` changes things, the same way each time; `write`
/// changes things and must never run twice.
pub(crate) fn annotations(effect: EffectClass) -> ToolAnnotations {
    let mut hints = ToolAnnotations::new();
    let (read_only, destructive, idempotent) = match effect {
        EffectClass::Read => (true, false, true),
        EffectClass::Idempotent => (false, true, true),
        EffectClass::Write => (false, true, false),
    };
    hints.read_only_hint = Some(read_only);
    hints.destructive_hint = Some(destructive);
    hints.idempotent_hint = Some(idempotent);
    hints
}

/// `tool` as served, or `None` for a tool that is not a plugin's (a human
/// or external tool: the agent is refused before it gets here).
pub(crate) fn served(tool: &AgentTool) -> Option<ServedTool> {
    let ToolTarget::Plugin {
        effect,
        needs_approval,
        ..
    } = &tool.target
    else {
        return None;
    };
    let schema: JsonObject = match &tool.input_schema {
        Value::Object(schema) => schema.clone(),
        // MCP wants an object schema; a plugin's other schema is described,
        // not enforced here (the engine checks the arguments).
        _ => serde_json::from_value(serde_json::json!({ "type": "object" })).expect("an object"),
    };
    let description = format!(
        "{} [Warden: effect `{}`{}]",
        tool.description,
        effect,
        if *needs_approval {
            ", each call needs approval"
        } else {
            ""
        }
    );
    Some(ServedTool {
        tool: Tool::new(tool.name.clone(), description, Arc::new(schema))
            .with_annotations(annotations(*effect)),
        agent_tool: tool.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effect_classes_become_hints() {
        let cases = [
            (EffectClass::Read, (true, false, true)),
            (EffectClass::Idempotent, (false, true, true)),
            (EffectClass::Write, (false, true, false)),
        ];
        for (effect, (read_only, destructive, idempotent)) in cases {
            let hints = annotations(effect);
            assert_eq!(hints.read_only_hint, Some(read_only), "{effect:?}");
            assert_eq!(hints.destructive_hint, Some(destructive), "{effect:?}");
            assert_eq!(hints.idempotent_hint, Some(idempotent), "{effect:?}");
        }
    }
}
