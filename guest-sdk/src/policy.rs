//! Policies: the [`PolicyPlugin`] trait the export macro binds to the WIT
//! `policy` interface, the typed view of a request's subject ([`Subject`],
//! read with [`PolicyRequest::subject`]), and constructors for [`Decision`]
//! and [`PolicyError`].

use serde::Deserialize;
use serde_json::Value;

use crate::json;
use crate::types::{Decision, Effect, Failure, PolicyError, PolicyHook, PolicyRequest, SourceSpec};

/// A plugin the operator trusts to steer or stop runs. Export it with
/// [`export_policy_plugin!`](crate::export_policy_plugin).
///
/// The host asks it at the hooks an agent enables it for and records every
/// answer, so a run is never asked twice about the same point. A policy that
/// errors, panics or runs out of fuel, memory or time fails the run: policies
/// fail closed.
///
/// Both functions are plain Rust: unit-test them by calling them, with
/// requests built by [`testing::policy_request`](crate::testing::policy_request).
pub trait PolicyPlugin {
    /// The policy's name and description.
    fn describe() -> SourceSpec;

    /// Decides at one point of a run. Use [`PolicyRequest::subject`] to read
    /// what the point is about.
    ///
    /// [`Decision::feedback`] is for `before_finish` only; at any other hook
    /// the host records it as a failure of the policy.
    fn decide(request: PolicyRequest) -> Result<Decision, PolicyError>;
}

/// What a policy is asked about, per hook: the typed form of
/// [`PolicyRequest::subject`]'s JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// `run_start`: before the run's first model call.
    RunStart {
        /// The run's input.
        input: Value,
        /// The run's session id; `None` for a run outside a session.
        session: Option<String>,
    },
    /// `after_response`: after a model response, before any of its tool
    /// calls.
    AfterResponse {
        /// The run's step the response belongs to, from 1.
        step: u64,
        /// The response's text (may be empty).
        text: String,
        /// The tool calls the model asked for, in its order.
        tool_calls: Vec<RequestedCall>,
    },
    /// `before_tool_call`: before one tool call the agent accepted, with its
    /// arguments validated, before approval or execution.
    BeforeToolCall {
        /// The call's id within the run, for example `call-1-1`.
        call_id: String,
        /// The tool's model name, `<plugin>__<tool>`, for example
        /// `fs__write_file`.
        tool: String,
        /// The call's arguments.
        arguments: Value,
        /// The tool's effect class after the operator's overrides; `None`
        /// for human and external tools.
        effect: Option<Effect>,
    },
    /// `before_finish`: before the run completes.
    BeforeFinish {
        /// The step whose answer this is, from 1.
        step: u64,
        /// The run's output (validated against the agent's output schema, if
        /// it has one): a string for a plain-text answer.
        output: Value,
    },
}

/// One tool call a model response asks for, as `after_response` shows it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RequestedCall {
    /// The provider's id of the call.
    pub id: String,
    /// The tool's model name, `<plugin>__<tool>`.
    pub name: String,
    /// The arguments as the model wrote them (not validated yet).
    pub arguments: Value,
}

impl Subject {
    /// The hook this subject belongs to.
    pub fn hook(&self) -> PolicyHook {
        match self {
            Subject::RunStart { .. } => PolicyHook::RunStart,
            Subject::AfterResponse { .. } => PolicyHook::AfterResponse,
            Subject::BeforeToolCall { .. } => PolicyHook::BeforeToolCall,
            Subject::BeforeFinish { .. } => PolicyHook::BeforeFinish,
        }
    }
}

