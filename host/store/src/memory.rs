//! The in-memory [`MemoryStore`]: for tests and for embedding where runs need
//! not outlive the process. It keeps the same chain and gives the same
//! answers as the persistent stores (the conformance suite runs against it),
//! minus durability.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::chain::{self, Chain, RawRow, Recorded};
use super::history::{self, HistoryChunk, HistoryDigest};
use super::{
    Appended, ApprovalRule, COMMITMENTS, ChainBreak, ChainHash, ChainKey, Claim, Commitment,
    CommitmentFilter, EventStore, Holder, KeyClaim, Listing, ListingStatus, PruneFilter, RULES,
    Revocation, RowsReport, RunFilter, RunId, RunMeta, RunSummary, SessionHead, Settle,
    SettlingAppend, StatusClass, StoreError, StoredEvent, Tombstone, VerifyReport,
};

/// An event store in memory. Cheap to create; everything is lost on drop.
///
/// By default it chains with plain SHA-256; see [`MemoryStore::with_chain_key`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    chain: Chain,
    runs: Mutex<HashMap<RunId, MemRun>>,
    tombstones: Mutex<HashMap<RunId, Tombstone>>,
    /// Idempotency commitments: holder, and the result once settled. Locked
    /// after `runs` when both are needed; never emptied by pruning.
    commitments: Mutex<HashMap<String, (Holder, Option<Bytes>)>>,
    /// Standing approval rules, in the order they were added.
    rules: Mutex<Vec<ApprovalRule>>,
    /// Session history chunks by digest, as a table keeps them (the link
    /// and the body, checked against the digest when read). Locked after
    /// `runs`; never emptied by pruning.
    history: Mutex<HashMap<HistoryDigest, StoredChunk>>,
    /// Export cursors by reader, then run.
    cursors: Mutex<HashMap<String, BTreeMap<RunId, u64>>>,
    /// What a start in each session reads, kept as runs are created and
    /// their status set, as the persistent stores' `sessions` table is.
    /// Locked after `runs`; never emptied by pruning.
    sessions: Mutex<HashMap<String, SessionHead>>,
}

/// A history chunk's row: the chunk before it and its body.
#[derive(Debug, Clone)]
pub(crate) struct StoredChunk {
    pub(crate) previous: Option<HistoryDigest>,
    pub(crate) body: Bytes,
}

#[derive(Debug)]
pub(crate) struct MemRun {
    meta: RunMeta,
    status: ListingStatus,
    updated_ms: i64,
    /// The run row's count and head, kept apart from `events` as a database
    /// keeps them, so the checks compare two independent records.
    pub(crate) count: u64,
    pub(crate) head: ChainHash,
    pub(crate) events: Vec<StoredEvent>,
    /// The held claim (live or expired; `None` once released).
    claim: Option<Claim>,
    /// The newest fencing token issued.
    claim_token: u64,
    /// Deliveries owed, as the last append said.
    owes_deliveries: u32,
    /// When a waiting run wakes up, as the last append said.
    wake_ms: Option<i64>,
}

impl MemRun {
    fn summary(&self, run_id: &RunId) -> RunSummary {
        RunSummary {
            run_id: run_id.clone(),
            agent: self.meta.agent.clone(),
            status: self.status.name().to_owned(),
            labels: self.meta.labels.clone(),
            session: self.meta.session.clone(),
            created_ms: self.meta.created_ms,
            updated_ms: self.updated_ms,
            event_count: self.count,
            claim: self.claim.clone(),
            claim_token: self.claim_token,
            owes_deliveries: self.owes_deliveries,
            wake_ms: self.wake_ms,
        }
    }

    /// Whether a claim other than `owner`'s is live at `now_ms`.
    fn live_claim(&self, now_ms: i64) -> Option<&Claim> {
        self.claim.as_ref().filter(|l| !l.is_expired(now_ms))
    }

