//! Native stand-ins for the host, for unit tests of plugin logic (only on
//! non-wasm targets): a per-thread configuration map that
//! [`config`](crate::config) reads, a per-thread capture of log lines, a
//! per-thread HTTP responder that [`http::send`](crate::http::send) calls,
//! per-thread granted secrets for [`secrets`](crate::secrets), and
//! builders for the records the host would send.
//!
//! State is per thread, so tests running in parallel do not see each
//! other's configuration or logs.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::http::{HttpError, Request, Response, Url};
use crate::types::{Call, ContextRequest, Delivery, LogLevel, PolicyHook, PolicyRequest};

/// Most log lines kept per thread; later lines still go to stderr.
const MAX_CAPTURED_LINES: usize = 10_000;

type HttpResponder = Box<dyn Fn(&Request) -> Result<Response, HttpError>>;

thread_local! {
    static CONFIG: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
    static LOGS: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
    static HTTP: RefCell<Option<HttpResponder>> = const { RefCell::new(None) };
    static SECRETS: RefCell<HashMap<String, (String, bool)>> = RefCell::new(HashMap::new());
}

/// Grants the secret `name` with `value` on this thread, readable with
/// [`secrets::reveal`](crate::secrets::reveal) only when `reveal`. A
/// handle to it is the text `{{secret:NAME:FORM}}` (`plain`, `bearer`,
/// `basic:USER`), so a test sees which secret went into which header.
pub fn set_secret(name: impl Into<String>, value: impl Into<String>, reveal: bool) {
    SECRETS.with(|s| s.borrow_mut().insert(name.into(), (value.into(), reveal)));
}

/// Removes every secret granted on this thread.
pub fn clear_secrets() {
    SECRETS.with(|s| s.borrow_mut().clear());
}

pub(crate) fn native_handle(
    name: &str,
    form: crate::secrets::SecretForm,
) -> Result<String, crate::secrets::SecretError> {
    use crate::secrets::{SecretError, SecretForm};
    SECRETS.with(|s| {
        if !s.borrow().contains_key(name) {
            return Err(SecretError::NotGranted(format!(
                "no secret `{name}` is granted (warden_guest::testing::set_secret)"
            )));
        }
        let form = match form {
            SecretForm::Plain => "plain".to_owned(),
            SecretForm::Bearer => "bearer".to_owned(),
            SecretForm::Basic(user) if user.contains(':') => {
                return Err(SecretError::InvalidForm(format!(
                    "basic-auth username for secret `{name}` holds a `:`"
                )));
            }
            SecretForm::Basic(user) => format!("basic:{user}"),
        };
        Ok(format!("{{{{secret:{name}:{form}}}}}"))
    })
}

pub(crate) fn native_reveal(name: &str) -> Result<String, crate::secrets::SecretError> {
    use crate::secrets::SecretError;
    SECRETS.with(|s| match s.borrow().get(name) {
        None => Err(SecretError::NotGranted(format!(
            "no secret `{name}` is granted (warden_guest::testing::set_secret)"
        ))),
        Some((_, false)) => Err(SecretError::RevealDenied(format!(
            "secret `{name}` is granted without `reveal = true`"
        ))),
        Some((value, true)) => Ok(value.clone()),
    })
}

/// Makes [`http::send`](crate::http::send) on this thread answer with
/// `responder` instead of the network. By default none is set, and every
/// request fails with [`HttpError::Failed`].
pub fn set_http(responder: impl Fn(&Request) -> Result<Response, HttpError> + 'static) {
    HTTP.with(|http| *http.borrow_mut() = Some(Box::new(responder)));
}

/// Removes the HTTP responder set on this thread.
pub fn clear_http() {
    HTTP.with(|http| *http.borrow_mut() = None);
}

/// Sets the value [`config`](crate::config) returns for `key` on this thread.
pub fn set_config(key: impl Into<String>, value: impl Into<String>) {
    CONFIG.with(|config| config.borrow_mut().insert(key.into(), value.into()));
}

/// Removes every configuration value set on this thread.
pub fn clear_config() {
    CONFIG.with(|config| config.borrow_mut().clear());
}

/// Returns and forgets the lines logged on this thread so far (at most the
/// first 10,000 since the last call).
pub fn take_logs() -> Vec<(LogLevel, String)> {
    LOGS.with(|logs| std::mem::take(&mut *logs.borrow_mut()))
}

