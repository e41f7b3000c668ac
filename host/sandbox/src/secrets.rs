//! Secrets by handle: the values a plugin's grant names, kept on the host's
//! side of the sandbox and put into outgoing requests by the host.
//!
//! - **A handle** (`warden:plugin/secrets.handle`) is a placeholder text
//!   made of a random prefix drawn once per lease and a fixed-width number: it stands
//!   for one secret in one [`Form`], and means nothing outside its lease.
//! - **Substitution** happens in the network hooks (`net.rs`), after the
//!   guest handed the request over and the request passed the grant: every
//!   header value holding a handle of this lease gets the secret, written
//!   in its form, if the request's scheme, host and port match one of the
//!   secret's hosts; otherwise the header is removed, so a redirect to
//!   another host, or a request the plugin aims elsewhere, never carries it.
//!   A substituted header is marked sensitive.
//! - **Reveal** (`warden:plugin/secrets.reveal`) gives the value to the
//!   guest only for a secret granted with `reveal`; every other read is a
//!   typed `reveal-denied`. Every granted value, revealed or not, is in the
//!   lease's redactor, so a host that echoes a credential back has it
//!   redacted from what the plugin returns.
//! - **What the receipt keeps** ([`SecretUse`]): the secret's name, its
//!   version digest (computed by whoever built the grant, keyed, never the
//!   value's plain hash), what happened to it and for which `host:port`.
//!   Never the value, never the handle.

use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};

use super::net::HostPattern;

/// Most uses a receipt lists; later ones are dropped (a lease's requests
/// are bounded anyway).
const MAX_LISTED_USES: usize = 32;

/// Digits of a handle's number: fixed, so text the guest writes right
/// after a handle never changes which handle it is.
const HANDLE_DIGITS: usize = 8;

/// One secret granted to a plugin: its name, its value (kept out of
/// `Debug` and serialization), the hosts it may be sent to, whether the
/// guest may read it, and its version digest.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct Secret {
    name: String,
    #[serde(skip)]
    value: Arc<str>,
    hosts: Vec<String>,
    reveal: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("reveal", &self.reveal)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Secret {
    /// The secret `name` with `value`, attached only to requests matching
    /// one of `hosts` (each a [`HostPattern`]; one that does not parse
    /// matches nothing). Not revealed and without a version unless set.
    pub fn new(name: impl Into<String>, value: impl Into<Arc<str>>, hosts: Vec<String>) -> Self {
        Secret {
            name: name.into(),
            value: value.into(),
            hosts,
            reveal: false,
            version: None,
        }
    }

    /// Lets the guest read the value with `reveal`. Default: not revealed.
    pub fn revealed(mut self, reveal: bool) -> Self {
        self.reveal = reveal;
        self
    }

    /// The version digest receipts record. Default: none.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hosts it may be sent to.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether the guest may read it.
    pub fn is_revealed(&self) -> bool {
        self.reveal
    }

    /// The version digest, if the grant has one.
    pub fn version_digest(&self) -> Option<&str> {
        self.version.as_deref()
    }

    pub(crate) fn value(&self) -> &str {
        &self.value
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .filter_map(|h| HostPattern::parse(h).ok())
            .any(|p| p.matches(scheme, host, port))
    }
}

/// How a secret is written into a header value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Plain,
    Bearer,
    Basic(String),
}

impl Form {
    /// The text of this form that does not hold the value as it is: what
    /// a host echoing the header back would show, for the redactor.
    pub(crate) fn encoded(&self, value: &str) -> Option<String> {
        match self {
            Form::Basic(_) => self.render(value).strip_prefix("Basic ").map(str::to_owned),
            Form::Plain | Form::Bearer => None,
        }
    }

    fn render(&self, value: &str) -> String {
        use base64::Engine as _;
        match self {
            Form::Plain => value.to_owned(),
            Form::Bearer => format!("Bearer {value}"),
            Form::Basic(user) => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{value}"))
            ),
        }
    }
}

/// What happened to a secret in a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretAction {
    /// Put into a request to one of its hosts.
    Attached,
    /// Its header was removed from a request to a host it is not bound to.
    Withheld,
    /// Its value was given to the guest (`reveal = true`).
    Revealed,
}

/// One use of a secret, as a receipt records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretUse {
    /// The secret's name.
    pub name: String,
    /// Its version digest, when the grant has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// What happened.
    pub action: SecretAction,
    /// `host:port` of the request, for `attached` and `withheld`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Why the guest's `handle` or `reveal` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    NotGranted(String),
    RevealDenied(String),
    InvalidForm(String),
}

