//! MCP servers as tools (`[mcp_servers.<name>]` in an agent file): the
//! operator's settings for each server, the tools it lists turned into the
//! same [`ToolDescriptor`]s plugin tools have, and [`McpConnection`], whose
//! [`invoke`](McpConnection::invoke) is to an MCP tool what a lease is to a
//! plugin tool: it returns the same [`Leased`] result and receipt, so the
//! runtime records an MCP call exactly as it records a plugin call (intent,
//! call, completion; retries by effect class; idempotency keys).
//!
//! ```toml
//! [mcp_servers.files]                    # tools are named files__<tool>
//! command = "npx"                        # a local server over stdio: a bare name is
//! args = ["-y", "@modelcontextprotocol/server-filesystem", "/data"]  # found on PATH
//! read = ["data"]                        # directories it sees read-only (relative to
//! write = ["out"]                        # this file) and read-write; nothing else of
//!                                        # the machine but the system's own files
//! env = ["NPM_CONFIG_CACHE"]             # variables passed through; no others
//! network = false                        # default: no network at all
//! timeout = "30s"                        # each call's deadline: then the server is killed
//!                                        # (its start gets at least 60s)
//! max_output = "1MiB"                    # the largest result accepted
//! # unsandboxed = true                   # the operator's opt-out where no OS sandbox
//! #                                      # exists: the server runs with Warden's rights
//! [mcp_servers.files.tools.read_text_file]
//! effect = "read"                        # default for every MCP tool: write (approval)
//! # accept_hints = true                  # or: take the server's annotations for this tool
//! # description = "..."                  # replaces the server's (untrusted) text
//! # input_schema = '{"type": "object"}'  # replaces the server's schema
//! # idempotency_key = "request_id"       # as for plugin tools
//! # approval = "always"                  # never | always | writes (default)
//! # rename = "read_text"                 # offered as files__read_text ([`names`])
//! ```
//!
//! A remote server is reached over streamable HTTP ([`remote`]), only at a
//! host its `hosts` grant, with headers whose values come from named
//! environment variables (never written in the file, logged or recorded):
//!
//! ```toml
//! [mcp_servers.tickets]
//! url = "https://mcp.example.com/mcp"    # http:// or https://, no user info
//! hosts = ["mcp.example.com"]            # the outbound grant, as a plugin's `hosts`
//! header_env = { "Authorization" = "TICKETS_MCP_AUTH" }  # header = variable
//! timeout = "30s"                        # and max_output, tools.*: as above
//! ```
//!
//! A local server runs only inside the OS sandbox [`process`] sets up
//! (bubblewrap): where there is none it is refused, unless the operator set
//! `unsandboxed = true` for that server, which is logged loudly at every
//! start. The tools a server lists are untrusted: their effect class is
//! `write` whatever their annotations claim, and their list is pinned
//! ([`pins`]): a tool whose definition changed since it was pinned is not
//! offered until the operator accepts the new list (`warden mcp accept`).

pub mod names;
pub mod pins;
pub mod process;
pub mod remote;
pub mod session;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::approvals::NeedsApproval;
use super::events::McpToolsOffered;
use warden_plugins::ToolDescriptor;
use warden_plugins::grant::EffectClass;
use warden_plugins::tool::{MAX_DESCRIPTION, MAX_SCHEMA, MAX_TOOLS};
use warden_sandbox::{LeaseError, LeaseFailure, Leased, Outcome, UsageReceipt, ValidUntil, wit};
use warden_syntax::units::{ByteSize, HumanDuration};

/// Each call's deadline (and the server's start's) when the agent does not
/// say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The least time a server's start (the process, the handshake, the tool
/// listing) gets, whatever its call deadline: an interpreter on a loaded
/// machine may take seconds to start.
pub const MIN_START_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest deadline an agent may set.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The largest result accepted when the agent does not say.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;
/// The largest `max_output` an agent may set.
pub const MAX_OUTPUT_LIMIT: u64 = 64 << 20;

/// An MCP server that cannot be set up, reached or believed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServerError {
    /// A local server needs an OS sandbox and there is none, and the
    /// operator did not opt out for it.
    #[error(
        "MCP server `{server}`: no OS sandbox is available ({reason}); a local server runs only inside one: install bubblewrap (`bwrap`), or set `unsandboxed = true` for this server to run it with Warden's own rights"
    )]
    SandboxUnavailable {
        /// The server's key.
        server: String,
        /// What is missing.
        reason: String,
    },
    /// The server could not be started, or did not answer the handshake or
    /// the tool listing.
    #[error("MCP server `{server}`: {message}")]
    Failed {
        /// The server's key.
        server: String,
        /// What happened.
        message: String,
    },
    /// The pin file cannot be read, parsed or written.
    #[error("MCP pins `{path}`: {message}")]
    Pins {
        /// The pin file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A remote server's URL names a host its `hosts` do not grant.
    #[error(
        "MCP server `{server}`: host `{host}` is not granted (its `hosts`: {}): add it to `hosts` to reach it",
        listed(.granted)
    )]
    HostNotGranted {
        /// The server's key.
        server: String,
        /// The URL's `host:port`.
        host: String,
        /// The patterns granted.
        granted: Vec<String>,
    },
    /// A header of a remote server takes its value from a variable that is
    /// not set.
    #[error(
        "MCP server `{server}`: header `{header}` takes its value from environment variable `{var}`, which is not set"
    )]
    HeaderEnvMissing {
        /// The server's key.
        server: String,
        /// The header.
        header: String,
        /// The variable.
        var: String,
    },
    /// A command named a server the agent does not have.
    #[error("agent `{agent}` has no MCP server `{server}` (its servers: {known})")]
    UnknownServer {
        /// The agent.
        agent: String,
        /// The name given.
        server: String,
        /// The agent's servers.
        known: String,
    },
}

