//! Agent definitions: `agent.toml`, parsed strictly (unknown keys are
//! errors), then validated as a separate step with errors naming the file
//! and the key, and digested so a run can tell when its agent changed.
//!
//! ```toml
//! name = "notes"                         # [a-z][a-z0-9-]*, at most 64 bytes
//! description = "Reads and tidies notes" # optional
//! instructions = "You keep the notes folder tidy."
//! output_schema = '{"type": "object"}'   # optional: the JSON Schema of the final
//!                                        # output (JSON text); the final answer
//!                                        # must be JSON satisfying it
//! # output_schema_file = "out.schema.json" # or the schema in a file, relative
//! #                                        # to this file (not both)
//! max_invalid_tool_calls = 3             # invalid tool calls in a row (unknown tool,
//!                                        # arguments failing the schema) that end the
//!                                        # run; default 3
//! max_parallel_calls = 4                 # calls of one turn in flight at once (reads,
//!                                        # idempotent calls, child runs), 1 to 64;
//!                                        # default 1: one at a time (see batch.rs)
//! parallel_writes = false                # writes needing no approval may run beside
//!                                        # others; default false: each runs alone
//! on_refusal = "fail"                    # when the model refuses (or a content filter
//!                                        # stops it): fail the run (default) or
//!                                        # "complete" with the refusal's text
//!
//! [model]                                # optional: inherited whole when absent
//! provider = "scripted"                  # scripted | openai | anthropic
//! name = "demo"                          # the model, as the provider names it
//! max_tokens = 1024                      # per call; default 4096
//! max_attempts = 3                       # requests per model call in total, 1 to 10;
//!                                        # transient failures only; default 3
//! max_retry_wait = "60s"                 # the longest backoff or Retry-After slept
//!                                        # through; a longer one parks the run
//!                                        # (`waiting`) until due; default 60s
//! transcript = "notes.transcript.toml"   # scripted only; relative to this file
//! # openai and anthropic only:
//! # base_url = "http://localhost:11434/v1"  # default: the provider's public API
//! # base_url_env = "ANTHROPIC_BASE_URL"     # a variable holding the base URL;
//! #                                         # when set, it wins over base_url
//! # api_key_env = "OPENAI_API_KEY"          # the variable holding the key (never
//! #                                         # the key); required for the public APIs
//! # timeout = "60s"                         # connect, response start, and between
//! #                                         # two pieces of the stream; default 60s
//! # max_concurrent_calls = 8                # calls in flight per provider
//! # stream = true                           # ask for server-sent events
//! # headers = { "OpenAI-Organization" = "org-1" }   # no credentials here
//! # header_env = { "api-key" = "AZURE_OPENAI_KEY" } # header values from variables
//! # api_version = "2023-06-01"              # anthropic: anthropic-version
//! # max_tokens_field = "max_tokens"         # openai: or max_completion_tokens
//! # stream_usage = true                     # openai: stream_options.include_usage
//! [model.pricing]                        # optional; needed by budgets.max_cost
//! input_per_million = 3.0                # in `currency`, per million tokens
//! output_per_million = 15.0
//! currency = "USD"                       # default USD
//!
//! [plugins.fs]                           # the key names the plugin's tools: fs__<tool>
//! source = "builtin:fs"                  # or a path to plugin.toml, relative to this file
//! approval = { read_file = "never" }     # per tool: never | always | writes (default)
//! [plugins.fs.grant.mounts.workspace]    # the operator's grant, as in policy::Grant;
//! dir = "notes"                          # relative to this file
//!
//! [human_tools.ask_operator]             # a tool the model calls to ask a human:
//! description = "Ask the operator"       # the run suspends until resumed with input
//! arguments_schema = '{"type": "object"}'  # optional; default: {question: string}
//! response_schema = '{"type": "string"}'   # optional; default: a string
//!
//! [external_tools.pay_invoice]          # a tool the embedding application performs
//! description = "Pay an invoice"         # itself: the run parks at the call until the
//! arguments_schema = '{"type": "object"}'  # application reports its output with
//! output_schema = '{"type": "object"}'     # `Runtime::complete_external`
//! must_match = ["invoice_id"]            # output fields that must equal the arguments'
//!
//! [mcp_servers.files]                   # an MCP server whose tools the model may call
//! command = "server-files"               # (files__<tool>): see mcp_servers.rs for the keys
//! # url = "https://mcp.example.com/mcp"  # or a remote one, with hosts = [...] granted
//! read = ["notes"]                       # the directories its OS sandbox shows it
//!
//! [agents.worker]                       # another agent the model may call as a tool: a
//! agent = "worker.toml"                  # child run (see child_agents.rs for the keys)
//! description = "Does one part"
//!
//! [channels.outbox]                      # a delivery channel: deliveries are recorded
//! plugin = "outbox"                      # effects; the key of a channel plugin in [plugins]
//! receives = ["output", "parked"]        # output | failures | parked | events; default output
//! max_attempts = 5                       # per delivery, 1 to 20; default 5
//! backoff = "1s"                         # before the first retry, doubled after; default 1s
//! backoff_cap = "1m"                     # the longest wait; default 1m, at most 1h
//! [context.notes]                        # a context source, quoted into the prompt as data
//! plugin = "notes-files"                 # a key in [plugins] whose plugin is a context source
//! query = '{"paths": ["*.md"]}'          # passed to the source as is; default ""
//! resolve = "each_call"                  # each_call (before every step's model call, the
//!                                        # default) | once_per_turn (once per run)
//! on_error = "skip"                      # skip (recorded, noted in the prompt; the default)
//!                                        # | fail (recorded, then the run fails)
//! limits = { timeout = "5s" }            # its leases' limits, over the plugin's grant
//! [policies.no-deletes]                  # a policy the application registers under
//! hooks = ["before_tool_call"]           # this name (Runtime::with_policy); hooks:
//!                                        # run_start, after_response,
//!                                        # before_tool_call, before_finish
//!                                        # (default: all four)
//! [policies.guard]                       # a policy carried out by a WASM plugin:
//! plugin = "guard"                       # a key in [plugins] whose plugin is a policy
//!
//! [compaction]                           # optional: summarise older history when
//! max_prompt_tokens = 100_000            # a request's estimate (bytes / 4) exceeds this
//! keep_recent = 4                        # messages kept verbatim after the cut; default 4
//!
//! [budgets]                              # each optional; unset is unlimited
//! max_steps = 20
//! max_input_tokens = 200_000
//! max_output_tokens = 20_000
//! max_tool_calls = 50
//! max_fuel = 50_000_000_000
//! max_wall_time = "10m"
//! max_cost = 1.50                        # needs [model.pricing]
//! max_input_size = "1MiB"                # the largest input (and resume input),
//!                                        # as JSON text; default 1 MiB
//!
//! [labels]                               # at most 16; not part of the digest
//! team = "ops"
//! ```
//!
//! Provider and model travel together: an agent either sets the whole
//! `[model]` table or inherits the operator's default table whole, so a
//! model is never paired with a provider it was not configured for.
//!
//! Secrets never live in an agent file: the API key and secret headers are
//! named by environment variable (`api_key_env`, `header_env`) and read when
//! the provider is made ([`ModelSettings::provider`]). The digest covers the
//! variables' names, not their values; literal `headers` that carry
//! credentials (`authorization`, `x-api-key`, …) are refused.

pub mod child_agents;
pub mod plan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::approvals::NeedsApproval;
use super::batch::{MAX_PARALLEL_CALLS, Parallelism};
use super::budget::{
    BudgetLimits, DEFAULT_MAX_INPUT_BYTES, Pricing, RecordedLimits, currency_to_nanos,
    price_to_micros,
};
use super::canonical::{canonical_json, without_empty};
use super::ceilings::RunCeilings;
use super::channels::{
    BACKOFF_CAP_LIMIT_MS, Channel, DEFAULT_BACKOFF_CAP_MS, DEFAULT_BACKOFF_MS,
    DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_LIMIT, Receives,
};
use super::compaction::{CompactionSettings, DEFAULT_KEEP_RECENT};
use super::context::{ContextSource, OnContextError, ResolveWhen};
use super::ids::AgentDigest;
use super::mcp_servers::{McpServer, McpServerEntry};
use super::policy_hooks::PolicyHook;
use super::refusal::OnRefusal;
use super::retry::RetryPolicy;
use super::schema;
use child_agents::{AgentCall, AgentCallEntry, load_calls};
use plan::{Plan, PlanError, PlanProvider};
use warden_plugins::grant::Grant;
use warden_plugins::manifest::LimitSettings;
use warden_plugins::{PluginSource, builtin};
use warden_providers::config::{self, HttpModelSettings, ModelSection, ProviderKind};
use warden_providers::{ModelProvider, ProviderError};
use warden_sandbox::PluginKind;
use warden_syntax::units::{ByteSize, HumanDuration};

/// Most labels on an agent or a run.
pub const MAX_LABELS: usize = 16;
/// Label keys must be shorter than this, in bytes.
pub const MAX_LABEL_KEY: usize = 64;
/// Label values must be shorter than this, in bytes.
pub const MAX_LABEL_VALUE: usize = 256;
/// Output tokens per model call when the agent does not say.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// Invalid tool calls in a row that end a run when the agent does not say.
pub const DEFAULT_MAX_INVALID_TOOL_CALLS: u32 = 3;

/// An agent file that cannot be read, parsed or accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The file cannot be read.
    #[error("cannot read agent `{path}`: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown or mistyped keys.
    #[error("agent `{path}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said, with line and key.
        message: String,
    },
    /// A key has a value the agent file does not accept.
    #[error("agent `{path}`: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, dotted.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A plan file (see [`plan`]) the engine refuses: an unknown
    /// role or agent, a cycle, a stopping rule that cannot work.
    #[error("plan `{path}`: {error}")]
    Plan {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        error: PlanError,
    },
}

