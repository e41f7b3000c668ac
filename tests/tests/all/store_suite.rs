//! The store conformance suite run from outside the store crate, as a store
//! written in another crate would run it: a [`Backend`] of its own and one
//! `conformance_suite!` line. The store here is the intercepting store
//! (`warden_store::testing::Intercepted`, no hooks) around the memory store,
//! so the suite also holds the intercepting store to forwarding every call
//! unchanged: the engine's crash and stall tests rely on that.

use std::sync::Arc;

use async_trait::async_trait;
use warden::store::testing::{Backend, HistoryTamper, Intercepted, MemoryBackend, Tamper};
use warden::store::{ChainKey, EventStore, HistoryDigest, RunId};

/// The memory store behind an intercepting store; tampering goes to the
/// memory store's rows, behind both.
struct InterceptedMemory(MemoryBackend);

#[async_trait]
impl Backend for InterceptedMemory {
    async fn open(&self) -> Arc<dyn EventStore> {
        Arc::new(Intercepted {
            inner: self.0.open().await,
            hooks: (),
        })
    }

    async fn open_keyed(&self, key: ChainKey) -> Arc<dyn EventStore> {
        Arc::new(Intercepted {
            inner: self.0.open_keyed(key).await,
            hooks: (),
        })
    }

    async fn tamper(&self, run_id: &RunId, tamper: Tamper) {
        self.0.tamper(run_id, tamper).await;
    }

    async fn tamper_history(&self, digest: &HistoryDigest, tamper: HistoryTamper) {
        self.0.tamper_history(digest, tamper).await;
    }
}

warden::store::conformance_suite!(
    intercepted_memory,
    super::InterceptedMemory(warden::store::testing::MemoryBackend::new())
);
