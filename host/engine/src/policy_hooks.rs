//! Policy hooks: code the operator trusts to steer or stop a run, asked at
//! fixed points, with every answer recorded so replay never asks again.
//!
//! The hooks ([`PolicyHook`]), in the order a run meets them:
//! - `run_start`: before the first model call (with the run's input and
//!   session, if any); `deny` fails the run.
//! - `after_response`: after each model response is recorded, before any of
//!   its tool calls; `deny` fails the run.
//! - `before_tool_call`: before each tool call the model made that the
//!   agent accepts (after its arguments are validated, before approval or
//!   execution); `deny` is the call's result, which the model sees, and the
//!   tool never runs.
//! - `before_finish`: before the run completes, with its (validated) output;
//!   `feedback` sends a message back to the model, which is asked again
//!   (another step); `deny` fails the run.
//!
//! An agent enables policies by name (`[policies.<name>]` in `agent.toml`,
//! optionally limited to some hooks); the embedding application registers
//! the code under that name ([`Runtime::with_policy`](super::Runtime::with_policy)).
//! At each point every enabled policy for that hook is asked in name order
//! until one answers anything but `allow`.
//!
//! Deciding is pure: `gate` tells [`decide`](super::decide()) which policy
//! must be asked next at a point ([`PolicyConsult`]); the runtime asks it
//! ([`consult`]) and records the answer as
//! [`super::events::Event::PolicyDecided`] before
//! anything else happens, so a crash after the decision does not ask again,
//! and replay reads the recorded decision instead of asking (no policy needs
//! to be registered to replay).
//!
//! A policy that returns an error, panics, or does not answer within the
//! runtime's policy timeout fails closed: its decision is recorded as
//! `failed` with the reason, and the run fails with
//! [`RunError::PolicyFailed`](crate::events::RunError::PolicyFailed). A
//! `feedback` answer at any hook but `before_finish` is recorded as
//! `failed` too.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ids::{CallId, RunId};
use warden_plugins::grant::EffectClass;
use warden_providers::ToolCall;

/// How long the runtime waits for a policy's answer, by default.
pub const DEFAULT_POLICY_TIMEOUT: Duration = Duration::from_secs(30);

/// A point in a run where policies are asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyHook {
    /// Before the first model call.
    RunStart,
    /// After each model response.
    AfterResponse,
    /// Before each tool call.
    BeforeToolCall,
    /// Before the run completes.
    BeforeFinish,
}

impl PolicyHook {
    /// Every hook, in the order a run meets them.
    pub const ALL: [PolicyHook; 4] = [
        PolicyHook::RunStart,
        PolicyHook::AfterResponse,
        PolicyHook::BeforeToolCall,
        PolicyHook::BeforeFinish,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyHook::RunStart => "run_start",
            PolicyHook::AfterResponse => "after_response",
            PolicyHook::BeforeToolCall => "before_tool_call",
            PolicyHook::BeforeFinish => "before_finish",
        }
    }
}

impl std::fmt::Display for PolicyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One place a hook is met in a run: the hook and what it is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PolicyPoint {
    /// The run's start.
    RunStart,
    /// The model response of `step`.
    AfterResponse {
        /// The step.
        step: u32,
    },
    /// The tool call `call_id`.
    BeforeToolCall {
        /// The call.
        call_id: CallId,
    },
    /// The final answer of `step`.
    BeforeFinish {
        /// The step.
        step: u32,
    },
}

impl PolicyPoint {
    /// Its hook.
    pub fn hook(&self) -> PolicyHook {
        match self {
            PolicyPoint::RunStart => PolicyHook::RunStart,
            PolicyPoint::AfterResponse { .. } => PolicyHook::AfterResponse,
            PolicyPoint::BeforeToolCall { .. } => PolicyHook::BeforeToolCall,
            PolicyPoint::BeforeFinish { .. } => PolicyHook::BeforeFinish,
        }
    }
}

/// What a policy is asked: the run, and what the hook is about.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyRequest {
    /// The run.
    pub run_id: RunId,
    /// The agent's name.
    pub agent: String,
    /// The name the policy is enabled under.
    pub policy: String,
    /// The hook and its subject.
    #[serde(flatten)]
    pub subject: PolicySubject,
}

