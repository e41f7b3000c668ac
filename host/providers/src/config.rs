//! Provider configuration: the `[model]` table of an agent file or of
//! `warden.toml` as written ([`ModelSection`]), its HTTP keys checked into
//! [`HttpModelSettings`] (secrets still named by environment variable), and
//! [`connect`], which makes the provider a configuration names. The engine
//! resolves the rest of the table (token caps, pricing, retries) and owns
//! when a provider is called.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warden_syntax::units::HumanDuration;

use crate::http::{RESERVED_HEADERS, check_base_url};
use crate::{
    AnthropicOptions, AnthropicProvider, HttpConfig, MaxTokensField, ModelProvider, OpenAiOptions,
    OpenAiProvider, ProviderError, ScriptedProvider, Secret, anthropic, openai,
};

/// The `[model]` table, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Which provider speaks to the model.
    pub provider: ProviderKind,
    /// The model, as the provider names it.
    pub name: String,
    /// Output tokens per call. Default: 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The scripted provider's transcript, relative to the file. Required
    /// for `scripted`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<PathBuf>,
    /// What tokens cost. Default: unpriced (no cost is recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<PricingSection>,
    /// HTTP providers: the API's base URL. Default: the provider's public
    /// API (`https://api.openai.com/v1`, `https://api.anthropic.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// HTTP providers: an environment variable holding the base URL; when
    /// it is set and not empty it wins over `base_url`. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url_env: Option<String>,
    /// HTTP providers: the environment variable holding the API key.
    /// Default: none (no key is sent); required for the public APIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// HTTP providers: extra headers, never credentials. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// HTTP providers: extra headers whose values are read from the named
    /// environment variables. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header_env: BTreeMap<String, String>,
    /// HTTP providers: the most a call waits for a connection, for the
    /// response to start, and between two pieces of it. Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// Requests per model call in total (1 to 10), the first included:
    /// transient failures are tried again up to this. Default: 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The longest wait before another attempt (backoff, or what
    /// `Retry-After` asks for) that a driver sleeps through, at most 1 hour;
    /// a longer wait parks the run until it is due. Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_wait: Option<HumanDuration>,
    /// HTTP providers: calls in flight at once (1 to 1024). Default: 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<u32>,
    /// HTTP providers: whether to stream. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// `anthropic`: the `anthropic-version` header. Default: `2023-06-01`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `openai`: the field the token cap goes in. Default: `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_field: Option<MaxTokensField>,
    /// `openai`: whether to ask for usage in the stream. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_usage: Option<bool>,
}

impl ModelSection {
    /// A table for `provider` and `name` with every other key unset.
    pub fn new(provider: ProviderKind, name: impl Into<String>) -> Self {
        ModelSection {
            provider,
            name: name.into(),
            max_tokens: None,
            transcript: None,
            pricing: None,
            base_url: None,
            base_url_env: None,
            api_key_env: None,
            headers: BTreeMap::new(),
            header_env: BTreeMap::new(),
            timeout: None,
            max_attempts: None,
            max_retry_wait: None,
            max_concurrent_calls: None,
            stream: None,
            api_version: None,
            max_tokens_field: None,
            stream_usage: None,
        }
    }

    /// The keys that are set and only mean something to HTTP providers.
    fn http_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        let mut set = |on: bool, key: &'static str| {
            if on {
                keys.push(key);
            }
        };
        set(self.base_url.is_some(), "base_url");
        set(self.base_url_env.is_some(), "base_url_env");
        set(self.api_key_env.is_some(), "api_key_env");
        set(!self.headers.is_empty(), "headers");
        set(!self.header_env.is_empty(), "header_env");
        set(self.timeout.is_some(), "timeout");
        set(self.max_concurrent_calls.is_some(), "max_concurrent_calls");
        set(self.stream.is_some(), "stream");
        set(self.api_version.is_some(), "api_version");
        set(self.max_tokens_field.is_some(), "max_tokens_field");
        set(self.stream_usage.is_some(), "stream_usage");
        keys
    }
}

/// The providers an agent may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProviderKind {
    /// Replays a transcript file (see [`crate::scripted`]).
    #[serde(rename = "scripted")]
    Scripted,
    /// An OpenAI-compatible chat completions endpoint (see
    /// [`crate::openai`]).
    #[serde(rename = "openai")]
    OpenAi,
    /// The Anthropic Messages API (see [`crate::anthropic`]).
    #[serde(rename = "anthropic")]
    Anthropic,
    /// A plan file's schedule, decided by the engine (its `plan` module):
    /// never written in a `[model]` table, so never read from one.
    #[serde(rename = "plan", skip_deserializing)]
    Plan,
}

