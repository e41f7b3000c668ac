// An MCP client built with the official TypeScript SDK
// (`@modelcontextprotocol/sdk` on npm, pinned in tests/mcp/package.json),
// driving `warden mcp serve` as any third-party client would. Run by
// tests/tests/all/mcp.rs with Node, from target/mcp-js (where .ci/run
// installs the SDK):
//
//     client.mjs stdio <warden> <agent.toml>
//     client.mjs http <url> <token>
//
// One session: list the tools and their annotations, call a read tool, a
// write approved with `warden runs approve` from "another terminal", a
// write denied with `warden runs deny`, a write whose approval takes longer
// than the call's timeout (kept alive by progress), and an unknown tool. The
// environment carries WARDEN_STORE, WARDEN_BIN and MCP_WORK. A failed
// check throws, and the script exits 1.

import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

function warden(...args) {
  const out = execFileSync(process.env.WARDEN_BIN, ["--json", ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  });
  if (!out.trim()) return null;
  try {
    return JSON.parse(out);
  } catch {
    // A verb prints the event it recorded, then the run's summary.
    const lines = out.trim().split("\n");
    return JSON.parse(lines[lines.length - 1]);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function awaitingApproval() {
  for (let i = 0; i < 300; i++) {
    const runs = warden("runs", "list", "--status", "awaiting_approval");
    if (runs.length > 0) {
      const run = runs[0].run_id;
      const shown = warden("runs", "show", run);
      for (const step of shown.next) {
        if (step.action === "approve") return [run, step.command.split(" ").pop()];
      }
    }
    await sleep(100);
  }
  throw new Error("no run came to await approval");
}

function effects() {
  const path = join(process.env.MCP_WORK, "effects.log");
  return existsSync(path) ? readFileSync(path, "utf8").split("\n").filter(Boolean) : [];
}

const append = (line) => ({ op: "append", path: "/workspace/effects.log", content: `${line}\n` });
const text = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text).join("");

async function main([transport, first, second]) {
  const client = new Client({ name: "warden-tests-ts", version: "1.0.0" });
  let http = null;
  if (transport === "stdio") {
    await client.connect(
      new StdioClientTransport({
        command: first,
        args: ["mcp", "serve", second, ...(process.env.MCP_SERVE_FLAGS ?? "").split(" ").filter(Boolean)],
        env: process.env,
        stderr: "inherit",
      }),
    );
  } else {
    http = new StreamableHTTPClientTransport(new URL(first), {
      requestInit: { headers: { Authorization: `Bearer ${second}` } },
    });
    await client.connect(http);
  }

  const { tools } = await client.listTools();
  const listed = Object.fromEntries(tools.map((t) => [t.name, t]));
  check(listed.files__read_file && listed.hostile__fs, `tools: ${Object.keys(listed)}`);
  check(listed.files__read_file.annotations.readOnlyHint === true, "a read is read-only");
  check(listed.hostile__fs.annotations.readOnlyHint === false, "a write is not");
  check(listed.hostile__fs.annotations.destructiveHint === true, "a write is destructive");

  const read = await client.callTool({ name: "files__read_file", arguments: { path: "input.txt" } });
  check(!read.isError && text(read).includes("the input file"), `read: ${JSON.stringify(read)}`);

  // A write waits for a human at another terminal.
  const pending = client.callTool({ name: "hostile__fs", arguments: append("ts-approved") });
  const [run, call] = await awaitingApproval();
  check(!effects().includes("ts-approved"), "nothing ran before the approval");
  warden("runs", "approve", run, call);
  const written = await pending;
  check(!written.isError, `approved write: ${JSON.stringify(written)}`);
  check(effects().filter((e) => e === "ts-approved").length === 1, `effects: ${effects()}`);

  // A denied write is a refusal with the engine's code, and never made.
  const refused = client.callTool({ name: "hostile__fs", arguments: append("ts-denied") });
  const [run2, call2] = await awaitingApproval();
  warden("runs", "deny", run2, call2, "--reason", "not from ts");
  try {
    await refused;
    throw new Error("a denied write was made");
  } catch (error) {
    check(error.data?.code === "approval_denied", `denied: ${error.message} ${JSON.stringify(error.data)}`);
    check(error.message.includes("not from ts"), `the reason reaches the client: ${error.message}`);
  }
  check(!effects().includes("ts-denied"), `effects: ${effects()}`);

  // A write whose approval takes longer than the call's timeout (3 s here,
  // 60 s by default): the server's progress while it is parked (every
  // second here) resets the timeout, so the call waits for the human.
  const beats = [];
  const slow = client.callTool({ name: "hostile__fs", arguments: append("ts-progressed") }, CallToolResultSchema, {
    timeout: 3000,
    resetTimeoutOnProgress: true,
    onprogress: (progress) => beats.push(progress),
  });
  let failed = null;
  slow.catch((error) => {
    failed = error;
  });
  const [run3, call3] = await awaitingApproval();
  await sleep(5000);
  check(failed === null, `the parked call timed out: ${failed}`);
  warden("runs", "approve", run3, call3);
  const progressed = await slow;
  check(!progressed.isError, `approved slow write: ${JSON.stringify(progressed)}`);
  check(beats.length >= 3, `progress while parked: ${JSON.stringify(beats)}`);
  check(effects().filter((e) => e === "ts-progressed").length === 1, `effects: ${effects()}`);

  // An unknown tool is invalid params, nothing recorded.
  try {
    await client.callTool({ name: "files__nothing", arguments: {} });
    throw new Error("an unknown tool was accepted");
  } catch (error) {
    check(error.code === -32602, `unknown tool: ${error.code} ${error.message}`);
  }
  // Over HTTP the session (and its run) ends when the client ends it.
  if (http) await http.terminateSession();
  await client.close();
}

main(process.argv.slice(2)).then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