impl PolicyRequest {
    /// Parses the subject as the request's hook defines it.
    ///
    /// Fields the SDK does not know are ignored, so a newer host's additions
    /// do not break an older policy. A `hook` tag in the subject must name
    /// the request's hook.
    ///
    /// # Errors
    /// [`PolicyError::InvalidRequest`] naming the hook and, with serde's
    /// reason, the field that is missing or does not fit, for example
    /// ``invalid subject for hook `before_finish`: missing field `output` ``.
    pub fn subject(&self) -> Result<Subject, PolicyError> {
        let hook = self.hook;
        let invalid = |reason: String| {
            PolicyError::invalid_request(format!("invalid subject for hook `{hook}`: {reason}"))
        };
        let text = &self.subject;
        // serde would also read a struct from a JSON array, by position.
        if !matches!(text.trim_start().chars().next(), None | Some('{')) {
            return Err(invalid("the subject is not a JSON object".into()));
        }
        let (tag, subject) = match hook {
            PolicyHook::RunStart => {
                let w: wire::RunStart = json::parse(text).map_err(invalid)?;
                let subject = Subject::RunStart {
                    input: w.input,
                    session: w.session,
                };
                (w.hook, subject)
            }
            PolicyHook::AfterResponse => {
                let w: wire::AfterResponse = json::parse(text).map_err(invalid)?;
                let subject = Subject::AfterResponse {
                    step: w.step,
                    text: w.text,
                    tool_calls: w.tool_calls,
                };
                (w.hook, subject)
            }
            PolicyHook::BeforeToolCall => {
                let w: wire::BeforeToolCall = json::parse(text).map_err(invalid)?;
                let subject = Subject::BeforeToolCall {
                    call_id: w.call_id,
                    tool: w.tool,
                    arguments: w.arguments,
                    effect: w.effect,
                };
                (w.hook, subject)
            }
            PolicyHook::BeforeFinish => {
                let w: wire::BeforeFinish = json::parse(text).map_err(invalid)?;
                let subject = Subject::BeforeFinish {
                    step: w.step,
                    output: w.output,
                };
                (w.hook, subject)
            }
        };
        match tag {
            Some(tag) if tag != hook.as_str() => Err(invalid(format!(
                "field `hook`: the subject is tagged `{tag}`"
            ))),
            _ => Ok(subject),
        }
    }
}

impl Decision {
    /// Stops, with `reason`. At `before_tool_call` the reason becomes the
    /// call's result, which the model sees, and the tool never runs; at any
    /// other hook the run fails with it.
    pub fn deny(reason: impl Into<String>) -> Self {
        Decision::Deny(reason.into())
    }

    /// At `before_finish` only: sends `message` to the model, which is asked
    /// again. At any other hook the host records it as a failure.
    pub fn feedback(message: impl Into<String>) -> Self {
        Decision::Feedback(message.into())
    }
}

impl PolicyError {
    /// The request does not fit what the policy understands.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        PolicyError::InvalidRequest(message.into())
    }

    /// The policy tried and failed (the run fails closed).
    pub fn failed(message: impl Into<String>) -> Self {
        PolicyError::Failed(Failure::new(message, false))
    }

    /// The error's message, whatever its variant.
    pub fn message(&self) -> &str {
        match self {
            PolicyError::InvalidRequest(message) => message,
            PolicyError::Failed(failure) => &failure.message,
        }
    }
}