/// `items` for a message: comma-separated, or `none`.
fn listed(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

impl McpServerError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            McpServerError::SandboxUnavailable { .. } => "mcp_sandbox_unavailable",
            McpServerError::Failed { .. } => "mcp_server_failed",
            McpServerError::Pins { .. } => "mcp_pins_invalid",
            McpServerError::UnknownServer { .. } => "unknown_mcp_server",
            McpServerError::HostNotGranted { .. } => "mcp_host_not_granted",
            McpServerError::HeaderEnvMissing { .. } => "env_missing",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            McpServerError::SandboxUnavailable { server, .. }
            | McpServerError::Failed { server, .. } => serde_json::json!({ "server": server }),
            McpServerError::Pins { path, .. } => {
                serde_json::json!({ "file": warden_syntax::evidence::path(path) })
            }
            McpServerError::UnknownServer { agent, server, .. } => {
                serde_json::json!({ "agent": agent, "server": server })
            }
            McpServerError::HostNotGranted { server, host, .. } => {
                serde_json::json!({ "server": server, "host": host })
            }
            McpServerError::HeaderEnvMissing {
                server,
                header,
                var,
            } => {
                serde_json::json!({ "server": server, "header": header, "env": var })
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpServerEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    header_env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    read: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    write: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    network: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_output: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unsandboxed: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tools: BTreeMap<String, McpToolEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpToolEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    effect: Option<EffectClass>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    accept_hints: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<NeedsApproval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rename: Option<String>,
}

/// An MCP server an agent uses, as the operator set it up.
#[derive(Clone, Debug, PartialEq)]
pub struct McpServer {
    /// The key in the agent file; the model calls its tools `<key>__<tool>`.
    pub key: String,
    /// How it is reached: a local process, or a URL.
    pub transport: McpTransport,
    /// Each call's deadline, and the start's.
    pub timeout: Duration,
    /// The largest result accepted, in bytes.
    pub max_output: u64,
    /// The operator's settings per tool.
    pub tools: BTreeMap<String, McpToolSettings>,
    /// Approval rules by tool name, from `tools.<tool>.approval`.
    pub approval: BTreeMap<String, NeedsApproval>,
    /// The pin file: the agent file's name with `.mcp-pins.json`.
    pub pins: PathBuf,
}

/// How an MCP server is reached.
#[derive(Clone, Debug, PartialEq)]
pub enum McpTransport {
    /// A local program over stdio, in its OS sandbox (`command`).
    Local(LocalServer),
    /// A server over streamable HTTP (`url`).
    Remote(RemoteServer),
}

/// A local MCP server: a program Warden starts in its OS sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalServer {
    /// The program: a path (resolved against the agent file) or a bare name
    /// looked up on `PATH` when the server starts.
    pub command: String,
    /// Its arguments, as written.
    pub args: Vec<String>,
    /// The environment variables passed through from Warden's environment;
    /// the server sees no others.
    pub env: Vec<String>,
    /// Directories it sees read-only, absolute.
    pub read: Vec<PathBuf>,
    /// Directories it sees read-write, absolute.
    pub write: Vec<PathBuf>,
    /// Whether it shares the machine's network.
    pub network: bool,
    /// The operator's opt-out: run without an OS sandbox.
    pub unsandboxed: bool,
}

/// A remote MCP server, reached over streamable HTTP.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteServer {
    /// Its endpoint (`http://` or `https://`).
    pub url: String,
    /// Headers sent with every request, each with the environment variable
    /// its value is read from (the value is never kept here).
    pub header_env: BTreeMap<String, String>,
    /// The outbound grant: host patterns (as a plugin grant's `hosts`) the
    /// URL must match.
    pub hosts: Vec<String>,
}

/// The operator's settings for one tool of an MCP server.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct McpToolSettings {
    /// Its effect class, set by the operator.
    pub effect: Option<EffectClass>,
    /// Whether its effect class is the one its annotations claim.
    pub accept_hints: bool,
    /// The description the model sees instead of the server's.
    pub description: Option<String>,
    /// The argument schema instead of the server's.
    pub input_schema: Option<Value>,
    /// The argument whose value is the call's idempotency key across runs.
    pub idempotency_key: Option<String>,
    /// The name the model calls it by instead, after `<key>__`
    /// ([`names`]).
    pub rename: Option<String>,
}