/// What a hook is about. As JSON (what a WASM policy receives), tagged by
/// `hook`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "hook", rename_all = "snake_case")]
pub enum PolicySubject {
    /// The run is about to make its first model call.
    RunStart {
        /// The run's input.
        input: Value,
        /// The session the run belongs to, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The model answered.
    AfterResponse {
        /// The step.
        step: u32,
        /// Its text.
        text: String,
        /// The tools it called.
        tool_calls: Vec<ToolCall>,
    },
    /// The model's tool call is about to be carried out.
    BeforeToolCall {
        /// The call.
        call_id: CallId,
        /// The tool, as the model named it.
        tool: String,
        /// The arguments (validated against the tool's schema).
        arguments: Value,
        /// The effect class of a plugin tool; absent for human and external
        /// tools.
        #[serde(skip_serializing_if = "Option::is_none")]
        effect: Option<EffectClass>,
    },
    /// The run is about to complete.
    BeforeFinish {
        /// The step of the final answer.
        step: u32,
        /// The output (validated against the output schema, if any).
        output: Value,
    },
}

impl PolicySubject {
    /// Its hook.
    pub fn hook(&self) -> PolicyHook {
        match self {
            PolicySubject::RunStart { .. } => PolicyHook::RunStart,
            PolicySubject::AfterResponse { .. } => PolicyHook::AfterResponse,
            PolicySubject::BeforeToolCall { .. } => PolicyHook::BeforeToolCall,
            PolicySubject::BeforeFinish { .. } => PolicyHook::BeforeFinish,
        }
    }
}

/// A policy's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyDecision {
    /// Go on.
    Allow,
    /// Stop: the tool call's result (`before_tool_call`), or the run fails.
    Deny {
        /// Why; the model sees it for a tool call.
        reason: String,
    },
    /// `before_finish` only: send `message` to the model and ask it again.
    Feedback {
        /// What the model is told.
        message: String,
    },
}

/// A policy that could not decide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PolicyError {
    /// What went wrong.
    pub message: String,
}

impl PolicyError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        PolicyError {
            message: message.into(),
        }
    }
}

/// A policy: the embedding application's code, registered on the runtime
/// under a name and enabled per agent. It must not block the thread (use
/// `tokio::task::spawn_blocking` for blocking work): the runtime stops
/// waiting after its policy timeout.
#[async_trait::async_trait]
pub trait Policy: Send + Sync {
    /// The decision for `request`.
    async fn decide(&self, request: &PolicyRequest) -> Result<PolicyDecision, PolicyError>;
}

/// A decision as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyVerdict {
    /// The policy allowed.
    Allow,
    /// The policy denied.
    Deny,
    /// The policy sent feedback (`before_finish`).
    Feedback,
    /// The policy failed (error, panic, timeout, or an answer the hook does
    /// not take): the run fails.
    Failed,
}

impl PolicyVerdict {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyVerdict::Allow => "allow",
            PolicyVerdict::Deny => "deny",
            PolicyVerdict::Feedback => "feedback",
            PolicyVerdict::Failed => "failed",
        }
    }
}

impl std::fmt::Display for PolicyVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A recorded decision at a point, as the folded state keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDecision {
    /// The policy.
    pub policy: String,
    /// What it decided.
    pub verdict: PolicyVerdict,
    /// Its reason, feedback or failure.
    pub reason: Option<String>,
}

/// A policy the agent enables, as deciding sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnabledPolicy {
    /// Its name.
    pub name: String,
    /// The hooks it is asked at.
    pub hooks: Vec<PolicyHook>,
}

/// A policy to ask at a point.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConsult {
    /// Where.
    pub point: PolicyPoint,
    /// Which policy.
    pub policy: String,
    /// What it is asked about.
    pub subject: PolicySubject,
}

impl PolicyConsult {
    /// The request for run `run_id` of agent `agent`.
    pub fn request(&self, run_id: &RunId, agent: &str) -> PolicyRequest {
        PolicyRequest {
            run_id: run_id.clone(),
            agent: agent.to_owned(),
            policy: self.policy.clone(),
            subject: self.subject.clone(),
        }
    }
}

/// What the model is told when a policy sends its final answer back.
pub fn feedback_message(policy: &str, message: &str) -> String {
    format!("Policy `{policy}` sent your answer back: {message}")
}

/// What the model sees as the result of a tool call a policy denied.
pub fn denial_result(policy: &str, reason: &str) -> String {
    format!("the call was denied by policy `{policy}`: {reason}")
}

/// Asks `policy`, never failing: an error, a panic, a timeout or an answer
/// the hook does not take becomes [`PolicyVerdict::Failed`] with the
/// reason.
pub async fn consult(
    policy: &Arc<dyn Policy>,
    request: &PolicyRequest,
    timeout: Duration,
) -> (PolicyVerdict, Option<String>) {
    let asked = std::panic::AssertUnwindSafe(policy.decide(request)).catch_unwind();
    match tokio::time::timeout(timeout, asked).await {
        Err(_) => (
            PolicyVerdict::Failed,
            Some(format!(
                "no decision within {}",
                warden_syntax::units::format_duration(timeout)
            )),
        ),
        Ok(Err(panic)) => (
            PolicyVerdict::Failed,
            Some(format!("the policy panicked: {}", panic_message(&panic))),
        ),
        Ok(Ok(Err(e))) => (
            PolicyVerdict::Failed,
            Some(format!("the policy failed: {e}")),
        ),
        Ok(Ok(Ok(decision))) => verdict_of(decision, request.subject.hook()),
    }
}