/// The operator's default `[model]` table, inherited whole by agents that
/// set none.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelDefaults {
    /// The table.
    pub section: ModelSection,
    /// What its relative paths (the transcript) resolve against: the
    /// directory of the file it was read from.
    pub base_dir: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    instructions: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_schema_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<ModelSection>,
    #[serde(default)]
    plugins: BTreeMap<String, PluginEntry>,
    #[serde(default)]
    human_tools: BTreeMap<String, HumanToolEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    external_tools: BTreeMap<String, ExternalToolEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    agents: BTreeMap<String, AgentCallEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    mcp_servers: BTreeMap<String, McpServerEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    channels: BTreeMap<String, ChannelEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    policies: BTreeMap<String, PolicyEntry>,
    #[serde(default)]
    budgets: BudgetSettings,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    context: BTreeMap<String, ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_invalid_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_parallel_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parallel_writes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_refusal: Option<OnRefusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compaction: Option<CompactionEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactionEntry {
    max_prompt_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keep_recent: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextEntry {
    plugin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolve: Option<ResolveWhen>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_error: Option<OnContextError>,
    #[serde(default)]
    limits: LimitSettings,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginEntry {
    source: String,
    #[serde(default)]
    grant: Grant,
    #[serde(default)]
    approval: BTreeMap<String, NeedsApproval>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HumanToolEntry {
    description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arguments_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    response_schema: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExternalToolEntry {
    description: String,
    arguments_schema: String,
    output_schema: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    must_match: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelEntry {
    plugin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    receives: Option<Vec<Receives>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backoff: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backoff_cap: Option<HumanDuration>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hooks: Option<Vec<PolicyHook>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tool_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_fuel: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_wall_time: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_input_size: Option<ByteSize>,
}

/// A parsed and validated agent.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// The file it was read from.
    pub path: PathBuf,
    /// Its name.
    pub name: String,
    /// What it is for, for operators.
    pub description: Option<String>,
    /// The system prompt.
    pub instructions: String,
    /// The model it talks to.
    pub model: ModelSettings,
    /// The plugins whose tools it may use, by key, in key order.
    pub plugins: Vec<AgentPlugin>,
    /// The tools that ask a human, in name order.
    pub human_tools: Vec<HumanTool>,
    /// The tools the embedding application performs itself, in name order.
    pub external_tools: Vec<ExternalTool>,
    /// The agents it may call as tools (child runs), in name order.
    pub agents: Vec<AgentCall>,
    /// The MCP servers whose tools it may use, in key order.
    pub mcp_servers: Vec<McpServer>,
    /// Its delivery channels, in name order.
    pub channels: Vec<Channel>,
    /// The policies it enables, in name order.
    pub policies: Vec<AgentPolicy>,
    /// Its budgets, in engine units.
    pub budgets: BudgetLimits,
    /// The largest input a run (or a resume) takes, in bytes of its JSON
    /// text. Default: [`DEFAULT_MAX_INPUT_BYTES`].
    pub max_input_bytes: u64,
    /// Correlation labels (not part of the digest).
    pub labels: BTreeMap<String, String>,
    /// The JSON Schema of its final output, when declared.
    pub output_schema: Option<Value>,
    /// Its context sources, in name order.
    pub context: Vec<ContextSource>,
    /// Invalid tool calls in a row (unknown tools, arguments failing the
    /// schema) that end the run. Default: [`DEFAULT_MAX_INVALID_TOOL_CALLS`].
    pub max_invalid_tool_calls: u32,
    /// How many calls of one turn may be in flight at once
    /// (`max_parallel_calls`, `parallel_writes`).
    pub parallel: Parallelism,
    /// What a refusal does. Default: fail the run.
    pub on_refusal: OnRefusal,
    /// When older history is summarised; `None` never.
    pub compaction: Option<CompactionSettings>,
    /// The digest of the definition, labels excluded.
    pub digest: AgentDigest,
}

/// The model an agent talks to, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSettings {
    /// The provider.
    pub provider: ProviderKind,
    /// The model's name.
    pub name: String,
    /// Output tokens per call.
    pub max_tokens: u32,
    /// The scripted transcript, resolved against its file's directory.
    pub transcript: Option<PathBuf>,
    /// What tokens cost.
    pub pricing: Option<Pricing>,
    /// How a failed model call is tried again (`max_attempts`,
    /// `max_retry_wait`).
    pub retry: RetryPolicy,
    /// How the HTTP providers reach their API; `None` for `scripted`.
    pub http: Option<HttpModelSettings>,
    /// For a plan file, the plan that decides instead of a model (provider
    /// [`ProviderKind::Plan`]).
    pub plan: Option<Arc<Plan>>,
}

impl ModelSettings {
    /// The provider that reaches this model: for `scripted`, the transcript,
    /// read now (so a malformed one is reported before a run starts); for
    /// the HTTP providers, the environment variables the agent names, read
    /// now, on the process-wide HTTP client.
    pub fn provider(&self) -> Result<Arc<dyn ModelProvider>, ProviderError> {
        if let Some(plan) = &self.plan {
            return Ok(Arc::new(PlanProvider::new(Arc::clone(plan))));
        }
        config::connect(
            self.provider,
            self.transcript.as_deref(),
            self.http.as_ref(),
        )
    }
}

/// A plugin an agent uses.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentPlugin {
    /// The key in the agent file; the model calls its tools `<key>__<tool>`.
    pub key: String,
    /// Where it comes from, paths resolved against the agent file.
    pub source: PluginSource,
    /// The operator's grant.
    pub grant: Grant,
    /// What relative directories in the grant resolve against.
    pub grant_base: PathBuf,
    /// When each tool's calls need approval, by tool name; unlisted tools
    /// use [`NeedsApproval::Writes`].
    pub approval: BTreeMap<String, NeedsApproval>,
    /// The bundle the agent's lock file pins, when the agent has one (set
    /// by [`Agent::load`]; not part of the digest): a plugin whose bundle
    /// differs is refused before it is compiled.
    pub pin: Option<warden_plugins::lock::LockPin>,
}

impl AgentPlugin {
    /// When calls of `tool` need approval.
    pub fn needs_approval(&self, tool: &str) -> NeedsApproval {
        self.approval.get(tool).copied().unwrap_or_default()
    }
}

/// A policy an agent enables: asked at its hooks, by the name the embedding
/// application registers its code under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentPolicy {
    /// Its name.
    pub name: String,
    /// The key in `[plugins]` of the policy plugin that decides; `None`: the
    /// embedding application registers the policy under `name`.
    pub plugin: Option<String>,
    /// The hooks it is asked at, in the order a run meets them.
    pub hooks: Vec<PolicyHook>,
}

/// A tool the embedding application performs itself, with its own
/// credentials: the run parks at the call with its frozen arguments until the
/// application reports the output (`Runtime::complete_external`), which is
/// checked against `output_schema` and `must_match` before it is recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalTool {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub arguments_schema: Value,
    /// The JSON Schema the reported output must satisfy.
    pub output_schema: Value,
    /// Output fields that must equal the call's arguments of the same name
    /// (an invoice id, an amount), so a report cannot answer another call.
    pub must_match: Vec<String>,
}

/// A tool the model calls to ask a human: the run suspends at the call and
/// the resume input becomes its result.
#[derive(Clone, Debug, PartialEq)]
pub struct HumanTool {
    /// The name the model calls it by.
    pub name: String,
    /// What it is for, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub arguments_schema: Value,
    /// The JSON Schema the human's answer must satisfy.
    pub response_schema: Value,
}

fn default_arguments_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"question": {"type": "string", "description": "What to ask"}},
        "required": ["question"],
    })
}

fn default_response_schema() -> Value {
    serde_json::json!({"type": "string"})
}

/// A problem with a set of labels.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// More than [`MAX_LABELS`].
    #[error("{count} labels, more than {MAX_LABELS}")]
    TooMany {
        /// How many there are.
        count: usize,
    },
    /// An empty key.
    #[error("a label key is empty (the label `\"\"`): every label needs a key, as in `team=ops`")]
    EmptyKey,
    /// A key of [`MAX_LABEL_KEY`] bytes or more.
    #[error("label key `{key}` is {len} bytes, it must be under {MAX_LABEL_KEY}")]
    KeyTooLong {
        /// The key.
        key: String,
        /// Its length.
        len: usize,
    },
    /// A value of [`MAX_LABEL_VALUE`] bytes or more.
    #[error("label `{key}` has a value of {len} bytes, it must be under {MAX_LABEL_VALUE}")]
    ValueTooLong {
        /// The key.
        key: String,
        /// The value's length.
        len: usize,
    },
}

impl LabelError {
    /// The dotted key under `labels` the error is about.
    pub fn key(&self) -> String {
        match self {
            LabelError::KeyTooLong { key, .. } | LabelError::ValueTooLong { key, .. } => {
                format!("labels.{key}")
            }
            LabelError::TooMany { .. } | LabelError::EmptyKey => "labels".into(),
        }
    }

    /// The label's key the error is about (`""` for an empty one), if it is
    /// about one label.
    pub fn label(&self) -> Option<&str> {
        match self {
            LabelError::KeyTooLong { key, .. } | LabelError::ValueTooLong { key, .. } => Some(key),
            LabelError::EmptyKey => Some(""),
            LabelError::TooMany { .. } => None,
        }
    }
}

/// Checks labels against the limits (also for labels a runtime adds).
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany {
            count: labels.len(),
        });
    }
    for (key, value) in labels {
        if key.is_empty() {
            return Err(LabelError::EmptyKey);
        }
        if key.len() >= MAX_LABEL_KEY {
            return Err(LabelError::KeyTooLong {
                key: key.clone(),
                len: key.len(),
            });
        }
        if value.len() >= MAX_LABEL_VALUE {
            return Err(LabelError::ValueTooLong {
                key: key.clone(),
                len: value.len(),
            });
        }
    }
    Ok(())
}

/// Whether `name` is a valid agent name or plugin key: `[a-z][a-z0-9-]*`,
/// at most 64 bytes.
fn is_valid_name(name: &str) -> bool {
    warden_plugins::manifest::is_valid_plugin_name(name)
}

/// Whether `name` is a valid human tool name: a valid tool name without
/// `__`, so it cannot collide with a plugin tool's `<key>__<tool>`.
pub(crate) fn is_valid_human_tool_name(name: &str) -> bool {
    warden_plugins::tool::is_valid_tool_name(name) && !name.contains("__")
}

