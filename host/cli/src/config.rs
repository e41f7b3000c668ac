//! `warden.toml`: the operator's configuration, and the effective settings
//! once flags and `WARDEN_*` environment variables are laid over it.
//!
//! ```toml
//! store = ".warden/warden.db"      # a SQLite file (or sqlite:PATH), relative to this
//!                                  # file, or postgres://user@host/db[?schema=NAME]
//! record_prompts = false           # record model requests in full (they may hold secrets)
//! cache_dir = "/var/cache/warden"  # compiled components; relative to this file
//!
//! [labels]                         # added to every run this host starts
//! team = "ops"
//!
//! [defaults.model]                 # the [model] table of agents that set none,
//! provider = "scripted"            # inherited whole (as in an agent file; paths
//! name = "demo"                    # relative to this file)
//! transcript = "demo.transcript.toml"
//!
//! [ceilings]                       # the most any plugin gets, whatever its
//! timeout = "60s"                  # manifest or grant says (keys as in a
//! fuel = 100_000_000_000           # manifest's [limits]; defaults:
//!                                  # `Limits::CEILINGS`), and what one model
//! tool_calls_per_response = 64     # response and one run may start
//! children_per_response = 8        # (defaults: `RunCeilings::DEFAULT`)
//! children_per_run = 32
//! fuel_per_run = 1_000_000_000_000
//!
//! [compile]                        # how much compiling one component may take
//! max_size = "64MiB"               # (defaults: `CompileLimits::DEFAULT`); past
//! timeout = "600s"                 # one, the plugin is refused by name
//! memory = "4GiB"
//!
//! [grants.fs.mounts.workspace]     # the grant of the plugin an agent calls `fs`
//! dir = "/srv/notes"               # ([plugins.fs] in the agent), unless the agent
//! access = "read-only"             # grants it inline; relative to this file
//!
//! [trust]                          # present: plugins must be signed (fail-closed)
//! allow_unsigned = ["plugins/dev"] # … except from beneath these directories
//!
//! [trust.publishers.acme]          # whose minisign keys are trusted
//! keys = ["RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3"]
//! ```
//!
//! Unknown keys are errors, and every error names the file and the key.
//!
//! **Precedence**, highest first: a flag (`--store`, `--record-prompts`,
//! `--config-file`), then its environment variable (`WARDEN_STORE`,
//! `WARDEN_RECORD_PROMPTS`, `WARDEN_LABELS`, `WARDEN_CACHE_DIR`,
//! `WARDEN_CONFIG`), then `warden.toml`, then the built-in default. The file
//! is `--config-file`, else `$WARDEN_CONFIG`, else `./warden.toml` when it exists;
//! without one every setting has its default.
//!
//! **Grants** are keyed by the plugin's key in the agent file (the prefix of
//! its tools' names, `fs` in `fs__read_file`). A plugin whose agent entry
//! has a `grant` table of its own keeps it, whole: the two are never merged,
//! just as an agent's `[model]` table is never merged with the default one.
//! Grants from here are the operator's environment, like the directories
//! they name: they are not part of the agent's digest.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use warden::engine::agent::validate_labels;
use warden::engine::ceilings::{Ceiling, RunCeilings};
use warden::engine::{Agent, AgentError, ModelDefaults};
use warden::grant::Grant;
use warden::plugins::manifest::LimitSettings;
use warden::providers::config::ModelSection;
use warden::sandbox::{CompileLimits, Limits};
pub(crate) use warden::store::StoreLocation;

/// The file looked for in the working directory.
pub(crate) const DEFAULT_FILE: &str = "warden.toml";
/// The store when nothing names one.
pub(crate) const DEFAULT_STORE: &str = ".warden/warden.db";