/// A decision as recorded at `hook`.
pub fn verdict_of(decision: PolicyDecision, hook: PolicyHook) -> (PolicyVerdict, Option<String>) {
    match decision {
        PolicyDecision::Allow => (PolicyVerdict::Allow, None),
        PolicyDecision::Deny { reason } => (PolicyVerdict::Deny, Some(reason)),
        PolicyDecision::Feedback { message } if hook == PolicyHook::BeforeFinish => {
            (PolicyVerdict::Feedback, Some(message))
        }
        PolicyDecision::Feedback { .. } => (
            PolicyVerdict::Failed,
            Some(format!(
                "the policy answered feedback at {hook}: feedback is only taken before_finish"
            )),
        ),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Answer(Result<PolicyDecision, PolicyError>);

    #[async_trait::async_trait]
    impl Policy for Answer {
        async fn decide(&self, _: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
            self.0.clone()
        }
    }

    struct Panics;

    #[async_trait::async_trait]
    impl Policy for Panics {
        async fn decide(&self, _: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
            panic!("policy bug")
        }
    }

    struct Hangs;

    #[async_trait::async_trait]
    impl Policy for Hangs {
        async fn decide(&self, _: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
            std::future::pending().await
        }
    }

    fn request(hook: PolicyHook) -> PolicyRequest {
        let subject = match hook {
            PolicyHook::RunStart => PolicySubject::RunStart {
                input: Value::String("go".into()),
                session: None,
            },
            PolicyHook::AfterResponse => PolicySubject::AfterResponse {
                step: 1,
                text: "hi".into(),
                tool_calls: vec![],
            },
            PolicyHook::BeforeToolCall => PolicySubject::BeforeToolCall {
                call_id: CallId::new(1, 1),
                tool: "fs__write_file".into(),
                arguments: serde_json::json!({"path": "a"}),
                effect: Some(EffectClass::Write),
            },
            PolicyHook::BeforeFinish => PolicySubject::BeforeFinish {
                step: 2,
                output: Value::String("done".into()),
            },
        };
        PolicyRequest {
            run_id: RunId::new("r1").unwrap(),
            agent: "a".into(),
            policy: "p".into(),
            subject,
        }
    }

    #[tokio::test]
    async fn errors_panics_timeouts_and_misplaced_feedback_fail_closed() {
        let t = Duration::from_millis(50);
        let ask = |p: Arc<dyn Policy>, hook| async move { consult(&p, &request(hook), t).await };
        assert_eq!(
            ask(
                Arc::new(Answer(Ok(PolicyDecision::Allow))),
                PolicyHook::RunStart
            )
            .await,
            (PolicyVerdict::Allow, None)
        );
        assert_eq!(
            ask(
                Arc::new(Answer(Err(PolicyError::new("no database")))),
                PolicyHook::BeforeToolCall
            )
            .await,
            (
                PolicyVerdict::Failed,
                Some("the policy failed: no database".into())
            )
        );
        assert_eq!(
            ask(Arc::new(Panics), PolicyHook::AfterResponse).await,
            (
                PolicyVerdict::Failed,
                Some("the policy panicked: policy bug".into())
            )
        );
        let (verdict, reason) = ask(Arc::new(Hangs), PolicyHook::BeforeFinish).await;
        assert_eq!(verdict, PolicyVerdict::Failed);
        assert_eq!(reason.as_deref(), Some("no decision within 50ms"));
        let feedback = || {
            Arc::new(Answer(Ok(PolicyDecision::Feedback {
                message: "cite a source".into(),
            })))
        };
        assert_eq!(
            ask(feedback(), PolicyHook::BeforeFinish).await,
            (PolicyVerdict::Feedback, Some("cite a source".into()))
        );
        let (verdict, reason) = ask(feedback(), PolicyHook::BeforeToolCall).await;
        assert_eq!(verdict, PolicyVerdict::Failed);
        assert!(reason.unwrap().contains("only taken before_finish"));
    }

    #[test]
    fn requests_serialize_tagged_by_hook() {
        let json = serde_json::to_value(request(PolicyHook::BeforeToolCall)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "run_id": "r1",
                "agent": "a",
                "policy": "p",
                "hook": "before_tool_call",
                "call_id": "call-1-1",
                "tool": "fs__write_file",
                "arguments": {"path": "a"},
                "effect": "write"
            })
        );
    }
}
