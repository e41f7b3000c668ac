//! Python policies: an application's callable registered on the runtime
//! under a name (the engine's [`Policy`] hook), asked at the points the
//! agent enables it, its answer recorded as a native policy's is
//! (`policy_decided`), so replay never asks it again.
//!
//! The callable receives the request as a dict (`run_id`, `agent`,
//! `policy`, `hook` and the hook's subject) and answers `None` or
//! `"allow"`, `{"verdict": "deny", "reason": ...}` or, at `before_finish`,
//! `{"verdict": "feedback", "message": ...}` (`warden.allow()`,
//! `warden.deny()`, `warden.feedback()`). A plain function runs on the
//! engine's thread, handed over to blocking work meanwhile; an `async def` runs on the event loop the runtime was
//! opened from (which must be running: the run is driven from it). Anything else fails closed: an exception (its traceback is
//! the recorded reason), an answer of another shape, or no answer within
//! the runtime's policy timeout are recorded as `failed` and the run fails.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use warden::engine::{Policy, PolicyDecision, PolicyError, PolicyRequest};

use crate::errors::traceback_text;
use crate::json::to_python;

/// A Python callable as an engine policy.
pub(crate) struct PythonPolicy {
    /// The callable.
    callable: Py<PyAny>,
    /// The event loop an `async def` policy's coroutine runs on: the one
    /// the runtime was opened from.
    event_loop: Option<Py<PyAny>>,
}

impl PythonPolicy {
    pub(crate) fn new(callable: Py<PyAny>, event_loop: Option<Py<PyAny>>) -> Self {
        PythonPolicy {
            callable,
            event_loop,
        }
    }
}

#[async_trait::async_trait]
impl Policy for PythonPolicy {
    async fn decide(&self, request: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
        let request = serde_json::to_value(request)
            .map_err(|e| PolicyError::new(format!("the request is not JSON: {e}")))?;
        let (callable, event_loop) = Python::attach(|py| {
            (
                self.callable.clone_ref(py),
                self.event_loop.as_ref().map(|l| l.clone_ref(py)),
            )
        });
        // Python code may block: the worker thread it runs on is handed
        // over to blocking work meanwhile, and holds the GIL only while
        // Python runs (waiting on a coroutine releases it). Not a thread of
        // the blocking pool: one that attached to Python there aborts the
        // interpreter's exit.
        tokio::task::block_in_place(move || {
            Python::attach(|py| -> Result<PolicyDecision, PolicyError> {
                let failed = |e: PyErr| PolicyError::new(traceback_text(py, &e));
                let request = to_python(py, &request).map_err(failed)?;
                let mut answer = callable.bind(py).call1((request,)).map_err(failed)?;
                let asyncio = py.import("asyncio").map_err(failed)?;
                let coroutine = asyncio
                    .call_method1("iscoroutine", (&answer,))
                    .and_then(|b| b.is_truthy())
                    .map_err(failed)?;
                if coroutine {
                    let Some(event_loop) = &event_loop else {
                        return Err(PolicyError::new(
                            "an async policy needs the runtime opened from a running event loop",
                        ));
                    };
                    answer = asyncio
                        .call_method1("run_coroutine_threadsafe", (answer, event_loop.bind(py)))
                        .and_then(|f| f.call_method0("result"))
                        .map_err(failed)?;
                }
                decision(&answer)
            })
        })
    }
}

/// The decision a policy's answer stands for.
fn decision(answer: &Bound<'_, PyAny>) -> Result<PolicyDecision, PolicyError> {
    if answer.is_none() {
        return Ok(PolicyDecision::Allow);
    }
    if let Ok(text) = answer.cast::<PyString>() {
        return match text.to_str() {
            Ok("allow") => Ok(PolicyDecision::Allow),
            _ => Err(PolicyError::new(format!(
                "the policy answered {text}: expected None, \"allow\" or a dict with a verdict"
            ))),
        };
    }
    let Ok(dict) = answer.cast::<PyDict>() else {
        return Err(PolicyError::new(format!(
            "the policy answered a {}: expected None, \"allow\" or a dict with a verdict",
            answer
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    };
    let text = |key: &str| -> Result<Option<String>, PolicyError> {
        match dict.get_item(key) {
            Ok(Some(v)) if !v.is_none() => v
                .extract::<String>()
                .map(Some)
                .map_err(|_| PolicyError::new(format!("the policy's `{key}` is not a string"))),
            _ => Ok(None),
        }
    };
    match text("verdict")?.as_deref() {
        Some("allow") => Ok(PolicyDecision::Allow),
        Some("deny") => Ok(PolicyDecision::Deny {
            reason: text("reason")?.unwrap_or_else(|| "denied by policy".to_owned()),
        }),
        Some("feedback") => match text("message")? {
            Some(message) => Ok(PolicyDecision::Feedback { message }),
            None => Err(PolicyError::new("a feedback answer needs a `message`")),
        },
        Some(other) => Err(PolicyError::new(format!(
            "the policy's verdict `{other}` is not allow, deny or feedback"
        ))),
        None => Err(PolicyError::new("the policy's answer has no `verdict`")),
    }
}
