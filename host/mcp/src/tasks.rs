//! Long calls as durable tasks: the `io.modelcontextprotocol/tasks`
//! extension, where the task is the session's run.
//!
//! A call whose client declared the extension and that parks for approval
//! is answered at once with a task handle instead of waiting: the session
//! hands its run over (its claim released, the call still parked), so the
//! call waits in the store, not in this process. Whoever approves it later
//! (an operator, from any terminal), the next driver of the run performs it
//! once: this server's sweep of its agent's released runs, another
//! `warden mcp serve` of the same agent after a restart, or a
//! `warden worker` on the same store. `tasks/get` reads the run's log;
//! `tasks/cancel` withdraws the parked call by the one denial a session's
//! cancellation and end record (`Served::withdraw`).
//!
//! The handle is `<run>/<call>/<key>`: the run and the call it reads, and
//! a key drawn when the session's run started, whose digest the run
//! records as its `mcp_task_key` label. Only the client that received the
//! handle holds the key, so another session (or another client with the
//! same token) cannot read or cancel the task by guessing run and call
//! ids; the log holds only the digest.

use rmcp::model::{
    CallToolResult, DetailedTask, ErrorData, GetTaskResult, InputRequest, InputRequests,
    InputResponses, JsonObject, Task, TaskPayload,
};
use serde_json::{Value, json};

use std::sync::Arc;

use warden::engine::CallId;
use warden::engine::approval_prompt::ApprovalPrompt;
use warden::engine::approvals::{Approver, Approvers};
use warden::engine::state::{RunState, ToolCallProgress, ToolCallState};
use warden::store::RunSummary;
use warden::{RunId, RuntimeError};

use super::{Served, now_ms, orphaned, session};

/// The run label holding the digest of the session's task key.
pub(crate) const TASK_KEY_LABEL: &str = "mcp_task_key";

/// The reason the log records for a task the client cancelled.
pub(crate) const CANCELLED: &str = "the client cancelled the task";

/// The key of the one input request a task makes: its approval, asked of
/// the client when the operator lets the client decide. One call per
/// task, so the key is never reused for another request.
const APPROVAL_KEY: &str = "approval";

/// How often a client is asked to poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1000;

/// A task's handle: the run, its call, and the key that proves the holder
/// received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskId {
    pub(crate) run_id: RunId,
    pub(crate) call_id: CallId,
    key: String,
}

impl TaskId {
    pub(crate) fn new(run_id: RunId, call_id: CallId, key: String) -> TaskId {
        TaskId {
            run_id,
            call_id,
            key,
        }
    }

    /// Reads a handle; `None` when it is not one this server issues.
    pub(crate) fn parse(text: &str) -> Option<TaskId> {
        let (run, rest) = text.split_once('/')?;
        let (call, key) = rest.rsplit_once('/')?;
        if call.is_empty() || key.is_empty() {
            return None;
        }
        Some(TaskId {
            run_id: RunId::new(run).ok()?,
            call_id: CallId::from_text(call),
            key: key.to_owned(),
        })
    }

    /// Whether `state` is the run this handle was issued for: its recorded
    /// digest is the key's.
    pub(crate) fn opens(&self, state: &RunState) -> bool {
        state
            .labels
            .get(TASK_KEY_LABEL)
            .is_some_and(|digest| *digest == key_digest(&self.key))
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.run_id, self.call_id, self.key)
    }
}

/// A new session's task key and the digest its run records.
pub(crate) fn new_key() -> (String, String) {
    let key = format!("{:032x}", rand::random::<u128>());
    let digest = key_digest(&key);
    (key, digest)
}

fn key_digest(key: &str) -> String {
    warden_server::tokens::digest(key)
}

/// The call `call_id` of `state`, in whichever turn it was made.
pub(crate) fn find<'a>(state: &'a RunState, call_id: &CallId) -> Option<&'a ToolCallState> {
    state
        .turns
        .iter()
        .rev()
        .flat_map(|turn| turn.calls.iter())
        .find(|call| &call.call_id == call_id)
}

