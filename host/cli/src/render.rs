//! How events look on a terminal: one readable line (sometimes a few) per
//! event, shared by `warden run`'s live output and `warden runs show`.
//! Every piece of text a plugin, a model, an MCP server or a client wrote
//! goes through `warden::untrusted` ([`quoted`], [`short`], [`block`]):
//! shown as data, bounded, never interpreted by the terminal.

use serde_json::Value;

use warden::engine::budget::{BudgetKind, BudgetLimits, BudgetUsage, format_amount};
use warden::engine::events::{Event, ToolCallResult};
use warden::engine::{CallId, RunId, RunStatus};
use warden::providers::StopReason;
use warden::sandbox::UsageReceipt;
use warden::store::EventStore;

use super::contract::NextStep;
use warden::engine::approval_prompt::ApprovalPrompt;
use warden::engine::state::RunState;
use warden::untrusted;

/// The line(s) for one event, or `None` for events not worth a line.
/// Costs are shown in `currency` (the run's, from its log) when known; an
/// approval's frozen arguments come from `log`, the run's folded log.
pub(crate) fn event(
    event: &Event,
    currency: Option<&str>,
    log: Option<&RunState>,
) -> Option<String> {
    Some(match event {
        Event::RunStarted(s) => {
            let mut line = format!(
                "run {} of agent `{}` started with input {}",
                s.run_id,
                s.agent,
                short(&s.input, 200)
            );
            if let Some(parent) = &s.parent {
                line.push_str(&format!(
                    "\n  as a child of run {} (its call {})",
                    parent.run_id, parent.call_id
                ));
            }
            if let Some(session) = &s.session {
                line.push_str(&format!(
                    "\n  in session {} (run #{}, history of {} completed run(s), {} message(s))",
                    session.session_id,
                    session.position,
                    session.history_run_count(),
                    session.history_message_count()
                ));
            }
            line
        }
        Event::ModelCallIntent(i) if i.attempt > 1 => {
            format!(
                "· step {}: calling the model (attempt {})",
                i.step, i.attempt
            )
        }
        Event::ModelCallIntent(i) => format!("· step {}: calling the model", i.step),
        Event::ModelCallCompleted(c) if c.stop_reason == StopReason::Refusal => format!(
            "⊘ step {}: the model refused: {}",
            c.step,
            if c.text.is_empty() {
                "(no text)".to_owned()
            } else {
                quoted(&c.text)
            }
        ),
        Event::ModelCallCompleted(c) => {
            let mut line = format!(
                "· step {}: {} tokens in, {} out",
                c.step, c.usage.input_tokens, c.usage.output_tokens
            );
            if let Some(cost) = c.cost_nanos {
                let priced_in = c.pricing.as_ref().map(|p| p.currency.as_str());
                line.push_str(&format!(
                    ", cost {}",
                    format_amount(BudgetKind::Cost, cost, priced_in.or(currency))
                ));
            }
            line
        }
        Event::ModelCallFailed(f) => {
            let mut line = format!(
                "! step {}: model call failed: {}",
                f.step,
                quoted(&f.error.message)
            );
            let asked = f
                .error
                .retry_after_ms
                .map(|ms| format!(" (Retry-After: {})", wait_text(ms)))
                .unwrap_or_default();
            match (f.at_ms, f.retry_at_ms) {
                (Some(at), Some(due)) => line.push_str(&format!(
                    "
  next attempt in {}{asked}",
                    wait_text(due.saturating_sub(at))
                )),
                _ if !f.error.transient => line.push_str(
                    "
  not retried: the error is permanent",
                ),
                _ => {}
            }
            line
        }
        Event::ToolCallRejected(r) => {
            format!("✗ {} rejected: {}", r.call_id, quoted(&r.error.to_string()))
        }
        Event::ToolCallIntent(i) => format!(
            "→ {} {} [{}] {}",
            i.call_id,
            quoted(&i.tool.model_name()),
            i.effect,
            short(&i.arguments, 300)
        ),
        Event::ToolCallCompleted(c) => {
            let result = match &c.result {
                ToolCallResult::Output(v) => format!("ok {}", short(v, 300)),
                ToolCallResult::Error(e) => format!("error: {}", quoted(&e.to_string())),
            };
            format!("← {} {result} ({})", c.call_id, receipt(&c.receipt))
        }
        Event::ToolCallResolved(r) => format!(
            "← {} resolved by {}: {}{}",
            r.call_id,
            quoted(&r.by),
            short(&r.output, 300),
            r.note
                .as_deref()
                .map(|n| format!(" ({})", quoted(n)))
                .unwrap_or_default()
        ),
        Event::ToolCallAttemptFailed(f) if f.outcome_unknown => format!(
            "! {} attempt {} died mid-call ({}): the write's outcome is unknown",
            f.call_id,
            f.attempt,
            receipt(&f.receipt)
        ),
        Event::ToolCallAttemptFailed(f) => format!(
            "↻ {} attempt {} failed: {} ({}); trying again",
            f.call_id,
            f.attempt,
            quoted(&f.error.to_string()),
            receipt(&f.receipt)
        ),
        Event::ToolCallDeduplicated(d) => {
            let result = match &d.result {
                ToolCallResult::Output(v) => format!("ok {}", short(v, 300)),
                ToolCallResult::Error(e) => format!("error: {}", quoted(&e.to_string())),
            };
            format!(
                "← {} {result} (already done by run {} call {}; not run again)",
                d.call_id, d.origin_run, d.origin_call
            )
        }
        Event::ApprovalRequested(a) => ApprovalPrompt::new(a, log).text(),
        Event::ApprovalGranted(g) => match &g.rule {
            Some(rule) => format!(
                "✓ {} approved by rule {} (created by {})",
                g.call_id,
                rule.id,
                quoted(&rule.created_by)
            ),
            None => format!("✓ {} approved by {}", g.call_id, quoted(&g.by)),
        },
        Event::ApprovalWithdrawn(w) => format!(
            "↺ {} approval withdrawn ({}): it approves nothing; the call waits for approval again",
            w.call_id,
            w.reason.as_str()
        ),
        Event::ApprovalDenied(d) => format!(
            "✗ {} denied by {}: {}",
            d.call_id,
            quoted(&d.by),
            quoted(&d.reason)
        ),
        Event::ExternalCallRequested(r) => format!(
            "… {} {} is performed by the application: waiting for its output ({})",
            r.call_id,
            quoted(&r.tool),
            short(&r.arguments, 300)
        ),
        Event::ExternalCallCompleted(c) => format!(
            "← {} ok {} (reported{})",
            c.call_id,
            short(&c.output, 300),
            c.by.as_deref()
                .map(|b| format!(" by {}", quoted(b)))
                .unwrap_or_default()
        ),
        Event::Suspended(s) => format!("… suspended at {}: {}", s.call_id, quoted(&s.reason)),
        Event::Resumed(r) => format!("… resumed with {}", short(&r.input, 200)),
        Event::BudgetExceeded(b) => format!("! budget exceeded: {}", b.describe(currency)),
        Event::BudgetExtended(e) => format!(
            "… budget extended{}: {}",
            e.by.as_deref()
                .map(|b| format!(" by {}", quoted(b)))
                .unwrap_or_default(),
            limits_text(&e.limits, currency)
        ),
        Event::ClockObserved(_) | Event::RandomObserved(_) => return None,
        Event::WaitStarted(w) => format!(
            "… step {}: the next attempt is due at {} ({} after the failure, more than model.max_retry_wait): the run waits, parked; a worker or `warden runs resume` continues it then",
            w.step,
            warden::units::utc_text(w.until_ms as i64),
            wait_text(w.until_ms.saturating_sub(w.since_ms))
        ),
        Event::WaitEnded(e) => format!(
            "… the wait is over ({}): calling the model again",
            warden::units::utc_text(e.at_ms as i64)
        ),
        Event::PolicyDecided(d) => format!(
            "§ policy `{}` at {}{}: {}{}",
            quoted(&d.policy),
            d.hook,
            d.call_id
                .as_ref()
                .map(|c| format!(" ({c})"))
                .or_else(|| d.step.map(|s| format!(" (step {s})")))
                .unwrap_or_default(),
            d.decision,
            d.reason
                .as_deref()
                .map(|r| format!(": {}", quoted(r)))
                .unwrap_or_default()
        ),
        Event::OutputRejected(r) => format!(
            "↺ step {}: final answer sent back to the model: {}",
            r.step,
            quoted(&r.violation)
        ),
        Event::RunCompleted(c) if c.by_host => {
            format!(
                "✓ completed with the host's output: {}",
                untrusted::fragment(&text_of(&c.output))
            )
        }
        Event::RunCompleted(c) => {
            format!("✓ completed: {}", untrusted::fragment(&text_of(&c.output)))
        }
        Event::RunFailed(f) => format!(
            "✗ failed: {}",
            untrusted::line(&f.error.to_string(), untrusted::BLOCK_BYTES)
        ),
        Event::RunCancelled(c) => format!(
            "✗ cancelled{}{}",
            c.by.as_deref()
                .map(|b| format!(" by {}", quoted(b)))
                .unwrap_or_default(),
            c.reason
                .as_deref()
                .map(|r| format!(": {}", quoted(r)))
                .unwrap_or_default()
        ),
        Event::RunAbandoned(a) => format!(
            "✗ abandoned{}: {}",
            a.by.as_deref()
                .map(|b| format!(" by {}", quoted(b)))
                .unwrap_or_default(),
            quoted(&a.reason)
        ),
        Event::ContextResolved(c) => {
            let bytes: usize = c.items.iter().map(|i| i.content.len()).sum();
            format!(
                "· step {}: context `{}` resolved: {} item{}, {bytes} bytes, digest {} ({})",
                c.step,
                c.source,
                c.items.len(),
                if c.items.len() == 1 { "" } else { "s" },
                &c.digest[..c.digest.len().min(12)],
                receipt(&c.receipt)
            )
        }
        Event::CompactionIntent(i) => format!(
            "· step {}: the prompt is over its budget: summarising messages 2 to {}",
            i.step, i.upto
        ),
        Event::CompactionCompleted(c) => format!(
            "· step {}: compacted: messages 2 to {} are now a {}-byte summary ({} tokens in, {} out)",
            c.step,
            c.upto,
            c.summary.len(),
            c.usage.input_tokens,
            c.usage.output_tokens
        ),
        Event::CompactionFailed(f) => format!(
            "! step {}: compaction failed, the prompt goes on uncompacted: {}",
            f.step,
            quoted(&f.error.message)
        ),
        Event::ContextFailed(f) => format!(
            "! step {}: context `{}` failed: {}{}",
            f.step,
            f.source,
            quoted(&f.error.to_string()),
            f.receipt
                .as_ref()
                .map(|r| format!(" ({})", receipt(r)))
                .unwrap_or_default()
        ),
        // A delivery is shown once it is settled: one line each.
        Event::DeliveryIntent(_) => return None,
        Event::DeliveryAttemptFailed(f) => format!(
            "↻ delivery {} attempt {} failed: {} ({}); trying again",
            f.delivery_id,
            f.attempt,
            quoted(&f.error.to_string()),
            receipt(&f.receipt)
        ),
        Event::DeliveryCompleted(c) => format!(
            "✉ delivered {} (attempt {}, {})",
            c.delivery_id,
            c.attempt,
            receipt(&c.receipt)
        ),
        Event::DeliveryFailed(f) => format!(
            "✗ delivery {} given up after {} attempt{}: {}",
            f.delivery_id,
            f.attempts,
            if f.attempts == 1 { "" } else { "s" },
            quoted(&f.error.to_string())
        ),
        Event::ReconciliationRequired(r) => {
            format!("! needs reconciliation ({}): {}", r.by, quoted(&r.reason))
        }
        Event::Reconciled(r) => format!(
            "✓ reconciled by {}{}",
            quoted(&r.by),
            r.note
                .as_deref()
                .map(|n| format!(" ({})", quoted(n)))
                .unwrap_or_default()
        ),
        Event::RunForked(f) => format!(
            "⑂ forked by {} from run {} at position {}{}{}: the events above are inherited",
            f.by,
            f.source_run,
            f.position,
            if f.changed.is_empty() {
                String::new()
            } else {
                format!(", changed: {}", f.changed.join(", "))
            },
            f.withdrawn_approval
                .as_ref()
                .map(|c| format!(", approval of {c} withdrawn (asked again)"))
                .unwrap_or_default()
        ),
        Event::KeySettled(r) => format!(
            "✓ idempotency key {} of {} settled by {} with {}{}",
            quoted(&r.key),
            r.call_id,
            quoted(&r.by),
            short(&r.output, 300),
            r.note
                .as_deref()
                .map(|n| format!(" ({})", quoted(n)))
                .unwrap_or_default()
        ),
        Event::ChildStarted(c) => format!(
            "↳ {}: started child run {} of agent `{}` with input {}{}",
            c.call_id,
            c.child_run,
            c.agent,
            short(&c.input, 200),
            if c.capped.is_empty() {
                String::new()
            } else {
                format!(
                    " (capped by what this run had left: {})",
                    c.capped
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ),
        Event::ChildParked(p) => format!(
            "⏸ {}: child run {} is {}: this run waits for it",
            p.call_id, p.child_run, p.status
        ),
        Event::ChildFinished(f) => format!(
            "↲ {}: child run {} {}: {}",
            f.call_id,
            f.child_run,
            f.status,
            match &f.result {
                ToolCallResult::Output(v) => short(v, 200),
                ToolCallResult::Error(e) => quoted(&e.to_string()),
            }
        ),
        Event::KeyReleased(r) => format!(
            "⟳ idempotency key {} of {} released by {}{}",
            quoted(&r.key),
            r.call_id,
            quoted(&r.by),
            r.note
                .as_deref()
                .map(|n| format!(" ({})", quoted(n)))
                .unwrap_or_default()
        ),
    })
}

/// A wait in milliseconds as a duration: `2s`, `1m`, `250ms`, `1.5s`.
pub(crate) fn wait_text(ms: u64) -> String {
    if ms >= 1000 && !ms.is_multiple_of(1000) {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    warden::units::format_duration(std::time::Duration::from_millis(ms))
}

/// A recorded prompt for `runs show --prompts`: the quoted context whole,
/// then what else the request held.
pub(crate) fn prompt(request: Option<&warden::providers::ModelRequest>) -> String {
    let Some(r) = request else {
        return "(prompt not recorded: run with --record-prompts)".into();
    };
    let mut out = String::new();
    if r.context.is_empty() {
        out.push_str("context: none\n");
    } else {
        out.push_str("context:\n");
        for line in r.context.lines() {
            if !line.is_empty() {
                out.push_str("  ");
            }
            out.push_str(&untrusted::fragment(line));
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "instructions: {} bytes · messages: {} · tools: {} · max_tokens: {}",
        r.instructions.len(),
        r.messages.len(),
        r.tools.len(),
        r.max_tokens
    ));
    out
}

/// A receipt in a few words; the lease's wall time in milliseconds, or in
/// seconds from one second on.
pub(crate) fn receipt(r: &UsageReceipt) -> String {
    let took = match r.wall_time_us {
        us if us < 1_000_000 => format!("{:.2} ms", us as f64 / 1000.0),
        us => format!("{:.2}s", us as f64 / 1_000_000.0),
    };
    let mut line = format!("{} · fuel {} · {took}", r.outcome, r.fuel_consumed);
    if let Some(u) = &r.unlisted {
        line.push_str(&format!(" · {}", unlisted(u)));
    }
    line
}

/// The entries a lease's listings left out, as `left out 1 entry whose
/// name is not UTF-8: /workspace/caf\xe9.md`.
pub(crate) fn unlisted(u: &warden::sandbox::Unlisted) -> String {
    let more = u.count.saturating_sub(u.names.len() as u64);
    format!(
        "left out {} entr{} whose name is not UTF-8: {}{}",
        u.count,
        if u.count == 1 { "y" } else { "ies" },
        quoted(&u.names.join(", ")),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// Budget use on one line: each budget used or limited, as `used of
/// limit`, in human units (costs in `currency`).
pub(crate) fn budget(usage: &BudgetUsage, limits: &BudgetLimits, currency: Option<&str>) -> String {
    let parts: Vec<String> = BudgetKind::ORDER
        .iter()
        .filter_map(|&kind| {
            let used = usage.get(kind);
            let limit = limits.get(kind);
            if used == 0 && limit.is_none() {
                return None;
            }
            let amount = |n: u64| format_amount(kind, n, currency);
            let name = kind.as_str().replace('_', " ");
            Some(match limit {
                Some(l) => format!("{name} {} of {}", amount(used), amount(l)),
                None => format!("{name} {}", amount(used)),
            })
        })
        .collect();
    if parts.is_empty() {
        "nothing used".into()
    } else {
        parts.join(" · ")
    }
}

/// The limits `limits` sets, as `max_cost $8.00, max_wall_time 15m`.
pub(crate) fn limits_text(limits: &BudgetLimits, currency: Option<&str>) -> String {
    BudgetKind::ORDER
        .iter()
        .filter_map(|&kind| {
            let limit = limits.get(kind)?;
            Some(format!(
                "{} {}",
                kind.setting(),
                format_amount(kind, limit, currency)
            ))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do next with a run in `status`, as command lines: each step's
/// prose, then `or` the next, or `then` the next when it follows it
/// (`approve with: …\n   or deny with: …`). The children a run waits for
/// are read from `store`.
pub(crate) async fn next_step(
    store: &dyn EventStore,
    run_id: &RunId,
    status: RunStatus,
    events: &[Event],
) -> Option<String> {
    let steps = next_steps(store, run_id, status, events).await;
    (!steps.is_empty()).then(|| said(&steps))
}

/// One thing a human can do, with the prose that introduces it.
pub(crate) struct Said {
    pub(crate) prose: String,
    /// It comes after the step before (`then …`), not instead of it (`or …`).
    pub(crate) then: bool,
    pub(crate) step: NextStep,
}

/// `steps` as text: `{prose}: {command}`, the next ones after `or`, or
/// after `then` when they follow the one before.
pub(crate) fn said(steps: &[Said]) -> String {
    let mut text = String::new();
    for (i, s) in steps.iter().enumerate() {
        if i > 0 {
            text.push_str(if s.then { "\n   then " } else { "\n   or " });
        }
        text.push_str(&format!("{}: {}", s.prose, s.step.command));
    }
    text
}

/// The children a run waits for (started, not ended), each with the status
/// its own store entry lists now, `None` when the store no longer has it:
/// a parent's `child_parked` records how the child was when the parent
/// last looked, which a later approval or answer of the child outdates.
async fn waited_children(store: &dyn EventStore, events: &[Event]) -> Vec<(RunId, Option<String>)> {
    let mut waited: Vec<(CallId, RunId)> = Vec::new();
    for event in events {
        match event {
            Event::ChildStarted(c) => waited.push((c.call_id.clone(), c.child_run.clone())),
            Event::ChildFinished(f) => waited.retain(|(call, _)| *call != f.call_id),
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(waited.len());
    for (_, child) in waited {
        let status = store.summary(&child).await.ok().map(|s| s.status);
        out.push((child, status));
    }
    out
}

/// What a human can do about a run in `status` that waits for one (or for
/// a time): each step with the prose that introduces it. Empty for the
/// other statuses (see `status::next_steps`).
pub(crate) async fn next_steps(
    store: &dyn EventStore,
    run_id: &RunId,
    status: RunStatus,
    events: &[Event],
) -> Vec<Said> {
    let step = |prose: &str, action: &'static str, command: String| Said {
        prose: prose.to_owned(),
        then: false,
        step: NextStep { action, command },
    };
    let abandon = || {
        step(
            "give up with",
            "abandon",
            format!("warden runs abandon {run_id} --reason '…'"),
        )
    };
    let found = match status {
        RunStatus::AwaitingApproval => events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::ApprovalRequested(a) => Some(a.call_id.to_string()),
                _ => None,
            })
            .map(|call| {
                vec![
                    step(
                        "approve with",
                        "approve",
                        format!("warden runs approve {run_id} {call}"),
                    ),
                    step(
                        "deny with",
                        "deny",
                        format!("warden runs deny {run_id} {call} --reason '…'"),
                    ),
                ]
            }),
        RunStatus::Suspended => events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Suspended(s) => Some(s.schema.to_string()),
                _ => None,
            })
            .map(|schema| {
                vec![step(
                    "answer with",
                    "answer",
                    format!("warden runs resume {run_id} --input '<JSON matching {schema}>'"),
                )]
            }),
        RunStatus::BudgetExceeded => events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::BudgetExceeded(b) => Some(b.budget.setting()),
                _ => None,
            })
            .map(|budget| {
                vec![step(
                    "extend with",
                    "extend",
                    format!("warden runs resume {run_id} --input '{{\"{budget}\": <new limit>}}'"),
                )]
            }),
        RunStatus::Waiting => events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::WaitStarted(w) => Some(w.until_ms),
                _ => None,
            })
            .map(|until| {
                vec![step(
                    &format!(
                        "waits until {}: a `warden worker` on this store continues it then, or",
                        warden::units::utc_text(until as i64)
                    ),
                    "resume",
                    format!("warden runs resume {run_id}"),
                )]
            }),
        RunStatus::AwaitingChild => {
            let children = waited_children(store, events).await;
            // A child that no longer waits for anyone (it ended, or a
            // process drives it) needs nothing more than the parent's drive.
            let waiting: Vec<&(RunId, Option<String>)> = children
                .iter()
                .filter(|(_, s)| {
                    s.as_deref()
                        .and_then(|s| s.parse::<RunStatus>().ok())
                        .is_some_and(RunStatus::is_parked)
                })
                .collect();
            let mut steps: Vec<Said> = waiting
                .iter()
                .map(|(child, s)| {
                    step(
                        &format!(
                            "its child run {child} is {}: see what it needs with",
                            s.as_deref().unwrap_or_default()
                        ),
                        "show",
                        format!("warden runs show {child}"),
                    )
                })
                .collect();
            let resume = format!("warden runs resume {run_id}");
            if steps.is_empty() {
                let moved: Vec<String> = children
                    .iter()
                    .map(|(child, s)| {
                        format!(
                            "its child run {child} is {}",
                            s.as_deref().unwrap_or("gone from the store")
                        )
                    })
                    .collect();
                let prose = if moved.is_empty() {
                    "its children moved on: continue with".to_owned()
                } else {
                    format!("{}: continue with", moved.join(", "))
                };
                steps.push(step(&prose, "resume", resume));
            } else {
                let mut last = step(
                    if waiting.len() == 1 {
                        "once it was answered, continue both with"
                    } else {
                        "once they were answered, continue with"
                    },
                    "resume",
                    resume,
                );
                last.then = true;
                steps.push(last);
            }
            Some(steps)
        }
        RunStatus::AwaitingExternal => events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::ExternalCallRequested(r) => Some(r.call_id.to_string()),
                _ => None,
            })
            .map(|call| {
                vec![step(
                    "the application performs the call and reports it with Runtime::complete_external, or",
                    "complete",
                    format!("warden runs complete {run_id} {call} --output '<its output as JSON>'"),
                )]
            }),
        RunStatus::NeedsReconciliation
            if events.iter().rev().find_map(|e| match e {
                Event::ReconciliationRequired(_) => Some(true),
                Event::Reconciled(_) => Some(false),
                _ => None,
            }) == Some(true) =>
        {
            Some(vec![
                step(
                    "its log may be missing what it did after its backup: check, then go on from the log with",
                    "resolve",
                    format!("warden runs resolve {run_id} --note '<what you found>'"),
                ),
                abandon(),
            ])
        }
        RunStatus::NeedsReconciliation => Some(vec![
            step(
                "check whether the write happened, then",
                "resolve",
                format!("warden runs resolve {run_id} --output '<its output as JSON>'"),
            ),
            abandon(),
        ]),
        _ => None,
    };
    found.unwrap_or_default()
}

/// A final output as text: strings bare, anything else as JSON.
pub(crate) fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A run's output for the terminal: text as itself, JSON pretty-printed;
/// whole, but with every control made visible.
pub(crate) fn output(v: &Value) -> String {
    untrusted::fragment(&match v {
        Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
    })
}

/// JSON cut to about `max` bytes for one line (JSON escapes the ASCII
/// controls; the renderer shows the others).
pub(crate) fn short(v: &Value, max: usize) -> String {
    untrusted::line(&v.to_string(), max)
}

/// Text someone else wrote, on one line of at most
/// [`untrusted::LINE_BYTES`] bytes.
pub(crate) fn quoted(text: &str) -> String {
    untrusted::line(text, untrusted::LINE_BYTES)
}
