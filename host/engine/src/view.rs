//! [`AgentView`]: what deciding needs to know about an agent, with its
//! plugins' tools resolved: the one set of tools both offered to the model
//! and accepted from it, by the names the model uses, with their effect
//! classes and whether each needs approval.
//!
//! Built by the runtime once the agent's plugins are loaded; plain data, so
//! tests build it directly.

use super::refusal::OnRefusal;
use super::retry::RetryPolicy;
use super::schema::CompiledSchemas;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::agent::Agent;
use super::approvals::NeedsApproval;
use super::batch::Parallelism;
use super::budget::{BudgetLimits, Pricing};
use super::channels::Channel;
use super::compaction::CompactionSettings;
use super::context::ContextSource;
use super::events::{KeyedBy, McpToolsOffered, ToolRef};
use super::ids::AgentDigest;
use super::output::output_contract;
use super::policy_hooks::EnabledPolicy;
use warden_plugins::ToolDescriptor;
use warden_plugins::grant::EffectClass;
use warden_providers::{MAX_TOOL_NAME as MAX_MODEL_TOOL_NAME, ToolSpec};

/// An agent as deciding sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentView {
    /// The agent's name.
    pub name: String,
    /// The digest of its definition.
    pub digest: AgentDigest,
    /// The model's name.
    pub model: String,
    /// The provider that reaches the model, as the agent file names it
    /// (`scripted`, `openai`, `anthropic`, `plan`): recorded with each
    /// model call so the log says who answered.
    pub provider: String,
    /// The system prompt.
    pub instructions: String,
    /// Output tokens per model call.
    pub max_tokens: u32,
    /// How a failed model call is tried again.
    pub retry: RetryPolicy,
    /// The tools, sorted by name.
    pub tools: Vec<AgentTool>,
    /// The budgets.
    pub budgets: BudgetLimits,
    /// What tokens cost, recorded with each model call.
    pub pricing: Option<Pricing>,
    /// The context sources, in name order.
    pub context: Vec<ContextSource>,
    /// Invalid tool calls in a row that end the run.
    pub max_invalid_tool_calls: u32,
    /// What a refusal does.
    pub on_refusal: OnRefusal,
    /// When older history is summarised; `None` never.
    pub compaction: Option<CompactionSettings>,
    /// The JSON Schema the final output must satisfy, when declared (then
    /// `instructions` state it too).
    pub output_schema: Option<Value>,
    /// Its delivery channels, in name order.
    pub channels: Vec<Channel>,
    /// The policies it enables, in name order.
    pub policies: Vec<EnabledPolicy>,
    /// What each MCP server offers, by its key: the pinned list's digest
    /// and the tools offered, recorded when a run starts
    /// ([`RunStarted::mcp_tools`](crate::events::RunStarted::mcp_tools)) and
    /// compared by replay. Set by the runtime once its servers are
    /// connected; empty from [`new`](Self::new).
    pub mcp_tools: BTreeMap<String, McpToolsOffered>,
    /// How many calls of one turn may be in flight at once (`batch.rs`).
    pub parallel: Parallelism,
    /// The tools' input schemas, compiled once each.
    pub input_schemas: CompiledSchemas,
}

/// A tool as the model sees it, and what calling it means.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentTool {
    /// The name the model calls it by.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
    /// What a call does.
    pub target: ToolTarget,
}

/// What a call to a tool does.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolTarget {
    /// Runs a plugin's tool in a lease.
    Plugin {
        /// The tool.
        tool: ToolRef,
        /// Its effective effect class (the operator's setting wins).
        effect: EffectClass,
        /// Whether a human must approve each call.
        needs_approval: bool,
        /// Where its idempotency key comes from, when the operator named an
        /// argument for it.
        key: Option<KeyedBy>,
    },
    /// Suspends the run until a human answers.
    Human {
        /// The JSON Schema the answer must satisfy.
        response_schema: Value,
    },
    /// Parks the run until the embedding application reports the output.
    External {
        /// The JSON Schema the output must satisfy.
        output_schema: Value,
        /// Output fields that must equal the arguments'.
        must_match: Vec<String>,
    },
    /// Starts a child run of another agent (`[agents.<name>]`), whose
    /// output is the call's result.
    Agent {
        /// What each call asks for the child, before the caller's remaining
        /// budgets cap it.
        budgets: crate::budget::BudgetLimits,
        /// The child's agent.
        agent: std::sync::Arc<crate::agent::Agent>,
    },
}