impl McpServer {
    /// The approval rule of `tool`.
    pub fn needs_approval(&self, tool: &str) -> NeedsApproval {
        self.approval.get(tool).copied().unwrap_or_default()
    }
}

/// Checks `[mcp_servers]` of an agent file: keys, commands, directories,
/// variables, limits and tool settings. `invalid` makes the error for a
/// dotted key; `json_object` checks a schema given as text. Both make the
/// agent file's error, so this module need not know it.
pub(crate) fn validate<E>(
    entries: &BTreeMap<String, McpServerEntry>,
    path: &Path,
    base: &Path,
    plugin_keys: &[&str],
    invalid: &dyn Fn(&str, String) -> E,
    json_object: &dyn Fn(&str, &str) -> Result<Value, E>,
) -> Result<Vec<McpServer>, E> {
    let mut servers = Vec::with_capacity(entries.len());
    for (key, entry) in entries {
        let at = |k: &str| format!("mcp_servers.{key}.{k}");
        if !warden_plugins::manifest::is_valid_plugin_name(key) {
            return Err(invalid(
                &format!("mcp_servers.{key}"),
                "is not a valid server key (use [a-z][a-z0-9-]*, at most 64 bytes)".into(),
            ));
        }
        if plugin_keys.contains(&key.as_str()) {
            return Err(invalid(
                &format!("mcp_servers.{key}"),
                "is also a key in [plugins]: their tools would share names".into(),
            ));
        }
        let dirs = |k: &str, list: &[PathBuf]| -> Result<Vec<PathBuf>, E> {
            let mut out = Vec::with_capacity(list.len());
            for (i, d) in list.iter().enumerate() {
                // Opened without following a symlink in any component the
                // operator wrote, as a plugin's mount is: a directory a
                // plugin or server swapped for a link is refused, not
                // followed. What is kept is its real path, opened again
                // the same way when the server starts.
                let absolute = warden_sandbox::open_dir_nofollow(base, d)
                    .map_err(|e| invalid(&format!("{}[{i}]", at(k)), e.to_string()))?
                    .path;
                out.push(absolute);
            }
            Ok(out)
        };
        let local_keys = [
            ("args", !entry.args.is_empty()),
            ("env", !entry.env.is_empty()),
            ("read", !entry.read.is_empty()),
            ("write", !entry.write.is_empty()),
            ("network", entry.network),
            ("unsandboxed", entry.unsandboxed),
        ];
        let remote_keys = [
            ("header_env", !entry.header_env.is_empty()),
            ("hosts", !entry.hosts.is_empty()),
        ];
        let transport = match (&entry.command, &entry.url) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(invalid(
                    &format!("mcp_servers.{key}"),
                    "set either `command` (a local server) or `url` (a remote one)".into(),
                ));
            }
            (None, Some(url)) => {
                if let Some((k, _)) = local_keys.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        &at(k),
                        "applies to a local server (`command`) only".into(),
                    ));
                }
                remote::url_parts(url).map_err(|e| invalid(&at("url"), e))?;
                for (header, var) in &entry.header_env {
                    let k = format!("{}.{header}", at("header_env"));
                    let lower = header.to_ascii_lowercase();
                    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                        return Err(invalid(&k, format!("`{header}` is not a header name")));
                    }
                    if remote::RESERVED_HEADERS.contains(&lower.as_str()) {
                        return Err(invalid(
                            &k,
                            format!("`{header}` is set by Warden's MCP client"),
                        ));
                    }
                    if !is_env_name(var) {
                        return Err(invalid(
                            &k,
                            format!(
                                "`{var}` is not an environment variable name ([A-Z_][A-Z0-9_]*): name the variable holding the value, never the value"
                            ),
                        ));
                    }
                }
                for (i, host) in entry.hosts.iter().enumerate() {
                    warden_plugins::grant::HostPattern::parse(host)
                        .map_err(|e| invalid(&format!("{}[{i}]", at("hosts")), e))?;
                }
                McpTransport::Remote(RemoteServer {
                    url: url.clone(),
                    header_env: entry.header_env.clone(),
                    hosts: entry.hosts.clone(),
                })
            }
            (Some(command), None) => {
                if let Some((k, _)) = remote_keys.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        &at(k),
                        "applies to a remote server (`url`) only".into(),
                    ));
                }
                if command.trim().is_empty() {
                    return Err(invalid(&at("command"), "must not be empty".into()));
                }
                for (i, name) in entry.env.iter().enumerate() {
                    if !is_env_name(name) {
                        return Err(invalid(
                            &format!("{}[{i}]", at("env")),
                            format!(
                                "`{name}` is not an environment variable name ([A-Z_][A-Z0-9_]*)"
                            ),
                        ));
                    }
                }
                McpTransport::Local(LocalServer {
                    command: if command.contains('/') {
                        base.join(command).to_string_lossy().into_owned()
                    } else {
                        command.clone()
                    },
                    args: entry.args.clone(),
                    env: entry.env.clone(),
                    read: dirs("read", &entry.read)?,
                    write: dirs("write", &entry.write)?,
                    network: entry.network,
                    unsandboxed: entry.unsandboxed,
                })
            }
        };
        let timeout = match entry.timeout {
            None => DEFAULT_TIMEOUT,
            Some(HumanDuration(d)) if d.is_zero() || d > MAX_TIMEOUT => {
                return Err(invalid(
                    &at("timeout"),
                    format!("must be more than zero and at most 1h, got {d:?}"),
                ));
            }
            Some(HumanDuration(d)) => d,
        };
        let max_output = match entry.max_output {
            None => DEFAULT_MAX_OUTPUT,
            Some(ByteSize(n)) if n == 0 || n > MAX_OUTPUT_LIMIT => {
                return Err(invalid(
                    &at("max_output"),
                    format!("must be more than zero and at most 64MiB, got {n} bytes"),
                ));
            }
            Some(ByteSize(n)) => n,
        };
        let mut tools = BTreeMap::new();
        let mut approval = BTreeMap::new();
        for (tool, t) in &entry.tools {
            let tat = |k: &str| at(&format!("tools.{tool}.{k}"));
            if !names::is_mcp_tool_name(tool) {
                return Err(invalid(
                    &at(&format!("tools.{tool}")),
                    "is not an MCP tool name (1 to 128 of A-Z a-z 0-9 _ - .)".into(),
                ));
            }
            if let Some(why) = t
                .rename
                .as_deref()
                .and_then(|r| names::check_rename(key, r))
            {
                return Err(invalid(&tat("rename"), why));
            }
            if t.effect.is_some() && t.accept_hints {
                return Err(invalid(
                    &tat("accept_hints"),
                    "set either effect or accept_hints, not both".into(),
                ));
            }
            let input_schema = match &t.input_schema {
                Some(s) => Some(json_object(&tat("input_schema"), s)?),
                None => None,
            };
            if let Some(rule) = t.approval {
                approval.insert(tool.clone(), rule);
            }
            tools.insert(
                tool.clone(),
                McpToolSettings {
                    effect: t.effect,
                    accept_hints: t.accept_hints,
                    description: t.description.clone(),
                    input_schema,
                    idempotency_key: t.idempotency_key.clone(),
                    rename: t.rename.clone(),
                },
            );
        }
        servers.push(McpServer {
            key: key.clone(),
            transport,
            timeout,
            max_output,
            tools,
            approval,
            pins: pins::pin_path(path),
        });
    }
    Ok(servers)
}

