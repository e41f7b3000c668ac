// The Warden console: a page over the JSON API (/api/v1), no framework.
// Every value from a run is set as text (never as markup). The session is
// an HttpOnly cookie; this script holds only the session's CSRF token,
// sent on every request that changes something.

import { amount, cost, count, duration, relative, utc } from "/console/format.js";
import { agentChart, runSpans, statusChart, timelineChart, toolChart } from "/console/charts.js";

const session = { csrf: null, name: null, role: null };
let cleanup = [];

// ---- small helpers ---------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function json(value) {
  return el("pre", {}, JSON.stringify(value, null, 2));
}

function when(ms) {
  return ms ? utc(ms) : "";
}

// A time as text, with how long ago (or until) it is as its title.
function time(ms) {
  return ms ? el("time", { datetime: new Date(ms).toISOString(), title: relative(ms) }, utc(ms)) : "";
}

function statusBadge(status) {
  return el("span", { class: `status ${status}` }, status.replaceAll("_", " "));
}

function notice(message) {
  document.getElementById("notice").textContent = message || "";
}

class ApiError extends Error {
  constructor(status, error) {
    super(error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = error?.code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-Warden-CSRF"] = session.csrf || "";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = new ApiError(response.status, data?.error);
    if (response.status === 401 && !path.startsWith("/console/")) showLogin(error.message);
    throw error;
  }
  return data;
}

// Runs an action from a button: disables it meanwhile, shows what failed.
async function act(button, work) {
  button.disabled = true;
  notice("");
  try {
    await work();
  } catch (error) {
    notice(error.code ? `${error.code}: ${error.message}` : error.message);
  } finally {
    button.disabled = false;
  }
}

function every(ms, work) {
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    try {
      await work();
    } catch (error) {
      if (error.status !== 401) notice(error.message);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  let timer = setTimeout(tick, 0);
  cleanup.push(() => {
    stopped = true;
    clearTimeout(timer);
  });
}

// The statuses in which a run waits for a person (what the inbox holds).
const PARKED = ["awaiting_approval", "suspended", "budget_exceeded", "needs_reconciliation"];
// Parked for something else: a timer, the application, a child run.
const WAITING = ["waiting", "awaiting_external", "awaiting_child"];
const TERMINAL = ["completed", "failed", "cancelled", "abandoned"];
const STATUSES = [...PARKED, ...WAITING, "running", "queued", ...TERMINAL];
// Events that only record what the engine read (the clock, randomness):
// folded away in the timeline unless asked for.
const NOISE = ["clock_observed", "random_observed"];

// ---- login ------------------------------------------------------------------

function showLogin(message) {
  session.csrf = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("me").hidden = true;
  stopView();
  const input = el("input", { type: "password", name: "token", autocomplete: "current-password", required: true });
  const form = el(
    "form",
    { class: "stack login", "aria-label": "Log in" },
    el("h1", {}, "Log in"),
    el("p", { class: "muted" }, "A token from `warden serve tokens add NAME --role ROLE`."),
    el("label", {}, "Token", input),
    el("button", { type: "submit", class: "primary" }, "Log in"),
    message ? el("p", { role: "alert" }, message) : null,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const me = await api("POST", "/console/login", { token: input.value });
      input.value = "";
      signedIn(me);
    } catch (error) {
      showLogin(error.code === "rate_limited" ? error.message : "That token was not accepted.");
    }
  });
  const view = document.getElementById("view");
  view.replaceChildren(form);
  input.focus();
}

function signedIn(me) {
  Object.assign(session, { csrf: me.csrf, name: me.name, role: me.role });
  document.getElementById("nav").hidden = false;
  document.getElementById("me").hidden = false;
  document.getElementById("me-name").textContent = `${me.name} (${me.role})`;
  route();
}

// ---- views --------------------------------------------------------------------

function stopView() {
  for (const stop of cleanup) stop();
  cleanup = [];
}

// The runs list's query, as the page's address carries it
// (`#/runs?q=…&status=…`), so a search can be linked, reloaded and gone
// back to.
function runsQuery() {
  const [, query = ""] = (location.hash || "").split("?");
  return new URLSearchParams(query);
}

// What the search box holds, as the API's filters: `key=value` is a
// label, anything else the start of a run id.
function searchFilters(text, params) {
  const words = text.trim().split(/\s+/).filter(Boolean);
  const labels = words.filter((w) => w.includes("="));
  if (labels.length) params.set("label", labels.join(","));
  const id = words.find((w) => !w.includes("="));
  if (id) params.set("id_prefix", id);
}

// A `datetime-local` field's value as ms since the epoch (UTC), or "".
function fieldMs(value) {
  return value ? String(Date.parse(`${value}Z`)) : "";
}

function msField(ms) {
  return ms ? new Date(Number(ms)).toISOString().slice(0, 16) : "";
}