/// What a task is now, from its run: `outcome` is the call's settled
/// result as a synchronous client would get it (`None` while unsettled).
pub(crate) fn detailed(
    id: &TaskId,
    summary: &RunSummary,
    state: &RunState,
    call: &ToolCallState,
    outcome: Option<Result<CallToolResult, ErrorData>>,
    asked: InputRequests,
) -> GetTaskResult {
    let status = state.status();
    let (payload, message) = match (&call.progress, outcome) {
        (ToolCallProgress::Denied { by, reason }, _)
            if by == super::session::SERVER && reason == CANCELLED =>
        {
            (TaskPayload::Cancelled, CANCELLED.to_owned())
        }
        (_, Some(Ok(result))) => (
            TaskPayload::Completed {
                result: object(serde_json::to_value(&result)),
            },
            "the call settled".to_owned(),
        ),
        (_, Some(Err(error))) => {
            let message = error.message.to_string();
            (
                TaskPayload::Failed {
                    error: object(serde_json::to_value(&error)),
                },
                message,
            )
        }
        (ToolCallProgress::AwaitingApproval, None) => (
            // Under `--approvals client` the client is asked (`asked`: the
            // approval form); else the decision is an operator's and
            // nothing is asked of it.
            TaskPayload::InputRequired {
                input_requests: asked,
            },
            format!(
                "waiting for approval: warden runs approve {} {} (or deny)",
                id.run_id, id.call_id
            ),
        ),
        (_, None) if status.is_terminal() => (
            TaskPayload::Failed {
                error: object(serde_json::to_value(super::session::refusal(
                    status.as_str(),
                    format!(
                        "run {}: the run is {status} without the call's result",
                        id.run_id
                    ),
                    serde_json::json!({ "run_id": id.run_id, "call_id": id.call_id }),
                ))),
            },
            format!("the run is {status}"),
        ),
        (progress, None) => (
            TaskPayload::Working,
            format!(
                "the call is {}; the run is {status}",
                progress_name(progress)
            ),
        ),
    };
    let task = Task::new(
        id.to_string(),
        payload.status(),
        warden::units::utc_text(summary.created_ms),
        warden::units::utc_text(summary.updated_ms),
    )
    .with_status_message(message)
    .with_poll_interval_ms(POLL_INTERVAL_MS);
    GetTaskResult::new(DetailedTask::new(task, payload))
}

/// The seed of a task whose call just parked for approval.
pub(crate) fn seed(id: &TaskId, summary: &RunSummary) -> Task {
    Task::new(
        id.to_string(),
        rmcp::model::TaskStatus::InputRequired,
        warden::units::utc_text(summary.created_ms),
        warden::units::utc_text(summary.updated_ms),
    )
    .with_status_message(format!(
        "waiting for approval: warden runs approve {} {} (or deny)",
        id.run_id, id.call_id
    ))
    .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// Who may decide the calls of `state`'s run: the setting it was served
/// under (its `mcp_approvers` label); operators only when it has none.
fn approvers_of(state: &RunState) -> Approvers {
    state
        .labels
        .get("mcp_approvers")
        .and_then(|setting| Approvers::parse(setting))
        .unwrap_or(Approvers::Operators)
}

/// The approval form a task asks its client to fill (`approve`, and a
/// `reason` when denying): the form a synchronous client is asked by
/// elicitation.
fn approval_request(message: &str) -> Result<InputRequest, ErrorData> {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "approve": { "type": "boolean", "description": "Approve this call?" },
                    "reason": {
                        "type": "string",
                        "description": "Why, when denying (recorded with the denial)."
                    }
                },
                "required": ["approve"]
            }
        }
    }))
    .map_err(|error| ErrorData::internal_error(format!("the approval form: {error}"), None))
}

fn progress_name(progress: &ToolCallProgress) -> &'static str {
    match progress {
        ToolCallProgress::Approved { .. } => "approved",
        ToolCallProgress::InFlight(_) => "in flight",
        ToolCallProgress::AwaitingApproval => "awaiting approval",
        _ => "pending",
    }
}

fn object(value: Result<Value, serde_json::Error>) -> JsonObject {
    match value {
        Ok(Value::Object(object)) => object,
        _ => JsonObject::new(),
    }
}

impl Served {
    /// The task `handle` names, once it is one this server issued and the
    /// holder's key opens it: its run's state and summary, and the call.
    /// Anything else is `-32602` naming no run, so a guess learns nothing.
    pub(crate) async fn open_task(
        &self,
        handle: &str,
    ) -> Result<(TaskId, RunState, RunSummary), ErrorData> {
        let unknown = || ErrorData::invalid_params(format!("no task `{handle}` here"), None);
        let id = TaskId::parse(handle).ok_or_else(unknown)?;
        let state = match self.runtime.state(&id.run_id).await {
            Ok(state) => state,
            Err(RuntimeError::UnknownRun { .. }) => return Err(unknown()),
            Err(error) => return Err(session::engine_refusal(&error)),
        };
        if state.agent != self.agent.name
            || !id.opens(&state)
            || find(&state, &id.call_id).is_none()
        {
            return Err(unknown());
        }
        let summary = self.summary(&id.run_id).await?;
        Ok((id, state, summary))
    }

    /// The run's listing (its times, its claim).
    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, ErrorData> {
        self.runtime
            .store()
            .summary(run_id)
            .await
            .map_err(|e| session::engine_refusal(&RuntimeError::from(e)))
    }