/// Whether `name` is an environment variable name Warden accepts
/// (`[A-Z_][A-Z0-9_]*`).
fn is_env_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// What the server's annotations claim a tool's effect is: `read` for
/// `readOnlyHint`, `idempotent` for `idempotentHint`, else `write`.
fn hinted_effect(tool: &Value) -> EffectClass {
    let hint = |name: &str| {
        tool.get("annotations")
            .and_then(|a| a.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    if hint("readOnlyHint") {
        EffectClass::Read
    } else if hint("idempotentHint") {
        EffectClass::Idempotent
    } else {
        EffectClass::Write
    }
}

/// The descriptors of the tools `listed` (each tool as the server listed
/// it, as JSON), with the operator's settings applied and every tool that
/// is not pinned as listed withheld: the tools the model is offered.
pub fn descriptors(
    server: &McpServer,
    listed: &BTreeMap<String, Value>,
    pinned: &pins::PinnedServer,
) -> Vec<ToolDescriptor> {
    let mut out = Vec::with_capacity(listed.len());
    for (name, tool) in listed.iter().take(MAX_TOOLS) {
        let settings = server.tools.get(name).cloned().unwrap_or_default();
        let claimed = hinted_effect(tool);
        let effect = match (settings.effect, settings.accept_hints) {
            (Some(e), _) => e,
            (None, true) => claimed,
            // A server cannot talk its way out of approvals.
            (None, false) => EffectClass::Write,
        };
        let description = settings.description.clone().unwrap_or_else(|| {
            tool.get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        });
        let input_schema = settings
            .input_schema
            .clone()
            .or_else(|| tool.get("inputSchema").cloned())
            .unwrap_or_else(|| serde_json::json!({"type": "object"}));
        let withheld = if !names::is_mcp_tool_name(name) {
            Some(format!(
                "its name {name:?} is not an MCP tool name (1 to 128 of A-Z a-z 0-9 _ - .)"
            ))
        } else if description.len() > MAX_DESCRIPTION {
            Some(format!(
                "its description is {} bytes, more than {MAX_DESCRIPTION}: override it in `tools.{name}.description`",
                description.len()
            ))
        } else if serde_json::to_vec(&input_schema).map_or(0, |v| v.len()) > MAX_SCHEMA
            || super::schema::check_schema(&input_schema).is_err()
        {
            Some(format!(
                "its input schema is not a JSON Schema Warden accepts (or over {MAX_SCHEMA} bytes): override it in `tools.{name}.input_schema`"
            ))
        } else {
            match pinned.tools.get(name) {
                Some(p) if p.digest == pins::tool_digest(tool) => None,
                Some(_) => Some(format!(
                    "its definition changed since it was pinned: review it with `warden mcp tools {}` and accept it with `warden mcp accept {}`",
                    server.key, server.key
                )),
                None => Some(format!(
                    "it is new since the list was pinned: review it with `warden mcp tools {}` and accept it with `warden mcp accept {}`",
                    server.key, server.key
                )),
            }
        };
        out.push(ToolDescriptor {
            plugin: format!("mcp:{}", server.key),
            name: name.clone(),
            description,
            input_schema,
            claimed_effect: claimed,
            effect,
            idempotency_key: settings.idempotency_key.clone(),
            withheld,
        });
    }
    out
}

/// One MCP server of a prepared agent: started (or reached) once, its tools
/// listed and checked against the pins, then called one call at a time.
/// A server killed at a deadline is started again at the next call, and its
/// list must still match what was pinned.
pub struct McpConnection {
    server: McpServer,
    listed: BTreeMap<String, Value>,
    /// The digest of the pinned list the tools were checked against.
    pinned: String,
    tools: Vec<ToolDescriptor>,
    session: tokio::sync::Mutex<Option<session::Session>>,
}

impl std::fmt::Debug for McpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpConnection")
            .field("server", &self.server.key)
            .finish_non_exhaustive()
    }
}