/// A configuration that cannot be read or accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config `{path}`: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown or mistyped keys.
    #[error("config `{path}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, with line and key.
        message: String,
    },
    /// A key has a value that is not accepted.
    #[error("config `{path}`: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, dotted.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable has a value that is not accepted.
    #[error("environment variable `{var}`: {message}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A flag has a value that is not accepted.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// The evidence for the `--json` error envelope.
    pub(crate) fn details(&self) -> Value {
        match self {
            ConfigError::Read { path, .. } | ConfigError::Parse { path, .. } => {
                json!({ "file": path })
            }
            ConfigError::Invalid { path, key, .. } => json!({ "file": path, "key": key }),
            ConfigError::Env { var, .. } => json!({ "env": var }),
            ConfigError::Flag { flag, .. } => json!({ "flag": flag }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    store: Option<String>,
    record_prompts: Option<bool>,
    cache_dir: Option<PathBuf>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    defaults: DefaultsSection,
    #[serde(default)]
    grants: BTreeMap<String, Grant>,
    #[serde(default)]
    ceilings: CeilingsSection,
    #[serde(default)]
    compile: CompileSection,
    #[serde(default)]
    mcp: McpSection,
    #[serde(default)]
    serve: ServeSection,
    trust: Option<TrustSection>,
}

/// `[trust]`: present, plugins from manifests must be signed by a trusted
/// publisher's key, except beneath `allow_unsigned`; absent, unsigned
/// plugins load from anywhere (a signature present is still verified).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustSection {
    /// Directories unsigned plugins may load from (and from beneath).
    #[serde(default)]
    allow_unsigned: Vec<PathBuf>,
    /// Trusted publishers, by name.
    #[serde(default)]
    publishers: BTreeMap<String, PublisherSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublisherSection {
    /// Their minisign public keys (`RW…`, the second line of a
    /// `minisign.pub`).
    keys: Vec<String>,
}

/// `[serve]`: what `warden serve` offers besides the store, and how it
/// holds its connections.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeSection {
    /// The agents it starts runs of: agent files, or directories whose
    /// agent files it serves.
    #[serde(default)]
    agents: Vec<PathBuf>,
    /// The proxies whose `X-Forwarded-For` names the client's address.
    #[serde(default)]
    trusted_proxies: Vec<std::net::IpAddr>,
    /// How long a client has to send a request's head (and a kept-alive
    /// connection may wait idle).
    header_timeout: Option<warden::units::HumanDuration>,
    /// The most connections held at once.
    max_connections: Option<usize>,
    /// The most connections held before any of their requests
    /// authenticated.
    max_unauthenticated_connections: Option<usize>,
}

/// `[ceilings]`: the most any plugin's lease gets (a manifest's `[limits]`
/// keys), and what one model response and one run may start
/// ([`RunCeilings`]). Unknown keys are refused by the lease settings, which
/// receive every key but the run ceilings' (serde's `flatten` would let
/// them through).
#[derive(Debug, Default)]
struct CeilingsSection {
    tool_calls_per_response: Option<u32>,
    children_per_response: Option<u32>,
    children_per_run: Option<u32>,
    fuel_per_run: Option<u64>,
    lease: LimitSettings,
}

impl<'de> Deserialize<'de> for CeilingsSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut table = toml::Table::deserialize(d)?;
        let mut take = |key: &str, max: u64| match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if n >= 0 && n as u64 <= max => Ok(Some(n as u64)),
            Some(other) => Err(D::Error::custom(format!(
                "`{key}` must be an integer from 0 to {max}, got `{other}`"
            ))),
        };
        let small = u64::from(u32::MAX);
        let narrow = |n: Option<u64>| n.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(CeilingsSection {
            tool_calls_per_response: narrow(take("tool_calls_per_response", small)?),
            children_per_response: narrow(take("children_per_response", small)?),
            children_per_run: narrow(take("children_per_run", small)?),
            fuel_per_run: take("fuel_per_run", i64::MAX as u64)?,
            lease: LimitSettings::deserialize(toml::Value::Table(table))
                .map_err(D::Error::custom)?,
        })
    }
}

impl CeilingsSection {
    /// The run ceilings: the keys set here over [`RunCeilings::DEFAULT`].
    fn run_ceilings(&self) -> Result<RunCeilings, (String, String)> {
        let d = RunCeilings::DEFAULT;
        let at_least_one = |key: &str, n: Option<u64>| match n {
            Some(0) => Err((format!("ceilings.{key}"), "must be at least 1".to_owned())),
            _ => Ok(()),
        };
        at_least_one(
            "tool_calls_per_response",
            self.tool_calls_per_response.map(u64::from),
        )?;
        at_least_one("fuel_per_run", self.fuel_per_run)?;
        Ok(RunCeilings {
            tool_calls_per_response: self
                .tool_calls_per_response
                .unwrap_or(d.tool_calls_per_response),
            children_per_response: self
                .children_per_response
                .unwrap_or(d.children_per_response),
            children_per_run: self.children_per_run.unwrap_or(d.children_per_run),
            fuel_per_run: self.fuel_per_run.unwrap_or(d.fuel_per_run),
        })
    }
}

/// `[compile]`: how much compiling one component may take.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompileSection {
    max_size: Option<warden::units::ByteSize>,
    timeout: Option<warden::units::HumanDuration>,
    memory: Option<warden::units::ByteSize>,
}

impl CompileSection {
    /// The keys set here over [`CompileLimits::DEFAULT`], each more than
    /// zero.
    fn limits(&self) -> Result<CompileLimits, (String, String)> {
        let zero = |key: &str| {
            Err((
                format!("compile.{key}"),
                "must be more than zero".to_owned(),
            ))
        };
        let d = CompileLimits::DEFAULT;
        let limits = CompileLimits {
            max_bytes: self.max_size.map_or(d.max_bytes, |b| b.0),
            timeout: self.timeout.map_or(d.timeout, |t| t.0),
            memory_bytes: self.memory.map_or(d.memory_bytes, |b| b.0),
        };
        if limits.max_bytes == 0 {
            return zero("max_size");
        }
        if limits.timeout.is_zero() {
            return zero("timeout");
        }
        if limits.memory_bytes == 0 {
            return zero("memory");
        }
        Ok(limits)
    }
}

/// `[mcp]`: what `warden mcp serve` serves when no agent file is given.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSection {
    agent: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsSection {
    model: Option<ModelSection>,
}

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A command-line flag.
    Flag(&'static str),
    /// An environment variable.
    Env(&'static str),
    /// The configuration file.
    File,
    /// Nothing set it.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(flag) => write!(f, "flag {flag}"),
            Source::Env(var) => write!(f, "env {var}"),
            Source::File => f.write_str("file"),
            Source::Default => f.write_str("default"),
        }
    }
}

