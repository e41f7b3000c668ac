//! Live turns: a run driven in the background by the engine
//! ([`Runtime::start_turn`](warden::Runtime::start_turn)), watched from
//! Python as an async iterator of plain dicts, each with a `type`:
//! `text_delta` (`step`, `text`: what the model streamed, not yet
//! recorded), `tool_call_started` (`call_id`, `tool`, `arguments`,
//! `effect`), `tool_call_finished` (`call_id`, `tool`, `result`, `receipt`),
//! `approval_needed` (`call_id`, `tool`, `arguments`, `preview`) and, last,
//! `finished` (`outcome`: `completed` with `output`, `failed` with `error`,
//! `cancelled` or `abandoned` with `reason`, `parked` with `status`).
//!
//! `cancel()` is the engine's cancellation: the model stream or tool lease
//! in flight is interrupted and `run_cancelled` recorded; the iterator then
//! ends with a `cancelled` outcome. Dropping the turn while it is driven
//! cancels it the same way; a parked or finished turn is left as it is.

use std::sync::Arc;

use futures::StreamExt as _;
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use warden::engine::{RunId, TurnEvent, TurnHandle, TurnOutcome};

use crate::aio;
use crate::errors::engine_error;
use crate::json::Json;

/// A live turn.
#[pyclass(frozen, module = "warden._native")]
pub(crate) struct Turn {
    run_id: RunId,
    runtime: aio::KeptAtExit<warden::Runtime>,
    /// Taken by one `__anext__` at a time; the engine's handle, whose drop
    /// cancels a turn still driven.
    handle: aio::KeptAtExit<Arc<Mutex<Option<TurnHandle>>>>,
}

impl Turn {
    pub(crate) fn new(runtime: warden::Runtime, handle: TurnHandle) -> Self {
        Turn {
            run_id: handle.run_id().clone(),
            runtime: aio::KeptAtExit::new(runtime),
            handle: aio::KeptAtExit::new(Arc::new(Mutex::new(Some(handle)))),
        }
    }
}

#[pymethods]
impl Turn {
    /// The turn's run.
    #[getter]
    fn run_id(&self) -> &str {
        self.run_id.as_str()
    }

    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = Arc::clone(&*self.handle);
        aio::future_into_py(py, async move {
            let mut slot = handle.lock().await;
            let next = match slot.as_mut() {
                Some(h) => h.next().await,
                None => None,
            };
            match next {
                Some(event) => {
                    if matches!(event, TurnEvent::Finished(_)) {
                        // The stream's last event: the handle has nothing
                        // more to give, and a finished turn's drop is a
                        // no-op.
                        slot.take();
                    }
                    Ok(Json(shown(&event)))
                }
                None => {
                    slot.take();
                    Err(PyStopAsyncIteration::new_err(()))
                }
            }
        })
    }

    /// Cancels the turn (a turn that already ended is left as it is).
    #[pyo3(signature = (reason = None))]
    fn cancel<'py>(&self, py: Python<'py>, reason: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        let runtime = warden::Runtime::clone(&self.runtime);
        let run_id = self.run_id.clone();
        aio::future_into_py(py, async move {
            match runtime.cancel(&run_id, None, reason).await {
                Ok(()) | Err(warden::RuntimeError::AlreadyTerminal { .. }) => Ok(()),
                Err(e) => Err(engine_error(&e)),
            }
        })
    }
}

/// A turn event as a dict.
fn shown(event: &TurnEvent) -> Value {
    match event {
        TurnEvent::TextDelta { step, text } => {
            json!({ "type": "text_delta", "step": step, "text": text })
        }
        TurnEvent::ToolCallStarted {
            call_id,
            tool,
            arguments,
            effect,
        } => json!({
            "type": "tool_call_started",
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "effect": effect,
        }),
        TurnEvent::ToolCallFinished {
            call_id,
            tool,
            result,
            receipt,
        } => json!({
            "type": "tool_call_finished",
            "call_id": call_id,
            "tool": tool,
            "result": result,
            "receipt": receipt,
        }),
        TurnEvent::ApprovalNeeded {
            call_id,
            tool,
            arguments,
            preview,
        } => json!({
            "type": "approval_needed",
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "preview": preview,
        }),
        TurnEvent::Finished(outcome) => {
            let mut body = json!({ "type": "finished" });
            match outcome {
                TurnOutcome::Completed { output } => {
                    body["outcome"] = json!("completed");
                    body["output"] = output.clone();
                }
                TurnOutcome::Failed { error } => {
                    body["outcome"] = json!("failed");
                    body["error"] = json!({
                        "code": serde_json::to_value(error).ok().and_then(|d| d.get("kind").cloned()),
                        "message": error.to_string(),
                    });
                }
                TurnOutcome::Cancelled { reason } => {
                    body["outcome"] = json!("cancelled");
                    body["reason"] = json!(reason);
                }
                TurnOutcome::Abandoned { reason } => {
                    body["outcome"] = json!("abandoned");
                    body["reason"] = json!(reason);
                }
                TurnOutcome::Parked { status } => {
                    body["outcome"] = json!("parked");
                    body["status"] = json!(status.as_str());
                }
                _ => body["outcome"] = json!("unknown"),
            }
            body
        }
        _ => json!({ "type": "unknown" }),
    }
}