/// What connecting to one server found: its tools as listed, and what the
/// pins say of them.
#[derive(Clone, Debug)]
pub struct Listing {
    /// Each tool as the server listed it, by name.
    pub listed: BTreeMap<String, Value>,
    /// What was pinned before this listing (`None`: nothing was, and this
    /// listing has just been pinned).
    pub pinned_before: Option<pins::PinnedServer>,
    /// The pins now.
    pub pinned: pins::PinnedServer,
}

impl McpConnection {
    /// Starts (or reaches) `server`, lists its tools, and pins the list if
    /// nothing was pinned for it yet (its first use).
    pub async fn connect(server: &McpServer) -> Result<Arc<McpConnection>, McpServerError> {
        let mut session = session::Session::start(server).await?;
        let listing = list_and_pin(server, &mut session).await?;
        let tools = descriptors(server, &listing.listed, &listing.pinned);
        for t in &tools {
            if let Some(why) = &t.withheld {
                tracing::warn!(server = %server.key, tool = %t.name, "MCP tool `{}__{}` is not offered: {why}", server.key, t.name);
            }
        }
        Ok(Arc::new(McpConnection {
            server: server.clone(),
            listed: listing.listed,
            pinned: listing.pinned.digest,
            tools,
            session: tokio::sync::Mutex::new(Some(session)),
        }))
    }

    /// The server's settings.
    pub fn server(&self) -> &McpServer {
        &self.server
    }

    /// Its tools, as the view offers them (withheld ones included, marked).
    pub fn tools(&self) -> &[ToolDescriptor] {
        &self.tools
    }

    /// What it offers a run, as `run_started` records it: the pinned list's
    /// digest and the tools not withheld.
    pub fn offered(&self) -> McpToolsOffered {
        McpToolsOffered {
            pins: self.pinned.clone(),
            offered: self
                .tools
                .iter()
                .filter(|t| t.withheld.is_none())
                .map(|t| t.name.clone())
                .collect(),
        }
    }