/// A setting and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sourced<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

/// What the command line says, before the environment and the file.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    /// `--config-file`.
    pub(crate) config: Option<PathBuf>,
    /// `--store`.
    pub(crate) store: Option<String>,
    /// `--record-prompts`.
    pub(crate) record_prompts: bool,
}

/// The effective settings.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The configuration file read, if any.
    pub(crate) file: Option<PathBuf>,
    /// Where runs are stored.
    pub(crate) store: Sourced<StoreLocation>,
    /// Whether model requests are recorded in full.
    pub(crate) record_prompts: Sourced<bool>,
    /// Where compiled components are cached (none: not cached).
    pub(crate) cache_dir: Sourced<Option<PathBuf>>,
    /// Labels added to every run started.
    pub(crate) labels: Sourced<BTreeMap<String, String>>,
    /// The default model table.
    pub(crate) model: Option<ModelDefaults>,
    /// Grants by plugin key.
    pub(crate) grants: BTreeMap<String, Grant>,
    /// What relative directories in `grants` resolve against.
    grants_base: PathBuf,
    /// The store's chain key, from `WARDEN_CHAIN_KEY` only (hex, at least
    /// 32 bytes): a secret never read from, or shown in, the file.
    pub(crate) chain_key: Option<warden::store::ChainKey>,
    /// The most any plugin gets of each limit: `[ceilings]` over
    /// [`Limits::CEILINGS`].
    pub(crate) ceilings: Limits,
    /// What one model response and one run may start: `[ceilings]`'s run
    /// keys over [`RunCeilings::DEFAULT`].
    pub(crate) run_ceilings: RunCeilings,
    /// How much compiling one component may take: `[compile]` over
    /// [`CompileLimits::DEFAULT`].
    pub(crate) compile: CompileLimits,
    /// `[mcp] agent`: the agent `warden mcp serve` serves by default,
    /// resolved against the configuration file's directory.
    pub(crate) mcp_agent: Option<PathBuf>,
    /// `[serve] agents`: the agent files (or directories of them) `warden
    /// serve` starts runs of, resolved against the configuration file's
    /// directory.
    pub(crate) serve_agents: Vec<PathBuf>,
    /// `[serve] trusted_proxies`.
    pub(crate) serve_trusted_proxies: Vec<std::net::IpAddr>,
    /// `[serve] header_timeout`, `max_connections`,
    /// `max_unauthenticated_connections` over their defaults.
    pub(crate) serve_connections: warden_server::ConnectionLimits,
    /// `[trust]`: whose signatures every plugin host checks plugins
    /// against, and where unsigned plugins may load from.
    pub(crate) trust: warden::plugins::TrustPolicy,
}

/// `WARDEN_CHAIN_KEY`: hex digits for at least 32 bytes.
fn chain_key(text: &str) -> Result<warden::store::ChainKey, ConfigError> {
    let invalid = |message: String| ConfigError::Env {
        var: "WARDEN_CHAIN_KEY",
        message,
    };
    let bytes = hex::decode(text.trim()).map_err(|e| {
        invalid(format!(
            "not hex digits ({e}); use e.g. `openssl rand -hex 32`"
        ))
    })?;
    warden::store::ChainKey::new(&bytes).map_err(|e| invalid(e.to_string()))
}

fn truthy(var: &'static str, text: &str) -> Result<bool, ConfigError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(ConfigError::Env {
            var,
            message: format!("`{text}` is not a boolean (use true or false, 1 or 0)"),
        }),
    }
}

/// `KEY=VALUE` pairs separated by commas.
pub(crate) fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| format!("`{kv}`: expected KEY=VALUE"))
        })
        .collect()
}