function runsView(view) {
  const q = runsQuery();
  const search = el("input", {
    type: "search",
    name: "q",
    id: "search",
    value: q.get("q") || "",
    placeholder: "run id, or label key=value",
    "aria-label": "Search runs by id or label",
    "aria-keyshortcuts": "/",
  });
  const status = el(
    "select",
    { name: "status", "aria-label": "Status" },
    el("option", { value: "" }, "every status"),
    el("option", { value: PARKED.join(",") }, "waiting for a person"),
    el("option", { value: [...PARKED, ...WAITING].join(",") }, "every parked kind"),
    STATUSES.map((s) => el("option", { value: s }, s.replaceAll("_", " "))),
  );
  status.value = q.get("status") || "";
  const agent = el("input", { name: "agent", value: q.get("agent") || "", "aria-label": "Agent", placeholder: "agent" });
  const sessionField = el("input", { name: "session", value: q.get("session") || "", "aria-label": "Session", placeholder: "session" });
  const since = el("input", { type: "datetime-local", name: "since", value: msField(q.get("since_ms")), "aria-label": "Created from (UTC)" });
  const before = el("input", { type: "datetime-local", name: "before", value: msField(q.get("before_ms")), "aria-label": "Created before (UTC)" });
  const form = el(
    "form",
    { class: "filters", role: "search", "aria-label": "Find runs" },
    el("label", { class: "grow" }, "Search", search),
    el("label", {}, "Status", status),
    el("label", {}, "Agent", agent),
    el("label", {}, "Session", sessionField),
    el("label", {}, "From (UTC)", since),
    el("label", {}, "Before (UTC)", before),
    el("button", { type: "submit", class: "primary" }, "Find"),
  );
  const body = el("tbody");
  const starter = el("div");
  const newer = el("button", { type: "button", "aria-keyshortcuts": "p" }, "← Newer");
  const older = el("button", { type: "button", "aria-keyshortcuts": "n" }, "Older →");
  const pageInfo = el("span", { class: "muted", "aria-live": "polite" });
  view.replaceChildren(
    el("h1", {}, "Runs"),
    starter,
    form,
    el(
      "table",
      { "aria-label": "Runs", class: "runs" },
      el("thead", {}, el("tr", {}, ["Run", "Agent", "Status", "Labels", "Created", "Updated", "Events"].map((h) => el("th", { scope: "col" }, h)))),
      body,
    ),
    el("nav", { class: "pager", "aria-label": "Pages" }, newer, pageInfo, older),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (search.value.trim()) next.set("q", search.value.trim());
    for (const [key, value] of [
      ["status", status.value],
      ["agent", agent.value.trim()],
      ["session", sessionField.value.trim()],
      ["since_ms", fieldMs(since.value)],
      ["before_ms", fieldMs(before.value)],
    ]) {
      if (value) next.set(key, value);
    }
    location.hash = `#/runs?${next}`;
  });
  // Pages newest first: the cursors of the pages seen, to go back.
  const cursors = [];
  let cursor = null;
  let next = null;
  // Only the newest request's answer is shown: a poll that was under way
  // when a page button was pressed must not bring the old page back.
  let asked = 0;
  const refresh = async () => {
    const mine = ++asked;
    const params = new URLSearchParams();
    searchFilters(q.get("q") || "", params);
    for (const key of ["status", "agent", "session", "since_ms", "before_ms"]) {
      if (q.get(key)) params.set(key, q.get(key));
    }
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `/api/v1/runs?${params}`);
    if (mine !== asked) return;
    next = page.next;
    newer.disabled = cursors.length === 0;
    older.disabled = !next;
    pageInfo.textContent = `page ${cursors.length + 1}, newest first`;
    body.replaceChildren(
      ...page.runs.map((r) =>
        el(
          "tr",
          { "data-run": r.run_id },
          el("td", {}, el("a", { href: `#/run/${encodeURIComponent(r.run_id)}` }, r.run_id)),
          el("td", {}, r.agent),
          el(
            "td",
            {},
            statusBadge(r.status),
            r.status === "waiting" && r.wake_ms ? el("span", { class: "muted wake" }, ` wakes ${relative(r.wake_ms)}`) : null,
          ),
          el("td", {}, Object.entries(r.labels || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))),
          el("td", {}, time(r.created_ms)),
          el("td", {}, time(r.updated_ms)),
          el("td", { class: "num" }, count(r.events)),
        ),
      ),
    );
    if (!page.runs.length) body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, cursor ? "No older runs." : "No runs match.")));
  };
  newer.addEventListener("click", () => {
    cursor = cursors.pop() ?? null;
    refresh().catch((e) => notice(e.message));
  });
  older.addEventListener("click", () => {
    if (!next) return;
    cursors.push(cursor);
    cursor = next;
    refresh().catch((e) => notice(e.message));
  });
  keys.pages = { newer, older, search };
  cleanup.push(() => {
    keys.pages = null;
  });
  every(2000, refresh);
  if (session.role === "operator") startForm(starter);
}