/// An agent whose tools do not fit together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgentViewError {
    /// A plugin the agent uses was not given.
    #[error("agent `{agent}`: no tools were given for plugin `{plugin}`")]
    MissingPlugin {
        /// The agent.
        agent: String,
        /// The plugin's key.
        plugin: String,
    },
    /// Tools were given for a plugin the agent does not use.
    #[error("agent `{agent}` has no plugin `{plugin}`")]
    UnknownPlugin {
        /// The agent.
        agent: String,
        /// The plugin's key.
        plugin: String,
    },
    /// An approval rule names a tool the plugin does not offer.
    #[error(
        "agent `{agent}`: key `plugins.{plugin}.approval.{tool}`: plugin `{plugin}` has no tool `{tool}` (it offers: {offered})"
    )]
    ApprovalForUnknownTool {
        /// The agent.
        agent: String,
        /// The plugin's key.
        plugin: String,
        /// The tool named.
        tool: String,
        /// The tools it offers.
        offered: String,
    },
    /// A tool's name, as the model would see it, is too long.
    #[error(
        "agent `{agent}`: tool name `{name}` is {len} bytes, more than models accept ({MAX_MODEL_TOOL_NAME}): use a shorter plugin key"
    )]
    NameTooLong {
        /// The agent.
        agent: String,
        /// The name.
        name: String,
        /// Its length.
        len: usize,
    },
    /// Two tools have the same name.
    #[error("agent `{agent}`: two tools are named `{name}`")]
    DuplicateName {
        /// The agent.
        agent: String,
        /// The name.
        name: String,
    },
}

/// Pushes the tools `descriptors` offer under `key` (a plugin's or an MCP
/// server's) as plugin tools, each needing approval as `rule` says.
///
/// A tool whose effect the grant forbids, or whose listed definition is not
/// the pinned one, is not offered: the model never plans around it, and a
/// call by name is refused as unknown before any approval is asked.
///
/// `offered` names each tool after `<key>__`: a plugin's tool by its name,
/// an MCP server's by what [`names`](crate::mcp_servers::names) maps it to.
/// Approval rules and idempotency-key scopes name it as its plugin or
/// server does.
fn push_tools(
    tools: &mut Vec<AgentTool>,
    key: &str,
    descriptors: &[ToolDescriptor],
    rule: impl Fn(&str) -> NeedsApproval,
    offered: impl Fn(&str) -> String,
) {
    for d in descriptors.iter().filter(|d| d.withheld.is_none()) {
        let tool = ToolRef {
            plugin: key.to_owned(),
            tool: offered(&d.name),
        };
        let needs_approval = match rule(&d.name) {
            NeedsApproval::Never => false,
            NeedsApproval::Always => true,
            NeedsApproval::Writes => d.effect == EffectClass::Write,
        };
        tools.push(AgentTool {
            name: tool.model_name(),
            description: d.description.clone(),
            input_schema: d.input_schema.clone(),
            target: ToolTarget::Plugin {
                key: d.idempotency_key.as_ref().map(|field| KeyedBy {
                    field: field.clone(),
                    scope: format!("{}/{}", d.plugin, d.name),
                }),
                tool,
                effect: d.effect,
                needs_approval,
            },
        });
    }
}