    /// Makes one call, bounded by the server's deadline and `bound` (what is
    /// left of the run's wall time), as a lease is: the result the runtime
    /// records, and a receipt. At the deadline, or on `cancel`, the server
    /// is killed (its sandbox with it); the next call starts it again.
    ///
    /// `valid` is the driver's view of its claim, the one every plugin
    /// lease of the drive carries (`None`: a driver without a claim): the
    /// call is refused once it has passed, and a call under way when it
    /// passes ends [`LeaseFailure::Expired`], as a lease does. A local
    /// server is held to it by a watchdog process
    /// ([`ValidUntil::fence_process`]) that kills the server's sandbox at
    /// the deadline even while this process is stopped; a remote server's
    /// request is abandoned then, but what the server already received it
    /// may still carry out (docs/operations.md).
    pub async fn invoke(
        &self,
        call: &wit::Call,
        bound: Option<Duration>,
        cancel: Option<&CancellationToken>,
        valid: Option<&ValidUntil>,
    ) -> Leased<Result<wit::ToolOutput, wit::ToolError>> {
        let started = Instant::now();
        let operation = format!("tool `{}`", call.tool);
        let fail = |failure: LeaseFailure, output_bytes: u64| {
            let mut receipt = UsageReceipt::empty(failure.outcome());
            receipt.wall_time_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            receipt.output_bytes = output_bytes;
            Leased {
                result: Err(LeaseError {
                    plugin: format!("mcp:{}", self.server.key),
                    operation: operation.clone(),
                    failure,
                }),
                receipt,
            }
        };
        let deadline = bound.map_or(self.server.timeout, |b| b.min(self.server.timeout));
        // The call names the tool as the model does; the server knows it
        // by its own name.
        let Some(tool) = self
            .tools
            .iter()
            .find(|t| names::model_suffix(&self.server, &t.name) == call.tool)
        else {
            return fail(
                LeaseFailure::Refused {
                    reason: format!("the server lists no tool `{}`", call.tool),
                },
                0,
            );
        };
        if let Some(why) = &tool.withheld {
            return fail(
                LeaseFailure::Refused {
                    reason: why.clone(),
                },
                0,
            );
        }
        let arguments = match serde_json::from_str::<Value>(&call.arguments) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Leased {
                    result: Ok(Err(wit::ToolError::InvalidArguments(
                        "the arguments are not a JSON object".into(),
                    ))),
                    receipt: UsageReceipt::empty(Outcome::GuestError),
                };
            }
        };
        let expired = || valid.is_some_and(|v| !v.is_valid());
        if expired() {
            return fail(LeaseFailure::Expired, 0);
        }
        let mut slot = self.session.lock().await;
        if slot.as_mut().is_some_and(|s| !s.alive()) {
            // Killed since its last call (by a claim's watchdog, say).
            if let Some(s) = slot.take() {
                s.kill().await;
            }
        }
        if slot.is_none() {
            // Killed at a deadline, or died: start it again, and believe it
            // only if it still lists this tool as pinned.
            match session::Session::start(&self.server).await {
                Ok(mut session) => match session.list_tools().await {
                    Ok(listed) if listed.get(&tool.name) == self.listed.get(&tool.name) => {
                        *slot = Some(session);
                    }
                    Ok(_) => {
                        return fail(
                            LeaseFailure::Refused {
                                reason: format!(
                                    "the restarted server's definition of `{}` is not the pinned one",
                                    tool.name
                                ),
                            },
                            0,
                        );
                    }
                    Err(e) => {
                        return fail(
                            LeaseFailure::Refused {
                                reason: e.to_string(),
                            },
                            0,
                        );
                    }
                },
                Err(e) => {
                    return fail(
                        LeaseFailure::Refused {
                            reason: e.to_string(),
                        },
                        0,
                    );
                }
            }
        }
        let never = CancellationToken::new();
        let cancel = cancel.unwrap_or(&never);
        let session = slot.as_ref().expect("started above");
        // A local server is held to the claim from outside this process
        // (it may be stopped while the server goes on); no write starts
        // unfenced.
        let fence = match (valid, session.pid()) {
            (Some(valid), Some(pid)) => match valid.fence_process(pid) {
                Ok(fence) => Some(fence),
                Err(e) => {
                    return fail(
                        LeaseFailure::Refused {
                            reason: format!(
                                "cannot hold the server to the claim's deadline (its watchdog did not start: {e})"
                            ),
                        },
                        0,
                    );
                }
            },
            _ => None,
        };
        // Arming it may have taken a while: no call starts past the claim.
        if expired() {
            return fail(LeaseFailure::Expired, 0);
        }
        let outcome = {
            let ended = tokio::select! {
                biased;
                () = claim_over(valid) => Ended::Expired,
                bytes = session.over_limit() => Ended::OverLimit(bytes),
                r = session.call_tool(&tool.name, arguments) => Ended::Answered(r),
                () = tokio::time::sleep(deadline) => Ended::Deadline,
                () = cancel.cancelled() => Ended::Cancelled,
            };
            // The transport may report the cut before the meter is read;
            // a call that broke once the claim was over was broken by its
            // watchdog (this process may just have woken from a stop).
            match (ended, session.cut()) {
                (Ended::Answered(Ok(r)), _) => Ended::Answered(Ok(r)),
                (_, _) if expired() => Ended::Expired,
                (Ended::Answered(Err(_)), Some(bytes)) => Ended::OverLimit(bytes),
                (ended, _) => ended,
            }
        };
        drop(fence);
        if expired() && !matches!(outcome, Ended::Expired) {
            // Its watchdog may have killed it once it answered: the next
            // call starts it again rather than calling a dead server.
            if let Some(s) = slot.take() {
                s.kill().await;
            }
        }
        let result = match outcome {
            Ended::Expired => {
                tracing::warn!(server = %self.server.key, tool = %call.tool, "the claim ran out during an MCP call: the server is killed, the call's outcome unknown");
                if let Some(s) = slot.take() {
                    s.kill().await;
                }
                return fail(LeaseFailure::Expired, 0);
            }
            Ended::OverLimit(bytes) => {
                // Cut as it arrived: the rest was never read, and the
                // session cannot go on mid-message.
                tracing::warn!(server = %self.server.key, tool = %call.tool, bytes, limit = self.server.max_output, "MCP server's answer is over `max_output`: cut");
                if let Some(s) = slot.take() {
                    s.kill().await;
                }
                return fail(
                    LeaseFailure::OutputLimit {
                        bytes,
                        limit: self.server.max_output,
                    },
                    bytes,
                );
            }
            Ended::Cancelled => {
                if let Some(s) = slot.take() {
                    s.kill().await;
                }
                return fail(LeaseFailure::Cancelled, 0);
            }
            Ended::Deadline => {
                tracing::warn!(server = %self.server.key, tool = %call.tool, ?deadline, "MCP server missed the call's deadline: killed");
                if let Some(s) = slot.take() {
                    s.kill().await;
                }
                return fail(LeaseFailure::Timeout { limit: deadline }, 0);
            }
            Ended::Answered(Err(e)) => {
                // The connection broke mid-call: what the server did is not
                // known. Say why it stopped, if it did.
                let mut why = String::new();
                if let Some(mut s) = slot.take() {
                    why = s.why_stopped().await;
                    s.kill().await;
                }
                return fail(
                    LeaseFailure::Trap {
                        message: format!("the MCP server failed mid-call: {e}{why}"),
                    },
                    0,
                );
            }
            Ended::Answered(Ok(result)) => result,
        };
        let (content, is_error) = tool_result(&result);
        let bytes = content.len() as u64;
        if bytes > self.server.max_output {
            return fail(
                LeaseFailure::OutputLimit {
                    bytes,
                    limit: self.server.max_output,
                },
                bytes,
            );
        }
        let mut receipt = UsageReceipt::empty(if is_error {
            Outcome::GuestError
        } else {
            Outcome::Ok
        });
        receipt.wall_time_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        receipt.output_bytes = bytes;
        Leased {
            result: Ok(if is_error {
                Err(wit::ToolError::Failed(wit::Failure {
                    message: content,
                    retryable: false,
                }))
            } else {
                Ok(wit::ToolOutput { content })
            }),
            receipt,
        }
    }
}

