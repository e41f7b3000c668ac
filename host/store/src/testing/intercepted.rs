//! [`Intercepted`]: an [`EventStore`] that forwards every call to an inner
//! store and lets a test or bench act around what it cares about (appends of
//! each kind, claims, commitment claims) through [`Hooks`]: a crash at the
//! n-th append, a driver stalled at a delivery, a count, a timing. Each user
//! writes its hook, not another twenty-method forwarding store.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    Appended, ApprovalRule, Claim, Commitment, CommitmentFilter, Durability, EventStore,
    HistoryChunk, HistoryDigest, Holder, KeyClaim, Listing, ListingStatus, PruneFilter, RunFilter,
    RunId, RunMeta, RunSummary, SessionHead, SettlingAppend, StoreError, StoredEvent, Tombstone,
    VerifyReport,
};

/// Which kind of append a hook sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendVia {
    /// [`EventStore::append`].
    Append,
    /// [`EventStore::append_fenced_to`] (or `append_fenced`).
    Fenced,
    /// [`EventStore::append_settling`].
    Settling,
}

/// What happens to an append, as [`Hooks::before_append`] decides.
#[derive(Debug)]
pub enum BeforeAppend {
    /// It goes to the inner store.
    Write,
    /// It goes to the inner store, and then the caller gets this error
    /// anyway (the write is durable, the driver never learns so).
    WriteThenFail(StoreError),
    /// It never reaches the inner store; the caller gets this error.
    Fail(StoreError),
}

/// What a test or bench does around the calls it intercepts. Every hook
/// defaults to doing nothing.
#[async_trait]
pub trait Hooks: Send + Sync {
    /// Before an append of `events` to `run_id`. May wait forever (a stalled
    /// driver).
    async fn before_append(
        &self,
        via: AppendVia,
        run_id: &RunId,
        events: &[Bytes],
    ) -> BeforeAppend {
        let _ = (via, run_id, events);
        BeforeAppend::Write
    }

    /// After an append the inner store took.
    fn after_append(&self, via: AppendVia, run_id: &RunId, events: &[Bytes]) {
        let _ = (via, run_id, events);
    }

    /// After an append the inner store took, before its caller learns so:
    /// may wait (a driver stopped with its append durable).
    async fn before_acknowledge(&self, via: AppendVia, run_id: &RunId, events: &[Bytes]) {
        let _ = (via, run_id, events);
    }

    /// Before any append, with how durable it asked to be.
    fn durability(&self, run_id: &RunId, events: &[Bytes], durability: Durability) {
        let _ = (run_id, events, durability);
    }

    /// Before a claim: how many runs it may take of the `limit` asked for.
    fn claim_limit(&self, limit: usize) -> usize {
        limit
    }

    /// After a claim, with the claims it granted.
    fn after_claim(&self, claims: &[Claim]) {
        let _ = claims;
    }

    /// Before a commitment is claimed.
    fn before_claim_commitment(&self, key: &str) {
        let _ = key;
    }

    /// Before a read of the store: a run's log loaded (whole or a tail),
    /// the listing read, or a session's head.
    fn before_read(&self, read: Read<'_>) {
        let _ = read;
    }
}