impl Agent {
    /// The limits a run of this agent starts under on a host with
    /// `ceilings`, as its `run_started` records them.
    pub fn recorded_limits(&self, ceilings: &RunCeilings) -> RecordedLimits {
        RecordedLimits {
            budgets: self.budgets,
            max_input_bytes: self.max_input_bytes,
            currency: self.model.pricing.as_ref().map(|p| p.currency.clone()),
            ceilings: Some(*ceilings),
        }
    }

    /// Checks that each plugin the agent names as a context source, a
    /// channel or a policy is of that kind; `plugin` gives a plugin's kinds
    /// and source by its key in `[plugins]`. The error names the key that
    /// uses the plugin.
    pub fn check_plugin_kinds<'a>(
        &self,
        plugin: impl Fn(&str) -> (&'a [PluginKind], String),
    ) -> Result<(), AgentError> {
        let context = self.context.iter().map(|c| {
            let key = format!("context.{}.plugin", c.name);
            (
                key,
                c.plugin.as_str(),
                PluginKind::Context,
                "a context source",
            )
        });
        let channels = self.channels.iter().map(|c| {
            let key = format!("channels.{}.plugin", c.name);
            (key, c.plugin.as_str(), PluginKind::Channel, "a channel")
        });
        let policies = self.policies.iter().filter_map(|p| {
            let key = format!("policies.{}.plugin", p.name);
            Some((key, p.plugin.as_deref()?, PluginKind::Policy, "a policy"))
        });
        for (key, name, needed, noun) in context.chain(channels).chain(policies) {
            let (kinds, source) = plugin(name);
            if !kinds.contains(&needed) {
                let kinds: Vec<String> = kinds.iter().map(ToString::to_string).collect();
                return Err(AgentError::Invalid {
                    path: self.path.clone(),
                    key,
                    message: format!(
                        "plugin `{name}` ({source}) is not {noun} (its kinds: {})",
                        kinds.join(", ")
                    ),
                });
            }
        }
        Ok(())
    }

