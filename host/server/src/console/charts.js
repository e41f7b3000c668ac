// The console's pictures, drawn by uPlot (vendored: vendor/uplot/README.md):
// a run's timeline (its model calls, tool calls, approval waits, retries,
// children and timers as bars on a time axis) and the overview of many
// runs. Each chart comes with its figures as a table, for keyboards,
// screen readers and exact numbers.

import uPlot from "/console/vendor/uplot/uPlot.esm.js";
import { cost, count, duration, utc } from "/console/format.js";

// The timeline's lanes, top to bottom, and their colours.
export const LANES = [
  ["model", "model calls", "#0b57d0"],
  ["tool", "tool calls", "#1a7f37"],
  ["retry", "retries", "#cf222e"],
  ["approval", "approval waits", "#9a6700"],
  ["input", "input waits", "#8250df"],
  ["child", "child runs", "#bc4c00"],
  ["wait", "timers", "#5b6470"],
];

// The time an event carries, if any (the clock readings the engine
// records; see `Event::clock_reading`).
function reading(event) {
  if (event.type === "run_started") return event.clock_seed_ms ?? null;
  return typeof event.at_ms === "number" ? event.at_ms : null;
}

// A run's spans from its event lines: `{lane, label, start, end, seq}`,
// times in ms. An event without a time of its own happened at the last
// time read before it; a tool call lasts what its receipt says.
export function runSpans(lines) {
  const spans = [];
  const open = new Map();
  const tools = new Map();
  let now = null;
  const start = (key, lane, label, seq) => open.set(key, { lane, label, start: now, seq });
  const end = (key, at = now) => {
    const span = open.get(key);
    if (!span) return;
    open.delete(key);
    if (span.start !== null && at !== null) spans.push({ ...span, end: Math.max(at, span.start) });
  };
  for (const { seq, event } of lines) {
    const at = reading(event);
    if (at !== null) now = at;
    const name = (t) => (t ? `${t.plugin}__${t.tool}` : "tool");
    switch (event.type) {
      case "model_call_intent":
        start(`model:${event.step}`, "model", `model call, step ${event.step}`, seq);
        break;
      case "model_call_completed":
        end(`model:${event.step}`);
        break;
      case "model_call_failed":
        end(`model:${event.step}`);
        if (event.retry_at_ms && now !== null) {
          spans.push({ lane: "retry", label: `model retry, step ${event.step}`, start: now, end: event.retry_at_ms, seq });
        }
        break;
      case "tool_call_intent":
        tools.set(event.call_id, name(event.tool));
        break;
      case "tool_call_attempt_failed":
      case "tool_call_completed": {
        const us = event.receipt?.wall_time_us ?? 0;
        if (now === null) break;
        const label = `${tools.get(event.call_id) ?? event.call_id}${event.type === "tool_call_attempt_failed" ? ` attempt ${event.attempt} failed` : ""}`;
        const lane = event.type === "tool_call_attempt_failed" ? "retry" : "tool";
        spans.push({ lane, label, start: now, end: now + us / 1000, seq });
        break;
      }
      case "approval_requested":
        start(`approval:${event.call_id}`, "approval", `approval of ${name(event.tool)}`, seq);
        break;
      case "approval_granted":
      case "approval_denied":
      case "approval_withdrawn":
        end(`approval:${event.call_id}`);
        break;
      case "suspended":
        start(`input:${event.call_id}`, "input", `input for ${event.call_id}`, seq);
        break;
      case "resumed":
        end(`input:${event.call_id}`);
        break;
      case "child_started":
        start(`child:${event.child_run}`, "child", `child ${event.child_run} (${event.agent})`, seq);
        break;
      case "child_finished":
        end(`child:${event.child_run}`);
        break;
      case "wait_started":
        start(`wait:${event.step}`, "wait", `timer, step ${event.step}`, seq);
        break;
      case "wait_ended":
        end(`wait:${event.step}`);
        break;
      default:
    }
  }
  // What is still open (a wait, a child still running) lasts until the
  // last time read.
  for (const key of [...open.keys()]) end(key);
  return spans.sort((a, b) => a.start - b.start);
}

function sized(container, height) {
  return { width: Math.max(container.clientWidth || 320, 240), height };
}