impl AgentView {
    /// The view of `agent` whose plugins offer `plugin_tools`: one entry per
    /// plugin key, with the descriptors its loaded plugin reports.
    pub fn new(
        agent: &Agent,
        plugin_tools: &[(&str, &[ToolDescriptor])],
    ) -> Result<AgentView, AgentViewError> {
        let agent_name = agent.name.clone();
        let mut tools = Vec::new();
        for (key, _) in plugin_tools {
            if !agent.plugins.iter().any(|p| p.key == *key)
                && !agent.mcp_servers.iter().any(|s| s.key == *key)
            {
                return Err(AgentViewError::UnknownPlugin {
                    agent: agent_name,
                    plugin: (*key).to_owned(),
                });
            }
        }
        for plugin in &agent.plugins {
            let Some((_, descriptors)) = plugin_tools.iter().find(|(k, _)| *k == plugin.key) else {
                return Err(AgentViewError::MissingPlugin {
                    agent: agent_name,
                    plugin: plugin.key.clone(),
                });
            };
            for tool in plugin.approval.keys() {
                if !descriptors.iter().any(|d| &d.name == tool) {
                    return Err(AgentViewError::ApprovalForUnknownTool {
                        agent: agent_name,
                        plugin: plugin.key.clone(),
                        tool: tool.clone(),
                        offered: descriptors
                            .iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            }
            push_tools(
                &mut tools,
                &plugin.key,
                descriptors,
                |t| plugin.needs_approval(t),
                str::to_owned,
            );
        }
        // An MCP server's tools are plugin tools to deciding: a call is an
        // intent, the call, a completion, approved when it is a write.
        for server in &agent.mcp_servers {
            let Some((_, descriptors)) = plugin_tools.iter().find(|(k, _)| *k == server.key) else {
                return Err(AgentViewError::MissingPlugin {
                    agent: agent_name,
                    plugin: server.key.clone(),
                });
            };
            push_tools(
                &mut tools,
                &server.key,
                descriptors,
                |t| server.needs_approval(t),
                |t| crate::mcp_servers::names::model_suffix(server, t),
            );
        }
        for human in &agent.human_tools {
            tools.push(AgentTool {
                name: human.name.clone(),
                description: human.description.clone(),
                input_schema: human.arguments_schema.clone(),
                target: ToolTarget::Human {
                    response_schema: human.response_schema.clone(),
                },
            });
        }
        for external in &agent.external_tools {
            tools.push(AgentTool {
                name: external.name.clone(),
                description: external.description.clone(),
                input_schema: external.arguments_schema.clone(),
                target: ToolTarget::External {
                    output_schema: external.output_schema.clone(),
                    must_match: external.must_match.clone(),
                },
            });
        }
        for call in &agent.agents {
            tools.push(AgentTool {
                name: call.name.clone(),
                description: call.description.clone(),
                input_schema: call.input_schema.clone(),
                target: ToolTarget::Agent {
                    budgets: call.budgets,
                    agent: call.agent.clone(),
                },
            });
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut seen = BTreeSet::new();
        for tool in &tools {
            if tool.name.len() > MAX_MODEL_TOOL_NAME {
                return Err(AgentViewError::NameTooLong {
                    agent: agent_name,
                    name: tool.name.clone(),
                    len: tool.name.len(),
                });
            }
            if !seen.insert(tool.name.as_str()) {
                return Err(AgentViewError::DuplicateName {
                    agent: agent_name,
                    name: tool.name.clone(),
                });
            }
        }
        Ok(AgentView {
            name: agent.name.clone(),
            digest: agent.digest.clone(),
            model: agent.model.name.clone(),
            provider: agent.model.provider.as_str().to_owned(),
            instructions: match &agent.output_schema {
                None => agent.instructions.clone(),
                Some(schema) => output_contract(&agent.instructions, schema),
            },
            max_tokens: agent.model.max_tokens,
            retry: agent.model.retry,
            tools,
            budgets: agent.budgets,
            pricing: agent.model.pricing.clone(),
            context: agent.context.clone(),
            max_invalid_tool_calls: agent.max_invalid_tool_calls,
            parallel: agent.parallel,
            input_schemas: CompiledSchemas::default(),
            on_refusal: agent.on_refusal,
            compaction: agent.compaction,
            output_schema: agent.output_schema.clone(),
            channels: agent.channels.clone(),
            policies: agent
                .policies
                .iter()
                .map(|p| EnabledPolicy {
                    name: p.name.clone(),
                    hooks: p.hooks.clone(),
                })
                .collect(),
            mcp_tools: BTreeMap::new(),
        })
    }

    /// The tool the model calls `name`.
    pub fn tool(&self, name: &str) -> Option<&AgentTool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The context source named `name`.
    pub fn context_source(&self, name: &str) -> Option<&ContextSource> {
        self.context.iter().find(|c| c.name == name)
    }

    /// The tools as offered to the model: exactly the names
    /// [`tool`](Self::tool) accepts, from the one list built with the view.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::MINIMAL;
    use serde_json::json;
    use std::path::Path;

    fn descriptor(name: &str, effect: EffectClass) -> ToolDescriptor {
        ToolDescriptor {
            plugin: "p".into(),
            name: name.into(),
            description: format!("does {name}"),
            input_schema: json!({"type": "object"}),
            claimed_effect: effect,
            effect,
            idempotency_key: None,
            withheld: None,
        }
    }

    fn agent(extra: &str) -> Agent {
        Agent::parse(&format!("{MINIMAL}{extra}"), Path::new("a.toml"), None).unwrap()
    }

    #[test]
    fn tools_are_named_by_plugin_key_with_approval_resolved() {
        let a = agent(
            "[plugins.fs]\nsource = \"builtin:fs\"\napproval = { read_file = \"always\", edit_file = \"never\" }\n[human_tools.ask]\ndescription = \"Ask\"\n",
        );
        let fs = [
            descriptor("read_file", EffectClass::Read),
            descriptor("write_file", EffectClass::Write),
            descriptor("edit_file", EffectClass::Write),
            descriptor("stat", EffectClass::Idempotent),
        ];
        let view = AgentView::new(&a, &[("fs", &fs)]).unwrap();
        let names: Vec<&str> = view.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ask",
                "fs__edit_file",
                "fs__read_file",
                "fs__stat",
                "fs__write_file"
            ]
        );
        let approval = |name: &str| match &view.tool(name).unwrap().target {
            ToolTarget::Plugin { needs_approval, .. } => *needs_approval,
            _ => {
                panic!("{name} is a plugin tool")
            }
        };
        assert!(approval("fs__read_file"), "always");
        assert!(!approval("fs__edit_file"), "never");
        assert!(approval("fs__write_file"), "writes, by default");
        assert!(!approval("fs__stat"), "idempotent is not a write");
        assert!(matches!(
            view.tool("ask").unwrap().target,
            ToolTarget::Human { .. }
        ));
        assert_eq!(view.tool_specs().len(), 5);
        assert_eq!(view.tool_specs()[1].name, "fs__edit_file");
        assert_eq!(view.max_tokens, 4096);
        assert!(view.tool("read_file").is_none());
    }

    /// An MCP server's tools become plugin tools by the one path plugin
    /// tools take: named `<key>__<tool>`, a write needing approval unless
    /// the operator's rule says otherwise, a withheld tool not offered.
    #[test]
    fn an_mcp_servers_tools_are_offered_as_plugin_tools() {
        let a = agent(
            "[plugins.fs]\nsource = \"builtin:fs\"\n[mcp_servers.remote]\nurl = \"https://mcp.example.com/mcp\"\nhosts = [\"mcp.example.com\"]\n[mcp_servers.remote.tools.search]\napproval = \"never\"\n",
        );
        let fs = [descriptor("read_file", EffectClass::Read)];
        let remote = [
            descriptor("search", EffectClass::Write),
            descriptor("publish", EffectClass::Write),
            ToolDescriptor {
                withheld: Some("changed since it was pinned".into()),
                ..descriptor("changed", EffectClass::Read)
            },
        ];
        let view = AgentView::new(&a, &[("fs", &fs), ("remote", &remote)]).unwrap();
        let names: Vec<&str> = view.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["fs__read_file", "remote__publish", "remote__search"]
        );
        let approval = |name: &str| match &view.tool(name).unwrap().target {
            ToolTarget::Plugin { needs_approval, .. } => *needs_approval,
            _ => panic!("{name} is a plugin tool"),
        };
        assert!(approval("remote__publish"), "a write, by default");
        assert!(!approval("remote__search"), "the operator's rule");
        assert!(view.tool("remote__changed").is_none());
        assert!(matches!(
            AgentView::new(&a, &[("fs", &fs)]).unwrap_err(),
            AgentViewError::MissingPlugin { ref plugin, .. } if plugin == "remote"
        ));
    }

    #[test]
    fn mismatched_plugins_and_rules_are_refused() {
        let a = agent("[plugins.fs]\nsource = \"builtin:fs\"\napproval = { nope = \"never\" }\n");
        let fs = [descriptor("read_file", EffectClass::Read)];
        let err = AgentView::new(&a, &[("fs", &fs)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent `notes`: key `plugins.fs.approval.nope`: plugin `fs` has no tool `nope` (it offers: read_file)"
        );
        let a = agent("[plugins.fs]\nsource = \"builtin:fs\"\n");
        assert!(matches!(
            AgentView::new(&a, &[]).unwrap_err(),
            AgentViewError::MissingPlugin { .. }
        ));
        assert!(matches!(
            AgentView::new(&a, &[("fs", &fs), ("other", &fs)]).unwrap_err(),
            AgentViewError::UnknownPlugin { .. }
        ));
        let long = "p".repeat(60);
        let a = agent(&format!("[plugins.{long}]\nsource = \"builtin:fs\"\n"));
        assert!(matches!(
            AgentView::new(&a, &[(&long, &fs)]).unwrap_err(),
            AgentViewError::NameTooLong { len: 71, .. }
        ));
    }
}