    /// Reads, parses and validates the agent at `path`. An agent without a
    /// `[model]` table inherits `defaults`. When the agent has a lock file
    /// (`AGENT.lock` next to it, `warden plugin lock`), each plugin is
    /// pinned to its entry: one the lock does not list, or whose bundle
    /// differs, is refused when it is loaded.
    pub fn load(path: &Path, defaults: Option<&ModelDefaults>) -> Result<Agent, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|error| AgentError::Read {
            path: path.to_owned(),
            error,
        })?;
        let mut agent = Agent::parse(&text, path, defaults)?;
        agent.pin_to_lock(path)?;
        Ok(agent)
    }

    /// Pins each plugin to its entry in the lock file of the agent file
    /// `path`, when there is one.
    fn pin_to_lock(&mut self, path: &Path) -> Result<(), AgentError> {
        use warden_plugins::lock::{Lock, LockPin};
        let file = Lock::path_for(path);
        let lock = Lock::read(&file).map_err(|e| AgentError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let Some(lock) = lock else {
            return Ok(());
        };
        for plugin in &mut self.plugins {
            plugin.pin = Some(LockPin {
                file: file.clone(),
                key: plugin.key.clone(),
                entry: lock.plugins.get(&plugin.key).cloned(),
            });
        }
        Ok(())
    }

    /// Parses and validates agent text. `path` names the file in errors, and
    /// its directory is what relative paths resolve against.
    pub fn parse(
        text: &str,
        path: &Path,
        defaults: Option<&ModelDefaults>,
    ) -> Result<Agent, AgentError> {
        if plan::is_plan(text) {
            return plan::parse(text, path, defaults);
        }
        let file: AgentFile = toml::from_str(text).map_err(|e| AgentError::Parse {
            path: path.to_owned(),
            message: warden_syntax::toml_errors::one_line(text, &e),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        validate(file, path, base, defaults)
    }

    /// Builds and validates an agent from a JSON value shaped like an agent
    /// file (the tables become objects), for embedders that build agents in
    /// code. `origin` names it in errors, and its directory is what relative
    /// paths (plugins, schema files) resolve against, as a file's would.
    pub fn from_json(
        value: Value,
        origin: &Path,
        defaults: Option<&ModelDefaults>,
    ) -> Result<Agent, AgentError> {
        let file = AgentFile::deserialize(value).map_err(|e| AgentError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })?;
        let base = origin.parent().unwrap_or(Path::new("."));
        validate(file, origin, base, defaults)
    }
}

fn validate(
    file: AgentFile,
    path: &Path,
    base: &Path,
    defaults: Option<&ModelDefaults>,
) -> Result<Agent, AgentError> {
    let invalid = |key: &str, message: String| AgentError::Invalid {
        path: path.to_owned(),
        key: key.to_owned(),
        message,
    };
    let json_object = |key: &str, text: &str| -> Result<Value, AgentError> {
        match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => match schema::check_schema(&v) {
                Ok(()) => Ok(v),
                Err(e) => Err(invalid(key, e.to_string())),
            },
            Ok(_) => Err(invalid(
                key,
                "must be a JSON object (JSON Schema) as text".into(),
            )),
            Err(e) => Err(invalid(key, format!("is not valid JSON: {e}"))),
        }
    };

    if !is_valid_name(&file.name) {
        return Err(invalid(
            "name",
            format!(
                "`{}` is not a valid agent name (use [a-z][a-z0-9-]*, at most 64 bytes)",
                file.name
            ),
        ));
    }
    if file.instructions.trim().is_empty() {
        return Err(invalid("instructions", "must not be empty".into()));
    }
    let output_schema = match (&file.output_schema, &file.output_schema_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "output_schema_file",
                "set either output_schema or output_schema_file, not both".into(),
            ));
        }
        (Some(text), None) => Some(json_object("output_schema", text)?),
        (None, Some(rel)) => {
            let at = base.join(rel);
            let text = std::fs::read_to_string(&at).map_err(|e| {
                invalid(
                    "output_schema_file",
                    format!("cannot read `{}`: {e}", at.display()),
                )
            })?;
            Some(json_object("output_schema_file", &text)?)
        }
        (None, None) => None,
    };

    // The model: the agent's own table, or the defaults' whole.
    let (section, model_base) = match (&file.model, defaults) {
        (Some(section), _) => (section.clone(), base.to_owned()),
        (None, Some(d)) => (d.section.clone(), d.base_dir.clone()),
        (None, None) => {
            return Err(invalid(
                "model",
                "no model: set [model] with `provider` and `name`, or configure a default model to inherit".into(),
            ));
        }
    };
    if section.name.trim().is_empty() {
        return Err(invalid("model.name", "must not be empty".into()));
    }
    let max_tokens = section.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 || max_tokens > 1_000_000 {
        return Err(invalid(
            "model.max_tokens",
            format!("must be between 1 and 1000000, got {max_tokens}"),
        ));
    }
    let transcript = match (section.provider, &section.transcript) {
        (ProviderKind::Scripted, Some(t)) => Some(model_base.join(t)),
        (ProviderKind::Scripted, None) => {
            return Err(invalid(
                "model.transcript",
                "is required for the scripted provider: name the transcript file".into(),
            ));
        }
        (kind, Some(_)) => {
            return Err(invalid(
                "model.transcript",
                format!(
                    "only the scripted provider reads a transcript, not `{}`",
                    kind.as_str()
                ),
            ));
        }
        (_, None) => None,
    };
    let http = config::http_settings(&section).map_err(|(key, message)| invalid(&key, message))?;
    let retry = retry_policy(&section).map_err(|(key, message)| invalid(&key, message))?;
    let pricing = match &section.pricing {
        None => None,
        Some(p) => {
            let currency = p.currency.clone().unwrap_or_else(|| "USD".into());
            if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(invalid(
                    "model.pricing.currency",
                    format!("`{currency}` is not an ISO 4217 code such as USD"),
                ));
            }
            let price = |key: &str, amount: f64| {
                price_to_micros(amount).ok_or_else(|| {
                    invalid(key, format!("must be a non-negative amount, got {amount}"))
                })
            };
            Some(Pricing {
                currency,
                input_micros_per_million: price(
                    "model.pricing.input_per_million",
                    p.input_per_million,
                )?,
                output_micros_per_million: price(
                    "model.pricing.output_per_million",
                    p.output_per_million,
                )?,
            })
        }
    };

    let mut plugins = Vec::with_capacity(file.plugins.len());
    for (key, entry) in &file.plugins {
        let at = |k: &str| format!("plugins.{key}.{k}");
        if !is_valid_name(key) {
            return Err(invalid(
                &format!("plugins.{key}"),
                "is not a valid plugin key (use [a-z][a-z0-9-]*, at most 64 bytes)".into(),
            ));
        }
        if entry.source.trim().is_empty() {
            return Err(invalid(&at("source"), "must not be empty".into()));
        }
        let source = match entry.source.parse::<PluginSource>() {
            Ok(PluginSource::Builtin(name)) => {
                if builtin::find(&name).is_none() {
                    return Err(invalid(
                        &at("source"),
                        format!(
                            "no built-in plugin `{name}` (built in: {})",
                            builtin::names().join(", ")
                        ),
                    ));
                }
                PluginSource::Builtin(name)
            }
            Ok(PluginSource::Manifest(p)) => PluginSource::Manifest(base.join(p)),
            Err(never) => match never {},
        };
        for tool in entry.approval.keys() {
            if !warden_plugins::tool::is_valid_tool_name(tool) {
                return Err(invalid(
                    &at(&format!("approval.{tool}")),
                    "is not a valid tool name (use [a-z][a-z0-9_]*, at most 64 bytes)".into(),
                ));
            }
        }
        entry
            .grant
            .limits
            .validate(&at("grant.limits"))
            .map_err(|(key, message)| invalid(&key, message))?;
        for (tool, o) in &entry.grant.tools {
            if let Some(schema) = &o.input_schema {
                json_object(&at(&format!("grant.tools.{tool}.input_schema")), schema)?;
            }
        }
        plugins.push(AgentPlugin {
            key: key.clone(),
            source,
            grant: entry.grant.clone(),
            grant_base: base.to_owned(),
            approval: entry.approval.clone(),
            pin: None,
        });
    }

    let mut human_tools = Vec::with_capacity(file.human_tools.len());
    for (name, entry) in &file.human_tools {
        let at = |k: &str| format!("human_tools.{name}.{k}");
        if !is_valid_human_tool_name(name) {
            return Err(invalid(
                &format!("human_tools.{name}"),
                "is not a valid human tool name (use [a-z][a-z0-9_]*, at most 64 bytes, without `__`)"
                    .into(),
            ));
        }
        if entry.description.trim().is_empty() {
            return Err(invalid(&at("description"), "must not be empty".into()));
        }
        human_tools.push(HumanTool {
            name: name.clone(),
            description: entry.description.clone(),
            arguments_schema: match &entry.arguments_schema {
                Some(s) => json_object(&at("arguments_schema"), s)?,
                None => default_arguments_schema(),
            },
            response_schema: match &entry.response_schema {
                Some(s) => json_object(&at("response_schema"), s)?,
                None => default_response_schema(),
            },
        });
    }

    let mut external_tools = Vec::with_capacity(file.external_tools.len());
    for (name, entry) in &file.external_tools {
        let at = |k: &str| format!("external_tools.{name}.{k}");
        if !is_valid_human_tool_name(name) {
            return Err(invalid(
                &format!("external_tools.{name}"),
                "is not a valid tool name (use [a-z][a-z0-9_]*, at most 64 bytes, without `__`)"
                    .into(),
            ));
        }
        if file.human_tools.contains_key(name) {
            return Err(invalid(
                &format!("external_tools.{name}"),
                "is also a human tool".into(),
            ));
        }
        if entry.description.trim().is_empty() {
            return Err(invalid(&at("description"), "must not be empty".into()));
        }
        let arguments_schema = json_object(&at("arguments_schema"), &entry.arguments_schema)?;
        let output_schema = json_object(&at("output_schema"), &entry.output_schema)?;
        let declared = arguments_schema
            .get("properties")
            .and_then(Value::as_object);
        for (i, field) in entry.must_match.iter().enumerate() {
            if let Some(props) = declared
                && !props.contains_key(field)
            {
                return Err(invalid(
                    &format!("{}[{i}]", at("must_match")),
                    format!("`{field}` is not an argument of the tool"),
                ));
            }
        }
        external_tools.push(ExternalTool {
            name: name.clone(),
            description: entry.description.clone(),
            arguments_schema,
            output_schema,
            must_match: entry.must_match.clone(),
        });
    }

    let plugin_keys: Vec<&str> = file.plugins.keys().map(String::as_str).collect();
    let mcp_servers = super::mcp_servers::validate(
        &file.mcp_servers,
        path,
        base,
        &plugin_keys,
        &invalid,
        &json_object,
    )?;

    let channels = validate_channels(&file, &invalid)?;

    let b = &file.budgets;
    for (key, value) in [
        ("budgets.max_steps", b.max_steps),
        ("budgets.max_input_tokens", b.max_input_tokens),
        ("budgets.max_output_tokens", b.max_output_tokens),
        ("budgets.max_tool_calls", b.max_tool_calls),
        ("budgets.max_fuel", b.max_fuel),
    ] {
        if value == Some(0) {
            return Err(invalid(key, "must be more than zero".into()));
        }
    }
    let wall_time_ms = match b.max_wall_time {
        Some(d) if d.0.is_zero() => {
            return Err(invalid(
                "budgets.max_wall_time",
                "must be more than zero".into(),
            ));
        }
        Some(d) => Some(u64::try_from(d.0.as_millis()).unwrap_or(u64::MAX)),
        None => None,
    };
    let cost_nanos = match b.max_cost {
        None => None,
        Some(amount) => {
            if pricing.is_none() {
                return Err(invalid(
                    "budgets.max_cost",
                    "a cost budget needs pricing: set [model.pricing] with input_per_million and output_per_million".into(),
                ));
            }
            match currency_to_nanos(amount) {
                Some(n) if n > 0 => Some(n),
                _ => {
                    return Err(invalid(
                        "budgets.max_cost",
                        format!("must be a positive amount, got {amount}"),
                    ));
                }
            }
        }
    };
    let max_input_bytes = match b.max_input_size {
        Some(ByteSize(0)) => {
            return Err(invalid(
                "budgets.max_input_size",
                "must be more than zero".into(),
            ));
        }
        Some(ByteSize(n)) => n,
        None => DEFAULT_MAX_INPUT_BYTES,
    };
    let budgets = BudgetLimits {
        steps: b.max_steps,
        input_tokens: b.max_input_tokens,
        output_tokens: b.max_output_tokens,
        cost_nanos,
        tool_calls: b.max_tool_calls,
        fuel: b.max_fuel,
        wall_time_ms,
    };

    let mut context = Vec::with_capacity(file.context.len());
    for (name, entry) in &file.context {
        let at = |k: &str| format!("context.{name}.{k}");
        if !is_valid_name(name) {
            return Err(invalid(
                &format!("context.{name}"),
                "is not a valid context source name (use [a-z][a-z0-9-]*, at most 64 bytes)".into(),
            ));
        }
        check_plugin_key(&file, &entry.plugin, &at("plugin"), &invalid)?;
        entry
            .limits
            .validate(&at("limits"))
            .map_err(|(key, message)| invalid(&key, message))?;
        context.push(ContextSource {
            name: name.clone(),
            plugin: entry.plugin.clone(),
            query: entry.query.clone().unwrap_or_default(),
            resolve: entry.resolve.unwrap_or_default(),
            on_error: entry.on_error.unwrap_or_default(),
            limits: entry.limits.clone(),
        });
    }
    let max_invalid_tool_calls = file
        .max_invalid_tool_calls
        .unwrap_or(DEFAULT_MAX_INVALID_TOOL_CALLS);
    if !(1..=100).contains(&max_invalid_tool_calls) {
        return Err(invalid(
            "max_invalid_tool_calls",
            format!("must be between 1 and 100, got {max_invalid_tool_calls}"),
        ));
    }

    let max_parallel_calls = file.max_parallel_calls.unwrap_or(1);
    if !(1..=MAX_PARALLEL_CALLS).contains(&max_parallel_calls) {
        return Err(invalid(
            "max_parallel_calls",
            format!("must be between 1 and {MAX_PARALLEL_CALLS}, got {max_parallel_calls}"),
        ));
    }
    let parallel = Parallelism {
        max_calls: max_parallel_calls,
        writes: file.parallel_writes.unwrap_or(false),
    };

    let compaction = match &file.compaction {
        None => None,
        Some(c) => {
            if c.max_prompt_tokens < 256 {
                return Err(invalid(
                    "compaction.max_prompt_tokens",
                    format!("must be at least 256, got {}", c.max_prompt_tokens),
                ));
            }
            let keep_recent = c.keep_recent.unwrap_or(DEFAULT_KEEP_RECENT);
            if !(1..=1000).contains(&keep_recent) {
                return Err(invalid(
                    "compaction.keep_recent",
                    format!("must be between 1 and 1000, got {keep_recent}"),
                ));
            }
            Some(CompactionSettings {
                max_prompt_tokens: c.max_prompt_tokens,
                keep_recent,
            })
        }
    };

    validate_labels(&file.labels).map_err(|e| invalid(&e.key(), e.to_string()))?;

    let mut policies = Vec::with_capacity(file.policies.len());
    let mut resolved = file.clone();
    for (name, entry) in &file.policies {
        if !is_valid_name(name) {
            return Err(invalid(
                &format!("policies.{name}"),
                format!(
                    "`{name}` is not a valid policy name (use [a-z][a-z0-9-]*, at most 64 bytes)"
                ),
            ));
        }
        let hooks = match &entry.hooks {
            None => PolicyHook::ALL.to_vec(),
            Some(hooks) if hooks.is_empty() => {
                return Err(invalid(
                    &format!("policies.{name}.hooks"),
                    "must name at least one hook (or be left out for all)".into(),
                ));
            }
            Some(hooks) => {
                let mut sorted = hooks.clone();
                sorted.sort();
                sorted.dedup();
                if sorted.len() != hooks.len() {
                    return Err(invalid(
                        &format!("policies.{name}.hooks"),
                        "names a hook twice".into(),
                    ));
                }
                sorted
            }
        };
        if let Some(plugin) = &entry.plugin {
            check_plugin_key(&file, plugin, &format!("policies.{name}.plugin"), &invalid)?;
        }
        // The digest covers the effective hooks, so `[policies.x]` with no
        // keys still changes it.
        resolved.policies.insert(
            name.clone(),
            PolicyEntry {
                plugin: entry.plugin.clone(),
                hooks: Some(hooks.clone()),
            },
        );
        policies.push(AgentPolicy {
            name: name.clone(),
            plugin: entry.plugin.clone(),
            hooks,
        });
    }

    // A schema read from a file is digested by its content: editing the file
    // changes the agent.
    let schema_from_file = file.output_schema_file.as_ref().and(output_schema.as_ref());
    let agents = load_calls(&mut resolved.agents, path, base, defaults, &json_object)?;
    let digest = digest(&resolved, &section, schema_from_file);
    Ok(Agent {
        path: path.to_owned(),
        name: file.name,
        description: file.description,
        instructions: file.instructions,
        model: ModelSettings {
            provider: section.provider,
            name: section.name,
            max_tokens,
            transcript,
            pricing,
            retry,
            http,
            plan: None,
        },
        plugins,
        human_tools,
        external_tools,
        agents,
        mcp_servers,
        channels,
        policies,
        budgets,
        max_input_bytes,
        labels: file.labels,
        output_schema,
        context,
        max_invalid_tool_calls,
        parallel,
        on_refusal: file.on_refusal.unwrap_or_default(),
        compaction,
        digest,
    })
}

/// Checks that `plugin`, set at `key`, names one of the agent's `[plugins]`.
fn check_plugin_key(
    file: &AgentFile,
    plugin: &str,
    key: &str,
    invalid: &dyn Fn(&str, String) -> AgentError,
) -> Result<(), AgentError> {
    if file.plugins.contains_key(plugin) {
        return Ok(());
    }
    let keys: Vec<&str> = file.plugins.keys().map(String::as_str).collect();
    Err(invalid(
        key,
        format!(
            "`{plugin}` is not a plugin of this agent (its [plugins]: {})",
            if keys.is_empty() {
                "none".to_owned()
            } else {
                keys.join(", ")
            }
        ),
    ))
}

