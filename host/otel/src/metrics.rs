//! Prometheus metrics read from the store ([`Metrics`]), rendered in the
//! text exposition format for a `/metrics` endpoint.
//!
//! Like the traces, the counters are derived from the runs' logs, not
//! counted on live code paths: each scrape reads the events recorded since
//! the last one (each run's position is remembered in memory) and adds
//! them up. So they are the store's totals, the same on every process that
//! serves them over one store (aggregate them with `max`, not `sum`), and
//! a restarted process counts every log again from the start (Prometheus
//! sees a counter reset). The gauges (runs by status, queue depth) are the
//! store's listing at the scrape. Store append latency is the serving
//! process's own, measured around its appends ([`MeteredStore`]).
//!
//! Names follow Prometheus's conventions: `warden_` prefix, base units
//! (`_seconds`), `_total` on counters.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use warden_engine::events::{self, Event, ToolCallResult};
use warden_store::{
    Appended, ApprovalRule, Claim, Commitment, CommitmentFilter, EventStore, HistoryChunk,
    HistoryDigest, Holder, KeyClaim, Listing, ListingStatus, PruneFilter, RunFilter, RunId,
    RunMeta, RunSummary, SessionHead, SettlingAppend, StoreError, StoredEvent, Tombstone,
    VerifyReport,
};

use crate::OtelError;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A histogram's upper bounds and counts.
#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const FUEL: &[f64] = &[1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];

/// What the logs read so far add up to.
#[derive(Debug)]
struct Counts {
    /// How far each run's log was read.
    read: HashMap<RunId, u64>,
    /// Each run's tool calls in flight: plugin and effect, by call id.
    in_flight: HashMap<(RunId, String), (String, String)>,
    steps: u64,
    model_calls: BTreeMap<&'static str, u64>,
    tokens: BTreeMap<&'static str, u64>,
    cost_nanos: BTreeMap<String, u64>,
    tool_calls: BTreeMap<(String, String, String), u64>,
    parks: BTreeMap<&'static str, u64>,
    lease_seconds: Histogram,
    lease_fuel: Histogram,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            read: HashMap::new(),
            in_flight: HashMap::new(),
            steps: 0,
            model_calls: BTreeMap::new(),
            tokens: BTreeMap::new(),
            cost_nanos: BTreeMap::new(),
            tool_calls: BTreeMap::new(),
            parks: BTreeMap::new(),
            lease_seconds: Histogram::new(SECONDS),
            lease_fuel: Histogram::new(FUEL),
        }
    }
}

impl Counts {
    fn add(&mut self, run: &RunId, event: &Event) {
        let mut park = |reason: &'static str| *self.parks.entry(reason).or_default() += 1;
        match event {
            Event::ModelCallIntent(i) if i.attempt == 1 => self.steps += 1,
            Event::ModelCallCompleted(c) => {
                *self.model_calls.entry("completed").or_default() += 1;
                *self.tokens.entry("input").or_default() += c.usage.input_tokens;
                *self.tokens.entry("output").or_default() += c.usage.output_tokens;
                if let (Some(cost), Some(pricing)) = (c.cost_nanos, &c.pricing) {
                    *self.cost_nanos.entry(pricing.currency.clone()).or_default() += cost;
                }
            }
            Event::ModelCallFailed(_) => *self.model_calls.entry("failed").or_default() += 1,
            Event::ApprovalRequested(_) => park("approval"),
            Event::Suspended(_) => park("input"),
            Event::ExternalCallRequested(_) => park("external"),
            Event::BudgetExceeded(_) => park("budget"),
            Event::WaitStarted(_) => park("wait"),
            Event::ChildParked(_) => park("child"),
            Event::ToolCallIntent(i) => {
                self.in_flight.insert(
                    (run.clone(), i.call_id.as_str().to_owned()),
                    (i.tool.plugin.clone(), i.effect.to_string()),
                );
            }
            Event::ToolCallCompleted(c) => {
                let (plugin, effect) = self
                    .in_flight
                    .remove(&(run.clone(), c.call_id.as_str().to_owned()))
                    .unwrap_or_default();
                let outcome = match &c.result {
                    ToolCallResult::Output(_) => "ok",
                    ToolCallResult::Error(_) => "error",
                };
                *self
                    .tool_calls
                    .entry((plugin, effect, outcome.to_owned()))
                    .or_default() += 1;
                self.lease_seconds
                    .observe(c.receipt.wall_time_us as f64 / 1e6);
                self.lease_fuel.observe(c.receipt.fuel_consumed as f64);
            }
            _ => {}
        }
    }
}