// Starting a run: an agent the server serves (by name), an input, and
// whether the server drives it or queues it for workers.
function startForm(box) {
  api("GET", "/api/v1/agents")
    .then(({ agents }) => {
      if (!agents.length) return;
      const agent = el("select", { name: "agent" }, agents.map((a) => el("option", { value: a.name }, a.description ? `${a.name}: ${a.description}` : a.name)));
      const input = el("textarea", { name: "input", rows: 2, placeholder: "plain text, or JSON" });
      const queue = el("input", { type: "checkbox", name: "submit" });
      const button = el("button", { type: "submit", class: "primary" }, "Start");
      const form = el(
        "form",
        { class: "stack", "aria-label": "Start a run" },
        el("label", {}, "Agent", agent),
        el("label", {}, "Input", input),
        el("label", { class: "inline" }, queue, "Queue it for the workers"),
        button,
      );
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        act(button, async () => {
          let value = input.value;
          try {
            value = JSON.parse(value);
          } catch {
            // Plain text is the input as it is, as on the command line.
          }
          const run = await api("POST", "/api/v1/runs", { agent: agent.value, input: value, submit: queue.checked });
          location.hash = `#/run/${encodeURIComponent(run.run_id)}`;
        });
      });
      // Folded away until wanted: the list is what the page is for.
      box.replaceChildren(el("details", { class: "card" }, el("summary", {}, "Start a run"), form));
    })
    .catch((error) => notice(error.message));
}

// The decision a parked run waits for, with the controls that make it.
function decisionPanel(run, onDone) {
  const pending = run.pending;
  const done = async (work) => {
    await work();
    await onDone();
  };
  const box = el("section", { class: "card", "aria-label": "Decision" });
  if (run.status === "awaiting_approval" && pending) {
    const requested = (run.events || []).filter((e) => e.event.type === "approval_requested" && e.event.call_id === pending.call_id).at(-1);
    const preview = requested?.event.preview;
    const reason = el("input", { name: "reason", "aria-label": "Reason for denying", placeholder: "reason (to deny)" });
    const approve = el("button", { type: "button", class: "primary" }, "Approve");
    const deny = el("button", { type: "button", class: "danger" }, "Deny");
    approve.addEventListener("click", () =>
      act(approve, () => done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/approve`, { call_id: pending.call_id }))),
    );
    deny.addEventListener("click", () =>
      act(deny, async () => {
        if (!reason.value.trim()) throw new Error("A denial needs a reason.");
        await done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/deny`, { call_id: pending.call_id, reason: reason.value }));
      }),
    );
    box.append(
      el("h2", {}, `Approve ${pending.tool}?`),
      el("p", { class: "muted" }, `call ${pending.call_id}`),
      // The server's prompt (Warden's line, the frozen arguments, the
      // plugin's preview framed as its words), made safe to show there.
      pending.prompt
        ? el("pre", { class: "prompt" }, pending.prompt)
        : [json(pending.arguments), preview ? el("div", {}, el("strong", {}, "Preview: "), preview.summary, preview.detail ? el("pre", {}, preview.detail) : null) : null],
      el("div", { class: "actions" }, approve, reason, deny),
    );
    return box;
  }
  if (run.status === "suspended" && pending) {
    box.append(el("h2", {}, `Input for ${pending.tool}`), el("p", {}, pending.reason || ""));
    box.append(
      schemaForm(pending.schema || {}, "Resume", (input) =>
        done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/resume`, { input })),
      ),
    );
    return box;
  }
  if (run.status === "budget_exceeded") {
    const form = el("form", { class: "stack", "aria-label": "Extend the budget" });
    const inputs = {};
    for (const [kind, { used, limit }] of Object.entries(run.budget || {})) {
      if (limit === null || limit === undefined) continue;
      inputs[kind] = el("input", { type: "number", step: "any", min: "0", name: kind, value: limit });
      form.append(el("label", {}, `${kind} (used ${used}, limit ${limit})`, inputs[kind]));
    }
    const submit = el("button", { type: "submit", class: "primary" }, "Extend and resume");
    form.append(submit);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      act(submit, () => {
        const input = {};
        for (const [kind, field] of Object.entries(inputs)) {
          if (field.value !== "" && Number(field.value) !== run.budget[kind].limit) input[kind] = Number(field.value);
        }
        return done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/resume`, { input }));
      });
    });
    box.append(el("h2", {}, "Budget exceeded"), form);
    return box;
  }
  if (run.status === "needs_reconciliation") {
    const intent = (run.events || []).filter((e) => e.event.type === "tool_call_intent").at(-1);
    const asked = (run.events || []).filter((e) => e.event.type === "reconciliation_required").at(-1);
    const output = el("textarea", { name: "output", rows: 4, "aria-label": "The write's output, as JSON" }, "null");
    const note = el("input", { name: "note", "aria-label": "Note", placeholder: "what you found" });
    const resolve = el("button", { type: "button", class: "primary" }, "Resolve");
    const reason = el("input", { name: "abandon-reason", "aria-label": "Reason for abandoning", placeholder: "reason (to abandon)" });
    const abandon = el("button", { type: "button", class: "danger" }, "Abandon");
    resolve.addEventListener("click", () =>
      act(resolve, () => done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/resolve`, { output: JSON.parse(output.value), note: note.value || undefined }))),
    );
    abandon.addEventListener("click", () =>
      act(abandon, () => done(() => api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/abandon`, { reason: reason.value }))),
    );
    box.append(
      el("h2", {}, "A write has no recorded outcome"),
      el("p", {}, asked?.event.reason || "Check whether it happened, then say what it did."),
      intent ? el("div", {}, el("strong", {}, `${intent.event.tool.plugin}__${intent.event.tool.tool}`), json(intent.event.arguments)) : null,
      el("label", {}, "Its output (JSON)", output),
      el("div", { class: "actions" }, note, resolve),
      el("div", { class: "actions" }, reason, abandon),
    );
    return box;
  }
  return null;
}