// Keeps a chart as wide as its container (narrow screens included).
function follow(container, chart, height) {
  const observer = new ResizeObserver(() => chart.setSize(sized(container, height)));
  observer.observe(container);
  return () => {
    observer.disconnect();
    chart.destroy();
  };
}

function table(caption, head, rows) {
  const t = document.createElement("table");
  const c = t.createCaption();
  c.textContent = caption;
  const tr = t.createTHead().insertRow();
  for (const h of head) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    tr.append(th);
  }
  const body = t.createTBody();
  for (const row of rows) {
    const r = body.insertRow();
    for (const cell of row) r.insertCell().append(cell instanceof Node ? cell : document.createTextNode(String(cell)));
  }
  return t;
}

function figure(label) {
  const fig = document.createElement("figure");
  fig.className = "chart";
  fig.setAttribute("aria-label", label);
  const plot = document.createElement("div");
  plot.className = "plot";
  fig.append(plot);
  return [fig, plot];
}

// The run's timeline chart: one lane per kind of span, time across.
// Returns the figure (chart and its table) and a function that removes it.
export function timelineChart(spans) {
  const [fig, plot] = figure("Timeline chart");
  fig.id = "timeline-chart";
  const lanes = LANES.filter(([lane]) => spans.some((s) => s.lane === lane));
  if (!spans.length) {
    fig.append(document.createTextNode("No timed steps yet."));
    return [fig, () => {}];
  }
  const first = Math.min(...spans.map((s) => s.start));
  const last = Math.max(...spans.map((s) => s.end));
  // A bar too short to see is drawn a sliver wide.
  const sliver = Math.max((last - first) / 200, 1);
  const shown = spans.map((s) => ({ ...s, end: Math.max(s.end, s.start + sliver) }));
  const xs = [...new Set(shown.flatMap((s) => [s.start, s.end]))].sort((a, b) => a - b);
  const data = [xs];
  for (const [i, [lane]] of lanes.entries()) {
    const mine = shown.filter((s) => s.lane === lane);
    data.push(xs.map((x) => (mine.some((s) => s.start <= x && x <= s.end) ? lanes.length - i : null)));
  }
  const height = 60 + lanes.length * 34;
  const opts = {
    ...sized(plot, height),
    ms: 1,
    legend: { show: false },
    cursor: { y: false, points: { show: false } },
    scales: { x: { time: true }, y: { range: [0.4, lanes.length + 0.6] } },
    axes: [
      {},
      {
        size: 110,
        splits: () => lanes.map((_, i) => lanes.length - i),
        values: (_, splits) => splits.map((v) => lanes[lanes.length - v]?.[1] ?? ""),
        grid: { show: false },
      },
    ],
    series: [
      {},
      ...lanes.map(([, label, colour]) => ({
        label,
        stroke: colour,
        width: 14,
        spanGaps: false,
        points: { show: false },
      })),
    ],
  };
  const chart = new uPlot(opts, data, plot);
  fig.append(
    table(
      "Timed steps",
      ["#", "what", "started", "took"],
      spans.map((s) => [`#${s.seq}`, s.label, utc(s.start), duration(s.end - s.start)]),
    ),
  );
  return [fig, follow(plot, chart, height)];
}

// Status groups, drawn stacked in this order (bottom first).
const GROUPS = [
  ["completed", ["completed"], "#1a7f37"],
  ["running", ["running", "queued"], "#0b57d0"],
  ["parked", ["awaiting_approval", "suspended", "awaiting_external", "awaiting_child", "budget_exceeded", "waiting", "needs_reconciliation"], "#9a6700"],
  ["failed", ["failed", "cancelled", "abandoned"], "#cf222e"],
];

function bars(align = 0, size = 0.6) {
  return uPlot.paths.bars({ size: [size, 60], align });
}