impl Settings {
    /// The settings from `overrides`, the environment as `env` reads it, and
    /// the configuration file, all relative paths resolved: the file's
    /// against its directory, the others against `cwd`.
    pub(crate) fn load(
        overrides: &Overrides,
        env: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
    ) -> Result<Settings, ConfigError> {
        let named = overrides
            .config
            .clone()
            .or_else(|| env("WARDEN_CONFIG").map(PathBuf::from));
        let file_path = match named {
            Some(path) => Some(cwd.join(path)),
            None => {
                let default = cwd.join(DEFAULT_FILE);
                default.is_file().then_some(default)
            }
        };
        let (file, base) = match &file_path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
                    path: path.clone(),
                    error,
                })?;
                let file: ConfigFile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: path.clone(),
                    message: warden::toml_errors::one_line(&text, &e),
                })?;
                let base = path.parent().map_or(cwd.to_owned(), Path::to_owned);
                (file, base)
            }
            None => (ConfigFile::default(), cwd.to_owned()),
        };
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: file_path.clone().unwrap_or_default(),
            key: key.to_owned(),
            message,
        };

        let store = if let Some(text) = &overrides.store {
            Sourced {
                value: StoreLocation::parse(text, cwd).map_err(|e| ConfigError::Flag {
                    flag: "--store",
                    message: e.to_string(),
                })?,
                source: Source::Flag("--store"),
            }
        } else if let Some(text) = env("WARDEN_STORE") {
            Sourced {
                value: StoreLocation::parse(&text, cwd).map_err(|e| ConfigError::Env {
                    var: "WARDEN_STORE",
                    message: e.to_string(),
                })?,
                source: Source::Env("WARDEN_STORE"),
            }
        } else if let Some(text) = &file.store {
            Sourced {
                value: StoreLocation::parse(text, &base)
                    .map_err(|e| invalid("store", e.to_string()))?,
                source: Source::File,
            }
        } else {
            Sourced {
                value: StoreLocation::Sqlite(cwd.join(DEFAULT_STORE)),
                source: Source::Default,
            }
        };

        let record_prompts = if overrides.record_prompts {
            Sourced {
                value: true,
                source: Source::Flag("--record-prompts"),
            }
        } else if let Some(text) = env("WARDEN_RECORD_PROMPTS") {
            Sourced {
                value: truthy("WARDEN_RECORD_PROMPTS", &text)?,
                source: Source::Env("WARDEN_RECORD_PROMPTS"),
            }
        } else if let Some(value) = file.record_prompts {
            Sourced {
                value,
                source: Source::File,
            }
        } else {
            Sourced {
                value: false,
                source: Source::Default,
            }
        };

        let cache_dir = if let Some(dir) = env("WARDEN_CACHE_DIR") {
            Sourced {
                value: Some(cwd.join(dir)),
                source: Source::Env("WARDEN_CACHE_DIR"),
            }
        } else if let Some(dir) = &file.cache_dir {
            Sourced {
                value: Some(base.join(dir)),
                source: Source::File,
            }
        } else {
            Sourced {
                value: env("XDG_CACHE_HOME")
                    .map(|d| PathBuf::from(d).join("warden/components"))
                    .or_else(|| {
                        env("HOME").map(|d| PathBuf::from(d).join(".cache/warden/components"))
                    }),
                source: Source::Default,
            }
        };

        validate_labels(&file.labels).map_err(|e| invalid("labels", e.to_string()))?;
        let labels = match env("WARDEN_LABELS") {
            Some(text) => {
                let mut labels = file.labels.clone();
                labels.extend(parse_labels(&text).map_err(|message| ConfigError::Env {
                    var: "WARDEN_LABELS",
                    message,
                })?);
                validate_labels(&labels).map_err(|e| ConfigError::Env {
                    var: "WARDEN_LABELS",
                    message: e.to_string(),
                })?;
                Sourced {
                    value: labels,
                    source: Source::Env("WARDEN_LABELS"),
                }
            }
            None => Sourced {
                source: if file.labels.is_empty() {
                    Source::Default
                } else {
                    Source::File
                },
                value: file.labels.clone(),
            },
        };

        let model = match file.defaults.model {
            None => None,
            Some(section) => {
                let defaults = ModelDefaults {
                    section,
                    base_dir: base.clone(),
                };
                // An agent that sets nothing but what every agent must shows
                // whether the table is acceptable, with the key it names.
                let probe = "name = \"config-check\"\ninstructions = \"-\"\n";
                let probe_path = file_path.clone().unwrap_or_default();
                match Agent::parse(probe, &probe_path, Some(&defaults)) {
                    Ok(_) => {}
                    Err(AgentError::Invalid { key, message, .. }) => {
                        return Err(invalid(&format!("defaults.{key}"), message));
                    }
                    Err(other) => return Err(invalid("defaults.model", other.to_string())),
                }
                Some(defaults)
            }
        };

        for (key, grant) in &file.grants {
            grant
                .limits
                .validate(&format!("grants.{key}.limits"))
                .map_err(|(key, message)| invalid(&key, message))?;
        }
        file.ceilings
            .lease
            .validate("ceilings")
            .map_err(|(key, message)| invalid(&key, message))?;
        let ceilings = file.ceilings.lease.apply_to(&Limits::CEILINGS);
        let run_ceilings = file
            .ceilings
            .run_ceilings()
            .map_err(|(key, message)| invalid(&key, message))?;
        let compile = file
            .compile
            .limits()
            .map_err(|(key, message)| invalid(&key, message))?;
        let serve_connections = serve_connections(&file.serve).map_err(|(k, m)| invalid(&k, m))?;
        let trust = match &file.trust {
            None => warden::plugins::TrustPolicy::development(),
            Some(section) => {
                let mut trust = warden::plugins::TrustPolicy::enforcing(
                    section
                        .allow_unsigned
                        .iter()
                        .map(|d| base.join(d))
                        .collect(),
                );
                for (name, publisher) in &section.publishers {
                    if publisher.keys.is_empty() {
                        return Err(invalid(
                            &format!("trust.publishers.{name}.keys"),
                            "lists no key".into(),
                        ));
                    }
                    trust = trust.with_publisher(name, &publisher.keys).map_err(|e| {
                        invalid(&format!("trust.publishers.{name}.keys"), e.to_string())
                    })?;
                }
                trust
            }
        };

        Ok(Settings {
            file: file_path,
            store,
            record_prompts,
            cache_dir,
            labels,
            model,
            grants: file.grants,
            mcp_agent: file.mcp.agent.map(|agent| base.join(agent)),
            serve_agents: file.serve.agents.iter().map(|a| base.join(a)).collect(),
            serve_trusted_proxies: file.serve.trusted_proxies.clone(),
            serve_connections,
            grants_base: base,
            chain_key: match env("WARDEN_CHAIN_KEY") {
                None => None,
                Some(text) => Some(chain_key(&text)?),
            },
            ceilings,
            run_ceilings,
            compile,
            trust,
        })
    }

    /// Reads the agent at `path` with the default model and fills in the
    /// grant of every plugin the agent grants nothing inline from `grants`.
    pub(crate) fn load_agent(&self, path: &Path) -> Result<Agent, AgentError> {
        let absolute = path.canonicalize().map_err(|error| AgentError::Read {
            path: path.to_owned(),
            error,
        })?;
        let mut agent = Agent::load(&absolute, self.model.as_ref())?;
        self.apply_grants(&mut agent);
        Ok(agent)
    }

    /// Gives each plugin of `agent` without an inline grant the configured
    /// grant for its key, if there is one.
    pub(crate) fn apply_grants(&self, agent: &mut Agent) {
        for plugin in &mut agent.plugins {
            if plugin.grant != Grant::default() {
                continue;
            }
            if let Some(grant) = self.grants.get(&plugin.key) {
                tracing::debug!(agent = %agent.name, plugin = %plugin.key, "grant from the configuration");
                plugin.grant = grant.clone();
                plugin.grant_base = self.grants_base.clone();
            }
        }
    }

    /// `[trust]` as it is in force.
    fn trust_json(&self) -> Value {
        let t = &self.trust;
        json!({
            "require_signatures": t.is_enforcing(),
            "allow_unsigned": if t.is_enforcing() { json!(t.allow_unsigned()) } else { json!(["*"]) },
            "publishers": t.publishers().map(|(name, keys)| (name.to_owned(), json!({ "key_ids": keys }))).collect::<serde_json::Map<_, _>>(),
        })
    }

    /// The effective configuration as JSON, secrets masked.
    pub(crate) fn to_json(&self) -> Value {
        let sourced =
            |value: Value, source: Source| json!({ "value": value, "source": source.to_string() });
        json!({
            "file": self.file,
            "store": sourced(json!(self.store.value.to_string()), self.store.source),
            "record_prompts": sourced(json!(self.record_prompts.value), self.record_prompts.source),
            "cache_dir": sourced(json!(self.cache_dir.value), self.cache_dir.source),
            "labels": sourced(json!(self.labels.value), self.labels.source),
            "defaults": {
                "model": self.model.as_ref().map(|m| masked(&m.section)),
            },
            "grants": self.grants.iter().map(|(k, g)| (k.clone(), masked(g))).collect::<serde_json::Map<_, _>>(),
            "ceilings": self.ceilings_json(),
            "compile": self.compile_json(),
            "serve": self.serve_json(),
            "trust": self.trust_json(),
        })
    }

    /// `[ceilings]` as it is in force: the lease ceilings, then the run
    /// ceilings.
    fn ceilings_json(&self) -> Value {
        let mut out = limits_json(&self.ceilings);
        for ceiling in Ceiling::ALL {
            out[ceiling.key()] = json!(self.run_ceilings.get(ceiling));
        }
        out
    }

    /// `[compile]` as it is in force.
    fn compile_json(&self) -> Value {
        json!({
            "max_size": self.compile.max_bytes,
            "timeout": warden::units::format_duration(self.compile.timeout),
            "memory": self.compile.memory_bytes,
        })
    }

    /// `[serve]` as it is in force.
    fn serve_json(&self) -> Value {
        let c = &self.serve_connections;
        json!({
            "agents": self.serve_agents,
            "trusted_proxies": self.serve_trusted_proxies,
            "header_timeout": warden::units::format_duration(c.header_timeout),
            "max_connections": c.max_connections,
            "max_unauthenticated_connections": c.max_unauthenticated,
        })
    }

    /// The effective configuration as `warden.toml` text, each setting
    /// commented with where it came from, secrets masked.
    pub(crate) fn to_toml(&self) -> String {
        let mut out = String::new();
        match &self.file {
            Some(f) => out.push_str(&format!("# effective configuration (file: {})\n", f.display())),
            None => out.push_str(&format!(
                "# effective configuration (no {DEFAULT_FILE} here, no --config-file, no WARDEN_CONFIG)\n"
            )),
        }
        let line = |key: &str, value: &Value, source: Source| {
            let text = toml_value(value);
            format!("{key} = {text}    # {source}\n")
        };
        out.push_str(&line(
            "store",
            &json!(self.store.value.to_string()),
            self.store.source,
        ));
        out.push_str(&line(
            "record_prompts",
            &json!(self.record_prompts.value),
            self.record_prompts.source,
        ));
        match &self.cache_dir.value {
            Some(dir) => out.push_str(&line(
                "cache_dir",
                &json!(dir.display().to_string()),
                self.cache_dir.source,
            )),
            None => out.push_str("# cache_dir: none, components are compiled on every load\n"),
        }
        out.push_str(&format!("\n[labels]    # {}\n", self.labels.source));
        for (k, v) in &self.labels.value {
            out.push_str(&format!("{} = {}\n", toml_key(k), toml_value(&json!(v))));
        }
        if let Some(model) = &self.model {
            out.push_str("\n[defaults.model]    # file\n");
            out.push_str(&table_body(&masked(&model.section)));
        }
        for (key, grant) in &self.grants {
            let body = masked(grant);
            out.push_str(&format!("\n[grants.{}]    # file\n", toml_key(key)));
            out.push_str(&table_body(&body));
        }
        out.push_str(
            "\n[ceilings]    # the most a plugin's lease gets, and a response or run may start: the file's keys over the defaults\n",
        );
        out.push_str(&table_body(&self.ceilings_json()));
        out.push_str("\n[compile]    # how much compiling one component may take: the file's keys over the defaults\n");
        out.push_str(&table_body(&self.compile_json()));
        out.push_str("\n[serve]    # the file's keys over the defaults\n");
        out.push_str(&table_body(&self.serve_json()));
        out.push_str(if self.trust.is_enforcing() {
            "\n# [trust]    # file: plugins must be signed by a trusted publisher, except beneath allow_unsigned\n"
        } else {
            "\n# [trust]    # default (none configured): unsigned plugins load from anywhere; a signature present is still verified\n"
        });
        for line in table_body(&self.trust_json()).lines() {
            out.push_str(&format!("# {line}\n"));
        }
        out
    }
}

