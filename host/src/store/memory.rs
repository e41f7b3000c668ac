//! The in-memory [`MemoryStore`]: for tests and for embedding where runs need
//! not outlive the process. It keeps the same chain and gives the same
//! answers as the persistent stores (the conformance suite runs against it),
//! minus durability.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::chain::{self, Chain, RawRow, Recorded};
use super::{
    Appended, ChainBreak, ChainHash, ChainKey, Claim, EventStore, Holder, RunFilter, RunId,
    RunMeta, RunSummary, Settlement, StoreError, StoredEvent, VerifyReport,
};

/// An event store in memory. Cheap to create; everything is lost on drop.
///
/// By default it chains with plain SHA-256; see [`MemoryStore::with_chain_key`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    chain: Chain,
    runs: Mutex<HashMap<RunId, MemRun>>,
    /// Idempotency commitments: holder, and the result once settled. Always
    /// locked after `runs` when both are needed.
    commitments: Mutex<HashMap<String, (Holder, Option<Bytes>)>>,
}

#[derive(Debug)]
pub(crate) struct MemRun {
    meta: RunMeta,
    status: String,
    updated_ms: i64,
    /// The run row's count and head, kept apart from `events` as a database
    /// keeps them, so the checks compare two independent records.
    pub(crate) count: u64,
    pub(crate) head: ChainHash,
    pub(crate) events: Vec<StoredEvent>,
}

impl MemRun {
    fn summary(&self, run_id: &RunId) -> RunSummary {
        RunSummary {
            run_id: run_id.clone(),
            agent: self.meta.agent.clone(),
            status: self.status.clone(),
            labels: self.meta.labels.clone(),
            session: self.meta.session.clone(),
            created_ms: self.meta.created_ms,
            updated_ms: self.updated_ms,
            event_count: self.count,
        }
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
            commitments: Mutex::default(),
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
    #[cfg(test)]
    pub(crate) fn tamper(&self, run_id: &RunId, edit: impl FnOnce(&mut MemRun)) {
        edit(self.runs().get_mut(run_id).expect("tampered run exists"));
    }

    fn commitments(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Holder, Option<Bytes>)>> {
        self.commitments
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends to a run whose lock the caller holds: checks everything
    /// first, then changes the run without failing.
    fn append_locked(
        &self,
        runs: &mut HashMap<RunId, MemRun>,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        status: &str,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        let run = runs.get_mut(run_id).ok_or_else(|| Self::unknown(run_id))?;
        if run.count != expected_len {
            return Err(StoreError::Conflict {
                run_id: run_id.clone(),
                expected: expected_len,
                actual: run.count,
            });
        }
        let tail: Vec<_> = run
            .events
            .iter()
            .filter(|e| e.seq >= run.count)
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
        run.status = status.to_owned();
        run.updated_ms = updated_ms;
        Ok(Appended {
            event_count: run.count,
            head: run.head,
        })
    }

    fn unknown(run_id: &RunId) -> StoreError {
        StoreError::UnknownRun {
            run_id: run_id.clone(),
        }
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: &str,
    ) -> Result<Appended, StoreError> {
        let mut runs = self.runs();
        if runs.contains_key(run_id) {
            return Err(StoreError::AlreadyExists {
                run_id: run_id.clone(),
            });
        }
        let hash = self
            .chain
            .link(&self.chain.genesis(run_id), 1, &first_event);
        let updated_ms = meta.created_ms;
        runs.insert(
            run_id.clone(),
            MemRun {
                meta,
                status: status.to_owned(),
                updated_ms,
                count: 1,
                head: hash,
                events: vec![StoredEvent {
                    seq: 1,
                    bytes: first_event,
                    hash,
                }],
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
        status: &str,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        let mut runs = self.runs();
        self.append_locked(&mut runs, run_id, expected_len, events, status, updated_ms)
    }

    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        self.load_after(run_id, 0).await
    }

    async fn load_after(
        &self,
        run_id: &RunId,
        after_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let (start, rows, recorded) = {
            let runs = self.runs();
            let run = runs.get(run_id).ok_or_else(|| Self::unknown(run_id))?;
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
        let run = runs.get(run_id).ok_or_else(|| Self::unknown(run_id))?;
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
        if let Some(limit) = filter.limit {
            found.truncate(limit);
        }
        Ok(found)
    }

    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError> {
        let (rows, recorded) = {
            let runs = self.runs();
            let run = runs.get(run_id).ok_or_else(|| Self::unknown(run_id))?;
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

    async fn claim(&self, key: &str, holder: &Holder) -> Result<Claim, StoreError> {
        let mut commitments = self.commitments();
        Ok(match commitments.get(key) {
            None => {
                commitments.insert(key.to_owned(), (holder.clone(), None));
                Claim::Granted
            }
            Some((h, None)) if h == holder => Claim::Granted,
            Some((h, None)) => Claim::Held(h.clone()),
            Some((h, Some(result))) => Claim::Settled {
                holder: h.clone(),
                result: result.clone(),
            },
        })
    }

    async fn append_settling(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        status: &str,
        updated_ms: i64,
        settlement: &Settlement,
    ) -> Result<Appended, StoreError> {
        let mut runs = self.runs();
        let mut commitments = self.commitments();
        match commitments.get(&settlement.key) {
            Some((h, None)) if *h == settlement.holder => {}
            _ => {
                return Err(StoreError::CommitmentNotHeld {
                    key: settlement.key.clone(),
                    run_id: settlement.holder.run_id.clone(),
                    call_id: settlement.holder.call_id.clone(),
                });
            }
        }
        let appended =
            self.append_locked(&mut runs, run_id, expected_len, events, status, updated_ms)?;
        commitments.insert(
            settlement.key.clone(),
            (settlement.holder.clone(), Some(settlement.result.clone())),
        );
        Ok(appended)
    }
}
