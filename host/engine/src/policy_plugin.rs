//! Policies carried out by WASM components (the `policy-plugin` world): the
//! request translated to WIT, one lease per question, and the answer
//! translated back into a recorded decision.
//!
//! An agent enables one with `[policies.<name>] plugin = "<key>"`, naming a
//! plugin of kind `policy` in its `[plugins]` (loaded under the operator's
//! grant like any plugin). The policy plugin is asked exactly where a native
//! policy would be ([`super::policy_hooks`]), and fails closed the same way:
//! a trap, a limit hit (fuel, memory, time, output), an error the guest
//! returns, or an answer the hook does not take is recorded as a `failed`
//! decision, and the run fails. The lease's receipt is recorded with the
//! decision, so its fuel counts against the run's budget.

use std::time::Duration;

use super::policy_hooks::{PolicyDecision, PolicyHook, PolicyRequest, PolicyVerdict, verdict_of};
use warden_plugins::LoadedPlugin;
use warden_sandbox::{UsageReceipt, wit};

impl From<wit::PolicyHook> for PolicyHook {
    fn from(hook: wit::PolicyHook) -> Self {
        match hook {
            wit::PolicyHook::RunStart => PolicyHook::RunStart,
            wit::PolicyHook::AfterResponse => PolicyHook::AfterResponse,
            wit::PolicyHook::BeforeToolCall => PolicyHook::BeforeToolCall,
            wit::PolicyHook::BeforeFinish => PolicyHook::BeforeFinish,
        }
    }
}

impl From<PolicyHook> for wit::PolicyHook {
    fn from(hook: PolicyHook) -> Self {
        match hook {
            PolicyHook::RunStart => wit::PolicyHook::RunStart,
            PolicyHook::AfterResponse => wit::PolicyHook::AfterResponse,
            PolicyHook::BeforeToolCall => wit::PolicyHook::BeforeToolCall,
            PolicyHook::BeforeFinish => wit::PolicyHook::BeforeFinish,
        }
    }
}

impl From<wit::Decision> for PolicyDecision {
    fn from(decision: wit::Decision) -> Self {
        match decision {
            wit::Decision::Allow => PolicyDecision::Allow,
            wit::Decision::Deny(reason) => PolicyDecision::Deny { reason },
            wit::Decision::Feedback(message) => PolicyDecision::Feedback { message },
        }
    }
}

/// `request` as a policy plugin receives it: the subject as one JSON object
/// tagged by `hook`.
pub fn wit_request(request: &PolicyRequest) -> wit::PolicyRequest {
    wit::PolicyRequest {
        run_id: request.run_id.to_string(),
        agent: request.agent.clone(),
        policy: request.policy.clone(),
        hook: request.subject.hook().into(),
        subject: serde_json::to_string(&request.subject)
            .expect("a policy subject serializes: its keys are strings"),
    }
}

/// Asks the policy plugin, never failing: a lease failure, a guest error, no
/// answer within `timeout`, or an answer the hook does not take becomes
/// [`PolicyVerdict::Failed`] with the reason. The receipt is the lease's
/// (`None` only when no lease ran).
pub async fn consult_plugin(
    plugin: &LoadedPlugin,
    request: &PolicyRequest,
    timeout: Duration,
) -> (PolicyVerdict, Option<String>, Option<UsageReceipt>) {
    let hook = request.subject.hook();
    let wit = wit_request(request);
    let asked = plugin.decide(&wit, None);
    let leased = match tokio::time::timeout(timeout, asked).await {
        Err(_) => {
            let waited = warden_syntax::units::format_duration(timeout);
            return (
                PolicyVerdict::Failed,
                Some(format!("no decision within {waited}")),
                None,
            );
        }
        Ok(Err(e)) => return (PolicyVerdict::Failed, Some(e.to_string()), None),
        Ok(Ok(leased)) => leased,
    };
    let receipt = Some(leased.receipt);
    let (verdict, reason) = match leased.result {
        Err(e) => (
            PolicyVerdict::Failed,
            Some(format!("the policy plugin failed: {e}")),
        ),
        Ok(Err(wit::PolicyError::InvalidRequest(message))) => (
            PolicyVerdict::Failed,
            Some(format!(
                "the policy refused the request as invalid: {message}"
            )),
        ),
        Ok(Err(wit::PolicyError::Failed(failure))) => (
            PolicyVerdict::Failed,
            Some(format!("the policy failed: {}", failure.message)),
        ),
        Ok(Ok(decision)) => verdict_of(decision.into(), hook),
    };
    (verdict, reason, receipt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CallId, RunId};
    use crate::policy_hooks::PolicySubject;
    use warden_plugins::grant::EffectClass;

    #[test]
    fn hooks_translate_both_ways() {
        for hook in PolicyHook::ALL {
            assert_eq!(PolicyHook::from(wit::PolicyHook::from(hook)), hook);
        }
    }

    #[test]
    fn the_wit_request_carries_the_subject_as_tagged_json() {
        let request = PolicyRequest {
            run_id: RunId::new("r1").unwrap(),
            agent: "a".into(),
            policy: "guard".into(),
            subject: PolicySubject::BeforeToolCall {
                call_id: CallId::new(1, 2),
                tool: "fs__write_file".into(),
                arguments: serde_json::json!({"path": "x"}),
                effect: Some(EffectClass::Write),
            },
        };
        let wit = wit_request(&request);
        assert_eq!(wit.run_id, "r1");
        assert_eq!(wit.policy, "guard");
        assert_eq!(wit.hook, wit::PolicyHook::BeforeToolCall);
        let subject: serde_json::Value = serde_json::from_str(&wit.subject).unwrap();
        assert_eq!(
            subject,
            serde_json::json!({
                "hook": "before_tool_call",
                "call_id": "call-1-2",
                "tool": "fs__write_file",
                "arguments": {"path": "x"},
                "effect": "write"
            })
        );
    }
}