/// `[serve]`'s connection settings over their defaults, each checked.
fn serve_connections(
    serve: &ServeSection,
) -> Result<warden_server::ConnectionLimits, (String, String)> {
    let mut limits = warden_server::ConnectionLimits::DEFAULT;
    if let Some(t) = serve.header_timeout {
        if t.0.is_zero() {
            return Err((
                "serve.header_timeout".into(),
                "must be more than zero".into(),
            ));
        }
        limits.header_timeout = t.0;
    }
    if let Some(n) = serve.max_connections {
        if n == 0 {
            return Err(("serve.max_connections".into(), "must be at least 1".into()));
        }
        limits.max_connections = n;
    }
    if let Some(n) = serve.max_unauthenticated_connections {
        if n == 0 {
            return Err((
                "serve.max_unauthenticated_connections".into(),
                "must be at least 1".into(),
            ));
        }
        limits.max_unauthenticated = n;
    }
    if limits.max_unauthenticated > limits.max_connections {
        return Err((
            "serve.max_unauthenticated_connections".into(),
            format!(
                "must be at most serve.max_connections ({})",
                limits.max_connections
            ),
        ));
    }
    Ok(limits)
}

/// A lease's limits as `[ceilings]` keys (sizes in bytes).
fn limits_json(limits: &Limits) -> Value {
    json!({
        "fuel": limits.fuel.map_or(json!("unmetered"), |f| json!(f)),
        "memory": limits.memory_bytes,
        "tables": limits.table_elements,
        "timeout": warden::units::format_duration(limits.timeout),
        "output": limits.output_bytes,
        "stdio": limits.stdio_bytes,
        "http_requests": limits.http_requests,
        "http_response": limits.http_response_bytes,
    })
}