// A form for a JSON Schema object (one field per property), or a JSON
// text area for anything else. `submit` gets the value.
function schemaForm(schema, label, submit) {
  const form = el("form", { class: "stack", "aria-label": label });
  const fields = [];
  const properties = schema.type === "object" && schema.properties ? schema.properties : null;
  if (properties) {
    const required = new Set(schema.required || []);
    for (const [name, prop] of Object.entries(properties)) {
      let input;
      if (Array.isArray(prop.enum)) {
        input = el("select", { name }, prop.enum.map((v) => el("option", { value: JSON.stringify(v) }, String(v))));
        fields.push([name, () => JSON.parse(input.value)]);
      } else if (prop.type === "boolean") {
        input = el("input", { type: "checkbox", name });
        fields.push([name, () => input.checked]);
      } else if (prop.type === "integer" || prop.type === "number") {
        input = el("input", { type: "number", name, step: prop.type === "integer" ? "1" : "any", required: required.has(name) });
        fields.push([name, () => (input.value === "" ? undefined : Number(input.value))]);
      } else if (prop.type === "string") {
        input = el("input", { type: "text", name, required: required.has(name) });
        fields.push([name, () => (input.value === "" && !required.has(name) ? undefined : input.value)]);
      } else {
        input = el("textarea", { name, rows: 3 });
        fields.push([name, () => (input.value === "" ? undefined : JSON.parse(input.value))]);
      }
      form.append(el("label", {}, prop.title || name, prop.description ? el("span", { class: "muted" }, prop.description) : null, input));
    }
  } else {
    const input = el("textarea", { name: "input", rows: 4, "aria-label": "Input, as JSON" });
    fields.push([null, () => JSON.parse(input.value)]);
    form.append(el("label", {}, "Input (JSON)", input));
  }
  const button = el("button", { type: "submit", class: "primary" }, label);
  form.append(button);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    act(button, () => {
      if (fields.length === 1 && fields[0][0] === null) return submit(fields[0][1]());
      const value = {};
      for (const [name, read] of fields) {
        const v = read();
        if (v !== undefined) value[name] = v;
      }
      return submit(value);
    });
  });
  return form;
}

// One line of the timeline: what the event says, briefly.
function describe(event) {
  const tool = (t) => (t ? `${t.plugin}__${t.tool}` : "");
  switch (event.type) {
    case "run_started":
      return [`Started ${event.agent}`, json(event.input)];
    case "model_call_intent":
      return [`Model call, step ${event.step}`];
    case "model_call_completed": {
      const spent = event.cost_nanos ? `, cost ${cost(event.cost_nanos, event.pricing?.currency ?? shownCurrency)}` : "";
      const calls = (event.tool_calls || []).map((c) => c.name).join(", ");
      return [
        `Model answered (step ${event.step}): ${count(event.usage?.input_tokens)} tokens in, ${count(event.usage?.output_tokens)} out${spent}`,
        event.text ? el("pre", {}, event.text) : null,
        calls ? el("div", {}, `asks for: ${calls}`) : null,
      ];
    }
    case "tool_call_intent":
      return [`Tool call ${tool(event.tool)} (${event.effect})`, json(event.arguments)];
    case "tool_call_completed": {
      const r = event.receipt || {};
      return [
        `Tool call ${event.call_id} finished: ${r.outcome ?? ""}, took ${duration((r.wall_time_us ?? 0) / 1000)}, fuel ${count(r.fuel_consumed)}`,
        json(event.result),
      ];
    }
    case "approval_requested":
      return [`Approval asked for ${tool(event.tool)}`, event.preview ? el("pre", {}, `${event.preview.summary}\n${event.preview.detail || ""}`) : null];
    case "approval_granted":
      return [`Approved by ${event.by}`];
    case "approval_denied":
      return [`Denied by ${event.by}: ${event.reason}`];
    case "policy_decided":
      return [`Policy ${event.policy} (${event.hook}): ${JSON.stringify(event.decision)}${event.reason ? ` — ${event.reason}` : ""}`];
    case "budget_exceeded":
      return [`Budget exceeded`, json(event)];
    case "run_completed":
      return [`Completed`, json(event.output)];
    case "run_failed":
      return [`Failed: ${event.error?.message ?? event.error?.kind ?? ""}`, json(event.error)];
    case "wait_started":
      return [`Waiting until ${utc(event.until_ms)} (${duration(event.until_ms - event.since_ms)})`];
    case "child_started":
      return [`Child run `, el("a", { href: `#/run/${encodeURIComponent(event.child_run)}` }, event.child_run), ` of ${event.agent} started`];
    case "child_parked":
      return [`Child run `, el("a", { href: `#/run/${encodeURIComponent(event.child_run)}` }, event.child_run), ` is ${String(event.status).replaceAll("_", " ")}`];
    case "child_finished":
      return [`Child run `, el("a", { href: `#/run/${encodeURIComponent(event.child_run)}` }, event.child_run), ` ${String(event.status).replaceAll("_", " ")}`];
    case "clock_observed":
      return [`Clock read: ${utc(event.at_ms)}`];
    default:
      return [event.type.replaceAll("_", " "), el("details", {}, el("summary", {}, "details"), json(event))];
  }
}