/// A read [`Hooks::before_read`] sees.
#[derive(Clone, Copy, Debug)]
pub enum Read<'a> {
    /// [`EventStore::load`] or [`EventStore::load_after`] of this run.
    Log(&'a RunId),
    /// [`EventStore::list`] with this filter.
    List(&'a RunFilter),
    /// [`EventStore::session_head`] of this session.
    SessionHead(&'a str),
}

/// `inner` with `hooks` around it.
pub struct Intercepted<H> {
    /// The store that does the work.
    pub inner: Arc<dyn EventStore>,
    /// What the test or bench does around it.
    pub hooks: H,
}

impl<H: Hooks> Intercepted<H> {
    /// Runs `write` unless the hook says otherwise, then tells the hook.
    async fn intercept(
        &self,
        via: AppendVia,
        run_id: &RunId,
        events: &[Bytes],
        write: impl std::future::Future<Output = Result<Appended, StoreError>>,
    ) -> Result<Appended, StoreError> {
        match self.hooks.before_append(via, run_id, events).await {
            BeforeAppend::Fail(error) => Err(error),
            BeforeAppend::WriteThenFail(error) => {
                write.await?;
                self.hooks.after_append(via, run_id, events);
                Err(error)
            }
            BeforeAppend::Write => {
                let appended = write.await?;
                self.hooks.after_append(via, run_id, events);
                self.hooks.before_acknowledge(via, run_id, events).await;
                Ok(appended)
            }
        }
    }
}

#[async_trait]
impl<H: Hooks> EventStore for Intercepted<H> {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError> {
        self.inner.create(run_id, meta, first_event, status).await
    }

    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        status: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.hooks.durability(run_id, events, status.durability);
        let write = self
            .inner
            .append(run_id, expected_len, events, status, updated_ms);
        self.intercept(AppendVia::Append, run_id, events, write)
            .await
    }

    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        self.hooks.before_read(Read::Log(run_id));
        self.inner.load(run_id).await
    }

    async fn load_after(&self, run_id: &RunId, after: u64) -> Result<Vec<StoredEvent>, StoreError> {
        self.hooks.before_read(Read::Log(run_id));
        self.inner.load_after(run_id, after).await
    }

    async fn load_many(
        &self,
        run_ids: &[RunId],
    ) -> Result<Vec<(RunId, Vec<StoredEvent>)>, StoreError> {
        self.inner.load_many(run_ids).await
    }

    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, StoreError> {
        self.inner.summary(run_id).await
    }

    async fn list(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.hooks.before_read(Read::List(filter));
        self.inner.list(filter).await
    }

    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
        self.hooks.before_read(Read::SessionHead(session));
        self.inner.session_head(session).await
    }

    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError> {
        self.inner.verify(run_id).await
    }

    async fn run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        self.inner.run_ids().await
    }

    async fn invalid_run_ids(&self) -> Result<Vec<String>, StoreError> {
        self.inner.invalid_run_ids().await
    }

    async fn load_history(&self, head: &HistoryDigest) -> Result<Vec<HistoryChunk>, StoreError> {
        self.inner.load_history(head).await
    }

    async fn acquire_claim(
        &self,
        run_id: &RunId,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        self.inner
            .acquire_claim(run_id, owner, now_ms, ttl_ms)
            .await
    }

    async fn renew_claim(
        &self,
        claim: &Claim,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        self.inner.renew_claim(claim, now_ms, ttl_ms).await
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        status: Option<ListingStatus>,
    ) -> Result<(), StoreError> {
        self.inner.release_claim(claim, status).await
    }

    async fn append_fenced_to(
        &self,
        run_id: &RunId,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        status: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.hooks.durability(run_id, events, status.durability);
        let write =
            self.inner
                .append_fenced_to(run_id, claim, expected_len, events, status, updated_ms);
        self.intercept(AppendVia::Fenced, run_id, events, write)
            .await
    }

    async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let limit = self.hooks.claim_limit(limit);
        let claims = self.inner.claim(owner, now_ms, ttl_ms, limit).await?;
        self.hooks.after_claim(&claims);
        Ok(claims)
    }

    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        self.inner.prune(filter, now_ms).await
    }

    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        self.hooks.before_claim_commitment(key);
        self.inner.claim_commitment(key, holder).await
    }

    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        self.inner.commitments(filter).await
    }

    async fn append_settling(&self, request: SettlingAppend<'_>) -> Result<Appended, StoreError> {
        self.hooks
            .durability(request.run_id, request.events, request.listing.durability);
        let write = self.inner.append_settling(request);
        self.intercept(AppendVia::Settling, request.run_id, request.events, write)
            .await
    }

    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        self.inner.add_rule(rule).await
    }

    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        self.inner.rules().await
    }

    async fn export_cursors(
        &self,
        reader: &str,
    ) -> Result<std::collections::BTreeMap<RunId, u64>, StoreError> {
        self.inner.export_cursors(reader).await
    }

    async fn advance_export_cursor(
        &self,
        reader: &str,
        run_id: &RunId,
        through: u64,
    ) -> Result<(), StoreError> {
        self.inner
            .advance_export_cursor(reader, run_id, through)
            .await
    }

    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        self.inner.rule(id).await
    }

    async fn verify_rows(&self) -> Result<crate::RowsReport, StoreError> {
        self.inner.verify_rows().await
    }

    async fn revoke_rule(
        &self,
        id: &str,
        by: &str,
        at_ms: i64,
    ) -> Result<ApprovalRule, StoreError> {
        self.inner.revoke_rule(id, by, at_ms).await
    }
}

/// No hooks: every call goes to the inner store unchanged.
impl Hooks for () {}