    /// `tasks/get`: the task as its run's log has it. A run nobody drives
    /// (its call decided since it was handed over) is recovered at once
    /// beside the answer, so the next poll finds the result.
    pub(crate) async fn get_task(
        self: &Arc<Self>,
        handle: &str,
    ) -> Result<GetTaskResult, ErrorData> {
        let (id, state, summary) = self.open_task(handle).await?;
        if orphaned(&summary, now_ms()) {
            self.recover_soon(summary.clone());
        }
        let call = find(&state, &id.call_id).expect("checked by open_task");
        let outcome = session::outcome(&id.run_id, call, None);
        let mut asked = InputRequests::new();
        if matches!(call.progress, ToolCallProgress::AwaitingApproval)
            && approvers_of(&state) == Approvers::OperatorsAndClient
        {
            let events = self
                .runtime
                .events(&id.run_id)
                .await
                .map_err(|e| session::engine_refusal(&e))?;
            let prompt = ApprovalPrompt::find(&events, &state, &id.call_id)
                .map(|prompt| prompt.text())
                .unwrap_or_else(|| format!("? {} needs approval", id.call_id));
            let message = format!("Warden: run {} asks for approval\n{prompt}", id.run_id);
            asked.insert(APPROVAL_KEY.to_owned(), approval_request(&message)?);
        }
        Ok(detailed(&id, &summary, &state, call, outcome, asked))
    }

    /// `tasks/update`: the client's answer to the approval its task asked
    /// for, recorded under the identity its transport authenticated, by
    /// the gate every decision of a served session passes
    /// ([`Approvers::admit`]) with the setting the run was served under. A
    /// response to anything not outstanding (no approval asked, the call
    /// decided meanwhile, an anonymous client) is ignored, as the extension
    /// says.
    pub(crate) async fn update_task(
        self: &Arc<Self>,
        handle: &str,
        responses: &InputResponses,
        client: Option<&Approver>,
    ) -> Result<(), ErrorData> {
        let (id, state, _) = self.open_task(handle).await?;
        let call = find(&state, &id.call_id).expect("checked by open_task");
        let approvers = approvers_of(&state);
        let (Some(answer), Some(client)) = (responses.get(APPROVAL_KEY), client) else {
            return Ok(());
        };
        if !matches!(call.progress, ToolCallProgress::AwaitingApproval)
            || approvers != Approvers::OperatorsAndClient
        {
            return Ok(());
        }
        let by = approvers.admit(client).map_err(|refused| {
            session::refusal(
                "not_entitled",
                refused.to_string(),
                json!({ "run_id": id.run_id, "call_id": id.call_id }),
            )
        })?;
        let accepted = answer["action"] == "accept";
        let content = &answer["content"];
        let recorded = if accepted && content["approve"] == true {
            self.runtime.approve(&id.run_id, &id.call_id, by).await
        } else {
            let reason = content["reason"]
                .as_str()
                .filter(|reason| accepted && !reason.is_empty())
                .unwrap_or("denied by the client's user");
            self.runtime.deny(&id.run_id, &id.call_id, by, reason).await
        };
        match recorded {
            Ok(())
            | Err(RuntimeError::NotAwaitingApproval { .. } | RuntimeError::Conflict { .. }) => {}
            Err(error) => return Err(session::engine_refusal(&error)),
        }
        if let Ok(summary) = self.runtime.store().summary(&id.run_id).await
            && orphaned(&summary, now_ms())
        {
            self.recover_soon(summary);
        }
        Ok(())
    }

    /// `tasks/cancel`: withdraws the call while it waits for approval, by
    /// the denial a cancelled synchronous call gets, so it is never made,
    /// whoever approves it later; the run then completes. A call already
    /// decided or made is left as it is (cancellation is cooperative).
    pub(crate) async fn cancel_task(self: &Arc<Self>, handle: &str) -> Result<(), ErrorData> {
        let (id, state, _) = self.open_task(handle).await?;
        let call = find(&state, &id.call_id).expect("checked by open_task");
        if matches!(call.progress, ToolCallProgress::AwaitingApproval) {
            self.withdraw(&id.run_id, &id.call_id, CANCELLED)
                .await
                .map_err(|e| session::engine_refusal(&e))?;
        }
        let summary = self.summary(&id.run_id).await?;
        if orphaned(&summary, now_ms()) {
            self.recover_soon(summary);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reads_back_and_names_its_run_and_call() {
        let id = TaskId::new(
            RunId::new("run-0123").unwrap(),
            CallId::from_text("call-1-0"),
            "abcd".to_owned(),
        );
        let text = id.to_string();
        assert_eq!(text, "run-0123/call-1-0/abcd");
        assert_eq!(TaskId::parse(&text), Some(id));
        for bad in [
            "",
            "run-0123",
            "run-0123/call-1-0",
            "run-0123//abcd",
            "bad id/c/k",
        ] {
            assert_eq!(TaskId::parse(bad), None, "{bad}");
        }
    }
}
