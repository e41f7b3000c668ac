//! `GET /api/v1/overview`: what the console's overview draws, over the
//! most recent runs: how many runs started in each stretch of time, by
//! status (from the listing alone), and, from the logs of the newest of
//! them, cost and tokens per agent and the slowest tools. Bounded: one
//! page-sized read of the listing index and one batch load, however many
//! runs the store holds.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use warden::engine::RunId;
use warden::store::{RunFilter, RunSummary};

use crate::App;
use crate::api::Params;
use crate::contract;
use crate::error::ApiError;

/// The most runs counted by status.
const LISTED: usize = 2_000;
/// The most runs whose logs are read for costs, tokens and tools.
const READ: usize = 200;
/// The bucket widths the status counts may use, the narrowest first.
const BUCKETS_MS: [i64; 8] = [
    60_000,
    5 * 60_000,
    15 * 60_000,
    3_600_000,
    6 * 3_600_000,
    86_400_000,
    7 * 86_400_000,
    30 * 86_400_000,
];
/// The most buckets the status counts are split into.
const MAX_BUCKETS: i64 = 48;
/// How many of the slowest tools are listed.
const TOOLS: usize = 10;

/// The query of `GET /api/v1/overview`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// Only runs created at or after this time (ms since the epoch).
    since_ms: Option<i64>,
}

/// Runs started per bucket, by status: `(bucket width, first bucket's
/// start, counts by status, one per bucket)`.
fn by_status(runs: &[RunSummary]) -> Value {
    let (Some(first), Some(last)) = (
        runs.iter().map(|r| r.created_ms).min(),
        runs.iter().map(|r| r.created_ms).max(),
    ) else {
        return json!({ "bucket_ms": BUCKETS_MS[0], "starts_ms": [], "counts": {} });
    };
    let width = BUCKETS_MS
        .iter()
        .copied()
        .find(|w| (last - first) / w < MAX_BUCKETS)
        .unwrap_or(BUCKETS_MS[BUCKETS_MS.len() - 1]);
    let start = first.div_euclid(width) * width;
    let count = usize::try_from((last - start) / width + 1).unwrap_or(1);
    let mut counts: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for run in runs {
        let i = usize::try_from((run.created_ms - start) / width).unwrap_or(0);
        counts
            .entry(run.status.as_str())
            .or_insert_with(|| vec![0; count])[i.min(count - 1)] += 1;
    }
    let starts: Vec<i64> = (0..count as i64).map(|i| start + i * width).collect();
    json!({ "bucket_ms": width, "starts_ms": starts, "counts": counts })
}

/// What one agent's runs used.
#[derive(Default)]
struct AgentUse {
    runs: u64,
    cost_nanos: u64,
    input_tokens: u64,
    output_tokens: u64,
    currencies: std::collections::BTreeSet<String>,
}

/// One tool's calls.
#[derive(Default)]
struct ToolTimes {
    calls: u64,
    failed_attempts: u64,
    total_us: u64,
    max_us: u64,
}

/// `GET /api/v1/overview`.
pub async fn overview(
    State(app): State<Arc<App>>,
    Params(q): Params<OverviewQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut filter = RunFilter::new().newest_first().limit(LISTED);
    if let Some(since) = q.since_ms {
        filter = filter.created_since(since);
    }
    let store = app.runtime.store();
    let runs = store.list(&filter).await.map_err(|e| app.fail(&e))?;
    let read: Vec<RunId> = runs.iter().take(READ).map(|r| r.run_id.clone()).collect();
    let logs = store.load_many(&read).await.map_err(|e| app.fail(&e))?;
    let mut agents: BTreeMap<&str, AgentUse> = BTreeMap::new();
    let mut tools: BTreeMap<String, ToolTimes> = BTreeMap::new();
    for (run_id, stored) in &logs {
        let Some(agent) = runs.iter().find(|r| r.run_id == *run_id) else {
            continue;
        };
        let used = agents.entry(agent.agent.as_str()).or_default();
        used.runs += 1;
        // Which tool each call is, from its intent.
        let mut called: BTreeMap<String, String> = BTreeMap::new();
        for e in stored {
            // A line that is not JSON is left out here; `show` names it.
            let Ok(line) = contract::stored_line(e.seq, &e.bytes) else {
                continue;
            };
            let event = &line["event"];
            let number = |v: &Value| v.as_u64().unwrap_or(0);
            match event["type"].as_str() {
                Some("model_call_completed") => {
                    used.cost_nanos += number(&event["cost_nanos"]);
                    used.input_tokens += number(&event["usage"]["input_tokens"]);
                    used.output_tokens += number(&event["usage"]["output_tokens"]);
                    if let Some(currency) = event["pricing"]["currency"].as_str() {
                        used.currencies.insert(currency.to_owned());
                    }
                }
                Some("tool_call_intent") => {
                    let name = format!(
                        "{}__{}",
                        event["tool"]["plugin"].as_str().unwrap_or("?"),
                        event["tool"]["tool"].as_str().unwrap_or("?")
                    );
                    called.insert(event["call_id"].as_str().unwrap_or("").to_owned(), name);
                }
                Some(kind @ ("tool_call_completed" | "tool_call_attempt_failed")) => {
                    let Some(name) = called.get(event["call_id"].as_str().unwrap_or("")) else {
                        continue;
                    };
                    let times = tools.entry(name.clone()).or_default();
                    let us = number(&event["receipt"]["wall_time_us"]);
                    times.total_us += us;
                    times.max_us = times.max_us.max(us);
                    if kind == "tool_call_completed" {
                        times.calls += 1;
                    } else {
                        times.failed_attempts += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let agents: Vec<Value> = agents
        .into_iter()
        .map(|(agent, u)| {
            // One currency, or none known: a sum across currencies means
            // nothing, and says so.
            let currency = match u.currencies.len() {
                0 => Value::Null,
                1 => json!(u.currencies.first()),
                _ => json!("mixed"),
            };
            json!({
                "agent": agent,
                "runs": u.runs,
                "cost_nanos": u.cost_nanos,
                "currency": currency,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
            })
        })
        .collect();
    let mut tools: Vec<(String, ToolTimes)> = tools.into_iter().collect();
    tools.sort_by_key(|(_, t)| std::cmp::Reverse(t.max_us));
    tools.truncate(TOOLS);
    let tools: Vec<Value> = tools
        .into_iter()
        .map(|(tool, t)| {
            let attempts = (t.calls + t.failed_attempts).max(1);
            json!({
                "tool": tool,
                "calls": t.calls,
                "failed_attempts": t.failed_attempts,
                "mean_ms": t.total_us / attempts / 1000,
                "max_ms": t.max_us / 1000,
            })
        })
        .collect();
    Ok(Json(json!({
        "v": contract::VERSION,
        "runs_listed": runs.len(),
        "runs_read": logs.len(),
        "statuses": by_status(&runs),
        "agents": agents,
        "tools": tools,
    })))
}