    fn issue_claim(&mut self, run_id: &RunId, owner: &str, now_ms: i64, ttl_ms: i64) -> Claim {
        self.claim_token += 1;
        let claim = Claim {
            run_id: run_id.clone(),
            owner: owner.to_owned(),
            token: self.claim_token,
            expires_ms: now_ms.saturating_add(ttl_ms),
        };
        self.claim = Some(claim.clone());
        claim
    }

    /// Whether `claim` is the current one.
    fn holds(&self, claim: &Claim) -> bool {
        self.claim
            .as_ref()
            .is_some_and(|l| l.token == claim.token && l.owner == claim.owner)
    }

    fn claimable(&self, now_ms: i64) -> bool {
        let class = self.status.class();
        (class == StatusClass::Queued
            || (self.claim_token > 0
                && (class == StatusClass::Running || self.owes_deliveries > 0))
            || (class == StatusClass::Waiting && self.wake_ms.is_some_and(|at| at <= now_ms)))
            && self.live_claim(now_ms).is_none()
    }

    fn rows(&self, after: u64) -> Vec<RawRow> {
        self.events
            .iter()
            .filter(|e| e.seq > after)
            .map(|e| RawRow {
                seq: e.seq,
                bytes: Ok(e.bytes.clone()),
                hash: Ok(e.hash),
            })
            .collect()
    }

    fn recorded(&self) -> Recorded {
        Recorded {
            count: self.count,
            head: Ok(self.head),
        }
    }
}