/// The secrets of one lease: the grant's, the handles the guest asked for
/// and what was done with them. Shared by the host import and the network
/// hooks.
#[derive(Debug)]
pub(crate) struct LeaseSecrets {
    plugin: Arc<str>,
    granted: Arc<[Secret]>,
    /// `warden-secret-<random>-`: a handle is this and a number.
    prefix: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Handle number to (index in `granted`, form).
    handles: Vec<(usize, Form)>,
    uses: Vec<SecretUse>,
}

impl LeaseSecrets {
    pub(crate) fn new(plugin: Arc<str>, granted: Arc<[Secret]>) -> Self {
        let prefix = format!("warden-secret-{}-", hex::encode(rand::random::<[u8; 12]>()));
        LeaseSecrets {
            plugin,
            granted,
            prefix,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, name: &str) -> Result<usize, Refusal> {
        self.granted
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.granted.iter().map(|s| s.name.as_str()).collect();
                Refusal::NotGranted(format!(
                    "no secret `{name}` is granted to plugin `{}` (granted: {}); the operator grants one under [secrets.{name}]",
                    self.plugin,
                    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                ))
            })
    }

    /// The encoded text `form` makes of the secret `name`, if any (see
    /// [`Form::encoded`]).
    pub(crate) fn encoded(&self, name: &str, form: &Form) -> Option<String> {
        let secret = self.granted.iter().find(|s| s.name == name)?;
        form.encoded(secret.value())
    }

    /// The guest's `handle`.
    pub(crate) fn handle(&self, name: &str, form: Form) -> Result<String, Refusal> {
        let index = self.find(name)?;
        if let Form::Basic(user) = &form
            && (user.contains(':') || user.chars().any(char::is_control))
        {
            return Err(Refusal::InvalidForm(format!(
                "basic-auth username for secret `{name}` holds a `:` or a control character"
            )));
        }
        let mut state = self.lock();
        let number = state.handles.len();
        state.handles.push((index, form));
        Ok(format!(
            "{}{number:0width$}",
            self.prefix,
            width = HANDLE_DIGITS
        ))
    }

    /// The guest's `reveal`.
    pub(crate) fn reveal(&self, name: &str) -> Result<String, Refusal> {
        let index = self.find(name)?;
        let secret = &self.granted[index];
        if !secret.reveal {
            tracing::debug!(plugin = &*self.plugin, secret = name, "reveal refused");
            return Err(Refusal::RevealDenied(format!(
                "secret `{name}` is granted without `reveal = true`, so plugin `{}` may use it by handle only",
                self.plugin
            )));
        }
        self.record(secret, SecretAction::Revealed, None);
        Ok(secret.value.to_string())
    }

    fn record(&self, secret: &Secret, action: SecretAction, host: Option<String>) {
        let used = SecretUse {
            name: secret.name.clone(),
            version: secret.version.clone(),
            action,
            host,
        };
        let mut state = self.lock();
        if !state.uses.contains(&used) && state.uses.len() < MAX_LISTED_USES {
            state.uses.push(used);
        }
    }

    /// Puts the secrets into the header values holding this lease's
    /// handles, for a request to `scheme://host:port` that passed the
    /// grant; removes a header holding a handle of a secret not bound to
    /// that host, or whose value would not make a valid header.
    pub(crate) fn substitute(&self, headers: &mut HeaderMap, scheme: &str, host: &str, port: u16) {
        if !headers
            .values()
            .any(|v| contains(v.as_bytes(), self.prefix.as_bytes()))
        {
            return;
        }
        let target = format!("{host}:{port}");
        let old = std::mem::take(headers);
        let mut name = None;
        for (n, value) in old {
            if let Some(n) = n {
                name = Some(n);
            }
            let name = name.clone().expect("the first header has a name");
            if !contains(value.as_bytes(), self.prefix.as_bytes()) {
                headers.append(name, value);
                continue;
            }
            match self.fill(value.as_bytes(), scheme, host, port, &target) {
                Some(filled) => {
                    headers.append(name, filled);
                }
                None => {
                    tracing::debug!(plugin = &*self.plugin, header = %name, target, "secret header withheld");
                }
            }
        }
    }

    /// The header value with every handle replaced, or `None` when one of
    /// them may not go to this host.
    fn fill(
        &self,
        value: &[u8],
        scheme: &str,
        host: &str,
        port: u16,
        target: &str,
    ) -> Option<HeaderValue> {
        let handles: Vec<(usize, Form)> = self.lock().handles.clone();
        let prefix = self.prefix.as_bytes();
        let mut out = Vec::with_capacity(value.len());
        let mut rest = value;
        let mut attached = Vec::new();
        let mut allowed = true;
        while let Some(at) = find(rest, prefix) {
            out.extend_from_slice(&rest[..at]);
            let after = &rest[at + prefix.len()..];
            let digits = after
                .iter()
                .take(HANDLE_DIGITS)
                .take_while(|b| b.is_ascii_digit())
                .count();
            let number = std::str::from_utf8(&after[..digits])
                .ok()
                .and_then(|d| d.parse::<usize>().ok());
            match number
                .filter(|_| digits == HANDLE_DIGITS)
                .and_then(|n| handles.get(n))
            {
                Some((index, form)) => {
                    let secret = &self.granted[*index];
                    if secret.allows(scheme, host, port) {
                        out.extend_from_slice(form.render(secret.value()).as_bytes());
                        attached.push(secret);
                    } else {
                        self.record(secret, SecretAction::Withheld, Some(target.to_owned()));
                        allowed = false;
                    }
                }
                // Not a handle of this lease: a forged or stale one stays
                // text, and stands for nothing.
                None => out.extend_from_slice(&rest[at..at + prefix.len() + digits]),
            }
            rest = &after[digits..];
        }
        out.extend_from_slice(rest);
        if !allowed {
            return None;
        }
        let mut filled = HeaderValue::from_bytes(&out).ok()?;
        filled.set_sensitive(true);
        for secret in attached {
            self.record(secret, SecretAction::Attached, Some(target.to_owned()));
        }
        Some(filled)
    }

    /// What the lease did with its secrets, if anything.
    pub(crate) fn uses(&self) -> Vec<SecretUse> {
        self.lock().uses.clone()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> LeaseSecrets {
        LeaseSecrets::new(
            Arc::from("p"),
            Arc::from(vec![
                Secret::new("token", "s3cr3t-value", vec!["api.example.com".into()]).version("v1"),
                Secret::new("open", "readable-value", vec![]).revealed(true),
            ]),
        )
    }

    #[test]
    fn a_handle_is_filled_for_its_host_only() {
        let secrets = lease();
        let bearer = secrets.handle("token", Form::Bearer).unwrap();
        assert!(!bearer.contains("s3cr3t"));
        let plain = secrets.handle("token", Form::Plain).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", bearer.parse().unwrap());
        headers.insert("x-key", format!("k={plain};v=2").parse().unwrap());
        headers.insert("accept", "*/*".parse().unwrap());
        let mut elsewhere = headers.clone();
        secrets.substitute(&mut headers, "https", "api.example.com", 443);
        assert_eq!(headers["authorization"], "Bearer s3cr3t-value");
        assert!(headers["authorization"].is_sensitive());
        assert_eq!(headers["x-key"], "k=s3cr3t-value;v=2");
        secrets.substitute(&mut elsewhere, "https", "evil.example.com", 443);
        assert_eq!(elsewhere.len(), 1, "{elsewhere:?}");
        assert_eq!(elsewhere["accept"], "*/*");
        let uses = secrets.uses();
        assert_eq!(
            uses.iter()
                .map(|u| (u.action, u.host.as_deref().unwrap()))
                .collect::<Vec<_>>(),
            [
                (SecretAction::Attached, "api.example.com:443"),
                (SecretAction::Withheld, "evil.example.com:443")
            ]
        );
        assert_eq!(uses[0].version.as_deref(), Some("v1"));
    }

    #[test]
    fn basic_auth_is_encoded_by_the_host() {
        let secrets = lease();
        let basic = secrets.handle("token", Form::Basic("me".into())).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", basic.parse().unwrap());
        secrets.substitute(&mut headers, "http", "api.example.com", 80);
        // base64("me:s3cr3t-value")
        assert_eq!(headers["authorization"], "Basic bWU6czNjcjN0LXZhbHVl");
        assert!(matches!(
            secrets.handle("token", Form::Basic("a:b".into())),
            Err(Refusal::InvalidForm(_))
        ));
    }

    #[test]
    fn reading_needs_reveal_and_unknown_names_are_refused() {
        let secrets = lease();
        assert!(matches!(
            secrets.reveal("token"),
            Err(Refusal::RevealDenied(m)) if m.contains("`token`")
        ));
        assert_eq!(secrets.reveal("open").unwrap(), "readable-value");
        assert!(matches!(
            secrets.handle("other", Form::Plain),
            Err(Refusal::NotGranted(m)) if m.contains("token, open")
        ));
    }

    #[test]
    fn a_forged_or_foreign_handle_stands_for_nothing() {
        let secrets = lease();
        let other = lease().handle("token", Form::Plain).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x", other.parse().unwrap());
        headers.insert("y", "warden-secret-0".parse().unwrap());
        secrets.substitute(&mut headers, "https", "api.example.com", 443);
        assert_eq!(headers["x"], other.as_str());
        assert!(secrets.uses().is_empty());
    }

    #[test]
    fn debug_and_serialization_never_show_the_value() {
        let secret = Secret::new("token", "s3cr3t-value", vec!["api.example.com".into()]);
        assert!(!format!("{secret:?}").contains("s3cr3t"));
        assert!(!serde_json::to_string(&secret).unwrap().contains("s3cr3t"));
    }
}
