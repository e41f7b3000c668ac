//! A run's log read as spans: pure, no I/O, so a test gives it events and
//! checks the spans.
//!
//! Which spans (names and attributes follow the OpenTelemetry GenAI
//! semantic conventions where they name the thing; Warden's own facts are
//! `warden.*`):
//! - `invoke_agent {agent}`: the run, from its start (or its fork) to its
//!   terminal event; a child run's hangs under its parent's tool call, a
//!   fork's is the root of its own trace, linked to its source run;
//! - `chat {model}`: a model call, intent to completion or failure;
//! - `execute_tool {tool}`: a tool call (a plugin's, an MCP server's, an
//!   agent called as a tool, or an external one), intent to completion,
//!   with the lease's fuel, memory and wall time; failed attempts are span
//!   events;
//! - `await_approval {tool}`, `await_input`, `durable_wait`,
//!   `budget_park`: the times a run waited for a human, for a timer or for
//!   a budget;
//! - `deliver {channel}`: a delivery to a channel, intent to completion.
//!
//! Each span carries the position of the event that closes it
//! ([`DerivedSpan::end_seq`]): an exporter that has sent everything up to
//! position `n` sends the spans that close after `n`, once each. A span
//! still open (a call in flight, a run not finished) is not derived until
//! its closing event is in the log.
//!
//! Times are the run's injected clock (its recorded readings); an event
//! without a reading takes the last reading before it. A tool call lasts
//! its lease's recorded wall time.
//!
//! Message content (the run's input and output, prompts, answers, tool
//! arguments and results) is left out unless [`SpanOptions::content`] is
//! set: it can hold anything the model or a tool saw.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Event as SpanEvent, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId,
    TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use serde::Serialize;
use warden_engine::events::{Event, ToolCallResult};
use warden_store::RunId;

use crate::ids;

/// What goes into the spans besides their structure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpanOptions {
    /// Message content: the run's input and output, prompts (when the log
    /// recorded them), answers, tool arguments and results. Default: off.
    pub content: bool,
}

/// Where a run's spans go: its trace, the span its root span hangs under,
/// and the spans its root span links to.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The trace.
    pub trace_id: TraceId,
    /// The parent of the run's root span (a child run's parent tool call);
    /// `None` for the root of a trace.
    pub parent: Option<SpanId>,
    /// Spans the run's root span links to (a fork's source run).
    pub links: Vec<SpanContext>,
}

impl Placement {
    /// A run that roots its own trace.
    pub fn root(run: &RunId) -> Self {
        Placement {
            trace_id: ids::trace_id(run),
            parent: None,
            links: Vec::new(),
        }
    }
}

/// One span read from a log.
#[derive(Clone, Debug)]
pub struct DerivedSpan {
    /// The position (from 1) of the event that closes the span.
    pub end_seq: u64,
    /// The span.
    pub data: SpanData,
}

/// A remote span context in `trace_id` (what a link or parent names).
pub fn context(trace_id: TraceId, span_id: SpanId) -> SpanContext {
    SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

/// Where the log forks, if it is a fork: the source run and the position
/// of the `run_forked` event (from 1).
pub fn fork_of(run: &RunId, log: &[Event]) -> Option<(RunId, u64)> {
    log.iter().enumerate().find_map(|(i, e)| match e {
        Event::RunForked(f) if f.run_id == *run => Some((f.source_run.clone(), i as u64 + 1)),
        _ => None,
    })
}

/// A span begun and not yet closed.
struct Open {
    seq: u64,
    span_id: SpanId,
    name: String,
    start_ms: u64,
    attributes: Vec<KeyValue>,
    events: Vec<SpanEvent>,
}

/// The spans of `run`'s log (`log[i]` at position `i + 1`), placed by
/// `placement`.
pub fn derive(
    run: &RunId,
    log: &[Event],
    placement: &Placement,
    options: SpanOptions,
) -> Vec<DerivedSpan> {
    Deriver::new(run, placement, options).run(log)
}

struct Deriver<'a> {
    run: &'a RunId,
    placement: &'a Placement,
    options: SpanOptions,
    root_span: SpanId,
    now_ms: u64,
    /// Spans a fork inherited whole (closed at or before this position) are
    /// its source's: left out.
    inherited: u64,
    root: Option<Open>,
    model: Option<Open>,
    compaction: Option<Open>,
    tools: BTreeMap<String, Open>,
    approvals: BTreeMap<String, Open>,
    parks: BTreeMap<&'static str, Open>,
    deliveries: BTreeMap<String, Open>,
    input_tokens: u64,
    output_tokens: u64,
    cost_nanos: u64,
    out: Vec<DerivedSpan>,
}