/// Keys whose values name environment variables (`env`, `api_key_env`,
/// `header_env`, …) rather than hold their values.
fn names_variables(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "env" || key.ends_with("_env")
}

/// Names that hold secrets rather than the names of secrets.
fn looks_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "auth",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// `value` as JSON with every string under a secret-looking key replaced by
/// `***`.
fn masked(value: &impl Serialize) -> Value {
    fn mask(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    if names_variables(k) {
                        // Variable names, not values: shown as they are.
                        continue;
                    }
                    if looks_secret(k) && !v.is_object() && !v.is_array() && !v.is_null() {
                        *v = json!("***");
                    } else {
                        mask(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(mask),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(value).unwrap_or(Value::Null);
    mask(&mut value);
    value
}

fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        serde_json::to_string(key).unwrap_or_default()
    }
}

/// A JSON value written as a TOML value (inline tables for objects).
fn toml_value(value: &Value) -> String {
    match value {
        Value::Null => "\"\"".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", toml_key(k), toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The members of a JSON object as `key = value` lines; empty members are
/// left out.
fn table_body(value: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(map) = value {
        for (k, v) in map {
            let empty = match v {
                Value::Null => true,
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => false,
            };
            if !empty {
                out.push_str(&format!("{} = {}\n", toml_key(k), toml_value(v)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_with(
        file: Option<&str>,
        env: &[(&str, &str)],
        overrides: Overrides,
    ) -> (Result<Settings, ConfigError>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = file {
            std::fs::write(dir.path().join(DEFAULT_FILE), text).unwrap();
        }
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let lookup = move |k: &str| env.get(k).cloned();
        let settings = Settings::load(&overrides, &lookup, dir.path());
        (settings, dir)
    }

    #[test]
    fn without_a_file_everything_has_its_default() {
        let (s, dir) = load_with(None, &[("HOME", "/home/u")], Overrides::default());
        let s = s.unwrap();
        assert_eq!(s.file, None);
        assert_eq!(
            s.store.value,
            StoreLocation::Sqlite(dir.path().join(".warden/warden.db"))
        );
        assert_eq!(s.store.source, Source::Default);
        assert!(!s.record_prompts.value);
        assert_eq!(
            s.cache_dir.value,
            Some(PathBuf::from("/home/u/.cache/warden/components"))
        );
        assert!(s.model.is_none() && s.grants.is_empty() && s.labels.value.is_empty());
    }

    #[test]
    fn ceilings_default_to_the_safe_ones_and_the_file_sets_each() {
        let (s, _dir) = load_with(None, &[], Overrides::default());
        assert_eq!(s.unwrap().ceilings, Limits::CEILINGS);
        let file = "[ceilings]\ntimeout = \"5s\"\nfuel = \"unmetered\"\nstdio = \"4KiB\"\n";
        let (s, _dir) = load_with(Some(file), &[], Overrides::default());
        let ceilings = s.unwrap().ceilings;
        assert_eq!(ceilings.timeout, std::time::Duration::from_secs(5));
        assert_eq!(ceilings.fuel, None);
        assert_eq!(ceilings.stdio_bytes, 4096);
        assert_eq!(ceilings.output_bytes, Limits::CEILINGS.output_bytes);
        let (s, _dir) = load_with(
            Some("[ceilings]\ntimeout = \"0s\"\n"),
            &[],
            Overrides::default(),
        );
        let err = s.unwrap_err().to_string();
        assert!(err.contains("ceilings.timeout"), "{err}");
    }

    #[test]
    fn trust_is_development_without_the_table_and_enforced_with_it() {
        let (s, _dir) = load_with(None, &[], Overrides::default());
        assert!(!s.unwrap().trust.is_enforcing());
        let key = "RWR3vY5GV1LU/3U8Y+3C6OfBcWycWuIZGbt0bZfsthbEUbN6L7/WpJt8";
        let file = format!(
            "[trust]\nallow_unsigned = [\"dev\"]\n[trust.publishers.acme]\nkeys = [\"{key}\"]\n"
        );
        let (s, dir) = load_with(Some(&file), &[], Overrides::default());
        let s = s.unwrap();
        assert!(s.trust.is_enforcing());
        assert_eq!(s.trust.allow_unsigned(), [dir.path().join("dev")]);
        let publishers: Vec<_> = s.trust.publishers().collect();
        assert_eq!(publishers, [("acme", vec!["FFD45257468EBD77"])]);
        for bad in [
            "[trust.publishers.acme]\nkeys = [\"not a key\"]\n",
            "[trust.publishers.acme]\nkeys = []\n",
        ] {
            let (s, _dir) = load_with(Some(bad), &[], Overrides::default());
            let err = s.unwrap_err().to_string();
            assert!(err.contains("trust.publishers.acme.keys"), "{err}");
        }
    }

    #[test]
    fn flags_beat_the_environment_which_beats_the_file() {
        let file = "store = \"runs/file.db\"\nrecord_prompts = false\n[labels]\nteam = \"ops\"\nzone = \"a\"\n";
        let (s, dir) = load_with(Some(file), &[], Overrides::default());
        let s = s.unwrap();
        assert_eq!(
            s.store.value,
            StoreLocation::Sqlite(dir.path().join("runs/file.db"))
        );
        assert_eq!(s.store.source, Source::File);
        assert_eq!(s.labels.value["team"], "ops");

        let env = [
            ("WARDEN_STORE", "sqlite:env.db"),
            ("WARDEN_RECORD_PROMPTS", "true"),
            ("WARDEN_LABELS", "zone=b, extra=1"),
        ];
        let (s, dir) = load_with(Some(file), &env, Overrides::default());
        let s = s.unwrap();
        assert_eq!(
            s.store.value,
            StoreLocation::Sqlite(dir.path().join("env.db"))
        );
        assert_eq!(s.store.source, Source::Env("WARDEN_STORE"));
        assert!(s.record_prompts.value);
        assert_eq!(
            s.labels.value,
            BTreeMap::from([
                ("team".to_owned(), "ops".to_owned()),
                ("zone".to_owned(), "b".to_owned()),
                ("extra".to_owned(), "1".to_owned()),
            ])
        );

        let flags = Overrides {
            store: Some("flag.db".into()),
            record_prompts: true,
            ..Overrides::default()
        };
        let (s, dir) = load_with(Some(file), &env, flags);
        let s = s.unwrap();
        assert_eq!(
            s.store.value,
            StoreLocation::Sqlite(dir.path().join("flag.db"))
        );
        assert_eq!(s.store.source, Source::Flag("--store"));
        assert_eq!(s.record_prompts.source, Source::Flag("--record-prompts"));
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let cases = [
            ("colour = 1\n", "unknown field `colour`"),
            ("[grants.fs]\nnetwork = true\n", "unknown field `network`"),
            (
                "[grants.fs.limits]\ntimeout = \"0s\"\n",
                "key `grants.fs.limits.timeout`: must be more than zero",
            ),
            (
                "store = \"mysql://db/warden\"\n",
                "key `store`: unknown store scheme `mysql`",
            ),
            (
                "[defaults.model]\nprovider = \"scripted\"\nname = \"demo\"\n",
                "key `defaults.model.transcript`: is required",
            ),
            (
                "[defaults.model]\nprovider = \"scripted\"\nname = \"demo\"\ntemperature = 2\n",
                "unknown field `temperature`",
            ),
            (
                &format!("[labels]\nk = \"{}\"\n", "v".repeat(300)),
                "key `labels`: label `k` has a value of 300 bytes",
            ),
        ];
        for (text, expected) in cases {
            let (err, dir) = load_with(Some(text), &[], Overrides::default());
            let err = err.unwrap_err().to_string();
            let file = dir.path().join(DEFAULT_FILE);
            assert!(
                err.starts_with(&format!("config `{}`: ", file.display())),
                "{err}"
            );
            assert!(
                err.contains(expected),
                "{text}: expected `{expected}` in {err}"
            );
        }
        let (err, _) = load_with(
            None,
            &[("WARDEN_RECORD_PROMPTS", "maybe")],
            Overrides::default(),
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "environment variable `WARDEN_RECORD_PROMPTS`: `maybe` is not a boolean (use true or false, 1 or 0)"
        );
        let named = Overrides {
            config: Some("missing.toml".into()),
            ..Overrides::default()
        };
        let (err, _) = load_with(None, &[], named);
        assert!(
            err.unwrap_err()
                .to_string()
                .starts_with("cannot read config `"),
        );
    }

    #[test]
    fn postgres_urls_are_stores_and_their_passwords_are_never_shown() {
        let (s, _dir) = load_with(
            Some("store = \"postgres://warden:s3cret@db.internal:5432/runs?schema=prod\"\n"),
            &[],
            Overrides::default(),
        );
        let s = s.unwrap();
        assert_eq!(
            s.store.value,
            StoreLocation::Postgres(
                "postgres://warden:s3cret@db.internal:5432/runs?schema=prod".into()
            )
        );
        assert_eq!(
            s.store.value.to_string(),
            "postgres://warden:***@db.internal:5432/runs?schema=prod"
        );
        assert!(!s.to_toml().contains("s3cret"));
        assert!(!s.to_json().to_string().contains("s3cret"));
    }

    #[test]
    fn configured_grants_fill_in_only_where_the_agent_grants_nothing() {
        let file = "[grants.fs.mounts.workspace]\ndir = \"data\"\naccess = \"read-only\"\n[grants.other]\nenv = [\"TOKEN\"]\n";
        let (s, dir) = load_with(Some(file), &[], Overrides::default());
        let s = s.unwrap();
        let agent_text = "name = \"a\"\ninstructions = \"i\"\n[model]\nprovider = \"scripted\"\nname = \"m\"\ntranscript = \"t.toml\"\n[plugins.fs]\nsource = \"builtin:fs\"\n[plugins.own]\nsource = \"builtin:fs\"\n[plugins.own.grant.mounts.workspace]\ndir = \"mine\"\n";
        let agents = tempfile::tempdir().unwrap();
        let mut agent = Agent::parse(agent_text, &agents.path().join("a.toml"), None).unwrap();
        s.apply_grants(&mut agent);
        let fs = &agent.plugins[0];
        assert_eq!(fs.key, "fs");
        assert_eq!(fs.grant.mounts["workspace"].dir, Path::new("data"));
        assert_eq!(fs.grant_base, dir.path());
        let own = &agent.plugins[1];
        assert_eq!(own.grant.mounts["workspace"].dir, Path::new("mine"));
        assert_eq!(own.grant_base, agents.path());
    }

    #[test]
    fn the_default_model_is_inherited_by_agents_without_one() {
        let file = "[defaults.model]\nprovider = \"scripted\"\nname = \"house\"\ntranscript = \"house.toml\"\n";
        let (s, dir) = load_with(Some(file), &[], Overrides::default());
        let s = s.unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "name = \"a\"\ninstructions = \"i\"\n").unwrap();
        let agent = s.load_agent(&path).unwrap();
        assert_eq!(agent.model.name, "house");
        assert_eq!(agent.model.transcript, Some(dir.path().join("house.toml")));
    }

    #[test]
    fn show_masks_secrets_and_names_sources() {
        let file = "[grants.hook]\nenv = [\"HOOK_TOKEN\"]\n[grants.hook.config]\nurl = \"https://example.com/hook\"\napi_key = \"sk-live-123\"\n";
        let (s, _dir) = load_with(
            Some(file),
            &[("WARDEN_STORE", "x.db")],
            Overrides::default(),
        );
        let s = s.unwrap();
        let text = s.to_toml();
        assert!(!text.contains("sk-live-123"), "{text}");
        assert!(text.contains("api_key = \"***\""), "{text}");
        assert!(text.contains("env = [\"HOOK_TOKEN\"]"), "{text}");
        assert!(
            text.contains("url = \"https://example.com/hook\""),
            "{text}"
        );
        assert!(text.contains("# env WARDEN_STORE"), "{text}");
        let json = s.to_json();
        assert_eq!(json["grants"]["hook"]["config"]["api_key"], "***");
        assert_eq!(json["store"]["source"], "env WARDEN_STORE");
        assert!(!json.to_string().contains("sk-live-123"));
    }
}