// Runs started per stretch of time, stacked by status group.
export function statusChart(statuses) {
  const [fig, plot] = figure("Runs by status over time");
  fig.id = "status-chart";
  const xs = statuses.starts_ms || [];
  if (!xs.length) {
    fig.append(document.createTextNode("No runs yet."));
    return [fig, () => {}];
  }
  const per = GROUPS.map(([, names]) => xs.map((_, i) => names.reduce((n, s) => n + (statuses.counts[s]?.[i] ?? 0), 0)));
  // Stacked: each series is its group plus those below it, drawn from the
  // tallest down so each shows above the next.
  const stacked = per.map((_, g) => xs.map((_, i) => per.slice(0, g + 1).reduce((n, p) => n + p[i], 0)));
  const order = GROUPS.map((_, g) => g).reverse();
  const height = 240;
  const chart = new uPlot(
    {
      ...sized(plot, height),
      ms: 1,
      scales: { x: { time: true, range: (_, min, max) => [min - statuses.bucket_ms / 2, max + statuses.bucket_ms / 2] } },
      axes: [{}, { size: 60, values: (_, splits) => splits.map((v) => count(v)) }],
      series: [
        { label: "from", value: (_, v) => (v === null ? "" : utc(v)) },
        ...order.map((g) => ({
          label: GROUPS[g][0],
          fill: GROUPS[g][2],
          stroke: GROUPS[g][2],
          paths: bars(0, 0.8),
          points: { show: false },
          value: (u, _v, _s, i) => (i === null ? "" : count(per[g][i])),
        })),
      ],
    },
    [xs, ...order.map((g) => stacked[g])],
    plot,
  );
  // A long table: folded under the chart until asked for.
  const figures = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "the figures";
  figures.append(
    summary,
    table(
      `Runs started per ${duration(statuses.bucket_ms)}`,
      ["from", ...GROUPS.map(([name]) => name)],
      xs.map((x, i) => [utc(x), ...per.map((p) => count(p[i]))]),
    ),
  );
  fig.append(figures);
  return [fig, follow(plot, chart, height)];
}

// Bars by category (agents, tools): two measures, each on its own axis.
function categoryChart(id, label, names, first, second) {
  const [fig, plot] = figure(label);
  fig.id = id;
  if (!names.length) {
    fig.append(document.createTextNode("Nothing to show yet."));
    return [fig, () => {}];
  }
  const xs = names.map((_, i) => i);
  const height = 240;
  const chart = new uPlot(
    {
      ...sized(plot, height),
      scales: { x: { time: false, range: [-0.5, names.length - 0.5] }, a: {}, b: {} },
      axes: [
        { splits: () => xs, values: (_, splits) => splits.map((i) => names[i] ?? ""), grid: { show: false } },
        { scale: "a", size: 80, values: (_, splits) => splits.map((v) => first.tick(v)), stroke: first.colour },
        { scale: "b", size: 80, side: 1, values: (_, splits) => splits.map((v) => second.tick(v)), stroke: second.colour, grid: { show: false } },
      ],
      series: [
        { label: "", value: (_, i) => names[i] ?? "" },
        { label: first.label, scale: "a", fill: first.colour, stroke: first.colour, paths: bars(-1, 0.35), points: { show: false }, value: (_, v) => (v === null ? "" : first.text(v)) },
        { label: second.label, scale: "b", fill: second.colour, stroke: second.colour, paths: bars(1, 0.35), points: { show: false }, value: (_, v) => (v === null ? "" : second.text(v)) },
      ],
    },
    [xs, first.values, second.values],
    plot,
  );
  fig.append(table(label, ["", first.label, second.label], names.map((n, i) => [n, first.text(first.values[i]), second.text(second.values[i])])));
  return [fig, follow(plot, chart, height)];
}

// Cost and tokens per agent.
export function agentChart(agents) {
  const currency = agents.find((a) => a.currency && a.currency !== "mixed")?.currency;
  return categoryChart(
    "agent-chart",
    "Cost and tokens per agent",
    agents.map((a) => a.agent),
    {
      label: "cost",
      colour: "#0b57d0",
      values: agents.map((a) => a.cost_nanos),
      text: (v) => cost(v, currency),
      tick: (v) => cost(v, currency),
    },
    {
      label: "tokens",
      colour: "#9a6700",
      values: agents.map((a) => a.input_tokens + a.output_tokens),
      text: count,
      tick: count,
    },
  );
}

// The slowest tools: their longest and their mean call.
export function toolChart(tools) {
  return categoryChart(
    "tool-chart",
    "Slowest tools",
    tools.map((t) => t.tool),
    { label: "longest", colour: "#cf222e", values: tools.map((t) => t.max_ms), text: duration, tick: duration },
    { label: "mean", colour: "#1a7f37", values: tools.map((t) => t.mean_ms), text: duration, tick: duration },
  );
}