impl<'a> Deriver<'a> {
    fn new(run: &'a RunId, placement: &'a Placement, options: SpanOptions) -> Self {
        Deriver {
            run,
            placement,
            options,
            root_span: ids::run_span(run),
            now_ms: 0,
            inherited: 0,
            root: None,
            model: None,
            compaction: None,
            tools: BTreeMap::new(),
            approvals: BTreeMap::new(),
            parks: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            input_tokens: 0,
            output_tokens: 0,
            cost_nanos: 0,
            out: Vec::new(),
        }
    }

    fn run(mut self, log: &[Event]) -> Vec<DerivedSpan> {
        if let Some((_, position)) = fork_of(self.run, log) {
            self.inherited = position - 1;
        }
        for (i, event) in log.iter().enumerate() {
            let seq = i as u64 + 1;
            if let Some(ms) = event.clock_reading() {
                self.now_ms = self.now_ms.max(ms);
            }
            self.event(seq, event);
        }
        let inherited = self.inherited;
        self.out.retain(|s| s.end_seq > inherited);
        self.out
    }

    fn open(&self, seq: u64, span_id: SpanId, name: String, attributes: Vec<KeyValue>) -> Open {
        Open {
            seq,
            span_id,
            name,
            start_ms: self.now_ms,
            attributes,
            events: Vec::new(),
        }
    }

    /// Closes `span` at `end_ms` (never before its start) by the event at
    /// `end_seq`, under `parent` (the run's span when `None`).
    fn close(&mut self, span: Open, end_seq: u64, end_ms: u64, status: Status) {
        self.close_under(
            span,
            end_seq,
            end_ms,
            status,
            Some(self.root_span),
            Vec::new(),
        );
    }

    fn close_under(
        &mut self,
        span: Open,
        end_seq: u64,
        end_ms: u64,
        status: Status,
        parent: Option<SpanId>,
        links: Vec<SpanContext>,
    ) {
        let mut events = SpanEvents::default();
        events.events = span.events;
        let mut span_links = SpanLinks::default();
        span_links.links = links.into_iter().map(Link::with_context).collect();
        let mut attributes = span.attributes;
        attributes.push(KeyValue::new("warden.run.id", self.run.as_str().to_owned()));
        attributes.push(KeyValue::new("warden.seq", span.seq as i64));
        self.out.push(DerivedSpan {
            end_seq,
            data: SpanData {
                span_context: context(self.placement.trace_id, span.span_id),
                parent_span_id: parent.unwrap_or(SpanId::INVALID),
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: Cow::Owned(span.name),
                start_time: time(span.start_ms),
                end_time: time(end_ms.max(span.start_ms)),
                attributes,
                dropped_attributes_count: 0,
                events,
                links: span_links,
                status,
                instrumentation_scope: scope(),
            },
        });
    }

    fn content(&self, attributes: &mut Vec<KeyValue>, key: &'static str, value: impl Serialize) {
        if self.options.content {
            let text = match serde_json::to_value(&value) {
                Ok(serde_json::Value::String(s)) => s,
                Ok(other) => other.to_string(),
                Err(_) => return,
            };
            attributes.push(KeyValue::new(key, text));
        }
    }

