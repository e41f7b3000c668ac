// The JavaScript guest SDK for Warden tool plugins.
//
// A plugin's `app.js` (or `app.ts`) exports each tool as one function
// wrapped by `tool`:
//
//     import { tool, string } from "warden-guest";
//
//     export const greet = tool({
//       description: "Greets someone",
//       args: { name: string("Who to greet") },
//       run: ({ name }) => ({ text: "hello, " + name }),
//     });
//
// The export's name (camelCase becomes snake_case) is the tool's name, the
// `args` builders are both the JSON Schema `describe` reports and the check
// each call's arguments pass before `run` sees them (a refusal names the
// field), the return value is sent as JSON, and `InvalidArguments`,
// `Denied` and `Failed` become the WIT's `tool-error` cases.
// `warden plugin build` bundles the app with this module and exports the
// tools as the `warden:plugin/tool` interface (`exportTools`).
//
// The module imports the host's interfaces, so it runs inside the component
// only: test a plugin with `warden plugin test`, in the real sandbox.

import { config as hostConfig, log as hostLog } from "warden:plugin/host@0.1.0";
import { getDirectories } from "wasi:filesystem/preopens@0.2.12";
import { getEnvironment } from "wasi:cli/environment@0.2.12";

// ---------------------------------------------------------------- errors

/** A failure the tool understood; throw a subclass. */
export class ToolError extends Error {}

/** The arguments do not fit the tool's schema or meaning. */
export class InvalidArguments extends ToolError {}

/** The tool refused: outside its mount, not permitted, and so on. */
export class Denied extends ToolError {}

/** The tool tried and failed; `retryable` says whether later may work. */
export class Failed extends ToolError {
  constructor(message, { retryable = false } = {}) {
    super(message);
    this.retryable = retryable;
  }
}

// ---------------------------------------------------------------- schema

class SchemaError extends Error {}

const kind = (v) =>
  v === null ? "null"
  : Array.isArray(v) ? "an array"
  : typeof v === "object" ? "an object"
  : typeof v === "string" ? "a string"
  : typeof v === "boolean" ? "a boolean"
  : typeof v === "number" ? (Number.isInteger(v) ? "an integer" : "a number")
  : typeof v;

const withDescription = (schema, description) =>
  description ? { ...schema, description } : schema;

function scalar(type, check, description) {
  return {
    schema: withDescription({ type }, description),
    decode(value, where) {
      if (!check(value)) throw new SchemaError(`${where}: expected ${type === "integer" ? "an integer" : "a " + type}, got ${kind(value)}`);
      return value;
    },
  };
}

/** A string argument. */
export const string = (description) => scalar("string", (v) => typeof v === "string", description);
/** A whole number. */
export const integer = (description) => scalar("integer", (v) => Number.isInteger(v), description);
/** Any number. */
export const number = (description) => scalar("number", (v) => typeof v === "number", description);
/** true or false. */
export const boolean = (description) => scalar("boolean", (v) => typeof v === "boolean", description);

/** One of the listed values. */
export function oneOf(values, description) {
  return {
    schema: withDescription({ enum: [...values] }, description),
    decode(value, where) {
      if (!values.includes(value)) throw new SchemaError(`${where}: expected one of ${JSON.stringify(values)}, got ${JSON.stringify(value)}`);
      return value;
    },
  };
}

/** An array of `item`. */
export function array(item, description) {
  return {
    schema: withDescription({ type: "array", items: item.schema }, description),
    decode(value, where) {
      if (!Array.isArray(value)) throw new SchemaError(`${where}: expected an array, got ${kind(value)}`);
      return value.map((v, i) => item.decode(v, `${where}[${i}]`));
    },
  };
}

/** `inner`, or absent: then `fallback` (undefined unless given). */
export function optional(inner, fallback) {
  return { ...inner, optional: true, fallback };
}

/** An object with exactly these fields (builders); unknown ones are refused. */
export function object(fields, description) {
  const names = Object.keys(fields);
  const schema = {
    type: "object",
    properties: Object.fromEntries(names.map((n) => [n, fields[n].schema])),
    required: names.filter((n) => !fields[n].optional),
    additionalProperties: false,
  };
  return {
    schema: withDescription(schema, description),
    decode(value, where) {
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        throw new SchemaError(`${where}: expected an object, got ${kind(value)}`);
      }
      const unknown = Object.keys(value).filter((k) => !names.includes(k)).sort();
      if (unknown.length) throw new SchemaError(`${where}: unknown field \`${unknown[0]}\`, expected one of ${JSON.stringify(names)}`);
      const out = {};
      for (const n of names) {
        const inner = where === "arguments" ? `field \`${n}\`` : `${where}.${n}`;
        if (!(n in value)) {
          if (!fields[n].optional) throw new SchemaError(`${where}: missing field \`${n}\``);
          if (fields[n].fallback !== undefined) out[n] = fields[n].fallback;
          continue;
        }
        out[n] = fields[n].decode(value[n], inner);
      }
      return out;
    },
  };
}

