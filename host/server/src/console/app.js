// The Warden console: a page over the JSON API (/api/v1), no framework.
// Every value from a run is set as text (never as markup). The session is
// an HttpOnly cookie; this script holds only the session's CSRF token,
// sent on every request that changes something.

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
  return ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "";
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

const PARKED = ["awaiting_approval", "suspended", "budget_exceeded", "needs_reconciliation"];
const TERMINAL = ["completed", "failed", "cancelled", "abandoned"];

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

function runsView(view) {
  const filter = el(
    "select",
    { "aria-label": "Status" },
    el("option", { value: "" }, "every status"),
    [...PARKED, "running", "queued", ...TERMINAL].map((s) => el("option", { value: s }, s.replaceAll("_", " "))),
  );
  const body = el("tbody");
  const starter = el("div");
  view.replaceChildren(
    el("h1", {}, "Runs"),
    starter,
    el("label", { class: "inline" }, "Show", filter),
    el(
      "table",
      { "aria-label": "Runs" },
      el("thead", {}, el("tr", {}, ["Run", "Agent", "Status", "Session", "Events", "Updated"].map((h) => el("th", { scope: "col" }, h)))),
      body,
    ),
  );
  const refresh = async () => {
    const query = filter.value ? `?status=${encodeURIComponent(filter.value)}` : "";
    const { runs } = await api("GET", `/api/v1/runs${query}`);
    body.replaceChildren(
      ...runs.map((r) =>
        el(
          "tr",
          { "data-run": r.run_id },
          el("td", {}, el("a", { href: `#/run/${encodeURIComponent(r.run_id)}` }, r.run_id)),
          el("td", {}, r.agent),
          el("td", {}, statusBadge(r.status)),
          el("td", {}, r.session ? el("a", { href: `#/session/${encodeURIComponent(r.session)}` }, r.session) : ""),
          el("td", {}, r.events),
          el("td", {}, when(r.updated_ms)),
        ),
      ),
    );
    if (!runs.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No runs yet.")));
  };
  filter.addEventListener("change", refresh);
  every(1000, refresh);
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
      const cost = event.cost_nanos ? `, $${(event.cost_nanos / 1e9).toFixed(6)}` : "";
      const calls = (event.tool_calls || []).map((c) => c.name).join(", ");
      return [
        `Model answered (step ${event.step}): ${event.usage?.input_tokens ?? 0} tokens in, ${event.usage?.output_tokens ?? 0} out${cost}`,
        event.text ? el("pre", {}, event.text) : null,
        calls ? el("div", {}, `asks for: ${calls}`) : null,
      ];
    }
    case "tool_call_intent":
      return [`Tool call ${tool(event.tool)} (${event.effect})`, json(event.arguments)];
    case "tool_call_completed": {
      const r = event.receipt || {};
      return [
        `Tool call ${event.call_id} finished: ${r.outcome ?? ""}, fuel ${r.fuel_consumed ?? "?"}, ${r.wall_time_us ?? "?"} µs`,
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
      return [`Failed`, json(event.error)];
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
  const kind = /approval|resumed|reconcil|resolved|cancelled|abandoned|extended/.test(type)
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

function runView(view, id) {
  const heading = el("h1", {}, `Run ${id}`);
  const summary = el("div");
  const decision = el("div");
  const budget = el("div");
  const timeline = el("ol", { class: "timeline", "aria-label": "Timeline" });
  const controls = el("div", { class: "actions" });
  const fork = el("div");
  view.replaceChildren(heading, summary, decision, controls, budget, el("h2", {}, "Timeline"), timeline, fork);
  let last = 0;
  let shownDecision = null;
  let refreshing = null;

  const refresh = async () => {
    const run = await api("GET", `/api/v1/runs/${encodeURIComponent(id)}`);
    // `replaceChildren` would show a null as the text "null": absent parts
    // are left out.
    summary.replaceChildren(
      ...[
        el("p", {}, statusBadge(run.status), " ", `agent ${run.agent}`, run.session ? ` · session ${run.session}` : "", ` · updated ${when(run.updated_ms)}`),
        run.output !== undefined ? el("div", {}, el("strong", {}, "Output"), json(run.output)) : null,
        run.error ? el("div", {}, el("strong", {}, "Error"), json(run.error)) : null,
      ].filter(Boolean),
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
        el("tbody", {}, Object.entries(run.budget || {}).map(([k, b]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, b.used), el("td", {}, b.limit ?? "—")))),
      ),
    );
    for (const line of run.events || []) {
      if (line.seq > last) {
        timeline.append(timelineItem(line));
        last = line.seq;
      }
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
        if (line.seq > last) {
          timeline.append(timelineItem(line));
          last = line.seq;
        }
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
  const [, page, arg] = (location.hash || "#/runs").split("/");
  const id = arg ? decodeURIComponent(arg) : null;
  for (const link of document.querySelectorAll("nav a")) {
    link.toggleAttribute("aria-current", link.getAttribute("href") === `#/${page}`);
    if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
  }
  if (page === "run" && id) runView(view, id);
  else if (page === "inbox") inboxView(view);
  else if (page === "sessions") sessionsView(view);
  else if (page === "session" && id) sessionView(view, id);
  else if (page === "audit") auditView(view);
  else runsView(view);
  view.focus();
  inboxCount();
}

async function inboxCount() {
  if (!session.csrf) return;
  try {
    const { runs } = await api("GET", `/api/v1/runs?status=${PARKED.join(",")}`);
    document.getElementById("inbox-count").textContent = runs.length ? String(runs.length) : "";
  } catch {
    // The view shows what failed.
  }
}

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