/// How a call to a server ended.
enum Ended {
    Answered(Result<Value, String>),
    OverLimit(u64),
    Deadline,
    Cancelled,
    /// The driver's view of its claim passed.
    Expired,
}

/// Resolves once `valid` has passed; never without one.
async fn claim_over(valid: Option<&ValidUntil>) {
    match valid {
        Some(valid) => valid.expired().await,
        None => std::future::pending().await,
    }
}

/// A `tools/call` result as the tool's output: its structured content when
/// it has some, else its text blocks joined as a JSON string, else its
/// content blocks as a JSON array; and whether it is an error.
fn tool_result(result: &Value) -> (String, bool) {
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let blocks = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let texts: Option<Vec<&str>> = blocks
        .iter()
        .map(|b| {
            (b.get("type").and_then(Value::as_str) == Some("text"))
                .then(|| b.get("text").and_then(Value::as_str))
                .flatten()
        })
        .collect();
    if is_error {
        let text = match texts {
            Some(t) => t.join("\n"),
            None => Value::Array(blocks).to_string(),
        };
        return (text, true);
    }
    let content = match (result.get("structuredContent"), texts) {
        (Some(s), _) if !s.is_null() => s.to_string(),
        (_, Some(t)) => Value::String(t.join("\n")).to_string(),
        (_, None) => Value::Array(blocks).to_string(),
    };
    (content, false)
}

/// Lists `session`'s tools, and pins the list if nothing is pinned for the
/// server yet.
async fn list_and_pin(
    server: &McpServer,
    session: &mut session::Session,
) -> Result<Listing, McpServerError> {
    let listed = session.list_tools().await?;
    let mut file = pins::PinFile::load(&server.pins)?;
    let before = file.servers.get(&server.key).cloned();
    let pinned = match &before {
        Some(p) => p.clone(),
        None => {
            let p = pins::PinnedServer::of(&listed);
            file.servers.insert(server.key.clone(), p.clone());
            file.save(&server.pins)?;
            tracing::info!(server = %server.key, pins = %server.pins.display(), "pinned the tool list of MCP server `{}` at its first use ({} tools)", server.key, listed.len());
            p
        }
    };
    Ok(Listing {
        listed,
        pinned_before: before,
        pinned,
    })
}

/// Starts `server`, lists its tools (pinning them at first use) and stops
/// it: what `warden mcp tools` shows.
pub async fn list(server: &McpServer) -> Result<Listing, McpServerError> {
    let mut session = session::Session::start(server).await?;
    let listing = list_and_pin(server, &mut session).await;
    session.kill().await;
    listing
}