// ---------------------------------------------------------------- tools

const TOOL = Symbol("warden tool");
const EFFECTS = ["read", "idempotent", "write"];

/**
 * A tool: `run(args, call)` with `args` checked against the `args`
 * builders first. `effect` is "read" (the default), "idempotent" or
 * "write"; `preflight(args, call)` returns `{ summary, detail }` for the
 * human approving a write.
 */
export function tool({ description = "", args = {}, effect = "read", run, preflight }) {
  if (typeof run !== "function") throw new TypeError("a tool needs a `run` function");
  if (!EFFECTS.includes(effect)) throw new TypeError(`effect must be one of ${EFFECTS.join(", ")}`);
  return { [TOOL]: true, description, args: object(args), effect, run, preflight };
}

/** `countLines` → `count_lines`: export names become tool names. */
export function toolName(exportName) {
  return exportName.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
}

/** The tools among a module's exports, by tool name. */
export function toolsOf(module) {
  const tools = new Map();
  for (const [exportName, value] of Object.entries(module)) {
    if (!value || !value[TOOL]) continue;
    const name = toolName(exportName);
    if (!/^[a-z][a-z0-9_]*$/.test(name) || name.length > 64) {
      throw new TypeError(`tool name \`${name}\` (export \`${exportName}\`) must match [a-z][a-z0-9_]*, at most 64 bytes`);
    }
    tools.set(name, value);
  }
  return tools;
}

function argumentsOf(name, t, call) {
  let value;
  try {
    value = JSON.parse(call.arguments);
  } catch (e) {
    throw new InvalidArguments(`invalid arguments for tool \`${name}\`: not JSON: ${e.message}`);
  }
  try {
    return t.args.decode(value, "arguments");
  } catch (e) {
    if (e instanceof SchemaError) throw new InvalidArguments(`invalid arguments for tool \`${name}\`: ${e.message}`);
    throw e;
  }
}

/**
 * Runs `call` against `tools`: the output as JSON text, or a rejection with
 * a ToolError. `run` may be async (to `await fetch(...)`): componentize-js
 * runs the event loop until the promise settles.
 */
export async function invoke(tools, call) {
  const t = tools.get(call.tool);
  if (!t) throw new InvalidArguments(`no tool \`${call.tool}\``);
  const output = await t.run(argumentsOf(call.tool, t, call), call);
  return JSON.stringify(output === undefined ? null : output);
}

/** The preview of `call`: the tool's `preflight`, or one naming the call. */
export function preview(tools, call) {
  const t = tools.get(call.tool);
  if (!t) throw new InvalidArguments(`no tool \`${call.tool}\``);
  const args = argumentsOf(call.tool, t, call);
  if (t.preflight) {
    const p = t.preflight(args, call);
    return { summary: String(p.summary), detail: String(p.detail ?? "") };
  }
  return { summary: `call \`${call.tool}\` (${t.effect})`, detail: JSON.stringify(args, null, 2) };
}

// SpiderMonkey throws the string "out of memory" when an allocation fails (a
// memory limit the sandbox refused to grow past, or one of its own), and an
// InternalError for "too much recursion": both are rethrown, so a limit hit
// stays a trap the host reports as one, never a tool error.
function asWitError(e) {
  if (e === "out of memory") throw e;
  if (e instanceof InvalidArguments) return { tag: "invalid-arguments", val: e.message };
  if (e instanceof Denied) return { tag: "denied", val: e.message };
  if (e instanceof Failed) return { tag: "failed", val: { message: e.message, retryable: e.retryable } };
  if (e instanceof ToolError) return { tag: "failed", val: { message: e.message, retryable: false } };
  if (typeof InternalError !== "undefined" && e instanceof InternalError) throw e;
  return { tag: "failed", val: { message: `the tool threw ${e && e.name ? e.name + ": " + e.message : String(e)}`, retryable: false } };
}

