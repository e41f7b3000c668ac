//! Agents as the runtime runs them (`Prepared`, once per agent digest):
//! the agent's plugins loaded under their grants, each context source's
//! plugin under the source's limits, the policies plugins carry out, its
//! MCP servers connected, and its model provider made (or the runtime's).

use std::collections::HashMap;
use std::sync::Arc;

use super::Runtime;
use super::error::RuntimeError;
use crate::agent::{Agent, AgentError};
use crate::view::{AgentView, AgentViewError};
use warden_plugins::LoadedPlugin;
use warden_providers::ModelProvider;

/// An agent with its plugins loaded and its provider made.
pub(super) struct Prepared {
    pub(super) view: AgentView,
    pub(super) plugins: HashMap<String, LoadedPlugin>,
    /// Each context source's plugin, by source name, loaded under the
    /// plugin's grant with the source's own limits over it.
    pub(super) context: HashMap<String, LoadedPlugin>,
    /// Each policy carried out by a plugin, by policy name.
    pub(super) policy_plugins: HashMap<String, LoadedPlugin>,
    /// Each MCP server, by its key: its calls are made as a plugin's are.
    pub(super) mcp: HashMap<String, Arc<crate::mcp_servers::McpConnection>>,
    pub(super) provider: Arc<dyn ModelProvider>,
}

impl Runtime {
    /// Loads the agent's plugins (once per agent digest) and makes its
    /// provider.
    pub(super) async fn prepare(&self, agent: &Agent) -> Result<Arc<Prepared>, RuntimeError> {
        if let Some(p) = self
            .inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&agent.digest)
        {
            return Ok(Arc::clone(p));
        }
        let mut plugins = HashMap::new();
        for p in &agent.plugins {
            let loaded = self
                .inner
                .plugins
                .load_pinned(
                    &p.source,
                    &p.grant,
                    &p.grant_base,
                    |k| std::env::var(k).ok(),
                    p.pin.as_ref(),
                )
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!("plugin `{}`: {e}", p.key),
                })?;
            plugins.insert(p.key.clone(), loaded);
        }
        agent
            .check_plugin_kinds(|key| (plugins[key].kinds(), plugins[key].source().to_string()))
            .map_err(|e| match e {
                AgentError::Invalid { key, message, .. } => RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!("key `{key}`: {message}"),
                },
                other => RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: other.to_string(),
                },
            })?;
        let mut context = HashMap::new();
        for source in &agent.context {
            let plugin = agent
                .plugins
                .iter()
                .find(|p| p.key == source.plugin)
                .expect("validated: a context source names a plugin of the agent");
            let mut grant = plugin.grant.clone();
            grant.limits = crate::context::overlay(&grant.limits, &source.limits);
            let loaded = self
                .inner
                .plugins
                .load_pinned(
                    &plugin.source,
                    &grant,
                    &plugin.grant_base,
                    |k| std::env::var(k).ok(),
                    plugin.pin.as_ref(),
                )
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!(
                        "context source `{}`: plugin `{}`: {e}",
                        source.name, plugin.key
                    ),
                })?;
            context.insert(source.name.clone(), loaded);
        }
        let policy_plugins = agent
            .policies
            .iter()
            .filter_map(|p| Some((p.name.clone(), plugins[p.plugin.as_ref()?].clone())))
            .collect();
        let mut mcp = HashMap::new();
        for server in &agent.mcp_servers {
            let connection = crate::mcp_servers::McpConnection::connect(server)
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: e.to_string(),
                })?;
            mcp.insert(server.key.clone(), connection);
        }
        let tools: Vec<(&str, &[warden_plugins::ToolDescriptor])> = agent
            .plugins
            .iter()
            .map(|p| (p.key.as_str(), plugins[&p.key].tools()))
            .chain(
                agent
                    .mcp_servers
                    .iter()
                    .map(|s| (s.key.as_str(), mcp[&s.key].tools())),
            )
            .collect();
        let mut view =
            AgentView::new(agent, &tools).map_err(|e: AgentViewError| RuntimeError::Agent {
                agent: agent.name.clone(),
                message: e.to_string(),
            })?;
        view.mcp_tools = mcp
            .iter()
            .map(|(key, c)| (key.clone(), c.offered()))
            .collect();
        // A plan decides its own steps: a runtime-wide provider stands in
        // for models, not for plans.
        let provider = match &self.inner.provider {
            Some(p) if agent.model.plan.is_none() => Arc::clone(p),
            _ => agent
                .model
                .provider()
                .map_err(|error| RuntimeError::Provider {
                    agent: agent.name.clone(),
                    error,
                })?,
        };
        let prepared = Arc::new(Prepared {
            view,
            plugins,
            context,
            policy_plugins,
            mcp,
            provider,
        });
        self.inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.digest.clone(), Arc::clone(&prepared));
        Ok(prepared)
    }
}