// Forking the run at a position of its timeline: a new run that reuses
// every recorded effect up to there. Each timeline item's position button
// fills the position in.
function forkForm(run) {
  const events = run.events || [];
  const end = events.findIndex((e) => /^run_(completed|failed|cancelled|abandoned)$/.test(e.event.type));
  const last = end === -1 ? events.length : end;
  if (last < 1) return "";
  // No `max`: the run may grow while the form is open; the server refuses
  // a position past its end (`fork_refused`), said in the notice.
  const at = el("input", { type: "number", name: "at", min: 1, value: last, required: true });
  const budgets = el("input", { name: "budgets", placeholder: '{"max_steps": 20}' });
  const button = el("button", { type: "submit" }, "Fork");
  const form = el(
    "form",
    { class: "stack card", id: "fork", "aria-label": "Fork this run" },
    el("h2", {}, "Fork this run"),
    el("p", { class: "muted" }, "The fork inherits the events up to this position (pick one with its # in the timeline), reuses them, never makes them again, and goes on from there."),
    el("label", {}, "Position", at),
    el("label", {}, "Budgets (JSON, optional)", budgets),
    button,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    act(button, async () => {
      const body = { at: Number(at.value) };
      if (budgets.value.trim()) body.budgets = JSON.parse(budgets.value);
      const fork = await api("POST", `/api/v1/runs/${encodeURIComponent(run.run_id)}/fork`, body);
      location.hash = `#/run/${encodeURIComponent(fork.run_id)}`;
    });
  });
  return form;
}

function timelineItem(line) {
  const type = line.event.type;
  const kind = NOISE.includes(type)
    ? "noise"
    : /approval|resumed|reconcil|resolved|cancelled|abandoned|extended/.test(type)
    ? "decision"
    : /tool_call|delivery|model_call/.test(type)
      ? "effect"
      : "";
  // The position is a button for operators: it picks this position in
  // the fork form.
  const seq =
    session.role === "operator"
      ? el("button", { type: "button", class: "seq", "aria-label": `Fork at position ${line.seq}`, title: "fork from here", onclick: () => pickFork(line.seq) }, `#${line.seq}`)
      : el("span", { class: "seq" }, `#${line.seq}`);
  return el("li", { class: kind, "data-seq": line.seq, "data-type": type }, seq, describe(line.event));
}

function pickFork(seq) {
  const at = document.querySelector("#fork input[name=at]");
  if (!at) return;
  at.value = String(seq);
  at.focus();
}

// The currency a run's costs are in (its recorded limits'), for amounts
// whose event does not say.
let shownCurrency = null;

function currencyOf(run) {
  const events = (run.events || []).map((line) => line.event);
  return events.find((e) => e.limits?.currency)?.limits.currency ?? events.find((e) => e.pricing?.currency)?.pricing.currency ?? null;
}

// What a failed run's error means and what to do about it, by its code.
const NEXT_FOR_ERROR = {
  model_call_failed: "The model's provider refused the call for good (a key, a model name, a malformed request). Fix the agent's [model] settings or the provider's key, then fork this run from before the failed step.",
  model_attempts_exhausted: "The provider kept failing (overloaded or unreachable). Once it answers again, fork this run from before the failed step: what was done before is reused, not redone.",
  refused: "The model refused to answer. Change the input, or set the agent's on_refusal, then start again or fork from before the refusal.",
  output_truncated: "The answer was cut at max_tokens. Raise [model] max_tokens in the agent file, then fork from before the last model call.",
  output_invalid: "The final answer broke the agent's output schema twice. Relax the schema or say more about it in the instructions, then fork from before the last model call.",
  policy_denied: "A policy stopped the run; its reason is in the timeline. Change the input, or the policy if it was wrong.",
  policy_failed: "A policy plugin failed, so the run failed closed. Check the plugin (warden -v shows its errors), then fork the run.",
  host: "Warden could not go on (for example a plugin failed to load). Read the message, fix the cause on the host, then fork the run.",
  context_failed: "A context source failed and its on_error is \"fail\". Fix the source, or set on_error = \"skip\", then fork the run.",
  invalid_tool_calls: "The model kept calling tools wrongly. Check the tools' descriptions and schemas, then fork the run.",
};

function errorPanel(error, next) {
  const advice = NEXT_FOR_ERROR[error.code] || "Fix the cause, then fork this run from before the failure (the fork form is at the end of the page).";
  return el(
    "section",
    { class: "card error", "aria-label": "Error" },
    el("h2", {}, `Failed: ${String(error.code).replaceAll("_", " ")}`),
    el("p", {}, error.message),
    el("p", {}, el("strong", {}, "Next: "), advice),
    (next || []).map((n) => el("p", {}, el("strong", {}, `${n.action}: `), el("code", {}, n.command))),
    error.details && Object.keys(error.details).length ? el("details", {}, el("summary", {}, "details"), json(error.details)) : null,
  );
}