impl ProviderKind {
    /// The name, as written.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Scripted => "scripted",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Plan => "plan",
        }
    }

    /// The public API's base URL, for the HTTP providers.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Scripted | ProviderKind::Plan => None,
            ProviderKind::OpenAi => Some(openai::DEFAULT_BASE_URL),
            ProviderKind::Anthropic => Some(anthropic::DEFAULT_BASE_URL),
        }
    }
}

/// The `[model.pricing]` table, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricingSection {
    /// Price of a million input tokens.
    pub input_per_million: f64,
    /// Price of a million output tokens.
    pub output_per_million: f64,
    /// ISO 4217 code. Default: `USD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// How an HTTP provider reaches its API, checked, with secrets still named
/// by environment variable (read by [`connect`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HttpModelSettings {
    /// The base URL written in the agent, or the provider's public API.
    pub base_url: String,
    /// The variable whose value, when set, replaces `base_url`.
    pub base_url_env: Option<String>,
    /// The variable holding the API key.
    pub api_key_env: Option<String>,
    /// Extra headers.
    pub headers: BTreeMap<String, String>,
    /// Extra headers by the variable holding each value.
    pub header_env: BTreeMap<String, String>,
    /// See [`HttpConfig::timeout`].
    pub timeout: std::time::Duration,
    /// See [`HttpConfig::max_concurrent_calls`].
    pub max_concurrent_calls: usize,
    /// See [`HttpConfig::stream`].
    pub stream: bool,
    /// `anthropic`: the `anthropic-version` header.
    pub api_version: String,
    /// `openai`: the field the token cap goes in.
    pub max_tokens_field: MaxTokensField,
    /// `openai`: whether to ask for usage in the stream.
    pub stream_usage: bool,
}