/// Checks `[channels.<name>]`: a valid name, a plugin key of the agent's,
/// what it receives (not empty, no duplicates), attempts and backoff in
/// range.
fn validate_channels(
    file: &AgentFile,
    invalid: &dyn Fn(&str, String) -> AgentError,
) -> Result<Vec<Channel>, AgentError> {
    let millis = |d: HumanDuration| u64::try_from(d.0.as_millis()).unwrap_or(u64::MAX);
    let mut channels = Vec::with_capacity(file.channels.len());
    for (name, entry) in &file.channels {
        let at = |k: &str| format!("channels.{name}.{k}");
        if !is_valid_name(name) {
            return Err(invalid(
                &format!("channels.{name}"),
                "is not a valid channel name (use [a-z][a-z0-9-]*, at most 64 bytes)".into(),
            ));
        }
        check_plugin_key(file, &entry.plugin, &at("plugin"), invalid)?;
        let receives = entry
            .receives
            .clone()
            .unwrap_or_else(|| vec![Receives::Output]);
        if receives.is_empty() {
            return Err(invalid(
                &at("receives"),
                format!(
                    "must name at least one of: {}",
                    Receives::ALL.map(Receives::as_str).join(", ")
                ),
            ));
        }
        for (i, r) in receives.iter().enumerate() {
            if receives[..i].contains(r) {
                return Err(invalid(
                    &format!("{}[{i}]", at("receives")),
                    format!("`{}` is listed twice", r.as_str()),
                ));
            }
        }
        let max_attempts = entry.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&max_attempts) {
            return Err(invalid(
                &at("max_attempts"),
                format!("must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {max_attempts}"),
            ));
        }
        let backoff_ms = entry.backoff.map_or(DEFAULT_BACKOFF_MS, millis);
        if backoff_ms == 0 {
            return Err(invalid(&at("backoff"), "must be more than zero".into()));
        }
        let backoff_cap_ms = entry
            .backoff_cap
            .map_or(DEFAULT_BACKOFF_CAP_MS.max(backoff_ms), millis);
        if backoff_cap_ms < backoff_ms || backoff_cap_ms > BACKOFF_CAP_LIMIT_MS {
            return Err(invalid(
                &at("backoff_cap"),
                format!(
                    "must be at least the backoff ({backoff_ms} ms) and at most 1h, got {backoff_cap_ms} ms"
                ),
            ));
        }
        channels.push(Channel {
            name: name.clone(),
            plugin: entry.plugin.clone(),
            receives,
            max_attempts,
            backoff_ms,
            backoff_cap_ms,
        });
    }
    Ok(channels)
}