// Each model step: when it started, how long it took (until the next
// step, or the run's last reading), its tokens, cost and tool calls.
function steps(lines) {
  const out = [];
  let now = null;
  let current = null;
  for (const { event } of lines) {
    const at = event.type === "run_started" ? event.clock_seed_ms : event.at_ms;
    if (typeof at === "number") now = at;
    if (event.type === "model_call_intent") {
      if (current) current.end = now;
      current = { step: event.step, start: now, end: now, input: 0, output: 0, cost: null, currency: null, tools: 0 };
      out.push(current);
    } else if (current) {
      current.end = now;
      if (event.type === "model_call_completed") {
        current.input += event.usage?.input_tokens ?? 0;
        current.output += event.usage?.output_tokens ?? 0;
        if (event.cost_nanos !== undefined && event.cost_nanos !== null) current.cost = (current.cost ?? 0) + event.cost_nanos;
        current.currency = event.pricing?.currency ?? current.currency;
      } else if (event.type === "tool_call_intent") {
        current.tools += 1;
      }
    }
  }
  return out;
}

function stepsTable(lines) {
  const rows = steps(lines);
  if (!rows.length) return "";
  return el(
    "table",
    { "aria-label": "Steps", class: "steps" },
    el("thead", {}, el("tr", {}, ["Step", "Started", "Took", "Tokens in", "Tokens out", "Cost", "Tool calls"].map((h) => el("th", { scope: "col" }, h)))),
    el(
      "tbody",
      {},
      rows.map((r) =>
        el(
          "tr",
          { "data-step": r.step },
          el("th", { scope: "row" }, r.step),
          el("td", {}, r.start === null ? "" : time(r.start)),
          el("td", { class: "num" }, r.start === null ? "" : duration(r.end - r.start)),
          el("td", { class: "num" }, count(r.input)),
          el("td", { class: "num" }, count(r.output)),
          el("td", { class: "num" }, r.cost === null ? "—" : cost(r.cost, r.currency ?? shownCurrency)),
          el("td", { class: "num" }, r.tools),
        ),
      ),
    ),
  );
}

function runView(view, id) {
  const heading = el("h1", {}, `Run ${id}`);
  const summary = el("div");
  const failure = el("div");
  const decision = el("div");
  const family = el("div");
  const budget = el("div");
  const stepsBox = el("div");
  const chartBox = el("div");
  const timeline = el("ol", { class: "timeline", "aria-label": "Timeline" });
  const noise = el("input", { type: "checkbox", name: "noise" });
  const noiseCount = el("span");
  noise.addEventListener("change", () => timeline.classList.toggle("all", noise.checked));
  const controls = el("div", { class: "actions" });
  const fork = el("div");
  view.replaceChildren(
    heading,
    summary,
    failure,
    decision,
    controls,
    family,
    budget,
    el("h2", {}, "Steps"),
    stepsBox,
    el("h2", {}, "Timeline chart"),
    chartBox,
    el("h2", {}, "Timeline"),
    el("label", { class: "inline" }, noise, "Show the clock and random readings ", noiseCount),
    timeline,
    fork,
  );
  let last = 0;
  let noisy = 0;
  let charted = -1;
  let dropChart = () => {};
  cleanup.push(() => dropChart());
  let shownDecision = null;
  let refreshing = null;
  const append = (line) => {
    timeline.append(timelineItem(line));
    last = line.seq;
    if (NOISE.includes(line.event.type)) noisy += 1;
    noiseCount.textContent = noisy ? `(${count(noisy)} folded)` : "";
  };

  const refresh = async () => {
    const run = await api("GET", `/api/v1/runs/${encodeURIComponent(id)}`);
    shownCurrency = currencyOf(run);
    const parent = run.parent?.run_id;
    // `replaceChildren` would show a null as the text "null": absent parts
    // are left out.
    summary.replaceChildren(
      ...[
        el(
          "p",
          {},
          statusBadge(run.status),
          " ",
          `agent ${run.agent}`,
          run.session ? [" · session ", el("a", { href: `#/session/${encodeURIComponent(run.session)}` }, run.session)] : "",
          " · created ",
          time(run.created_ms),
          " · updated ",
          time(run.updated_ms),
        ),
        run.status === "waiting" && run.wake_ms ? el("p", { class: "wake" }, "Wakes up at ", time(run.wake_ms), ` (${relative(run.wake_ms)})`) : null,
        parent ? el("p", {}, "Child of ", el("a", { href: `#/run/${encodeURIComponent(parent)}`, rel: "up" }, parent), ` (call ${run.parent.call_id})`) : null,
        Object.keys(run.labels || {}).length ? el("p", {}, Object.entries(run.labels).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))) : null,
        run.output !== undefined ? el("div", {}, el("strong", {}, "Output"), json(run.output)) : null,
      ].filter(Boolean),
    );
    failure.replaceChildren(run.error ? errorPanel(run.error, run.next) : "");
    family.replaceChildren(
      (run.children || []).length
        ? el(
            "section",
            { "aria-label": "Child runs" },
            el("h2", {}, "Child runs"),
            el(
              "ul",
              { class: "children" },
              run.children.map((c) =>
                el("li", { "data-child": c.run_id }, el("a", { href: `#/run/${encodeURIComponent(c.run_id)}` }, c.run_id), ` ${c.agent} `, c.status ? statusBadge(c.status) : ""),
              ),
            ),
          )
        : "",
    );
    // The decision, the controls and the fork form belong to the status and
    // the call that waits: approving one call can park the run on the next.
    const shown = `${run.status}:${run.pending?.call_id ?? ""}`;
    if (shown !== shownDecision) {
      shownDecision = shown;
      decision.replaceChildren(decisionPanel(run, refresh) || "");
      controls.replaceChildren();
      fork.replaceChildren(session.role === "operator" ? forkForm(run) : "");
      if (!TERMINAL.includes(run.status)) {
        const reason = el("input", { name: "cancel-reason", "aria-label": "Reason for cancelling", placeholder: "reason (to cancel)" });
        const cancel = el("button", { type: "button", class: "danger" }, "Cancel run");
        cancel.addEventListener("click", () =>
          act(cancel, async () => {
            await api("POST", `/api/v1/runs/${encodeURIComponent(id)}/cancel`, { reason: reason.value || undefined });
            await refresh();
          }),
        );
        controls.append(reason, cancel);
      }
    }
    budget.replaceChildren(
      el("h2", {}, "Budget"),
      el(
        "table",
        { "aria-label": "Budget" },
        el("thead", {}, el("tr", {}, ["", "used", "limit"].map((h) => el("th", { scope: "col" }, h)))),
        el(
          "tbody",
          {},
          Object.entries(run.budget || {}).map(([k, b]) =>
            el(
              "tr",
              { "data-budget": k },
              el("th", { scope: "row" }, k.replaceAll("_", " ")),
              el("td", { class: "num" }, amount(k, b.used, shownCurrency)),
              el("td", { class: "num" }, b.limit === null || b.limit === undefined ? "—" : amount(k, b.limit, shownCurrency)),
            ),
          ),
        ),
      ),
    );
    const lines = run.events || [];
    if (lines.length !== charted) {
      charted = lines.length;
      stepsBox.replaceChildren(stepsTable(lines));
      dropChart();
      const [figure, drop] = timelineChart(runSpans(lines));
      chartBox.replaceChildren(figure);
      dropChart = drop;
    }
    for (const line of lines) {
      if (line.seq > last) append(line);
    }
    return run;
  };
  // Refreshes at most one at a time; the live stream asks after each event.
  // An event that comes while a refresh is in flight may be newer than what
  // that refresh read: it is remembered and answered by one more refresh
  // after, or the view would keep a status the run has left (a parked run
  // shown as running, with no decision to make).
  let again = false;
  const soon = () => {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = refresh()
      .catch((e) => notice(e.message))
      .finally(() => {
        refreshing = null;
        if (again) {
          again = false;
          soon();
        }
      });
  };

  refresh()
    .then(() => {
      const stream = new EventSource(`/api/v1/runs/${encodeURIComponent(id)}/stream?after=${last}`);
      // The server names its messages: `event` for an event line, `error`
      // when it cannot read the log.
      stream.addEventListener("event", (message) => {
        const line = JSON.parse(message.data);
        if (line.seq > last) append(line);
        soon();
      });
      stream.addEventListener("error", (message) => {
        if (message.data) notice(`the live stream failed: ${message.data}`);
      });
      cleanup.push(() => stream.close());
    })
    .catch((error) => {
      if (error.status !== 401) view.replaceChildren(el("h1", {}, `Run ${id}`), el("p", { role: "alert" }, error.message));
    });
}