    fn event(&mut self, seq: u64, event: &Event) {
        match event {
            Event::RunStarted(s) => {
                self.now_ms = self.now_ms.max(s.clock_seed_ms);
                let mut attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", s.agent.clone()),
                    KeyValue::new("openinference.span.kind", "AGENT"),
                ];
                if let Some(parent) = &s.parent {
                    attributes.push(KeyValue::new(
                        "warden.parent.run_id",
                        parent.run_id.as_str().to_owned(),
                    ));
                    attributes.push(KeyValue::new(
                        "warden.parent.call_id",
                        parent.call_id.as_str().to_owned(),
                    ));
                }
                self.content(&mut attributes, "input.value", &s.input);
                let name = format!("invoke_agent {}", s.agent);
                self.root = Some(self.open(seq, self.root_span, name, attributes));
            }
            Event::RunForked(f) => {
                // A fork's run span starts at the fork; the source's spans
                // before it are the source's.
                let agent = self
                    .root
                    .as_ref()
                    .and_then(|r| r.name.strip_prefix("invoke_agent "))
                    .unwrap_or("agent")
                    .to_owned();
                let mut attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", agent.clone()),
                    KeyValue::new("openinference.span.kind", "AGENT"),
                    KeyValue::new("warden.fork.source_run", f.source_run.as_str().to_owned()),
                    KeyValue::new("warden.fork.position", f.position as i64),
                    KeyValue::new("warden.fork.by", f.by.clone()),
                ];
                if !f.changed.is_empty() {
                    attributes.push(KeyValue::new("warden.fork.changed", f.changed.join(",")));
                }
                self.now_ms = self.now_ms.max(f.at_ms);
                let mut root = self.open(
                    seq,
                    self.root_span,
                    format!("invoke_agent {agent}"),
                    attributes,
                );
                root.start_ms = f.at_ms;
                self.root = Some(root);
                // Usage inherited is the source's.
                (self.input_tokens, self.output_tokens, self.cost_nanos) = (0, 0, 0);
            }
            Event::ModelCallIntent(i) => {
                let model = i
                    .model
                    .clone()
                    .or_else(|| i.request.as_ref().map(|r| r.model.clone()));
                let mut attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "chat"),
                    KeyValue::new("openinference.span.kind", "LLM"),
                    KeyValue::new("warden.step", i64::from(i.step)),
                    KeyValue::new("warden.attempt", i64::from(i.attempt)),
                ];
                if let Some(provider) = &i.provider {
                    attributes.push(KeyValue::new("gen_ai.system", provider.clone()));
                    attributes.push(KeyValue::new("gen_ai.provider.name", provider.clone()));
                }
                if let Some(model) = &model {
                    attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
                    attributes.push(KeyValue::new("llm.model_name", model.clone()));
                }
                if let Some(request) = &i.request {
                    attributes.push(KeyValue::new(
                        "gen_ai.request.max_tokens",
                        i64::from(request.max_tokens),
                    ));
                    self.content(&mut attributes, "gen_ai.input.messages", &request.messages);
                }
                let name = match &model {
                    Some(m) => format!("chat {m}"),
                    None => "chat".to_owned(),
                };
                let span = self.open(
                    seq,
                    ids::event_span(self.run, "chat", seq),
                    name,
                    attributes,
                );
                self.model = Some(span);
            }
            Event::ModelCallCompleted(c) => {
                if let Some(mut span) = self.model.take() {
                    self.input_tokens += c.usage.input_tokens;
                    self.output_tokens += c.usage.output_tokens;
                    usage(
                        &mut span.attributes,
                        c.usage.input_tokens,
                        c.usage.output_tokens,
                    );
                    span.attributes.push(KeyValue::new(
                        "gen_ai.response.finish_reasons",
                        Value::Array(Array::String(vec![tag(&c.stop_reason).into()])),
                    ));
                    if let Some(cost) = c.cost_nanos {
                        self.cost_nanos += cost;
                        cost_attributes(
                            &mut span.attributes,
                            cost,
                            c.pricing.as_ref().map(|p| p.currency.as_str()),
                        );
                    }
                    if !c.tool_calls.is_empty() {
                        span.attributes.push(KeyValue::new(
                            "warden.tool_calls",
                            c.tool_calls.len() as i64,
                        ));
                    }
                    self.content(&mut span.attributes, "gen_ai.output.messages", &c.text);
                    let end = c.at_ms.unwrap_or(self.now_ms);
                    self.close(span, seq, end, Status::Ok);
                }
            }
            Event::ModelCallFailed(f) => {
                if let Some(mut span) = self.model.take() {
                    let kind = match f.error.status {
                        Some(status) => format!("http_{status}"),
                        None => "provider_error".to_owned(),
                    };
                    span.attributes.push(KeyValue::new("error.type", kind));
                    span.attributes
                        .push(KeyValue::new("warden.error.transient", f.error.transient));
                    let end = f.at_ms.unwrap_or(self.now_ms);
                    self.close(span, seq, end, Status::error(f.error.message.clone()));
                }
            }
            Event::CompactionIntent(i) => {
                let attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "chat"),
                    KeyValue::new("openinference.span.kind", "LLM"),
                    KeyValue::new("warden.step", i64::from(i.step)),
                    KeyValue::new("warden.compaction.upto", i64::from(i.upto)),
                ];
                let span = self.open(
                    seq,
                    ids::event_span(self.run, "compaction", seq),
                    "compact".to_owned(),
                    attributes,
                );
                self.compaction = Some(span);
            }
            Event::CompactionCompleted(c) => {
                if let Some(mut span) = self.compaction.take() {
                    self.input_tokens += c.usage.input_tokens;
                    self.output_tokens += c.usage.output_tokens;
                    usage(
                        &mut span.attributes,
                        c.usage.input_tokens,
                        c.usage.output_tokens,
                    );
                    if let Some(cost) = c.cost_nanos {
                        self.cost_nanos += cost;
                        cost_attributes(
                            &mut span.attributes,
                            cost,
                            c.pricing.as_ref().map(|p| p.currency.as_str()),
                        );
                    }
                    self.close(span, seq, self.now_ms, Status::Ok);
                }
            }
            Event::CompactionFailed(f) => {
                if let Some(span) = self.compaction.take() {
                    self.close(
                        span,
                        seq,
                        self.now_ms,
                        Status::error(f.error.message.clone()),
                    );
                }
            }
            Event::ToolCallIntent(i) => {
                let mut attributes = tool_attributes(&i.tool.model_name(), i.call_id.as_str());
                attributes.push(KeyValue::new("warden.plugin", i.tool.plugin.clone()));
                attributes.push(KeyValue::new("warden.tool", i.tool.tool.clone()));
                attributes.push(KeyValue::new("warden.effect", i.effect.to_string()));
                self.content(&mut attributes, "gen_ai.tool.call.arguments", &i.arguments);
                let span = self.open(
                    seq,
                    ids::tool_span(self.run, i.call_id.as_str()),
                    format!("execute_tool {}", i.tool.model_name()),
                    attributes,
                );
                self.tools.insert(i.call_id.as_str().to_owned(), span);
            }
            Event::ChildStarted(c) => {
                let call = c.call_id.as_str().to_owned();
                if !self.tools.contains_key(&call) {
                    let mut attributes = tool_attributes(&c.agent, &call);
                    attributes.push(KeyValue::new("warden.effect", "write"));
                    self.content(&mut attributes, "gen_ai.tool.call.arguments", &c.input);
                    let span = self.open(
                        seq,
                        ids::tool_span(self.run, &call),
                        format!("execute_tool {}", c.agent),
                        attributes,
                    );
                    self.tools.insert(call.clone(), span);
                }
                if let Some(span) = self.tools.get_mut(&call) {
                    span.attributes.push(KeyValue::new(
                        "warden.child.run_id",
                        c.child_run.as_str().to_owned(),
                    ));
                    span.attributes
                        .push(KeyValue::new("warden.child.agent", c.agent.clone()));
                }
            }
            Event::ExternalCallRequested(r) => {
                let mut attributes = tool_attributes(&r.tool, r.call_id.as_str());
                attributes.push(KeyValue::new("warden.external", true));
                self.content(&mut attributes, "gen_ai.tool.call.arguments", &r.arguments);
                let span = self.open(
                    seq,
                    ids::tool_span(self.run, r.call_id.as_str()),
                    format!("execute_tool {}", r.tool),
                    attributes,
                );
                self.tools.insert(r.call_id.as_str().to_owned(), span);
            }
            Event::ToolCallAttemptFailed(f) => {
                if let Some(span) = self.tools.get_mut(f.call_id.as_str()) {
                    span.events.push(SpanEvent::new(
                        "attempt_failed",
                        time(self.now_ms),
                        vec![
                            KeyValue::new("warden.attempt", i64::from(f.attempt)),
                            KeyValue::new("error.type", tag(&f.error)),
                            KeyValue::new("warden.outcome_unknown", f.outcome_unknown),
                            KeyValue::new("warden.fuel_consumed", f.receipt.fuel_consumed as i64),
                        ],
                        0,
                    ));
                }
            }
            Event::ToolCallCompleted(c) => {
                if let Some(mut span) = self.tools.remove(c.call_id.as_str()) {
                    let r = &c.receipt;
                    span.attributes.extend([
                        KeyValue::new("warden.outcome", tag(&r.outcome)),
                        KeyValue::new("warden.fuel_consumed", r.fuel_consumed as i64),
                        KeyValue::new("warden.peak_memory_bytes", r.peak_memory_bytes as i64),
                        KeyValue::new("warden.lease.wall_time_us", r.wall_time_us as i64),
                    ]);
                    let status = self.tool_result(&mut span, &c.result);
                    let end = span.start_ms + r.wall_time_us.div_ceil(1000);
                    self.close(span, seq, end, status);
                }
            }
            Event::ChildFinished(f) => {
                if let Some(mut span) = self.tools.remove(f.call_id.as_str()) {
                    span.attributes
                        .push(KeyValue::new("warden.child.status", f.status.to_string()));
                    let status = self.tool_result(&mut span, &f.result);
                    self.close(span, seq, self.now_ms, status);
                }
            }
            Event::ToolCallResolved(r) => {
                if let Some(mut span) = self.tools.remove(r.call_id.as_str()) {
                    span.attributes
                        .push(KeyValue::new("warden.outcome", "resolved"));
                    span.attributes
                        .push(KeyValue::new("warden.resolved_by", r.by.clone()));
                    self.content(&mut span.attributes, "gen_ai.tool.call.result", &r.output);
                    self.close(span, seq, self.now_ms, Status::Ok);
                }
            }
            Event::ExternalCallCompleted(c) => {
                if let Some(mut span) = self.tools.remove(c.call_id.as_str()) {
                    span.attributes.push(KeyValue::new("warden.outcome", "ok"));
                    self.content(&mut span.attributes, "gen_ai.tool.call.result", &c.output);
                    self.close(span, seq, self.now_ms, Status::Ok);
                }
            }
            Event::ToolCallDeduplicated(d) => {
                let mut attributes = tool_attributes("", d.call_id.as_str());
                attributes.push(KeyValue::new("warden.outcome", "deduplicated"));
                attributes.push(KeyValue::new(
                    "warden.origin.run_id",
                    d.origin_run.as_str().to_owned(),
                ));
                attributes.push(KeyValue::new(
                    "warden.origin.call_id",
                    d.origin_call.as_str().to_owned(),
                ));
                let span = self.open(
                    seq,
                    ids::tool_span(self.run, d.call_id.as_str()),
                    "execute_tool".to_owned(),
                    attributes,
                );
                self.close(span, seq, self.now_ms, Status::Ok);
            }
            Event::ToolCallRejected(r) => {
                let mut attributes = tool_attributes("", r.call_id.as_str());
                attributes.push(KeyValue::new("warden.outcome", "rejected"));
                attributes.push(KeyValue::new("error.type", tag(&r.error)));
                let span = self.open(
                    seq,
                    ids::tool_span(self.run, r.call_id.as_str()),
                    "execute_tool".to_owned(),
                    attributes,
                );
                self.close(span, seq, self.now_ms, Status::error(r.error.to_string()));
            }
            Event::ApprovalRequested(r) => {
                if let Some(ms) = r.at_ms {
                    self.now_ms = self.now_ms.max(ms);
                }
                let mut attributes = vec![
                    KeyValue::new("openinference.span.kind", "CHAIN"),
                    KeyValue::new("gen_ai.tool.name", r.tool.model_name()),
                    KeyValue::new("gen_ai.tool.call.id", r.call_id.as_str().to_owned()),
                    KeyValue::new("warden.plugin", r.tool.plugin.clone()),
                ];
                if let Some(effect) = r.effect {
                    attributes.push(KeyValue::new("warden.effect", effect.to_string()));
                }
                let span = self.open(
                    seq,
                    ids::event_span(self.run, "approval", seq),
                    format!("await_approval {}", r.tool.model_name()),
                    attributes,
                );
                self.approvals.insert(r.call_id.as_str().to_owned(), span);
            }
            Event::ApprovalGranted(g) => {
                if let Some(mut span) = self.approvals.remove(g.call_id.as_str()) {
                    span.attributes
                        .push(KeyValue::new("warden.approval", "granted"));
                    span.attributes
                        .push(KeyValue::new("warden.approval.by", g.by.clone()));
                    if let Some(rule) = &g.rule {
                        span.attributes
                            .push(KeyValue::new("warden.approval.rule", rule.id.clone()));
                    }
                    self.close(span, seq, self.now_ms, Status::Ok);
                }
            }
            Event::ApprovalDenied(d) => {
                if let Some(mut span) = self.approvals.remove(d.call_id.as_str()) {
                    span.attributes
                        .push(KeyValue::new("warden.approval", "denied"));
                    span.attributes
                        .push(KeyValue::new("warden.approval.by", d.by.clone()));
                    self.close(span, seq, self.now_ms, Status::Ok);
                }
            }
            Event::Suspended(s) => self.park(
                seq,
                "await_input",
                vec![KeyValue::new("warden.reason", s.reason.clone())],
            ),
            Event::Resumed(_) => self.unpark(seq, "await_input"),
            Event::WaitStarted(w) => self.park(
                seq,
                "durable_wait",
                vec![
                    KeyValue::new("warden.step", i64::from(w.step)),
                    KeyValue::new("warden.wait.until_ms", w.until_ms as i64),
                ],
            ),
            Event::WaitEnded(_) => self.unpark(seq, "durable_wait"),
            Event::BudgetExceeded(b) => self.park(
                seq,
                "budget_park",
                vec![
                    KeyValue::new("warden.budget", b.budget.to_string()),
                    KeyValue::new("warden.budget.used", b.used as i64),
                    KeyValue::new("warden.budget.limit", b.limit as i64),
                ],
            ),
            Event::BudgetExtended(_) => self.unpark(seq, "budget_park"),
            Event::DeliveryIntent(d) => {
                let attributes = vec![
                    KeyValue::new("openinference.span.kind", "CHAIN"),
                    KeyValue::new("warden.channel", d.channel.clone()),
                    KeyValue::new("warden.delivery.id", d.delivery_id.clone()),
                    KeyValue::new("warden.delivery.kind", d.kind.clone()),
                ];
                let span = self.open(
                    seq,
                    ids::event_span(self.run, "delivery", seq),
                    format!("deliver {}", d.channel),
                    attributes,
                );
                self.deliveries.insert(d.delivery_id.clone(), span);
            }
            Event::DeliveryAttemptFailed(f) => {
                if let Some(span) = self.deliveries.get_mut(&f.delivery_id) {
                    span.events.push(SpanEvent::new(
                        "attempt_failed",
                        time(self.now_ms),
                        vec![
                            KeyValue::new("warden.attempt", i64::from(f.attempt)),
                            KeyValue::new("warden.retry_at_ms", f.retry_at_ms as i64),
                        ],
                        0,
                    ));
                }
            }
            Event::DeliveryCompleted(c) => {
                if let Some(mut span) = self.deliveries.remove(&c.delivery_id) {
                    span.attributes
                        .push(KeyValue::new("warden.attempt", i64::from(c.attempt)));
                    span.attributes.push(KeyValue::new(
                        "warden.fuel_consumed",
                        c.receipt.fuel_consumed as i64,
                    ));
                    let end = span.start_ms + c.receipt.wall_time_us.div_ceil(1000);
                    self.close(span, seq, end, Status::Ok);
                }
            }
            Event::DeliveryFailed(f) => {
                if let Some(mut span) = self.deliveries.remove(&f.delivery_id) {
                    span.attributes
                        .push(KeyValue::new("warden.attempts", i64::from(f.attempts)));
                    self.close(span, seq, self.now_ms, Status::error(tag(&f.error)));
                }
            }
            Event::RunCompleted(c) => {
                let mut output = Vec::new();
                self.content(&mut output, "output.value", &c.output);
                self.finish(seq, "completed", Status::Ok, output);
            }
            Event::RunFailed(f) => {
                let attributes = vec![KeyValue::new("error.type", tag(&f.error))];
                self.finish(
                    seq,
                    "failed",
                    Status::error(f.error.to_string()),
                    attributes,
                );
            }
            Event::RunCancelled(c) => {
                let reason = c.reason.clone().unwrap_or_else(|| "cancelled".to_owned());
                self.finish(seq, "cancelled", Status::error(reason), Vec::new());
            }
            Event::RunAbandoned(a) => {
                self.finish(
                    seq,
                    "abandoned",
                    Status::error(a.reason.clone()),
                    Vec::new(),
                );
            }
            _ => {}
        }
    }

    /// Records a tool call's result on its span; its status.
    fn tool_result(&self, span: &mut Open, result: &ToolCallResult) -> Status {
        match result {
            ToolCallResult::Output(output) => {
                let mut attributes = std::mem::take(&mut span.attributes);
                self.content(&mut attributes, "gen_ai.tool.call.result", output);
                span.attributes = attributes;
                Status::Ok
            }
            ToolCallResult::Error(e) => {
                span.attributes.push(KeyValue::new("error.type", tag(e)));
                Status::error(e.to_string())
            }
        }
    }

    fn park(&mut self, seq: u64, kind: &'static str, mut attributes: Vec<KeyValue>) {
        attributes.push(KeyValue::new("openinference.span.kind", "CHAIN"));
        let span = self.open(
            seq,
            ids::event_span(self.run, kind, seq),
            kind.to_owned(),
            attributes,
        );
        self.parks.insert(kind, span);
    }

    fn unpark(&mut self, seq: u64, kind: &'static str) {
        if let Some(span) = self.parks.remove(kind) {
            self.close(span, seq, self.now_ms, Status::Ok);
        }
    }

    /// The run ended at `seq`: its span closes, and so does every wait it
    /// ended in (a run abandoned while parked).
    fn finish(&mut self, seq: u64, status_name: &str, status: Status, extra: Vec<KeyValue>) {
        for (_, span) in std::mem::take(&mut self.parks) {
            self.close(span, seq, self.now_ms, Status::Ok);
        }
        for (_, span) in std::mem::take(&mut self.approvals) {
            self.close(span, seq, self.now_ms, Status::Ok);
        }
        let Some(mut root) = self.root.take() else {
            return;
        };
        root.attributes
            .push(KeyValue::new("warden.run.status", status_name.to_owned()));
        usage(&mut root.attributes, self.input_tokens, self.output_tokens);
        if self.cost_nanos > 0 {
            root.attributes
                .push(KeyValue::new("warden.cost_nanos", self.cost_nanos as i64));
        }
        root.attributes.extend(extra);
        let links = self.placement.links.clone();
        let parent = self.placement.parent;
        self.close_under(root, seq, self.now_ms, status, parent, links);
    }
}