/// The most `[model] max_retry_wait` may be: a longer wait parks the run
/// anyway, and a driver asleep for hours holds a worker's slot.
pub const MAX_RETRY_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Checks the retry keys of a `[model]` table (every provider has them:
/// the engine retries, not the provider).
fn retry_policy(section: &ModelSection) -> Result<RetryPolicy, (String, String)> {
    let err = |key: &str, message: String| (format!("model.{key}"), message);
    let defaults = RetryPolicy::default();
    let max_attempts = section.max_attempts.unwrap_or(defaults.max_attempts);
    if !(1..=10).contains(&max_attempts) {
        return Err(err(
            "max_attempts",
            format!("must be between 1 and 10, got {max_attempts}"),
        ));
    }
    let max_wait_ms = match section.max_retry_wait {
        Some(w) if w.0 > MAX_RETRY_WAIT_LIMIT => {
            return Err(err(
                "max_retry_wait",
                format!(
                    "must be at most 1h, got {}",
                    warden_syntax::units::format_duration(w.0)
                ),
            ));
        }
        Some(w) => w.0.as_millis() as u64,
        None => defaults.max_wait_ms,
    };
    Ok(RetryPolicy {
        max_attempts,
        max_wait_ms,
    })
}

/// The digest: sha256 of a versioned tag and the canonical JSON of the file
/// as written, with the effective `[model]` table, the content of an
/// `output_schema_file`, and without labels. Null
/// and empty members are dropped, so a new optional key does not change the
/// digest of agents that leave it unset. Paths are digested as written, so
/// the digest does not depend on where the files are.
fn digest(file: &AgentFile, model: &ModelSection, schema_from_file: Option<&Value>) -> AgentDigest {
    let mut form = file.clone();
    form.model = Some(model.clone());
    form.labels.clear();
    let mut value = serde_json::to_value(&form).expect("an agent file serializes to JSON");
    if let (Some(schema), Value::Object(map)) = (schema_from_file, &mut value) {
        map.insert("output_schema_file_content".into(), schema.clone());
    }
    let mut bytes = b"warden-agent-v1\n".to_vec();
    bytes.extend_from_slice(canonical_json(&without_empty(&value)).as_bytes());
    AgentDigest::of(&bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use warden_providers::{MaxTokensField, Secret};

    pub(crate) const MINIMAL: &str = r#"
name = "notes"
instructions = "You keep notes."

[model]
provider = "scripted"
name = "demo"
transcript = "notes.transcript.toml"
"#;

    fn parse(text: &str) -> Result<Agent, AgentError> {
        Agent::parse(text, Path::new("/agents/notes.toml"), None)
    }

    #[test]
    fn a_full_agent_parses_with_paths_resolved_and_units_converted() {
        let text = r#"
name = "notes"
description = "Tidies notes"
instructions = "You keep notes."
output_schema = '{"type": "object"}'

[model]
provider = "scripted"
name = "demo"
max_tokens = 512
transcript = "t/notes.toml"
[model.pricing]
input_per_million = 3.0
output_per_million = 15.0

[plugins.fs]
source = "builtin:fs"
approval = { read_file = "never", write_file = "always" }
[plugins.fs.grant.mounts.workspace]
dir = "notes"
access = "read-only"

[plugins.local]
source = "../plugins/local/plugin.toml"

[human_tools.ask_operator]
description = "Ask the operator"

[budgets]
max_steps = 20
max_tool_calls = 5
max_wall_time = "10m"
max_cost = 1.5

[labels]
team = "ops"
"#;
        let a = parse(text).unwrap();
        assert_eq!(a.name, "notes");
        assert_eq!(a.model.max_tokens, 512);
        assert_eq!(
            a.model.transcript.as_deref(),
            Some(Path::new("/agents/t/notes.toml"))
        );
        assert_eq!(
            a.model.pricing,
            Some(Pricing {
                currency: "USD".into(),
                input_micros_per_million: 3_000_000,
                output_micros_per_million: 15_000_000,
            })
        );
        assert_eq!(a.plugins.len(), 2);
        let fs = &a.plugins[0];
        assert_eq!(fs.key, "fs");
        assert_eq!(fs.source, PluginSource::Builtin("fs".into()));
        assert_eq!(fs.grant_base, Path::new("/agents"));
        assert_eq!(fs.grant.mounts["workspace"].dir, Path::new("notes"));
        assert_eq!(fs.needs_approval("read_file"), NeedsApproval::Never);
        assert_eq!(fs.needs_approval("write_file"), NeedsApproval::Always);
        assert_eq!(fs.needs_approval("edit_file"), NeedsApproval::Writes);
        assert_eq!(
            a.plugins[1].source,
            PluginSource::Manifest(PathBuf::from("/agents/../plugins/local/plugin.toml"))
        );
        assert_eq!(a.human_tools[0].name, "ask_operator");
        assert_eq!(a.human_tools[0].response_schema, default_response_schema());
        assert_eq!(
            a.budgets,
            BudgetLimits {
                steps: Some(20),
                tool_calls: Some(5),
                wall_time_ms: Some(600_000),
                cost_nanos: Some(1_500_000_000),
                ..BudgetLimits::default()
            }
        );
        assert_eq!(a.labels["team"], "ops");
        assert_eq!(a.output_schema, Some(serde_json::json!({"type": "object"})));
    }

    #[test]
    fn an_agent_built_from_json_equals_the_same_agent_from_a_file() {
        let path = Path::new("/agents/notes.toml");
        let text = format!(
            "output_schema = '{{\"type\": \"object\"}}'\n{MINIMAL}\n[budgets]\nmax_steps = 7\n"
        );
        let from_file = Agent::parse(&text, path, None).unwrap();
        let value: Value = toml::from_str(&text).unwrap();
        let from_json = Agent::from_json(value, path, None).unwrap();
        assert_eq!(from_json, from_file);
        assert_eq!(from_json.digest, from_file.digest);

        // A misspelt key or a value of the wrong type names the key.
        let misspelt = serde_json::json!({"name": "notes", "instructions": "x", "modle": {}});
        let err = Agent::from_json(misspelt, path, None).unwrap_err();
        assert!(err.to_string().contains("modle"), "{err}");
        let wrong = serde_json::json!({"name": "notes", "instructions": 3});
        let err = Agent::from_json(wrong, path, None).unwrap_err();
        assert!(err.to_string().contains("/agents/notes.toml"), "{err}");
        // Validation is the file's: a bad name is refused the same way.
        let bad = serde_json::json!({"name": "Notes!", "instructions": "x"});
        let err = Agent::from_json(bad, path, None).unwrap_err();
        assert!(err.to_string().contains("not a valid agent name"), "{err}");
    }

    #[test]
    fn an_output_schema_file_is_read_relative_to_the_agent_and_digested_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let agent_path = dir.path().join("notes.toml");
        let text = format!("output_schema_file = \"schemas/out.json\"\n{MINIMAL}");
        std::fs::create_dir(dir.path().join("schemas")).unwrap();
        let schema = r#"{"type": "object", "required": ["title"]}"#;
        std::fs::write(dir.path().join("schemas/out.json"), schema).unwrap();
        let a = Agent::parse(&text, &agent_path, None).unwrap();
        assert_eq!(
            a.output_schema,
            Some(serde_json::json!({"type": "object", "required": ["title"]}))
        );
        // Editing the file changes the digest.
        std::fs::write(
            dir.path().join("schemas/out.json"),
            r#"{"type": "object", "required": ["name"]}"#,
        )
        .unwrap();
        let b = Agent::parse(&text, &agent_path, None).unwrap();
        assert_ne!(a.digest, b.digest);
        // A missing or malformed file, or both keys, name the key.
        std::fs::write(dir.path().join("schemas/out.json"), "{").unwrap();
        let err = Agent::parse(&text, &agent_path, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("key `output_schema_file`: is not valid JSON"),
            "{err}"
        );
        std::fs::write(
            dir.path().join("schemas/out.json"),
            r#"{"type": "nonsense"}"#,
        )
        .unwrap();
        let err = Agent::parse(&text, &agent_path, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("key `output_schema_file`: invalid JSON Schema"),
            "{err}"
        );
        let missing = format!("output_schema_file = \"nope.json\"\n{MINIMAL}");
        let err = Agent::parse(&missing, &agent_path, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("key `output_schema_file`: cannot read `")
                && err.to_string().contains("nope.json"),
            "{err}"
        );
        let both = format!("output_schema = '{{}}'\n{text}");
        let err = Agent::parse(&both, &agent_path, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("set either output_schema or output_schema_file, not both"),
            "{err}"
        );
    }

    #[test]
    fn policies_are_enabled_by_name_with_their_hooks_and_digested() {
        let with = |table: &str| format!("{MINIMAL}\n{table}");
        let a = parse(&with(
            "[policies.audit]\n[policies.no-deletes]\nhooks = [\"before_tool_call\"]\n",
        ))
        .unwrap();
        assert_eq!(
            a.policies,
            [
                AgentPolicy {
                    name: "audit".into(),
                    plugin: None,
                    hooks: PolicyHook::ALL.to_vec()
                },
                AgentPolicy {
                    name: "no-deletes".into(),
                    plugin: None,
                    hooks: vec![PolicyHook::BeforeToolCall]
                },
            ]
        );
        let plain = parse(MINIMAL).unwrap();
        let only_audit = parse(&with("[policies.audit]\n")).unwrap();
        assert_ne!(
            plain.digest, only_audit.digest,
            "an empty policy table counts"
        );
        assert_ne!(only_audit.digest, a.digest);
        let guard = |policy: &str| {
            parse(&with(&format!(
                "[plugins.guard]\nsource = \"builtin:fs\"\n{policy}"
            )))
            .unwrap()
        };
        let by_plugin = guard("[policies.audit]\nplugin = \"guard\"\n");
        assert_eq!(by_plugin.policies[0].plugin.as_deref(), Some("guard"));
        assert_ne!(
            by_plugin.digest,
            guard("[policies.audit]\n").digest,
            "which code decides is part of the agent"
        );
        for (table, key, message) in [
            (
                "[policies.Bad]\n",
                "policies.Bad",
                "not a valid policy name",
            ),
            (
                "[policies.a]\nhooks = []\n",
                "policies.a.hooks",
                "at least one hook",
            ),
            (
                "[policies.a]\nhooks = [\"run_start\", \"run_start\"]\n",
                "policies.a.hooks",
                "names a hook twice",
            ),
            (
                "[policies.a]\nplugin = \"guard\"\n",
                "policies.a.plugin",
                "`guard` is not a plugin of this agent (its [plugins]: none)",
            ),
        ] {
            assert_invalid(&with(table), key, message);
        }
        let err = parse(&with("[policies.a]\nhooks = [\"whenever\"]\n")).unwrap_err();
        assert!(
            err.to_string().contains("unknown variant `whenever`"),
            "{err}"
        );
    }

    /// Asserts that `text` is refused with an error naming `key` and saying
    /// `message`.
    fn assert_invalid(text: &str, key: &str, message: &str) {
        match parse(text) {
            Err(AgentError::Invalid {
                key: k,
                message: m,
                path,
            }) => {
                assert_eq!(path, Path::new("/agents/notes.toml"));
                assert_eq!(k, key, "{text}");
                assert!(m.contains(message), "{key}: {m}");
            }
            other => panic!("expected an invalid key `{key}`, got {other:?}"),
        }
    }

    #[test]
    fn validation_errors_name_the_file_and_the_key() {
        let with = |extra: &str| format!("{MINIMAL}{extra}");
        let long_key = format!("labels.{}", "k".repeat(64));
        let cases: Vec<(String, &str, &str)> = vec![
            (
                MINIMAL.replace("name = \"notes\"", "name = \"Notes!\""),
                "name",
                "not a valid agent name",
            ),
            (
                MINIMAL.replace("You keep notes.", " "),
                "instructions",
                "must not be empty",
            ),
            (
                MINIMAL.replace("transcript = \"notes.transcript.toml\"\n", ""),
                "model.transcript",
                "is required for the scripted provider",
            ),
            (
                MINIMAL.replace("name = \"demo\"", "name = \"\""),
                "model.name",
                "must not be empty",
            ),
            (
                MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nmax_tokens = 0"),
                "model.max_tokens",
                "between 1 and 1000000",
            ),
            (
                with("[budgets]\nmax_cost = 1.0\n"),
                "budgets.max_cost",
                "a cost budget needs pricing",
            ),
            (
                with("[budgets]\nmax_steps = 0\n"),
                "budgets.max_steps",
                "more than zero",
            ),
            (
                with("[budgets]\nmax_wall_time = \"0s\"\n"),
                "budgets.max_wall_time",
                "more than zero",
            ),
            (
                with("[model.pricing]\ninput_per_million = -1.0\noutput_per_million = 1.0\n"),
                "model.pricing.input_per_million",
                "non-negative",
            ),
            (
                with(
                    "[model.pricing]\ninput_per_million = 1.0\noutput_per_million = 1.0\ncurrency = \"usd\"\n",
                ),
                "model.pricing.currency",
                "not an ISO 4217 code",
            ),
            (
                with("[plugins.fs]\nsource = \"builtin:nope\"\n"),
                "plugins.fs.source",
                "no built-in plugin `nope` (built in: ",
            ),
            (
                with("[plugins.Fs]\nsource = \"builtin:fs\"\n"),
                "plugins.Fs",
                "not a valid plugin key",
            ),
            (
                with("[plugins.fs]\nsource = \"builtin:fs\"\napproval = { Bad = \"never\" }\n"),
                "plugins.fs.approval.Bad",
                "not a valid tool name",
            ),
            (
                with(
                    "[plugins.fs]\nsource = \"builtin:fs\"\n[plugins.fs.grant.limits]\ntimeout = \"0s\"\n",
                ),
                "plugins.fs.grant.limits.timeout",
                "more than zero",
            ),
            (
                with(
                    "[plugins.fs]\nsource = \"builtin:fs\"\n[plugins.fs.grant.tools.read_file]\ninput_schema = \"[1]\"\n",
                ),
                "plugins.fs.grant.tools.read_file.input_schema",
                "must be a JSON object",
            ),
            (
                with("[human_tools.ask__x]\ndescription = \"d\"\n"),
                "human_tools.ask__x",
                "without `__`",
            ),
            (
                with("[human_tools.ask]\ndescription = \"d\"\nresponse_schema = \"{\"\n"),
                "human_tools.ask.response_schema",
                "is not valid JSON",
            ),
            (
                with(
                    "[human_tools.ask]\ndescription = \"d\"\nresponse_schema = '{\"type\": \"nonsense\"}'\n",
                ),
                "human_tools.ask.response_schema",
                "invalid JSON Schema",
            ),
            (
                format!("output_schema = '\"x\"'\n{MINIMAL}"),
                "output_schema",
                "must be a JSON object",
            ),
            (
                with(&format!("[labels]\nk = \"{}\"\n", "v".repeat(256))),
                "labels.k",
                "must be under 256",
            ),
            (
                with(&format!("[labels]\n{} = \"v\"\n", "k".repeat(64))),
                &long_key,
                "must be under 64",
            ),
            (
                with(&format!(
                    "[labels]\n{}",
                    (0..17)
                        .map(|i| format!("k{i} = \"v\"\n"))
                        .collect::<String>()
                )),
                "labels",
                "17 labels, more than 16",
            ),
        ];
        for (text, key, message) in cases {
            assert_invalid(&text, key, message);
        }
    }

    #[test]
    fn parsing_is_strict() {
        for (text, expected) in [
            (format!("{MINIMAL}colour = 1\n"), "unknown field `colour`"),
            (
                MINIMAL.replace("name = \"demo\"", "name = \"demo\"\ntemperature = 1"),
                "unknown field `temperature`",
            ),
            (
                MINIMAL.replace("\"scripted\"", "\"gemini\""),
                "unknown variant `gemini`, expected one of `scripted`, `openai`, `anthropic`",
            ),
            (
                MINIMAL.replace("name = \"demo\"", "name = \"demo\"\napi_key = \"sk-1\""),
                "unknown field `api_key`",
            ),
            (
                format!(
                    "{MINIMAL}[plugins.fs]\nsource = \"builtin:fs\"\napproval = {{ read_file = \"sometimes\" }}\n"
                ),
                "unknown variant `sometimes`",
            ),
            (
                format!(
                    "{MINIMAL}[plugins.fs]\nsource = \"builtin:fs\"\n[plugins.fs.grant]\nnetwork = true\n"
                ),
                "unknown field `network`",
            ),
            (
                MINIMAL.replace("provider = \"scripted\"\n", ""),
                "missing field `provider`",
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(
                matches!(err, AgentError::Parse { .. }) && err.to_string().contains(expected),
                "{expected}: {err}"
            );
            assert!(
                err.to_string().starts_with("agent `/agents/notes.toml`: "),
                "{err}"
            );
        }
    }

    #[test]
    fn on_refusal_defaults_to_fail_and_parses_strictly() {
        assert_eq!(parse(MINIMAL).unwrap().on_refusal, OnRefusal::Fail);
        let complete = MINIMAL.replace("[model]", "on_refusal = \"complete\"\n[model]");
        let agent = parse(&complete).unwrap();
        assert_eq!(agent.on_refusal, OnRefusal::Complete);
        assert_ne!(agent.digest, parse(MINIMAL).unwrap().digest);
        let err = parse(&MINIMAL.replace("[model]", "on_refusal = \"retry\"\n[model]"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("on_refusal") || err.contains("`fail` or `complete`"),
            "{err}"
        );
    }

    #[test]
    fn context_sources_and_compaction_parse_strictly_with_errors_naming_the_key() {
        const FILES: &str = "[plugins.files]\nsource = \"builtin:files-context\"\n";
        let top = MINIMAL.replace("[model]", "max_invalid_tool_calls = 5\n[model]");
        let agent = parse(&format!(
            "{top}{FILES}[context.notes]\nplugin = \"files\"\nquery = '{{\"paths\": [\"*.md\"]}}'\nresolve = \"once_per_turn\"\non_error = \"fail\"\nlimits = {{ timeout = \"2s\" }}\n[context.more]\nplugin = \"files\"\n[compaction]\nmax_prompt_tokens = 8000\n"
        ))
        .unwrap();
        assert_eq!(agent.max_invalid_tool_calls, 5);
        let names: Vec<&str> = agent.context.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["more", "notes"], "in name order");
        let notes = &agent.context[1];
        assert_eq!(notes.plugin, "files");
        assert_eq!(notes.query, r#"{"paths": ["*.md"]}"#);
        assert_eq!(notes.resolve, ResolveWhen::OncePerTurn);
        assert_eq!(notes.on_error, OnContextError::Fail);
        assert_eq!(
            notes.limits.timeout.map(|t| t.0),
            Some(std::time::Duration::from_secs(2))
        );
        let more = &agent.context[0];
        assert_eq!(
            (more.query.as_str(), more.resolve, more.on_error),
            ("", ResolveWhen::EachCall, OnContextError::Skip),
            "the defaults"
        );
        assert_eq!(
            agent.compaction,
            Some(CompactionSettings {
                max_prompt_tokens: 8000,
                keep_recent: DEFAULT_KEEP_RECENT
            })
        );
        let plain = parse(MINIMAL).unwrap();
        assert_eq!(plain.max_invalid_tool_calls, DEFAULT_MAX_INVALID_TOOL_CALLS);
        assert!(plain.context.is_empty() && plain.compaction.is_none());

        // Each is in the digest.
        let with_source = parse(&format!(
            "{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\n"
        ))
        .unwrap();
        let without = parse(&format!("{MINIMAL}{FILES}")).unwrap();
        assert_ne!(with_source.digest, without.digest);
        let skip = parse(&format!(
            "{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\non_error = \"skip\"\n"
        ))
        .unwrap();
        assert_ne!(skip.digest, with_source.digest);
        let compacting = parse(&format!(
            "{MINIMAL}[compaction]\nmax_prompt_tokens = 8000\n"
        ))
        .unwrap();
        assert_ne!(compacting.digest, plain.digest);

        assert_invalid(
            &format!("{MINIMAL}{FILES}[context.notes]\nplugin = \"fs\"\n"),
            "context.notes.plugin",
            "`fs` is not a plugin of this agent (its [plugins]: files)",
        );
        assert_invalid(
            &format!("{MINIMAL}{FILES}[context.Notes]\nplugin = \"files\"\n"),
            "context.Notes",
            "is not a valid context source name",
        );
        assert_invalid(
            &format!(
                "{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\nlimits = {{ timeout = \"0s\" }}\n"
            ),
            "context.notes.limits.timeout",
            "must be more than zero",
        );
        assert_invalid(
            &MINIMAL.replace("[model]", "max_invalid_tool_calls = 0\n[model]"),
            "max_invalid_tool_calls",
            "must be between 1 and 100, got 0",
        );
        assert_invalid(
            &format!("{MINIMAL}[compaction]\nmax_prompt_tokens = 100\n"),
            "compaction.max_prompt_tokens",
            "must be at least 256, got 100",
        );
        assert_invalid(
            &format!("{MINIMAL}[compaction]\nmax_prompt_tokens = 1000\nkeep_recent = 0\n"),
            "compaction.keep_recent",
            "must be between 1 and 1000, got 0",
        );
        for (text, expected) in [
            (
                format!(
                    "{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\nresolve = \"always\"\n"
                ),
                "unknown variant `always`, expected `each_call` or `once_per_turn`",
            ),
            (
                format!(
                    "{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\non_error = \"retry\"\n"
                ),
                "unknown variant `retry`, expected `skip` or `fail`",
            ),
            (
                format!("{MINIMAL}{FILES}[context.notes]\nplugin = \"files\"\nmax_items = 3\n"),
                "unknown field `max_items`",
            ),
            (
                format!("{MINIMAL}{FILES}[context.notes]\nquery = \"x\"\n"),
                "missing field `plugin`",
            ),
            (
                format!("{MINIMAL}[compaction]\nkeep_recent = 2\n"),
                "missing field `max_prompt_tokens`",
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(
                matches!(err, AgentError::Parse { .. }) && err.to_string().contains(expected),
                "{expected}: {err}"
            );
        }
    }

    #[test]
    fn the_model_is_inherited_whole_or_not_at_all() {
        let without_model = "name = \"notes\"\ninstructions = \"i\"\n";
        let err = parse(without_model).unwrap_err();
        assert!(err.to_string().contains("key `model`: no model"), "{err}");
        let defaults = ModelDefaults {
            section: ModelSection {
                transcript: Some("default.toml".into()),
                ..ModelSection::new(ProviderKind::Scripted, "default-model")
            },
            base_dir: PathBuf::from("/etc/warden"),
        };
        let a = Agent::parse(without_model, Path::new("/a/x.toml"), Some(&defaults)).unwrap();
        assert_eq!(a.model.name, "default-model");
        assert_eq!(
            a.model.transcript.as_deref(),
            Some(Path::new("/etc/warden/default.toml"))
        );
        // An agent that sets [model] takes none of the defaults' keys.
        let own = Agent::parse(MINIMAL, Path::new("/a/x.toml"), Some(&defaults)).unwrap();
        assert_eq!(own.model.name, "demo");
        assert_eq!(
            own.model.transcript.as_deref(),
            Some(Path::new("/a/notes.transcript.toml"))
        );
        // Half a pair is not a table.
        let half = "name = \"n\"\ninstructions = \"i\"\n[model]\nname = \"other\"\n";
        let err = Agent::parse(half, Path::new("/a/x.toml"), Some(&defaults)).unwrap_err();
        assert!(
            err.to_string().contains("missing field `provider`"),
            "{err}"
        );
    }

    #[test]
    fn the_digest_is_stable_excludes_labels_and_sees_everything_else() {
        let base = parse(MINIMAL).unwrap();
        // Pinned: a recorded digest must stay comparable across versions.
        assert_eq!(
            base.digest,
            AgentDigest::of(
                br#"warden-agent-v1
{"instructions":"You keep notes.","model":{"name":"demo","provider":"scripted","transcript":"notes.transcript.toml"},"name":"notes"}"#
            )
        );
        // Formatting, key order, labels and the file's location do not matter.
        let reordered = "instructions = \"You keep notes.\"\nname = \"notes\"\n[labels]\nx = \"y\"\n[model]\ntranscript = \"notes.transcript.toml\"\nname = \"demo\"\nprovider = \"scripted\"\n";
        assert_eq!(parse(reordered).unwrap().digest, base.digest);
        let elsewhere = Agent::parse(MINIMAL, Path::new("/other/notes.toml"), None).unwrap();
        assert_eq!(elsewhere.digest, base.digest);
        // Anything else does.
        for changed in [
            MINIMAL.replace("You keep notes.", "You keep notes!"),
            MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nmax_tokens = 10"),
            format!("{MINIMAL}[budgets]\nmax_steps = 3\n"),
            format!("{MINIMAL}[plugins.fs]\nsource = \"builtin:fs\"\n"),
            format!(
                "{MINIMAL}[plugins.fs]\nsource = \"builtin:fs\"\napproval = {{ read_file = \"always\" }}\n"
            ),
        ] {
            assert_ne!(parse(&changed).unwrap().digest, base.digest, "{changed}");
        }
    }

    #[test]
    fn channels_parse_with_defaults_and_errors_name_the_key() {
        let with = |extra: &str| {
            format!(
                "{MINIMAL}[plugins.outbox]\nsource = \"builtin:jsonl-channel\"\n[channels.notify]\nplugin = \"outbox\"\n{extra}"
            )
        };
        let a = parse(&with("")).unwrap();
        assert_eq!(
            a.channels,
            vec![Channel {
                name: "notify".into(),
                plugin: "outbox".into(),
                receives: vec![Receives::Output],
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                backoff_ms: DEFAULT_BACKOFF_MS,
                backoff_cap_ms: DEFAULT_BACKOFF_CAP_MS,
            }]
        );
        let a = parse(&with(
            "receives = [\"parked\", \"failures\"]\nmax_attempts = 2\nbackoff = \"250ms\"\nbackoff_cap = \"2s\"\n",
        ))
        .unwrap();
        assert_eq!(
            a.channels[0].receives,
            [Receives::Parked, Receives::Failures]
        );
        assert_eq!(
            (
                a.channels[0].max_attempts,
                a.channels[0].backoff_ms,
                a.channels[0].backoff_cap_ms
            ),
            (2, 250, 2000)
        );
        // A channel is part of the digest; an agent without one keeps its
        // digest from before channels existed (pinned above).
        let plain = parse(&format!(
            "{MINIMAL}[plugins.outbox]\nsource = \"builtin:jsonl-channel\"\n"
        ))
        .unwrap();
        assert_ne!(parse(&with("")).unwrap().digest, plain.digest);
        assert_ne!(
            parse(&with("max_attempts = 2\n")).unwrap().digest,
            parse(&with("")).unwrap().digest
        );

        assert_invalid(
            &format!("{MINIMAL}[channels.notify]\nplugin = \"outbox\"\n"),
            "channels.notify.plugin",
            "`outbox` is not a plugin of this agent (its [plugins]: none)",
        );
        assert_invalid(
            &with("receives = []\n"),
            "channels.notify.receives",
            "at least one of: output, failures, parked, events",
        );
        assert_invalid(
            &with("receives = [\"output\", \"output\"]\n"),
            "channels.notify.receives[1]",
            "`output` is listed twice",
        );
        assert_invalid(
            &with("max_attempts = 0\n"),
            "channels.notify.max_attempts",
            "between 1 and 20, got 0",
        );
        assert_invalid(
            &with("max_attempts = 21\n"),
            "channels.notify.max_attempts",
            "got 21",
        );
        assert_invalid(
            &with("backoff = \"0s\"\n"),
            "channels.notify.backoff",
            "more than zero",
        );
        assert_invalid(
            &with("backoff = \"2s\"\nbackoff_cap = \"1s\"\n"),
            "channels.notify.backoff_cap",
            "at least the backoff (2000 ms)",
        );
        assert_invalid(
            &with("backoff_cap = \"2h\"\n"),
            "channels.notify.backoff_cap",
            "at most 1h",
        );
        assert_invalid(
            &with("").replace("[channels.notify]", "[channels.Notify]"),
            "channels.Notify",
            "not a valid channel name",
        );
        // Unknown keys and values are parse errors naming them.
        for (extra, named) in [
            ("receives = [\"everything\"]\n", "everything"),
            ("retries = 3\n", "retries"),
        ] {
            match parse(&with(extra)) {
                Err(AgentError::Parse { message, .. }) => {
                    assert!(message.contains(named), "{message}")
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
    }

    const OPENAI: &str = r#"
name = "notes"
instructions = "You keep notes."

[model]
provider = "openai"
name = "gpt-4o"
base_url = "http://127.0.0.1:11434/v1"
"#;

    #[test]
    fn http_providers_take_their_keys_with_documented_defaults() {
        let a = parse(OPENAI).unwrap();
        assert_eq!(a.model.provider, ProviderKind::OpenAi);
        assert_eq!(a.model.transcript, None);
        let http = a.model.http.clone().unwrap();
        assert_eq!(
            http,
            HttpModelSettings {
                base_url: "http://127.0.0.1:11434/v1".into(),
                base_url_env: None,
                api_key_env: None,
                headers: BTreeMap::new(),
                header_env: BTreeMap::new(),
                timeout: std::time::Duration::from_secs(60),
                max_concurrent_calls: 8,
                stream: true,
                api_version: "2023-06-01".into(),
                max_tokens_field: MaxTokensField::MaxTokens,
                stream_usage: true,
            }
        );
        let provider = a.model.provider().unwrap();
        assert_eq!(provider.name(), "openai");

        let full = r#"
name = "notes"
instructions = "You keep notes."

[model]
provider = "anthropic"
name = "claude-sonnet-4-5"
max_tokens = 2048
base_url_env = "WARDEN_TEST_UNSET_BASE_URL"
api_key_env = "PATH"
timeout = "5s"
max_attempts = 5
max_concurrent_calls = 2
stream = false
api_version = "2023-06-01"
headers = { "anthropic-beta" = "tools-2024" }
header_env = { "x-gateway-key" = "HOME" }
"#;
        let a = parse(full).unwrap();
        let http = a.model.http.clone().unwrap();
        assert_eq!(http.base_url, "https://api.anthropic.com");
        assert_eq!(http.timeout, std::time::Duration::from_secs(5));
        assert_eq!((http.max_concurrent_calls, http.stream), (2, false));
        assert_eq!(
            a.model.retry,
            RetryPolicy {
                max_attempts: 5,
                max_wait_ms: 60_000
            }
        );
        // The variables are read when the provider is made; an unset
        // base-URL variable falls back to base_url or the public API.
        let config = http.config().unwrap();
        assert_eq!(config.base_url, "https://api.anthropic.com");
        assert!(config.api_key == std::env::var("PATH").ok().map(Secret::new));
        assert_eq!(config.secret_headers[0].0, "x-gateway-key");
        assert_eq!(a.model.provider().unwrap().name(), "anthropic");

        // A variable that is not set is named, with the key that names it.
        let missing = OPENAI.replace(
            "base_url = ",
            "api_key_env = \"WARDEN_TEST_UNSET_KEY\"\nbase_url = ",
        );
        let err = parse(&missing).unwrap().model.provider().err().unwrap();
        assert_eq!(
            err.to_string(),
            "provider `openai`: cannot make the request: environment variable `WARDEN_TEST_UNSET_KEY` is not set (model.api_key_env)"
        );
    }

    #[test]
    fn http_keys_are_checked_naming_the_key_and_never_echoing_a_secret() {
        let with = |extra: &str| OPENAI.replace("base_url = ", &format!("{extra}\nbase_url = "));
        let cases: Vec<(String, &str, &str)> = vec![
            (
                OPENAI.replace("base_url = \"http://127.0.0.1:11434/v1\"\n", ""),
                "model.api_key_env",
                "is required for https://api.openai.com/v1: name the environment variable holding the key, such as OPENAI_API_KEY",
            ),
            (
                OPENAI
                    .replace("\"openai\"", "\"anthropic\"")
                    .replace("base_url = \"http://127.0.0.1:11434/v1\"\n", ""),
                "model.api_key_env",
                "such as ANTHROPIC_API_KEY",
            ),
            (
                with("api_key_env = \"sk-proj-abc123\""),
                "model.api_key_env",
                "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*), not hold a value",
            ),
            (
                with("header_env = { \"x-key\" = \"sk-proj-abc123\" }"),
                "model.header_env.x-key",
                "must name an environment variable",
            ),
            (
                with("headers = { Authorization = \"Bearer sk-proj-abc123\" }"),
                "model.headers.Authorization",
                "credentials must not be written in an agent file",
            ),
            (
                with("headers = { \"x-api-key\" = \"sk-proj-abc123\" }"),
                "model.headers.x-api-key",
                "credentials must not be written in an agent file",
            ),
            (
                with("headers = { \"content-type\" = \"text/plain\" }"),
                "model.headers.content-type",
                "is set by Warden",
            ),
            (
                with("headers = { \"bad header\" = \"x\" }"),
                "model.headers.bad header",
                "is not a valid header name",
            ),
            (
                OPENAI.replace("http://127.0.0.1:11434/v1", "ftp://host"),
                "model.base_url",
                "must start with http:// or https://",
            ),
            (
                OPENAI.replace(
                    "http://127.0.0.1:11434/v1",
                    "https://u:sk-proj-abc123@host/v1",
                ),
                "model.base_url",
                "must not carry credentials",
            ),
            (with("timeout = \"0s\""), "model.timeout", "more than zero"),
            (
                with("max_attempts = 0"),
                "model.max_attempts",
                "between 1 and 10, got 0",
            ),
            (
                with("max_retry_wait = \"2h\""),
                "model.max_retry_wait",
                "must be at most 1h, got 2h",
            ),
            (
                with("max_concurrent_calls = 5000"),
                "model.max_concurrent_calls",
                "between 1 and 1024, got 5000",
            ),
            (
                with("api_version = \"2023-06-01\""),
                "model.api_version",
                "is only used by the `anthropic` provider, not `openai`",
            ),
            (
                OPENAI.replace("\"openai\"", "\"anthropic\"")
                    + "max_tokens_field = \"max_tokens\"\n",
                "model.max_tokens_field",
                "is only used by the `openai` provider, not `anthropic`",
            ),
            (
                with("transcript = \"t.toml\""),
                "model.transcript",
                "only the scripted provider reads a transcript, not `openai`",
            ),
            (
                MINIMAL.replace(
                    "name = \"demo\"",
                    "name = \"demo\"\nbase_url = \"http://x\"",
                ),
                "model.base_url",
                "is not used by the scripted provider",
            ),
            (
                MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nstream = false"),
                "model.stream",
                "is not used by the scripted provider",
            ),
        ];
        for (text, key, message) in cases {
            let err = parse(&text).unwrap_err();
            assert!(!err.to_string().contains("sk-proj"), "{err}");
            assert_invalid(&text, key, message);
        }
    }

    #[test]
    fn the_digest_names_variables_but_holds_no_secret() {
        let base = parse(OPENAI).unwrap();
        let keyed = |var: &str| {
            parse(&OPENAI.replace(
                "base_url = ",
                &format!("api_key_env = \"{var}\"\nbase_url = "),
            ))
            .unwrap()
            .digest
        };
        // The variable's name is part of the definition, its value is not.
        assert_ne!(keyed("OPENAI_API_KEY"), base.digest);
        assert_ne!(keyed("OPENAI_API_KEY"), keyed("OTHER_KEY"));
        assert_eq!(keyed("OPENAI_API_KEY"), keyed("OPENAI_API_KEY"));
        // Every HTTP key is digested.
        for extra in [
            "timeout = \"5s\"",
            "stream = false",
            "max_attempts = 2",
            "headers = { a = \"b\" }",
        ] {
            let text = OPENAI.replace("base_url = ", &format!("{extra}\nbase_url = "));
            assert_ne!(parse(&text).unwrap().digest, base.digest, "{extra}");
        }
    }

    #[test]
    fn labels_are_checked_on_their_own_too() {
        let ok = BTreeMap::from([("a".to_owned(), "b".to_owned())]);
        assert_eq!(validate_labels(&ok), Ok(()));
        let empty = BTreeMap::from([(String::new(), "b".to_owned())]);
        assert_eq!(validate_labels(&empty), Err(LabelError::EmptyKey));
    }

    #[test]
    fn load_reads_the_file_and_names_it_when_it_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let a = Agent::load(&path, None).unwrap();
        assert_eq!(a.path, path);
        assert_eq!(
            a.model.transcript,
            Some(dir.path().join("notes.transcript.toml"))
        );
        // The transcript is read when the provider is made.
        let err = a.model.provider().err().unwrap();
        assert!(
            err.to_string().starts_with("cannot read transcript"),
            "{err}"
        );
        std::fs::write(
            dir.path().join("notes.transcript.toml"),
            "[[turns]]\ntext = \"hi\"\n",
        )
        .unwrap();
        assert_eq!(a.model.provider().unwrap().name(), "scripted");
        let missing = dir.path().join("missing.toml");
        let err = Agent::load(&missing, None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot read agent `{}`", missing.display())),
            "{err}"
        );
    }
}