/// Starts `server`, lists its tools and pins them as listed, replacing what
/// was pinned: what `warden mcp accept` does. Returns the listing with what
/// was pinned before.
pub async fn accept(server: &McpServer) -> Result<Listing, McpServerError> {
    let mut session = session::Session::start(server).await?;
    let listed = session.list_tools().await;
    session.kill().await;
    let listed = listed?;
    let mut file = pins::PinFile::load(&server.pins)?;
    let before = file.servers.get(&server.key).cloned();
    let pinned = pins::PinnedServer::of(&listed);
    file.servers.insert(server.key.clone(), pinned.clone());
    file.save(&server.pins)?;
    Ok(Listing {
        listed,
        pinned_before: before,
        pinned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_is_its_structured_content_else_its_text() {
        let r = json!({"content": [{"type": "text", "text": "hi"}], "structuredContent": {"a": 1}});
        assert_eq!(tool_result(&r), ("{\"a\":1}".into(), false));
        let r = json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(tool_result(&r), ("\"a\\nb\"".into(), false));
        let r = json!({"content": [{"type": "text", "text": "no"}], "isError": true});
        assert_eq!(tool_result(&r), ("no".into(), true));
    }

    fn parse(server: &str) -> Result<crate::agent::Agent, String> {
        crate::agent::Agent::parse(
            &format!("{}{server}", crate::agent::tests::MINIMAL),
            Path::new("a.toml"),
            None,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_remote_server_is_a_url_with_granted_hosts_and_headers_from_variables() {
        let agent = parse(
            "[mcp_servers.tickets]\nurl = \"https://mcp.example.com/mcp\"\nhosts = [\"mcp.example.com\"]\nheader_env = { \"Authorization\" = \"TICKETS_AUTH\" }\n",
        )
        .unwrap();
        let McpTransport::Remote(remote) = &agent.mcp_servers[0].transport else {
            panic!("a remote server");
        };
        assert_eq!(remote.header_env["Authorization"], "TICKETS_AUTH");
        for (server, says) in [
            (
                "url = \"https://a.example/mcp\"\ncommand = \"x\"",
                "either `command`",
            ),
            ("args = [\"x\"]", "either `command`"),
            (
                "url = \"https://a.example/mcp\"\nread = [\".\"]",
                "key `mcp_servers.s.read`: applies to a local server",
            ),
            (
                "command = \"x\"\nhosts = [\"a.example\"]",
                "key `mcp_servers.s.hosts`: applies to a remote server",
            ),
            (
                "url = \"ftp://a.example/\"",
                "not an http:// or https:// URL",
            ),
            ("url = \"https://u:pw@a.example/mcp\"", "user info"),
            (
                "url = \"https://a.example/mcp\"\nheader_env = { \"Authorization\" = \"Bearer abc\" }",
                "never the value",
            ),
            (
                "url = \"https://a.example/mcp\"\nheader_env = { \"Mcp-Session-Id\" = \"X\" }",
                "set by Warden's MCP client",
            ),
            (
                "url = \"https://a.example/mcp\"\nhosts = [\"a.example/path\"]",
                "key `mcp_servers.s.hosts[0]`",
            ),
        ] {
            let err = parse(&format!("[mcp_servers.s]\n{server}\n")).unwrap_err();
            assert!(err.contains(says), "{server}: {err}");
        }
    }

    #[test]
    fn an_ungranted_host_is_refused_before_a_connection() {
        let remote = RemoteServer {
            url: "http://127.0.0.1:9/mcp".into(),
            header_env: BTreeMap::new(),
            hosts: vec!["127.0.0.1:10".into(), "*.example.com".into()],
        };
        let err = remote::RemoteClient::new("s", &remote, 1024, DEFAULT_TIMEOUT).unwrap_err();
        assert_eq!(err.code(), "mcp_host_not_granted");
        assert_eq!(err.details()["host"], "127.0.0.1:9");
        assert!(
            err.to_string().contains("127.0.0.1:10, *.example.com"),
            "{err}"
        );
        let granted = RemoteServer {
            hosts: vec!["127.0.0.1:9".into()],
            header_env: BTreeMap::from([("X-Key".to_owned(), "WARDEN_UNSET_TEST_VAR".to_owned())]),
            ..remote
        };
        let err = remote::RemoteClient::new("s", &granted, 1024, DEFAULT_TIMEOUT).unwrap_err();
        assert_eq!(err.code(), "env_missing");
        assert_eq!(err.details()["env"], "WARDEN_UNSET_TEST_VAR");
    }

    #[test]
    fn annotations_are_only_hints() {
        let server = McpServer {
            key: "s".into(),
            transport: McpTransport::Remote(RemoteServer {
                url: "http://127.0.0.1:1/mcp".into(),
                header_env: BTreeMap::new(),
                hosts: vec![],
            }),
            timeout: DEFAULT_TIMEOUT,
            max_output: DEFAULT_MAX_OUTPUT,
            tools: BTreeMap::from([(
                "trusted".to_owned(),
                McpToolSettings {
                    accept_hints: true,
                    ..McpToolSettings::default()
                },
            )]),
            approval: BTreeMap::new(),
            pins: PathBuf::from("p.json"),
        };
        let ro = json!({"name": "x", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}});
        let listed = BTreeMap::from([
            ("claims".to_owned(), ro.clone()),
            ("trusted".to_owned(), ro.clone()),
        ]);
        let pinned = pins::PinnedServer::of(&listed);
        let d = descriptors(&server, &listed, &pinned);
        assert_eq!(d[0].name, "claims");
        assert_eq!(d[0].claimed_effect, EffectClass::Read);
        assert_eq!(d[0].effect, EffectClass::Write, "a claim is not accepted");
        assert_eq!(d[1].effect, EffectClass::Read, "accepted by the operator");
        assert!(d.iter().all(|t| t.withheld.is_none()));
        let mut changed = listed.clone();
        changed.insert(
            "claims".into(),
            json!({"name": "x", "description": "now different", "inputSchema": {"type": "object"}}),
        );
        let d = descriptors(&server, &changed, &pinned);
        assert!(
            d[0].withheld
                .as_deref()
                .unwrap()
                .contains("changed since it was pinned")
        );
        assert!(d[1].withheld.is_none());
    }
}
