//! Policy gates: at each point a run meets a policy hook, the action the
//! enabled policies require before the run goes on ([`gate`]). The hooks,
//! requests and verdicts are [`crate::policy_hooks`]'s.

use super::Action;
use crate::events::RunError;
use crate::policy_hooks::{PolicyConsult, PolicyHook, PolicyPoint, PolicySubject, PolicyVerdict};
use crate::state::RunState;
use crate::view::AgentView;

/// The action policies require at `point` before the run goes on, if any:
/// asking the next enabled policy that has not decided there, or failing
/// the run on a recorded denial or failure. `None`: every policy allowed
/// (or none is enabled for the hook).
pub(crate) fn gate(
    state: &RunState,
    view: &AgentView,
    point: PolicyPoint,
    subject: impl FnOnce() -> PolicySubject,
) -> Option<Action> {
    let hook = point.hook();
    let decided = state.policy_decisions(&point);
    if let Some(stop) = decided.iter().find(|d| d.verdict != PolicyVerdict::Allow) {
        let reason = stop.reason.clone().unwrap_or_default();
        return match stop.verdict {
            PolicyVerdict::Failed => Some(Action::Fail(RunError::PolicyFailed {
                policy: stop.policy.clone(),
                hook,
                message: reason,
            })),
            PolicyVerdict::Deny if hook != PolicyHook::BeforeToolCall => {
                Some(Action::Fail(RunError::PolicyDenied {
                    policy: stop.policy.clone(),
                    hook,
                    reason,
                }))
            }
            // A denied tool call is settled by the fold, and feedback
            // continues the run: neither leaves the point open.
            _ => None,
        };
    }
    let next = view
        .policies
        .iter()
        .filter(|p| p.hooks.contains(&hook))
        .find(|p| !decided.iter().any(|d| d.policy == p.name))?;
    Some(Action::ConsultPolicy(PolicyConsult {
        point,
        policy: next.name.clone(),
        subject: subject(),
    }))
}