fn tool_attributes(name: &str, call_id: &str) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("openinference.span.kind", "TOOL"),
        KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()),
    ];
    if !name.is_empty() {
        attributes.push(KeyValue::new("gen_ai.tool.name", name.to_owned()));
    }
    attributes
}

fn usage(attributes: &mut Vec<KeyValue>, input: u64, output: u64) {
    attributes.push(KeyValue::new("gen_ai.usage.input_tokens", input as i64));
    attributes.push(KeyValue::new("gen_ai.usage.output_tokens", output as i64));
}

fn cost_attributes(attributes: &mut Vec<KeyValue>, cost_nanos: u64, currency: Option<&str>) {
    attributes.push(KeyValue::new("warden.cost_nanos", cost_nanos as i64));
    if let Some(currency) = currency {
        attributes.push(KeyValue::new("warden.cost.currency", currency.to_owned()));
    }
}

/// A serialized enum's name: a unit variant's string, or a tagged one's
/// `kind`.
fn tag(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(serde_json::Value::Object(o)) => match o.get("kind") {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => o.keys().next().cloned().unwrap_or_default(),
        },
        _ => String::new(),
    }
}

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("warden")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_engine::events::decode;

    const RECEIPT: &str = r#"{"outcome":"ok","fuel_consumed":1000,"peak_memory_bytes":65536,"wall_time_us":2500,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0}"#;

    /// A run that asks the model, waits for approval of a write, runs it,
    /// asks again and completes: `run_id`'s log as stored.
    fn log(run_id: &str) -> Vec<Event> {
        [
            format!(
                r#"{{"v":1,"event":{{"type":"run_started","run_id":"{run_id}","agent":"notes","agent_digest":"ab12","input":"secret input","clock_seed_ms":1000,"random_seed":2}}}}"#
            ),
            r#"{"v":1,"event":{"type":"model_call_intent","step":1,"attempt":1,"request_hash":"cd","provider":"openai","model":"gpt-x"}}"#.into(),
            r#"{"v":1,"event":{"type":"model_call_completed","step":1,"text":"writing","tool_calls":[{"id":"c1","name":"fs__write_file","arguments":{"path":"a.txt"}}],"usage":{"input_tokens":120,"output_tokens":9},"cost_nanos":495000,"pricing":{"currency":"USD","input_micros_per_million":3000000,"output_micros_per_million":15000000},"stop_reason":"tool_use","at_ms":1400}}"#.into(),
            r#"{"v":1,"event":{"type":"approval_requested","call_id":"call-1-1","tool":{"plugin":"fs","tool":"write_file"},"effect":"write","at_ms":1500}}"#.into(),
            r#"{"v":1,"event":{"type":"approval_granted","call_id":"call-1-1","by":"alice","at_ms":9000}}"#.into(),
            r#"{"v":1,"event":{"type":"tool_call_intent","call_id":"call-1-1","tool":{"plugin":"fs","tool":"write_file"},"arguments":{"path":"a.txt"},"effect":"write","idempotency_key":"9f"}}"#.into(),
            format!(
                r#"{{"v":1,"event":{{"type":"tool_call_completed","call_id":"call-1-1","result":{{"output":{{"written":2}}}},"receipt":{RECEIPT}}}}}"#
            ),
            r#"{"v":1,"event":{"type":"model_call_intent","step":2,"attempt":1,"request_hash":"ef","provider":"openai","model":"gpt-x"}}"#.into(),
            r#"{"v":1,"event":{"type":"model_call_completed","step":2,"text":"done","usage":{"input_tokens":200,"output_tokens":3},"stop_reason":"end_turn","at_ms":9500}}"#.into(),
            r#"{"v":1,"event":{"type":"run_completed","output":"done"}}"#.into(),
        ]
        .iter()
        .map(|line| decode(line.as_bytes()).unwrap())
        .collect()
    }

    fn run(id: &str) -> RunId {
        RunId::new(id).unwrap()
    }

    fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    fn named<'a>(spans: &'a [DerivedSpan], name: &str) -> &'a SpanData {
        &spans
            .iter()
            .find(|s| s.data.name == name)
            .unwrap_or_else(|| panic!("no span {name}"))
            .data
    }

    #[test]
    fn a_log_reads_as_a_run_span_over_its_calls_and_waits() {
        let r = run("r1");
        let spans = derive(&r, &log("r1"), &Placement::root(&r), SpanOptions::default());
        let names: Vec<_> = spans.iter().map(|s| s.data.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "chat gpt-x",
                "await_approval fs__write_file",
                "execute_tool fs__write_file",
                "chat gpt-x",
                "invoke_agent notes"
            ]
        );
        let root = named(&spans, "invoke_agent notes");
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert_eq!(root.span_context.span_id(), ids::run_span(&r));
        assert_eq!(root.span_context.trace_id(), ids::trace_id(&r));
        for span in spans.iter().filter(|s| s.data.name != "invoke_agent notes") {
            assert_eq!(span.data.parent_span_id, ids::run_span(&r));
            assert_eq!(span.data.span_context.trace_id(), ids::trace_id(&r));
        }
        let chat = &spans[0].data;
        assert_eq!(attr(chat, "gen_ai.system").unwrap().as_str(), "openai");
        assert_eq!(
            attr(chat, "gen_ai.request.model").unwrap().as_str(),
            "gpt-x"
        );
        assert_eq!(
            attr(chat, "gen_ai.usage.input_tokens"),
            Some(&Value::I64(120))
        );
        assert_eq!(attr(chat, "warden.cost_nanos"), Some(&Value::I64(495_000)));
        assert_eq!(attr(chat, "warden.cost.currency").unwrap().as_str(), "USD");
        assert_eq!(chat.start_time, time(1000));
        assert_eq!(chat.end_time, time(1400));
        let wait = named(&spans, "await_approval fs__write_file");
        assert_eq!((wait.start_time, wait.end_time), (time(1500), time(9000)));
        assert_eq!(attr(wait, "warden.approval.by").unwrap().as_str(), "alice");
        let tool = named(&spans, "execute_tool fs__write_file");
        assert_eq!(tool.span_context.span_id(), ids::tool_span(&r, "call-1-1"));
        assert_eq!(attr(tool, "warden.effect").unwrap().as_str(), "write");
        assert_eq!(attr(tool, "warden.fuel_consumed"), Some(&Value::I64(1000)));
        // The lease's 2.5 ms, rounded up.
        assert_eq!(tool.end_time, time(9003));
        assert_eq!(
            attr(root, "gen_ai.usage.input_tokens"),
            Some(&Value::I64(320))
        );
        assert_eq!(
            attr(root, "warden.run.status").unwrap().as_str(),
            "completed"
        );
        // No content unless asked.
        assert!(spans.iter().all(|s| s.data.attributes.iter().all(|kv| {
            !kv.value.as_str().contains("secret input")
                && kv.key.as_str() != "gen_ai.output.messages"
        })));
        let with = derive(
            &r,
            &log("r1"),
            &Placement::root(&r),
            SpanOptions { content: true },
        );
        let root = named(&with, "invoke_agent notes");
        assert_eq!(attr(root, "input.value").unwrap().as_str(), "secret input");
        assert_eq!(attr(root, "output.value").unwrap().as_str(), "done");
    }

    #[test]
    fn spans_close_with_their_events_and_keep_their_ids_however_often_derived() {
        let r = run("r1");
        let full = derive(&r, &log("r1"), &Placement::root(&r), SpanOptions::default());
        // Up to the approval: only the first model call is complete.
        let partial = derive(
            &r,
            &log("r1")[..4],
            &Placement::root(&r),
            SpanOptions::default(),
        );
        assert_eq!(partial.len(), 1);
        assert_eq!(partial[0].end_seq, 3);
        assert_eq!(partial[0].data.span_context, full[0].data.span_context);
        // What closes after position 4 is everything else, once.
        let rest: Vec<_> = full.iter().filter(|s| s.end_seq > 3).collect();
        assert_eq!(rest.len(), full.len() - 1);
        let again = derive(&r, &log("r1"), &Placement::root(&r), SpanOptions::default());
        let ids = |s: &[DerivedSpan]| {
            s.iter()
                .map(|s| s.data.span_context.span_id())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&again), ids(&full));
        // Another run's spans have other ids.
        let other = derive(
            &run("r2"),
            &log("r2"),
            &Placement::root(&run("r2")),
            SpanOptions::default(),
        );
        assert!(ids(&other).iter().all(|id| !ids(&full).contains(id)));
    }

    #[test]
    fn a_fork_holds_only_what_it_did_after_the_fork_point() {
        // The source's first four events, then the fork: the approval and
        // everything after are the fork's.
        let mut fork = log("r1")[..4].to_vec();
        fork.push(
            decode(br#"{"v":1,"event":{"type":"run_forked","run_id":"f1","source_run":"r1","position":4,"source_head":"ab","agent_digest":"cd","limits":{"budgets":{},"max_input_bytes":100},"by":"ops","at_ms":5000}}"#)
                .unwrap(),
        );
        fork.extend(log("r1")[4..].iter().cloned());
        let f = run("f1");
        let mut placement = Placement::root(&f);
        placement.links.push(context(
            ids::trace_id(&run("r1")),
            ids::run_span(&run("r1")),
        ));
        let spans = derive(&f, &fork, &placement, SpanOptions::default());
        let names: Vec<_> = spans.iter().map(|s| s.data.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "await_approval fs__write_file",
                "execute_tool fs__write_file",
                "chat gpt-x",
                "invoke_agent notes"
            ]
        );
        let root = named(&spans, "invoke_agent notes");
        assert_eq!(root.start_time, time(5000));
        assert_eq!(root.span_context.trace_id(), ids::trace_id(&f));
        assert_eq!(root.links.links.len(), 1);
        assert_eq!(attr(root, "warden.fork.source_run").unwrap().as_str(), "r1");
        assert_eq!(
            named(&spans, "execute_tool fs__write_file")
                .span_context
                .span_id(),
            ids::tool_span(&f, "call-1-1")
        );
    }
}