impl HttpModelSettings {
    /// The endpoint's settings, the environment variables read now. Errors
    /// name the variable and the key, never a value.
    pub fn config(&self) -> Result<HttpConfig, String> {
        let base_url = match &self.base_url_env {
            Some(var) => match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => {
                    let v = v.trim().to_owned();
                    check_base_url(&v).map_err(|e| {
                        format!("environment variable `{var}` (model.base_url_env): {e}")
                    })?;
                    v
                }
                _ => self.base_url.clone(),
            },
            None => self.base_url.clone(),
        };
        let api_key = self
            .api_key_env
            .as_deref()
            .map(|var| Secret::from_env(var).map_err(|e| format!("{e} (model.api_key_env)")))
            .transpose()?;
        let secret_headers = self
            .header_env
            .iter()
            .map(|(name, var)| {
                Secret::from_env(var)
                    .map(|s| (name.clone(), s))
                    .map_err(|e| format!("{e} (model.header_env.{name})"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HttpConfig {
            base_url,
            api_key,
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            secret_headers,
            timeout: self.timeout,
            max_concurrent_calls: self.max_concurrent_calls,
            stream: self.stream,
        })
    }
}

/// The provider that reaches a model of `kind`: for `scripted`, the
/// transcript, read now (so a malformed one is reported before a run
/// starts); for the HTTP providers, the environment variables `http` names,
/// read now, on the process-wide HTTP client.
pub fn connect(
    kind: ProviderKind,
    transcript: Option<&Path>,
    http: Option<&HttpModelSettings>,
) -> Result<Arc<dyn ModelProvider>, ProviderError> {
    let invalid = |message: String| ProviderError::InvalidRequest {
        provider: kind.as_str().into(),
        message,
    };
    let http = || http.ok_or_else(|| invalid("no HTTP settings are configured".into()));
    match kind {
        ProviderKind::Scripted => {
            let path = transcript.ok_or_else(|| invalid("no transcript is configured".into()))?;
            Ok(Arc::new(ScriptedProvider::load(path)?))
        }
        ProviderKind::OpenAi => {
            let http = http()?;
            let options = OpenAiOptions {
                max_tokens_field: http.max_tokens_field,
                stream_usage: http.stream_usage,
            };
            Ok(Arc::new(OpenAiProvider::new(
                http.config().map_err(invalid)?,
                options,
            )?))
        }
        ProviderKind::Anthropic => {
            let http = http()?;
            let options = AnthropicOptions {
                api_version: http.api_version.clone(),
            };
            Ok(Arc::new(AnthropicProvider::new(
                http.config().map_err(invalid)?,
                options,
            )?))
        }
        ProviderKind::Plan => Err(invalid(
            "a plan's decisions are made by the engine from its plan file".into(),
        )),
    }
}

/// Whether `name` can name an environment variable: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Header names whose values are credentials: never written in an agent.
const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
];

/// Checks the HTTP keys of a `[model]` table: `None` for `scripted`. The
/// error is the dotted key and the message. Messages about variable names
/// never repeat the value (it may be a key pasted in the wrong place).
pub fn http_settings(
    section: &ModelSection,
) -> Result<Option<HttpModelSettings>, (String, String)> {
    let kind = section.provider;
    let err = |key: &str, message: String| (format!("model.{key}"), message);
    let Some(default_url) = kind.default_base_url() else {
        if let Some(key) = section.http_keys().first() {
            return Err(err(key, "is not used by the scripted provider".into()));
        }
        return Ok(None);
    };
    let only = |key: &str, set: bool, for_kind: ProviderKind| {
        if set && kind != for_kind {
            return Err(err(
                key,
                format!(
                    "is only used by the `{}` provider, not `{}`",
                    for_kind.as_str(),
                    kind.as_str()
                ),
            ));
        }
        Ok(())
    };
    only(
        "api_version",
        section.api_version.is_some(),
        ProviderKind::Anthropic,
    )?;
    only(
        "max_tokens_field",
        section.max_tokens_field.is_some(),
        ProviderKind::OpenAi,
    )?;
    only(
        "stream_usage",
        section.stream_usage.is_some(),
        ProviderKind::OpenAi,
    )?;
    let env_name = |key: &str, name: &str| {
        if is_env_name(name) {
            return Ok(());
        }
        Err(err(
            key,
            "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*), not hold a value".into(),
        ))
    };
    if let Some(url) = &section.base_url {
        check_base_url(url).map_err(|e| err("base_url", e))?;
    }
    if let Some(var) = &section.base_url_env {
        env_name("base_url_env", var)?;
    }
    match &section.api_key_env {
        Some(var) => env_name("api_key_env", var)?,
        None if section.base_url.is_none() && section.base_url_env.is_none() => {
            let example = match kind {
                ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
                _ => "OPENAI_API_KEY",
            };
            return Err(err(
                "api_key_env",
                format!(
                    "is required for {default_url}: name the environment variable holding the key, such as {example}"
                ),
            ));
        }
        None => {}
    }
    for (name, value) in &section.headers {
        let key = format!("headers.{name}");
        let lower = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(err(&key, "is not a valid header name".into()));
        }
        if CREDENTIAL_HEADERS.contains(&lower.as_str()) {
            return Err(err(
                &key,
                "credentials must not be written in an agent file: name an environment variable with api_key_env or header_env".into(),
            ));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(err(&key, "is set by Warden".into()));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(err(
                &key,
                "has a value that is not valid in a header".into(),
            ));
        }
    }
    for (name, var) in &section.header_env {
        let key = format!("header_env.{name}");
        let lower = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(err(&key, "is not a valid header name".into()));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(err(&key, "is set by Warden".into()));
        }
        if section.headers.keys().any(|h| h.eq_ignore_ascii_case(name)) {
            return Err(err(&key, "is also set in model.headers".into()));
        }
        env_name(&key, var)?;
    }
    let timeout = match section.timeout {
        Some(t) if t.0.is_zero() => return Err(err("timeout", "must be more than zero".into())),
        Some(t) => t.0,
        None => std::time::Duration::from_secs(60),
    };
    let max_concurrent_calls = section.max_concurrent_calls.unwrap_or(8);
    if !(1..=1024).contains(&max_concurrent_calls) {
        return Err(err(
            "max_concurrent_calls",
            format!("must be between 1 and 1024, got {max_concurrent_calls}"),
        ));
    }
    let api_version = section
        .api_version
        .clone()
        .unwrap_or_else(|| anthropic::DEFAULT_API_VERSION.into());
    if api_version.trim().is_empty() || http::HeaderValue::from_str(&api_version).is_err() {
        return Err(err(
            "api_version",
            "must be a version such as 2023-06-01".into(),
        ));
    }
    Ok(Some(HttpModelSettings {
        base_url: section
            .base_url
            .clone()
            .unwrap_or_else(|| default_url.to_owned()),
        base_url_env: section.base_url_env.clone(),
        api_key_env: section.api_key_env.clone(),
        headers: section.headers.clone(),
        header_env: section.header_env.clone(),
        timeout,
        max_concurrent_calls: max_concurrent_calls as usize,
        stream: section.stream.unwrap_or(true),
        api_version,
        max_tokens_field: section.max_tokens_field.unwrap_or_default(),
        stream_usage: section.stream_usage.unwrap_or(true),
    }))
}