/** The `warden:plugin/tool` interface over the tools a module exports. */
export function exportTools(module) {
  const tools = toolsOf(module);
  return {
    describe() {
      return [...tools].map(([name, t]) => ({
        name,
        description: t.description,
        inputSchema: JSON.stringify(t.args.schema),
        effect: t.effect,
      }));
    },
    preflight(call) {
      try {
        return preview(tools, call);
      } catch (e) {
        throw asWitError(e);
      }
    },
    async invoke(call) {
      try {
        return { content: await invoke(tools, call) };
      } catch (e) {
        throw asWitError(e);
      }
    },
  };
}

// ---------------------------------------------------------------- host

/** The value the operator set for `key`, or undefined. */
export function config(key) {
  return hostConfig(key) ?? undefined;
}

/**
 * The environment variable `name`, or undefined. Only the variables the
 * operator grants exist in the sandbox (JavaScript in the component has no
 * `process.env`).
 */
export function env(name) {
  for (const [key, value] of getEnvironment()) if (key === name) return value;
  return undefined;
}

/** One line to the host's log: level is trace, debug, info, warn or error. */
export function log(level, message) {
  hostLog(level, String(message));
}

// ---------------------------------------------------------------- files
//
// A mount the operator grants is a directory at `/<mount>`. JavaScript in
// the component has no `fs` module: these helpers open files through WASI.
// `inMount` refuses absolute paths and `..` before anything is opened, the
// same way (`Denied`); the sandbox refuses again whatever gets past it.

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** The path `path` (relative to the mount) names inside `/<mount>`, or Denied. */
export function inMount(mount, path) {
  if (typeof path !== "string" || path === "") throw new InvalidArguments("the path is empty");
  if (path.startsWith("/")) throw new Denied(`\`${path}\` is absolute: paths are relative to the \`${mount}\` mount`);
  if (path.split("/").includes("..")) throw new Denied(`\`${path}\` climbs out of the \`${mount}\` mount`);
  return `/${mount}/${path}`;
}

/** The ToolError for a WASI filesystem error `e` met while touching `path`. */
export function fileError(e, path) {
  const code = e && e.payload !== undefined ? e.payload : e;
  switch (code) {
    case "access":
    case "not-permitted":
    case "read-only":
      return new Denied(`\`${path}\`: not permitted by the sandbox (${code})`);
    case "no-entry":
      return new Failed(`\`${path}\` does not exist`);
    case "is-directory":
      return new Failed(`\`${path}\` is a directory`);
    default:
      return new Failed(`\`${path}\`: ${typeof code === "string" ? code : String(e)}`);
  }
}

// The preopened directory holding the absolute `path`, and the rest of it.
function resolve(path) {
  for (const [dir, name] of getDirectories()) {
    const root = name.endsWith("/") ? name : name + "/";
    if (path.startsWith(root)) return [dir, path.slice(root.length)];
  }
  throw new Denied(`\`${path}\` is outside every mount`);
}

function open(path, openFlags, flags) {
  const [dir, rest] = resolve(path);
  try {
    return dir.openAt({}, rest, openFlags, flags);
  } catch (e) {
    throw fileError(e, path);
  }
}

/**
 * The bytes of the file at the absolute `path`. No checks of its own: the
 * sandbox decides (`readText` checks first).
 */
export function readFileBytes(path) {
  const file = open(path, {}, { read: true });
  const chunks = [];
  let offset = 0n;
  try {
    for (;;) {
      const [bytes, end] = file.read(65536n, offset);
      chunks.push(bytes);
      offset += BigInt(bytes.length);
      if (end || bytes.length === 0) break;
    }
  } catch (e) {
    throw fileError(e, path);
  }
  const out = new Uint8Array(Number(offset));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** Writes `text` to the absolute `path`, replacing it. */
export function writeFileText(path, text) {
  const file = open(path, { create: true, truncate: true }, { write: true });
  const bytes = encoder.encode(text);
  try {
    let at = 0;
    while (at < bytes.length) at += Number(file.write(bytes.subarray(at), BigInt(at)));
  } catch (e) {
    throw fileError(e, path);
  }
}

/** The UTF-8 text of `path` inside `mount`, or a ToolError. */
export function readText(mount, path) {
  const bytes = readFileBytes(inMount(mount, path));
  try {
    return decoder.decode(bytes);
  } catch {
    throw new Failed(`\`${path}\` is not UTF-8 text`);
  }
}

/** Writes `text` to `path` inside `mount`, or a ToolError. */
export function writeText(mount, path, text) {
  writeFileText(inMount(mount, path), text);
}