/// A call of `tool` with `arguments`, id `test-call`, no run and no
/// idempotency key.
pub fn call(tool: impl Into<String>, arguments: serde_json::Value) -> Call {
    Call {
        id: "test-call".into(),
        run_id: String::new(),
        tool: tool.into(),
        arguments: arguments.to_string(),
        idempotency_key: String::new(),
    }
}

/// A context request with `query`, outside any run.
pub fn request(query: impl Into<String>) -> ContextRequest {
    ContextRequest {
        run_id: String::new(),
        query: query.into(),
    }
}

/// A delivery of `kind` with `payload`, id `test-delivery`, outside any run.
pub fn delivery(kind: impl Into<String>, payload: serde_json::Value) -> Delivery {
    Delivery {
        id: "test-delivery".into(),
        run_id: String::new(),
        kind: kind.into(),
        payload: payload.to_string(),
    }
}

/// A policy request in run `test-run` of agent `test-agent`, for policy
/// `test-policy`, with `subject` as its subject. The hook is the one the
/// subject's `hook` tag names, as the host writes it, for example
/// `{"hook": "before_tool_call", "call_id": "call-1-1", "tool": "fs__write_file",
/// "arguments": {}}`.
///
/// # Panics
/// If `subject` has no `hook` tag naming a hook (`run_start`,
/// `after_response`, `before_tool_call` or `before_finish`).
pub fn policy_request(subject: serde_json::Value) -> PolicyRequest {
    let tag = subject.get("hook").and_then(serde_json::Value::as_str);
    let Some(hook) = tag.and_then(PolicyHook::from_name) else {
        panic!(
            "a policy request's subject needs a `hook` tag naming a hook \
             (run_start, after_response, before_tool_call, before_finish), got {subject}"
        );
    };
    PolicyRequest {
        run_id: "test-run".into(),
        agent: "test-agent".into(),
        policy: "test-policy".into(),
        hook,
        subject: subject.to_string(),
    }
}

pub(crate) fn native_http(request: &Request, url: &Url) -> Result<Response, HttpError> {
    HTTP.with(|http| match &*http.borrow() {
        Some(responder) => responder(request),
        None => Err(HttpError::Failed {
            host: url.host_port(),
            reason: "no HTTP stand-in is set (warden_guest::testing::set_http)".into(),
        }),
    })
}

pub(crate) fn native_config(key: &str) -> Option<String> {
    CONFIG.with(|config| config.borrow().get(key).cloned())
}

pub(crate) fn native_log(level: LogLevel, message: &str) {
    eprintln!("[plugin {level}] {message}");
    LOGS.with(|logs| {
        let mut logs = logs.borrow_mut();
        if logs.len() < MAX_CAPTURED_LINES {
            logs.push((level, message.to_string()));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_what_this_thread_set() {
        clear_config();
        assert_eq!(crate::config("region"), None);
        set_config("region", "eu");
        assert_eq!(crate::config("region").as_deref(), Some("eu"));
        std::thread::spawn(|| assert_eq!(crate::config("region"), None))
            .join()
            .unwrap();
        clear_config();
        assert_eq!(crate::config("region"), None);
    }

    #[test]
    fn policy_request_takes_its_hook_from_the_tag() {
        let request = policy_request(serde_json::json!({"hook": "before_finish", "step": 1}));
        assert_eq!(request.hook, PolicyHook::BeforeFinish);
        assert_eq!(request.subject, r#"{"hook":"before_finish","step":1}"#);
        assert_eq!(
            (
                request.run_id.as_str(),
                request.agent.as_str(),
                request.policy.as_str()
            ),
            ("test-run", "test-agent", "test-policy")
        );
    }

    #[test]
    #[should_panic(expected = "needs a `hook` tag naming a hook")]
    fn policy_request_without_a_known_tag_panics() {
        policy_request(serde_json::json!({"hook": "before-finish"}));
    }

    #[test]
    fn log_capture_is_capped() {
        take_logs();
        for i in 0..MAX_CAPTURED_LINES + 5 {
            crate::log::write(LogLevel::Info, &i.to_string());
        }
        let logs = take_logs();
        assert_eq!(logs.len(), MAX_CAPTURED_LINES);
        assert_eq!(logs[0], (LogLevel::Info, "0".to_string()));
    }
}