/// The subjects as the host writes them, one struct per hook.
mod wire {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error as _};
    use serde_json::Value;

    use super::RequestedCall;
    use crate::types::Effect;

    #[derive(Deserialize)]
    pub(super) struct RunStart {
        pub hook: Option<String>,
        pub input: Value,
        #[serde(default)]
        pub session: Option<String>,
    }

    #[derive(Deserialize)]
    pub(super) struct AfterResponse {
        pub hook: Option<String>,
        pub step: u64,
        #[serde(default)]
        pub text: String,
        #[serde(default)]
        pub tool_calls: Vec<RequestedCall>,
    }

    #[derive(Deserialize)]
    pub(super) struct BeforeToolCall {
        pub hook: Option<String>,
        pub call_id: String,
        pub tool: String,
        pub arguments: Value,
        #[serde(default, deserialize_with = "effect")]
        pub effect: Option<Effect>,
    }

    #[derive(Deserialize)]
    pub(super) struct BeforeFinish {
        pub hook: Option<String>,
        pub step: u64,
        pub output: Value,
    }

    /// An effect class by its WIT name; absent or `null` is `None`.
    fn effect<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Effect>, D::Error> {
        const NAMES: &[&str] = &["read", "idempotent", "write"];
        Option::<String>::deserialize(de)?
            .map(|name| match name.as_str() {
                "read" => Ok(Effect::Read),
                "idempotent" => Ok(Effect::Idempotent),
                "write" => Ok(Effect::Write),
                other => Err(D::Error::unknown_variant(other, NAMES)),
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::policy_request;
    use serde_json::json;

    fn request(hook: PolicyHook, subject: &str) -> PolicyRequest {
        PolicyRequest {
            run_id: "run-1".into(),
            agent: "agent".into(),
            policy: "guard".into(),
            hook,
            subject: subject.into(),
        }
    }

    fn invalid(hook: PolicyHook, subject: &str) -> String {
        match request(hook, subject).subject() {
            Err(PolicyError::InvalidRequest(message)) => message,
            other => panic!("expected an invalid request for {subject}, got {other:?}"),
        }
    }

    #[test]
    fn every_hook_parses_into_its_subject() {
        let cases = [
            (
                json!({"hook": "run_start", "input": {"q": "hi"}, "session": "s-1"}),
                Subject::RunStart {
                    input: json!({"q": "hi"}),
                    session: Some("s-1".into()),
                },
            ),
            (
                json!({"hook": "run_start", "input": "plain"}),
                Subject::RunStart {
                    input: json!("plain"),
                    session: None,
                },
            ),
            (
                json!({"hook": "after_response", "step": 2, "text": "let me look",
                       "tool_calls": [{"id": "t1", "name": "fs__read_file",
                                       "arguments": {"path": "a.md"}}]}),
                Subject::AfterResponse {
                    step: 2,
                    text: "let me look".into(),
                    tool_calls: vec![RequestedCall {
                        id: "t1".into(),
                        name: "fs__read_file".into(),
                        arguments: json!({"path": "a.md"}),
                    }],
                },
            ),
            (
                json!({"hook": "before_tool_call", "call_id": "call-1-1",
                       "tool": "fs__write_file", "arguments": {"path": "x"},
                       "effect": "write"}),
                Subject::BeforeToolCall {
                    call_id: "call-1-1".into(),
                    tool: "fs__write_file".into(),
                    arguments: json!({"path": "x"}),
                    effect: Some(Effect::Write),
                },
            ),
            (
                json!({"hook": "before_tool_call", "call_id": "c", "tool": "t",
                       "arguments": {}}),
                Subject::BeforeToolCall {
                    call_id: "c".into(),
                    tool: "t".into(),
                    arguments: json!({}),
                    effect: None,
                },
            ),
            (
                json!({"hook": "before_finish", "step": 3, "output": {"answer": 42}}),
                Subject::BeforeFinish {
                    step: 3,
                    output: json!({"answer": 42}),
                },
            ),
        ];
        for (json, expected) in cases {
            let request = policy_request(json.clone());
            assert_eq!(request.hook, expected.hook(), "{json}");
            assert_eq!(request.subject().unwrap(), expected, "{json}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored_and_an_untagged_subject_follows_the_request() {
        let subject = request(
            PolicyHook::BeforeFinish,
            r#"{"step":1,"output":"done","added_later":true}"#,
        )
        .subject()
        .unwrap();
        assert_eq!(
            subject,
            Subject::BeforeFinish {
                step: 1,
                output: json!("done")
            }
        );
    }

    #[test]
    fn a_bad_subject_is_an_invalid_request_naming_the_hook_and_field() {
        let cases = [
            (
                PolicyHook::BeforeFinish,
                r#"{"hook":"before_finish","step":1}"#,
                "invalid subject for hook `before_finish`: missing field `output`",
            ),
            (
                PolicyHook::AfterResponse,
                r#"{"step":"one","output":1}"#,
                "invalid subject for hook `after_response`: field `step`: invalid type: string \"one\", expected u64",
            ),
            (
                PolicyHook::AfterResponse,
                r#"{"step":1,"tool_calls":[{"id":"t","name":7,"arguments":{}}]}"#,
                "invalid subject for hook `after_response`: field `tool_calls[0].name`: invalid type: integer `7`",
            ),
            (
                PolicyHook::BeforeToolCall,
                r#"{"call_id":"c","tool":"t","arguments":{},"effect":"delete"}"#,
                "invalid subject for hook `before_tool_call`: field `effect`: unknown variant `delete`, expected one of `read`, `idempotent`, `write`",
            ),
            (
                PolicyHook::RunStart,
                r#"{"hook":"before_finish","input":1}"#,
                "invalid subject for hook `run_start`: field `hook`: the subject is tagged `before_finish`",
            ),
            (
                PolicyHook::RunStart,
                "",
                "invalid subject for hook `run_start`: missing field `input`",
            ),
            (
                PolicyHook::RunStart,
                r#"{"input":1"#,
                "invalid subject for hook `run_start`: EOF while parsing an object",
            ),
            (
                PolicyHook::BeforeFinish,
                " [1]",
                "invalid subject for hook `before_finish`: the subject is not a JSON object",
            ),
        ];
        for (hook, subject, expected) in cases {
            let message = invalid(hook, subject);
            assert!(
                message.starts_with(expected),
                "{subject}: got {message:?}, want {expected:?}"
            );
        }
    }

    #[test]
    fn constructors_pick_the_variant() {
        assert_eq!(Decision::deny("no"), Decision::Deny("no".into()));
        assert_eq!(
            Decision::feedback("say more"),
            Decision::Feedback("say more".into())
        );
        assert_eq!(
            PolicyError::failed("down"),
            PolicyError::Failed(Failure::new("down", false))
        );
        assert_eq!(PolicyError::failed("down").message(), "down");
        assert_eq!(PolicyError::invalid_request("what").message(), "what");
        assert!(matches!(
            PolicyError::invalid_request("what"),
            PolicyError::InvalidRequest(_)
        ));
    }
}
