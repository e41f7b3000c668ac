//! [`ClientModel`]: the MCP client, seen by the engine as a run's model.
//!
//! A served session is one Warden run whose "model" is the client: each
//! `tools/call` is offered here, and the engine's next model call answers
//! with exactly that tool call. The engine then records and performs it as
//! it would any model's (intent, lease, completion, approvals, budgets) and
//! calls the model again; that next call is how the session learns the
//! call settled. With no call offered the model call waits; once the
//! session ends it answers a final text, and the run completes.
//!
//! Every answer is recorded as the model call's completion, so a replay
//! never asks the client again.

use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use warden::providers::{
    ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason, ToolCall,
};

/// The final answer of a session's run: what its log's output says.
pub(crate) const SESSION_ENDED: &str = "the MCP session ended";

/// A call the client made, waiting for the engine's next model call.
pub(crate) struct Offered {
    /// The tool call's id in the log (`mcp-<n>`).
    pub(crate) id: String,
    /// The tool, by the name the model (the client) calls it.
    pub(crate) name: String,
    /// Its arguments.
    pub(crate) arguments: Value,
    /// Told once the engine asks the model again: the call has settled.
    pub(crate) settled: oneshot::Sender<()>,
}

#[derive(Default)]
struct Slots {
    /// The call offered and not yet taken.
    offered: Option<Offered>,
    /// The call taken, told when the next model call comes.
    taken: Option<oneshot::Sender<()>>,
}

/// The provider of one session's run. Cheap to clone; clones share the
/// session.
#[derive(Clone)]
pub(crate) struct ClientModel {
    slots: Arc<Mutex<Slots>>,
    wake: Arc<Notify>,
    ended: CancellationToken,
}

impl ClientModel {
    /// A model for a session that ends when `ended` is cancelled.
    pub(crate) fn new(ended: CancellationToken) -> ClientModel {
        ClientModel {
            slots: Arc::default(),
            wake: Arc::new(Notify::new()),
            ended,
        }
    }

    /// A model for a session that is already over: every call answers the
    /// final text (the recovery of a run whose server died).
    pub(crate) fn ended() -> ClientModel {
        let ended = CancellationToken::new();
        ended.cancel();
        ClientModel::new(ended)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offers `call` to the engine's next model call (the session makes one
    /// call at a time).
    pub(crate) fn offer(&self, call: Offered) {
        self.slots().offered = Some(call);
        self.wake.notify_one();
    }

    /// Takes back a call the engine has not taken (its drive stopped
    /// first), so a later call is not preceded by it.
    pub(crate) fn withdraw(&self) {
        self.slots().offered = None;
    }

    async fn next(self) -> Vec<Result<ProviderEvent, warden::providers::ProviderError>> {
        // Asked again: the call taken before has its result in the log.
        let settled = self.slots().taken.take();
        if let Some(settled) = settled {
            let _ = settled.send(());
        }
        loop {
            let woken = self.wake.notified();
            // One lock for both: the call moves from offered to taken.
            let offered = {
                let mut slots = self.slots();
                let call = slots.offered.take();
                if let Some(call) = call {
                    slots.taken = Some(call.settled);
                    Some((call.id, call.name, call.arguments))
                } else {
                    None
                }
            };
            if let Some((id, name, arguments)) = offered {
                return vec![
                    Ok(ProviderEvent::ToolCall(ToolCall {
                        id,
                        name,
                        arguments,
                    })),
                    Ok(ProviderEvent::Stop(StopReason::ToolUse)),
                ];
            }
            if self.ended.is_cancelled() {
                return vec![
                    Ok(ProviderEvent::TextDelta(SESSION_ENDED.to_owned())),
                    Ok(ProviderEvent::Stop(StopReason::EndTurn)),
                ];
            }
            tokio::select! {
                () = woken => {}
                () = self.ended.cancelled() => {}
            }
        }
    }
}

impl ModelProvider for ClientModel {
    fn name(&self) -> &str {
        "mcp-client"
    }

    fn stream(&self, _request: &ModelRequest) -> ModelStream {
        let this = self.clone();
        Box::pin(futures::stream::once(this.next()).flat_map(futures::stream::iter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            instructions: String::new(),
            context: String::new(),
            messages: vec![],
            tools: vec![],
            max_tokens: 1,
        }
    }

    async fn events(model: &ClientModel) -> Vec<ProviderEvent> {
        model.stream(&request()).map(|e| e.unwrap()).collect().await
    }

    #[tokio::test]
    async fn answers_the_offered_call_then_tells_it_settled_at_the_next_request() {
        let ended = CancellationToken::new();
        let model = ClientModel::new(ended.clone());
        let (settled, mut told) = oneshot::channel();
        model.offer(Offered {
            id: "mcp-1".into(),
            name: "fs__read_file".into(),
            arguments: serde_json::json!({"path": "a"}),
            settled,
        });
        let first = events(&model).await;
        assert!(matches!(&first[0], ProviderEvent::ToolCall(c) if c.id == "mcp-1"));
        assert_eq!(first[1], ProviderEvent::Stop(StopReason::ToolUse));
        assert!(
            told.try_recv().is_err(),
            "not settled before the next request"
        );
        // The next request waits for a call or the end of the session.
        let next = tokio::spawn({
            let model = model.clone();
            async move { events(&model).await }
        });
        told.await.unwrap();
        ended.cancel();
        let last = next.await.unwrap();
        assert_eq!(last[0], ProviderEvent::TextDelta(SESSION_ENDED.into()));
        assert_eq!(last[1], ProviderEvent::Stop(StopReason::EndTurn));
    }

    #[tokio::test]
    async fn a_withdrawn_call_is_never_answered() {
        let model = ClientModel::ended();
        let (settled, _told) = oneshot::channel();
        model.offer(Offered {
            id: "mcp-1".into(),
            name: "t".into(),
            arguments: Value::Null,
            settled,
        });
        model.withdraw();
        let events = events(&model).await;
        assert_eq!(events[0], ProviderEvent::TextDelta(SESSION_ENDED.into()));
    }
}