// The overview of many runs: runs by status over time, cost and tokens
// per agent, the slowest tools.
function overviewView(view) {
  const box = el("div", { class: "overview" });
  const note = el("p", { class: "muted" });
  view.replaceChildren(el("h1", {}, "Overview"), note, box);
  let drops = [];
  const drop = () => {
    for (const d of drops) d();
    drops = [];
  };
  cleanup.push(drop);
  const refresh = async () => {
    const o = await api("GET", "/api/v1/overview");
    note.textContent = `The newest ${count(o.runs_listed)} runs by status; costs, tokens and tools from the newest ${count(o.runs_read)}.`;
    drop();
    const charts = [
      ["Runs by status over time", statusChart(o.statuses)],
      ["Cost and tokens per agent", agentChart(o.agents)],
      ["Slowest tools", toolChart(o.tools)],
    ];
    box.replaceChildren(...charts.map(([title, [figure]]) => el("section", {}, el("h2", {}, title), figure)));
    drops = charts.map(([, [, d]]) => d);
  };
  every(15000, refresh);
}

function inboxView(view) {
  const list = el("div");
  view.replaceChildren(el("h1", {}, "Inbox"), el("p", { class: "muted" }, "Runs waiting for a person, across every worker."), list);
  let shown = null;
  const refresh = async () => {
    // One request, one batch read on the server, however many runs wait.
    const { runs: details } = await api("GET", "/api/v1/inbox");
    // Redraw only when what waits changed, so a half-typed reason stays.
    const key = details.map((d) => `${d.run_id}:${d.status}:${d.pending?.call_id}`).join("|");
    if (key === shown) return;
    shown = key;
    list.replaceChildren(
      ...details.map((run) =>
        el(
          "article",
          { class: "card", "data-run": run.run_id, "aria-label": `Run ${run.run_id}` },
          el("div", {}, el("a", { href: `#/run/${encodeURIComponent(run.run_id)}` }, run.run_id), " ", statusBadge(run.status), ` · ${run.agent}`),
          decisionPanel(run, async () => {
            shown = null;
            await refresh();
          }),
        ),
      ),
    );
    if (!details.length) list.append(el("p", {}, "Nothing waits for a decision."));
  };
  every(1500, refresh);
}