impl MemoryStore {
    /// An empty store chaining with plain SHA-256.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store chaining with HMAC-SHA-256 under `key`.
    pub fn with_chain_key(key: ChainKey) -> Self {
        Self {
            chain: Chain::new(Some(key)),
            runs: Mutex::default(),
            tombstones: Mutex::default(),
            commitments: Mutex::default(),
            rules: Mutex::default(),
            history: Mutex::default(),
            cursors: Mutex::default(),
            sessions: Mutex::default(),
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, MemRun>> {
        // A panic while holding the lock cannot leave a run half-written:
        // every mutation below is checked first and applied without failing.
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Test hook: edits a run's stored rows, count and head behind the
    /// store's back, as someone with access to the storage could.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn tamper(&self, run_id: &RunId, edit: impl FnOnce(&mut MemRun)) {
        edit(self.runs().get_mut(run_id).expect("tampered run exists"));
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionHead>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets `run`'s status, keeping its session's head (see
    /// `store/session.rs`): what the persistent stores' triggers do.
    fn set_status(&self, run_id: &RunId, run: &mut MemRun, status: ListingStatus) {
        let before = run.status;
        run.status = status;
        let Some(session) = &run.meta.session else {
            return;
        };
        let mut sessions = self.sessions();
        let head = sessions.entry(session.clone()).or_default();
        if status == ListingStatus::COMPLETED && before != ListingStatus::COMPLETED {
            head.completed += 1;
            head.latest_completed = Some(run_id.clone());
        }
        if head
            .active
            .as_ref()
            .is_some_and(|(active, _)| active == run_id)
        {
            head.active = (status.class() != StatusClass::Settled)
                .then(|| (run_id.clone(), status.name().to_owned()));
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, HashMap<HistoryDigest, StoredChunk>> {
        self.history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Test hook: edits (or with `None`, deletes) a history chunk's row
    /// behind the store's back.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn tamper_history(
        &self,
        digest: &HistoryDigest,
        edit: impl FnOnce(&mut Option<StoredChunk>),
    ) {
        let mut rows = self.history();
        let mut row = rows.remove(digest);
        edit(&mut row);
        if let Some(row) = row {
            rows.insert(*digest, row);
        }
    }

    fn commitments(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Holder, Option<Bytes>)>> {
        self.commitments
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rules_locked(&self) -> std::sync::MutexGuard<'_, Vec<ApprovalRule>> {
        self.rules
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tombstones(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Tombstone>> {
        self.tombstones
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An unknown run: [`StoreError::Pruned`] if it left a tombstone.
    fn unknown(&self, run_id: &RunId) -> StoreError {
        match self.tombstones().get(run_id) {
            Some(t) => StoreError::Pruned {
                run_id: run_id.clone(),
                event_count: t.event_count,
                head: t.head,
            },
            None => StoreError::UnknownRun {
                run_id: run_id.clone(),
            },
        }
    }

    fn fenced(claim: &Claim, run: &MemRun) -> StoreError {
        StoreError::Fenced {
            run_id: claim.run_id.clone(),
            token: claim.token,
            current: run.claim_token,
        }
    }

    /// Refuses an append under `claim` unless `claim` is the current claim
    /// of the run it names (the run appended to, or the run driving it).
    fn check_fence(&self, runs: &HashMap<RunId, MemRun>, claim: &Claim) -> Result<(), StoreError> {
        let claimed = runs
            .get(&claim.run_id)
            .ok_or_else(|| self.unknown(&claim.run_id))?;
        if !claimed.holds(claim) {
            return Err(Self::fenced(claim, claimed));
        }
        Ok(())
    }

    /// The append itself, once the caller's checks passed.
    fn append_checked(
        &self,
        run_id: &RunId,
        run: &mut MemRun,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if run.count != expected_len {
            return Err(StoreError::Conflict {
                run_id: run_id.clone(),
                expected: expected_len,
                actual: run.count,
            });
        }
        // Events are kept in seq order (pushed so; damage only removes or
        // rewrites them in place), so the tail is found without a scan: an
        // append costs the same however long the log.
        let from = run.events.partition_point(|e| e.seq < run.count);
        let tail: Vec<_> = run.events[from..]
            .iter()
            .take(2)
            .map(|e| (e.seq, Ok(e.hash)))
            .collect();
        chain::check_tail(run.count, &run.head, &tail).map_err(|f| StoreError::Tampered {
            run_id: run_id.clone(),
            seq: f.seq,
            reason: f.kind,
        })?;
        let hashes = self.chain.extend(run.head, run.count, events);
        for (i, (bytes, hash)) in events.iter().zip(&hashes).enumerate() {
            run.events.push(StoredEvent {
                seq: run.count + 1 + i as u64,
                bytes: bytes.clone(),
                hash: *hash,
            });
        }
        run.count += events.len() as u64;
        run.head = *hashes.last().expect("events is not empty");
        self.set_status(run_id, run, listing.status);
        run.owes_deliveries = listing.owes_deliveries;
        run.wake_ms = listing.wake_ms;
        run.updated_ms = updated_ms;
        Ok(Appended {
            event_count: run.count,
            head: run.head,
        })
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError> {
        let mut runs = self.runs();
        if runs.contains_key(run_id) || self.tombstones().contains_key(run_id) {
            return Err(StoreError::AlreadyExists {
                run_id: run_id.clone(),
            });
        }
        if let Some(session) = &meta.session {
            let sessions = self.sessions();
            let head = sessions.get(session);
            if let Some((active, _)) = head.and_then(|h| h.active.as_ref()) {
                return Err(StoreError::SessionBusy {
                    session: session.clone(),
                    active_run: active.clone(),
                });
            }
            let found = head.map_or(0, |h| h.runs);
            if let Some(expected) = meta.session_runs
                && found != expected
            {
                return Err(StoreError::SessionChanged {
                    session: session.clone(),
                    expected,
                    found,
                });
            }
        }
        let mut meta = meta;
        let chunks = std::mem::take(&mut meta.history);
        let mut stored = self.history();
        history::check_new_chunks(&chunks, meta.history_head.as_ref(), |d| {
            Ok(stored.contains_key(d))
        })?;
        for chunk in chunks {
            stored.entry(*chunk.digest()).or_insert(StoredChunk {
                previous: chunk.previous().copied(),
                body: chunk.body().clone(),
            });
        }
        drop(stored);
        let hash = self
            .chain
            .link(&self.chain.genesis(run_id), 1, &first_event);
        let updated_ms = meta.created_ms;
        if let Some(session) = &meta.session {
            let mut sessions = self.sessions();
            let head = sessions.entry(session.clone()).or_default();
            head.runs += 1;
            if status == ListingStatus::COMPLETED {
                head.completed += 1;
                head.latest_completed = Some(run_id.clone());
            }
            if status.class() != StatusClass::Settled {
                head.active = Some((run_id.clone(), status.name().to_owned()));
            }
        }
        runs.insert(
            run_id.clone(),
            MemRun {
                meta,
                status,
                updated_ms,
                count: 1,
                head: hash,
                events: vec![StoredEvent {
                    seq: 1,
                    bytes: first_event,
                    hash,
                }],
                claim: None,
                claim_token: 0,
                owes_deliveries: 0,
                wake_ms: None,
            },
        );
        Ok(Appended {
            event_count: 1,
            head: hash,
        })
    }

    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        let mut runs = self.runs();
        let run = runs.get_mut(run_id).ok_or_else(|| self.unknown(run_id))?;
        self.append_checked(run_id, run, expected_len, events, listing, updated_ms)
    }

    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        self.load_after(run_id, 0).await
    }

    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
        Ok(self.sessions().get(session).cloned().unwrap_or_default())
    }

    async fn load_after(
        &self,
        run_id: &RunId,
        after_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let (start, rows, recorded) = {
            let runs = self.runs();
            let run = runs.get(run_id).ok_or_else(|| self.unknown(run_id))?;
            if after_seq >= run.count {
                return Ok(Vec::new());
            }
            let start = if after_seq == 0 {
                Ok(self.chain.genesis(run_id))
            } else {
                run.events
                    .iter()
                    .find(|e| e.seq == after_seq)
                    .map(|e| e.hash)
                    .ok_or(after_seq)
            };
            (start, run.rows(after_seq), run.recorded())
        };
        let start = start.map_err(|seq| StoreError::Tampered {
            run_id: run_id.clone(),
            seq,
            reason: ChainBreak::Missing {
                recorded_count: recorded.count,
            },
        })?;
        chain::walk(&self.chain, after_seq, start, rows, &recorded, true).into_events(run_id)
    }

    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, StoreError> {
        let runs = self.runs();
        let run = runs.get(run_id).ok_or_else(|| self.unknown(run_id))?;
        Ok(run.summary(run_id))
    }

    async fn list(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let mut found: Vec<RunSummary> = self
            .runs()
            .iter()
            .map(|(id, run)| run.summary(id))
            .filter(|s| filter.matches(s))
            .collect();
        found.sort_by(|a, b| (a.created_ms, &a.run_id).cmp(&(b.created_ms, &b.run_id)));
        if filter.newest_first {
            found.reverse();
        }
        if let Some(limit) = filter.limit {
            found.truncate(limit);
        }
        Ok(found)
    }

    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError> {
        let (rows, recorded) = {
            let runs = self.runs();
            let run = runs.get(run_id).ok_or_else(|| self.unknown(run_id))?;
            (run.rows(0), run.recorded())
        };
        let walk = chain::walk(
            &self.chain,
            0,
            self.chain.genesis(run_id),
            rows,
            &recorded,
            false,
        );
        Ok(VerifyReport {
            run_id: run_id.clone(),
            recorded_count: recorded.count,
            events_read: walk.rows_read,
            recorded_head: recorded.head.ok(),
            findings: walk.findings,
        })
    }

    async fn run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        let mut ids: Vec<RunId> = self.runs().keys().cloned().collect();
        ids.sort();
        Ok(ids)
    }

    async fn acquire_claim(
        &self,
        run_id: &RunId,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let mut runs = self.runs();
        let run = runs.get_mut(run_id).ok_or_else(|| self.unknown(run_id))?;
        if let Some(live) = run.live_claim(now_ms)
            && live.owner != owner
        {
            return Err(StoreError::Claimed {
                run_id: run_id.clone(),
                owner: live.owner.clone(),
                expires_ms: live.expires_ms,
            });
        }
        Ok(run.issue_claim(run_id, owner, now_ms, ttl_ms))
    }

    async fn renew_claim(
        &self,
        claim: &Claim,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let mut runs = self.runs();
        let run = runs
            .get_mut(&claim.run_id)
            .ok_or_else(|| self.unknown(&claim.run_id))?;
        if !run.holds(claim) {
            return Err(Self::fenced(claim, run));
        }
        let renewed = Claim {
            expires_ms: now_ms.saturating_add(ttl_ms),
            ..claim.clone()
        };
        run.claim = Some(renewed.clone());
        Ok(renewed)
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        status: Option<ListingStatus>,
    ) -> Result<(), StoreError> {
        let mut runs = self.runs();
        let run = runs
            .get_mut(&claim.run_id)
            .ok_or_else(|| self.unknown(&claim.run_id))?;
        if run.holds(claim) {
            run.claim = None;
            if let Some(status) = status {
                self.set_status(&claim.run_id, run, status);
            }
        }
        Ok(())
    }

    async fn append_fenced_to(
        &self,
        run_id: &RunId,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        let mut runs = self.runs();
        self.check_fence(&runs, claim)?;
        let run = runs.get_mut(run_id).ok_or_else(|| self.unknown(run_id))?;
        self.append_checked(run_id, run, expected_len, events, listing, updated_ms)
    }

    async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut runs = self.runs();
        let mut claimable: Vec<(i64, RunId)> = runs
            .iter()
            .filter(|(_, run)| run.claimable(now_ms))
            .map(|(id, run)| (run.meta.created_ms, id.clone()))
            .collect();
        claimable.sort();
        Ok(claimable
            .into_iter()
            .take(limit)
            .map(|(_, id)| {
                let run = runs.get_mut(&id).expect("listed above");
                run.issue_claim(&id, owner, now_ms, ttl_ms)
            })
            .collect())
    }

    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        let mut runs = self.runs();
        let mut doomed: Vec<RunId> = runs
            .iter()
            .filter(|(_, run)| {
                filter.matches(run.status.name(), run.updated_ms)
                    && run.live_claim(now_ms).is_none()
                    && run.owes_deliveries == 0
            })
            .map(|(id, _)| id.clone())
            .collect();
        doomed.sort();
        let mut tombstones = self.tombstones();
        let pruned: Vec<Tombstone> = doomed
            .into_iter()
            .map(|id| {
                let run = runs.remove(&id).expect("listed above");
                // A pruned run holds its session no more (the persistent
                // stores find the active run among the rows left).
                if let Some(session) = &run.meta.session {
                    let mut sessions = self.sessions();
                    if let Some(head) = sessions.get_mut(session)
                        && head
                            .active
                            .as_ref()
                            .is_some_and(|(active, _)| *active == id)
                    {
                        head.active = None;
                    }
                }
                let tombstone = Tombstone {
                    run_id: id.clone(),
                    agent: run.meta.agent,
                    status: run.status.name().to_owned(),
                    created_ms: run.meta.created_ms,
                    updated_ms: run.updated_ms,
                    event_count: run.count,
                    head: run.head,
                    pruned_ms: now_ms,
                };
                tombstones.insert(id, tombstone.clone());
                tombstone
            })
            .collect();
        // The chunks no remaining run's history reaches go with the runs.
        let mut chunks = self.history();
        let mut live = std::collections::HashSet::new();
        for head in runs.values().filter_map(|r| r.meta.history_head) {
            let mut next = Some(head);
            while let Some(digest) = next {
                if !live.insert(digest) {
                    break;
                }
                next = chunks.get(&digest).and_then(|c| c.previous);
            }
        }
        chunks.retain(|digest, _| live.contains(digest));
        Ok(pruned)
    }

    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        let mut commitments = self.commitments();
        Ok(match commitments.get(key) {
            None => {
                commitments.insert(key.to_owned(), (holder.clone(), None));
                KeyClaim::Granted
            }
            Some((h, None)) if h == holder => KeyClaim::Granted,
            Some((h, None)) => KeyClaim::Held(h.clone()),
            Some((h, Some(result))) => KeyClaim::Settled {
                holder: h.clone(),
                result: result.clone(),
            },
        })
    }

    async fn append_settling(&self, request: SettlingAppend<'_>) -> Result<Appended, StoreError> {
        let SettlingAppend {
            run_id,
            fence,
            expected_len,
            events,
            listing,
            updated_ms,
            settlement,
        } = request;
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        let mut runs = self.runs();
        if let Some(claim) = fence {
            self.check_fence(&runs, claim)?;
        }
        let run = runs.get_mut(run_id).ok_or_else(|| self.unknown(run_id))?;
        let mut commitments = self.commitments();
        let release = settlement.outcome == Settle::Release;
        match commitments.get(&settlement.key) {
            Some((h, None)) if *h == settlement.holder => {}
            Some((h, Some(_))) if release && *h == settlement.holder => {}
            _ => {
                return Err(StoreError::CommitmentNotHeld {
                    key: settlement.key.clone(),
                    run_id: settlement.holder.run_id.clone(),
                    call_id: settlement.holder.call_id.clone(),
                });
            }
        }
        let appended =
            self.append_checked(run_id, run, expected_len, events, listing, updated_ms)?;
        match &settlement.outcome {
            Settle::Result(result) => {
                commitments.insert(
                    settlement.key.clone(),
                    (settlement.holder.clone(), Some(result.clone())),
                );
            }
            Settle::Release => {
                commitments.remove(&settlement.key);
            }
        }
        Ok(appended)
    }

    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        let mut listed: Vec<Commitment> = self
            .commitments()
            .iter()
            .map(|(key, (holder, result))| Commitment {
                key: key.clone(),
                holder: holder.clone(),
                result: result.clone(),
            })
            .filter(|c| filter.matches(c))
            .collect();
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        let mut rules = self.rules_locked();
        if rules.iter().any(|r| r.id == rule.id) {
            return Err(StoreError::RuleExists {
                id: rule.id.clone(),
            });
        }
        rules.push(rule.clone());
        Ok(())
    }

    async fn export_cursors(&self, reader: &str) -> Result<BTreeMap<RunId, u64>, StoreError> {
        let cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cursors.get(reader).cloned().unwrap_or_default())
    }

    async fn advance_export_cursor(
        &self,
        reader: &str,
        run_id: &RunId,
        through: u64,
    ) -> Result<(), StoreError> {
        let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        let at = cursors
            .entry(reader.to_owned())
            .or_default()
            .entry(run_id.clone())
            .or_default();
        *at = (*at).max(through);
        Ok(())
    }

    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        let mut rules = self.rules_locked().clone();
        rules.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(rules)
    }

    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        Ok(self.rules_locked().iter().find(|r| r.id == id).cloned())
    }

    /// Nothing to find: the rows live in this process's memory, where
    /// nothing outside the store can change them.
    async fn verify_rows(&self) -> Result<RowsReport, StoreError> {
        let rules = self.rules_locked().len() as u64;
        let commitments = self.commitments().len() as u64;
        Ok(RowsReport::new(
            vec![(RULES, rules), (COMMITMENTS, commitments)],
            Vec::new(),
        ))
    }

    async fn revoke_rule(
        &self,
        id: &str,
        by: &str,
        at_ms: i64,
    ) -> Result<ApprovalRule, StoreError> {
        let mut rules = self.rules_locked();
        let rule = rules
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or_else(|| StoreError::UnknownRule { id: id.to_owned() })?;
        if rule.revoked.is_none() {
            rule.revoked = Some(Revocation {
                by: by.to_owned(),
                at_ms,
            });
        }
        Ok(rule.clone())
    }

    async fn load_history(&self, head: &HistoryDigest) -> Result<Vec<HistoryChunk>, StoreError> {
        let rows = self.history();
        let mut found = HashMap::new();
        let mut next = Some(*head);
        while let Some(digest) = next.take() {
            let Some(row) = rows.get(&digest) else { break };
            if found.contains_key(&digest) {
                break;
            }
            let chunk = HistoryChunk::stored(digest, row.previous, row.body.clone());
            next = chunk.as_ref().ok().and_then(|c| c.previous().copied());
            found.insert(digest, chunk);
        }
        history::chain_from(head, found)
    }
}