/// Metrics over a store; see the module's doc.
pub struct Metrics {
    store: Arc<dyn EventStore>,
    counts: tokio::sync::Mutex<Counts>,
    appends: Option<Arc<AppendTimes>>,
}

impl Metrics {
    /// Metrics read from `store`.
    pub fn new(store: Arc<dyn EventStore>) -> Self {
        Metrics {
            store,
            counts: tokio::sync::Mutex::new(Counts::default()),
            appends: None,
        }
    }

    /// With the append latency `store` measured (the store the process
    /// appends through).
    pub fn with_appends(mut self, store: &MeteredStore) -> Self {
        self.appends = Some(Arc::clone(&store.times));
        self
    }

    /// Reads what the logs recorded since the last call, and renders
    /// every metric.
    pub async fn render(&self) -> Result<String, OtelError> {
        let runs = self.store.list(&RunFilter::new()).await?;
        let mut counts = self.counts.lock().await;
        for run in &runs {
            let read = counts.read.get(&run.run_id).copied().unwrap_or(0);
            if run.event_count <= read {
                continue;
            }
            let events = match self.store.load_after(&run.run_id, read).await {
                Ok(events) => events,
                // Pruned since it was listed: nothing more to count.
                Err(StoreError::UnknownRun { .. } | StoreError::Pruned { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut last = read;
            for stored in events {
                let event = events::decode(&stored.bytes).map_err(|e| OtelError::Decode {
                    run_id: run.run_id.clone(),
                    seq: stored.seq,
                    reason: e.to_string(),
                })?;
                counts.add(&run.run_id, &event);
                last = stored.seq;
            }
            counts.read.insert(run.run_id.clone(), last);
        }
        Ok(self.text(&runs, &counts))
    }

    fn text(&self, runs: &[RunSummary], counts: &Counts) -> String {
        let mut out = String::new();
        let mut by_status: BTreeMap<&str, u64> = BTreeMap::new();
        for run in runs {
            *by_status.entry(run.status.as_str()).or_default() += 1;
        }
        family(
            &mut out,
            "warden_runs",
            "gauge",
            "Runs in the store, by status.",
        );
        for (status, n) in &by_status {
            let _ = writeln!(out, "warden_runs{{status=\"{}\"}} {n}", escape(status));
        }
        family(
            &mut out,
            "warden_queue_depth",
            "gauge",
            "Runs queued for a worker and not yet claimed.",
        );
        let _ = writeln!(
            out,
            "warden_queue_depth {}",
            by_status.get(warden_store::QUEUED).copied().unwrap_or(0)
        );
        family(
            &mut out,
            "warden_steps_total",
            "counter",
            "Model-call steps begun (first attempts).",
        );
        let _ = writeln!(out, "warden_steps_total {}", counts.steps);
        family(
            &mut out,
            "warden_model_calls_total",
            "counter",
            "Model call attempts ended, by outcome.",
        );
        for outcome in ["completed", "failed"] {
            let n = counts.model_calls.get(outcome).copied().unwrap_or(0);
            let _ = writeln!(out, "warden_model_calls_total{{outcome=\"{outcome}\"}} {n}");
        }
        family(
            &mut out,
            "warden_model_tokens_total",
            "counter",
            "Model tokens used, by direction.",
        );
        for direction in ["input", "output"] {
            let n = counts.tokens.get(direction).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "warden_model_tokens_total{{direction=\"{direction}\"}} {n}"
            );
        }
        family(
            &mut out,
            "warden_model_cost_total",
            "counter",
            "What model calls cost, in units of the pricing's currency.",
        );
        for (currency, nanos) in &counts.cost_nanos {
            let _ = writeln!(
                out,
                "warden_model_cost_total{{currency=\"{}\"}} {}",
                escape(currency),
                *nanos as f64 / 1e9
            );
        }
        family(
            &mut out,
            "warden_tool_calls_total",
            "counter",
            "Tool calls completed, by plugin, effect class and outcome.",
        );
        for ((plugin, effect, outcome), n) in &counts.tool_calls {
            let _ = writeln!(
                out,
                "warden_tool_calls_total{{plugin=\"{}\",effect=\"{}\",outcome=\"{}\"}} {n}",
                escape(plugin),
                escape(effect),
                escape(outcome)
            );
        }
        family(
            &mut out,
            "warden_parks_total",
            "counter",
            "Times runs parked, by what they waited for.",
        );
        for reason in ["approval", "input", "external", "budget", "wait", "child"] {
            let n = counts.parks.get(reason).copied().unwrap_or(0);
            let _ = writeln!(out, "warden_parks_total{{reason=\"{reason}\"}} {n}");
        }
        counts.lease_seconds.render(
            &mut out,
            "warden_lease_duration_seconds",
            "Wall time of tool calls' leases.",
        );
        counts.lease_fuel.render(
            &mut out,
            "warden_lease_fuel",
            "Fuel tool calls' leases consumed.",
        );
        if let Some(appends) = &self.appends {
            let times = appends.lock();
            times.render(
                &mut out,
                "warden_store_append_duration_seconds",
                "How long this process's appends to the store took.",
            );
        }
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the exposition format writes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The append latencies a [`MeteredStore`] measured.
#[derive(Debug)]
struct AppendTimes(Mutex<Histogram>);

impl AppendTimes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Histogram> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `write`'s result, its duration observed.
    async fn timed<T>(&self, write: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        let result = write.await;
        self.lock().observe(start.elapsed().as_secs_f64());
        result
    }
}

/// A store that measures how long its creates and appends take, and
/// otherwise is the store it wraps.
#[derive(Clone)]
pub struct MeteredStore {
    inner: Arc<dyn EventStore>,
    times: Arc<AppendTimes>,
}

impl MeteredStore {
    /// Measures `inner`'s appends.
    pub fn new(inner: Arc<dyn EventStore>) -> Self {
        MeteredStore {
            inner,
            times: Arc::new(AppendTimes(Mutex::new(Histogram::new(SECONDS)))),
        }
    }
}

#[async_trait]
impl EventStore for MeteredStore {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError> {
        self.times
            .timed(self.inner.create(run_id, meta, first_event, status))
            .await
    }

    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.times
            .timed(
                self.inner
                    .append(run_id, expected_len, events, listing, updated_ms),
            )
            .await
    }

    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.load(run_id).await
    }

    async fn load_after(
        &self,
        run_id: &RunId,
        after_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.load_after(run_id, after_seq).await
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
        self.inner.list(filter).await
    }

    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
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

    async fn append_fenced(
        &self,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.times
            .timed(
                self.inner
                    .append_fenced(claim, expected_len, events, listing, updated_ms),
            )
            .await
    }

    async fn append_fenced_to(
        &self,
        run_id: &RunId,
        fence: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.times
            .timed(self.inner.append_fenced_to(
                run_id,
                fence,
                expected_len,
                events,
                listing,
                updated_ms,
            ))
            .await
    }

    async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim(owner, now_ms, ttl_ms, limit).await
    }

    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        self.inner.prune(filter, now_ms).await
    }

    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        self.inner.claim_commitment(key, holder).await
    }

    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        self.inner.commitments(filter).await
    }

    async fn append_settling(&self, request: SettlingAppend<'_>) -> Result<Appended, StoreError> {
        self.times.timed(self.inner.append_settling(request)).await
    }

    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        self.inner.add_rule(rule).await
    }

    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        self.inner.rules().await
    }

    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        self.inner.rule(id).await
    }

    async fn verify_rows(&self) -> Result<warden_store::RowsReport, StoreError> {
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

    async fn export_cursors(&self, reader: &str) -> Result<BTreeMap<RunId, u64>, StoreError> {
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
}