function sessionsView(view) {
  const body = el("tbody");
  view.replaceChildren(
    el("h1", {}, "Sessions"),
    el(
      "table",
      { "aria-label": "Sessions" },
      el("thead", {}, el("tr", {}, ["Session", "Runs", "State", "Updated"].map((h) => el("th", { scope: "col" }, h)))),
      body,
    ),
  );
  every(3000, async () => {
    const { sessions } = await api("GET", "/api/v1/sessions");
    body.replaceChildren(
      ...sessions.map((s) =>
        el(
          "tr",
          {},
          el("td", {}, el("a", { href: `#/session/${encodeURIComponent(s.session)}` }, s.session)),
          el("td", {}, s.runs),
          el("td", {}, s.active_run ? el("span", {}, "busy: ", el("a", { href: `#/run/${encodeURIComponent(s.active_run)}` }, s.active_run)) : "idle"),
          el("td", {}, when(s.updated_ms)),
        ),
      ),
    );
  });
}

function sessionView(view, id) {
  const list = el("ol");
  view.replaceChildren(el("h1", {}, `Session ${id}`), list);
  api("GET", `/api/v1/sessions/${encodeURIComponent(id)}`)
    .then(({ runs }) =>
      list.replaceChildren(
        ...runs.map((r) =>
          el(
            "li",
            { class: "card" },
            el("a", { href: `#/run/${encodeURIComponent(r.run_id)}` }, r.run_id),
            " ",
            statusBadge(r.status),
            el("div", {}, el("strong", {}, "asked "), JSON.stringify(r.input)),
            r.output !== undefined ? el("div", {}, el("strong", {}, "answered "), JSON.stringify(r.output)) : null,
          ),
        ),
      ),
    )
    .catch((error) => notice(error.message));
}

function auditView(view) {
  const body = el("tbody");
  view.replaceChildren(
    el("h1", {}, "Audit"),
    el("p", { class: "muted" }, "Every decision recorded on the most recently updated runs, newest first."),
    el(
      "table",
      { "aria-label": "Decisions" },
      el("thead", {}, el("tr", {}, ["When", "Who", "What", "Run", "Reason"].map((h) => el("th", { scope: "col" }, h)))),
      body,
    ),
  );
  every(5000, async () => {
    const { decisions } = await api("GET", "/api/v1/audit");
    body.replaceChildren(
      ...decisions.map((d) =>
        el(
          "tr",
          {},
          el("td", {}, when(d.at_ms)),
          el("td", {}, d.by),
          el("td", {}, d.type.replaceAll("_", " ")),
          el("td", {}, el("a", { href: `#/run/${encodeURIComponent(d.run_id)}` }, `${d.run_id} #${d.seq}`)),
          el("td", {}, d.reason ?? ""),
        ),
      ),
    );
  });
}

// ---- routing --------------------------------------------------------------------

function route() {
  if (!session.csrf) return;
  stopView();
  notice("");
  const view = document.getElementById("view");
  const [path] = (location.hash || "#/runs").split("?");
  const [, page, arg] = path.split("/");
  const id = arg ? decodeURIComponent(arg) : null;
  for (const link of document.querySelectorAll("#nav a")) {
    link.toggleAttribute("aria-current", link.getAttribute("href") === `#/${page}`);
    if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
  }
  if (page === "run" && id) runView(view, id);
  else if (page === "inbox") inboxView(view);
  else if (page === "sessions") sessionsView(view);
  else if (page === "session" && id) sessionView(view, id);
  else if (page === "audit") auditView(view);
  else if (page === "overview") overviewView(view);
  else runsView(view);
  view.focus();
  inboxCount();
}

async function inboxCount() {
  if (!session.csrf) return;
  try {
    const { runs, next } = await api("GET", `/api/v1/runs?status=${PARKED.join(",")}&limit=500`);
    document.getElementById("inbox-count").textContent = runs.length ? `${count(runs.length)}${next ? "+" : ""}` : "";
  } catch {
    // The view shows what failed.
  }
}

// Keys: `/` goes to the search box, `n` and `p` to the older and newer
// page of runs (not while typing).
const keys = { pages: null };
document.addEventListener("keydown", (event) => {
  const typing = event.target.closest?.("input, textarea, select, [contenteditable]");
  if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.key === "/") {
    event.preventDefault();
    if (keys.pages) keys.pages.search.focus();
    else location.hash = "#/runs";
  } else if (keys.pages && event.key === "n" && !keys.pages.older.disabled) {
    keys.pages.older.click();
  } else if (keys.pages && event.key === "p" && !keys.pages.newer.disabled) {
    keys.pages.newer.click();
  }
});

window.addEventListener("hashchange", route);
document.getElementById("logout").addEventListener("click", async () => {
  try {
    await api("POST", "/console/logout");
  } finally {
    showLogin("Logged out.");
  }
});
setInterval(inboxCount, 2000);

api("GET", "/console/session")
  .then(signedIn)
  .catch(() => showLogin());
