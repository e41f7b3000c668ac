"""An MCP client built with the official Python SDK (`mcp` on PyPI), driving
`warden mcp serve` as any third-party client would.

Run by `tests/tests/all/mcp.rs`, which sets up the agent, the store and
(for HTTP) the server, then checks the store. Each scenario is one MCP
session (one Warden run); a failed check raises, and the script exits 1.

    client.py stdio <warden> <agent.toml> <scenario>...
    client.py http <url> <token> <scenario>...

The environment carries WARDEN_STORE and WARDEN_BIN (the binary the
scenarios approve and deny with from "another terminal").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Literal

import httpx2
import mcp.types as types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

CLIENT = types.Implementation(name="warden-tests", version="1.0")


class Target:
    """Where the server is: a command to spawn (stdio) or a URL (HTTP)."""

    def __init__(self, transport: str, first: str, second: str) -> None:
        self.transport = transport
        self.first = first
        self.second = second

    @asynccontextmanager
    async def session(self, elicit: Any = None) -> AsyncIterator[ClientSession]:
        if self.transport == "stdio":
            params = StdioServerParameters(
                command=self.first,
                args=[
                    "mcp",
                    "serve",
                    self.second,
                    "--approval-timeout",
                    os.environ.get("MCP_APPROVAL_TIMEOUT", "5s"),
                    *os.environ.get("MCP_SERVE_FLAGS", "").split(),
                ],
                env=dict(os.environ),
            )
            with open(os.environ.get("MCP_SERVER_LOG", os.devnull), "a") as log:
                async with stdio_client(params, errlog=log) as (read, write):
                    async with ClientSession(
                        read, write, elicitation_callback=elicit, client_info=CLIENT
                    ) as session:
                        await session.initialize()
                        yield session
        else:
            headers = {"Authorization": f"Bearer {self.second}"}
            async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
                async with streamable_http_client(self.first, http_client=http) as (read, write):
                    async with ClientSession(
                        read, write, elicitation_callback=elicit, client_info=CLIENT
                    ) as session:
                        await session.initialize()
                        yield session


    def stdio_params(self) -> StdioServerParameters:
        return StdioServerParameters(
            command=self.first,
            args=[
                "mcp",
                "serve",
                self.second,
                "--approval-timeout",
                os.environ.get("MCP_APPROVAL_TIMEOUT", "5s"),
                *os.environ.get("MCP_SERVE_FLAGS", "").split(),
            ],
            env=dict(os.environ),
        )

    @asynccontextmanager
    async def client(self, mode: str, tasks: bool = False) -> AsyncIterator[Client]:
        """The SDK's high-level `Client`: `mode` "legacy" (the `initialize`
        handshake), "auto" (`server/discover`, else the handshake) or a
        revision; with `tasks`, it declares the tasks extension."""
        extensions = [TasksExtension()] if tasks else None
        if self.transport == "stdio":
            with open(os.environ.get("MCP_SERVER_LOG", os.devnull), "a") as log:
                async with Client(
                    stdio_client(self.stdio_params(), errlog=log),
                    mode=mode,
                    extensions=extensions,
                    client_info=CLIENT,
                ) as client:
                    yield client
        else:
            headers = {"Authorization": f"Bearer {self.second}"}
            async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
                async with Client(
                    streamable_http_client(self.first, http_client=http),
                    mode=mode,
                    extensions=extensions,
                    client_info=CLIENT,
                ) as client:
                    yield client


# ---- the tasks extension (io.modelcontextprotocol/tasks) ----


class TaskHandle(types.Result):
    """What a `tools/call` answers when it became a task (`resultType: "task"`)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None


class TaskParams(types.RequestParams):
    task_id: str


class TaskGet(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class TaskCancel(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class TaskUpdateParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class TaskUpdate(types.Request[TaskUpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TaskUpdateParams
    name_param = "taskId"


class TaskState(types.Result):
    """A `tasks/get` answer: the task and, by its status, its result or error."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class TasksExtension(ClientExtension):
    """Declares the extension; a handle a plain `call_tool` gets is polled to its end."""

    identifier = "io.modelcontextprotocol/tasks"

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, context: ClaimContext) -> types.CallToolResult:
        state = await until_settled(context.session, handle.task_id)
        check(state.status == "completed", f"the task did not complete: {state}")
        return types.CallToolResult.model_validate(state.result)


async def task_get(session: ClientSession, task_id: str) -> TaskState:
    return await session.send_request(TaskGet(params=TaskParams(task_id=task_id)), TaskState)


async def task_cancel(session: ClientSession, task_id: str) -> None:
    await session.send_request(TaskCancel(params=TaskParams(task_id=task_id)), types.EmptyResult)


async def until_settled(session: ClientSession, task_id: str, seconds: float = 60) -> TaskState:
    """Polls `tasks/get` until the task is in a terminal state."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        state = await task_get(session, task_id)
        if state.status in ("completed", "failed", "cancelled"):
            return state
        check(asyncio.get_running_loop().time() < deadline, f"the task never settled: {state}")
        await asyncio.sleep((state.poll_interval_ms or 1000) / 1000)


def task_file() -> Path:
    return Path(os.environ["MCP_WORK"]).parent / "task.txt"


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def warden(*args: str) -> Any:
    """The `warden` command line, as an operator at another terminal."""
    out = subprocess.run(
        [os.environ["WARDEN_BIN"], "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    check(out.returncode == 0, f"warden {' '.join(args)}: {out.returncode} {out.stdout} {out.stderr}")
    if not out.stdout.strip():
        return None
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        # A verb prints the event it recorded, then the run's summary.
        return json.loads(out.stdout.strip().splitlines()[-1])


async def awaiting_approval() -> tuple[str, str]:
    """The run and call waiting for approval, once there is one."""
    for _ in range(300):
        runs = await asyncio.to_thread(warden, "runs", "list", "--status", "awaiting_approval")
        if runs:
            run = runs[0]["run_id"]
            shown = await asyncio.to_thread(warden, "runs", "show", run)
            for step in shown["next"]:
                if step["action"] == "approve":
                    return run, step["command"].split()[-1]
        await asyncio.sleep(0.1)
    raise AssertionError("no run came to await approval")


def effects() -> list[str]:
    path = Path(os.environ["MCP_WORK"]) / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


def append(line: str) -> dict[str, Any]:
    return {"op": "append", "path": "/workspace/effects.log", "content": line + "\n"}


def refusal_code(error: MCPError) -> str:
    data = error.data if isinstance(error.data, dict) else {}
    return str(data.get("code"))


async def approve_by_elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    check("hostile__" in params.message, f"the request names the tool: {params.message}")
    return types.ElicitResult(action="accept", content={"approve": True})


async def decline_by_elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


# ---- scenarios ----


async def tools(target: Target) -> None:
    async with target.session() as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        check({"files__read_file", "hostile__fs"} <= listed.keys(), f"tools: {sorted(listed)}")
        read = listed["files__read_file"].annotations
        check(read is not None and read.read_only_hint is True, f"read: {read}")
        check(read.destructive_hint is False and read.idempotent_hint is True, f"read: {read}")
        write = listed["hostile__fs"].annotations
        check(write is not None and write.read_only_hint is False, f"write: {write}")
        check(write.destructive_hint is True and write.idempotent_hint is False, f"write: {write}")
        check("needs approval" in (listed["hostile__fs"].description or ""), "the description says so")
        # Schemas strict validators (Ajv) accept: no `format` JSON Schema
        # does not define (schemars' `uint64` for a u64), the range as
        # `minimum`.
        schema = listed["files__read_file"].input_schema
        check("format" not in json.dumps(schema), f"a non-standard format: {schema}")
        check(schema["properties"]["limit"].get("minimum", -1) >= 0, f"limit: {schema}")


async def read(target: Target) -> None:
    async with target.session() as session:
        result = await session.call_tool("files__read_file", {"path": "input.txt"})
        check(not result.is_error, f"read failed: {result}")
        check("the input file" in text(result), f"read: {text(result)}")
        # A tool error is the tool's result, not a protocol error.
        missing = await session.call_tool("files__read_file", {"path": "nowhere.txt"})
        check(missing.is_error is True, f"a missing file is an error result: {missing}")
        # An unknown tool is refused before anything is recorded.
        try:
            await session.call_tool("files__nothing", {})
            raise AssertionError("an unknown tool was accepted")
        except MCPError as error:
            check(error.code == types.INVALID_PARAMS, f"unknown tool: {error.code}")


async def mistakes(target: Target) -> None:
    """Calls with bad arguments, more in a row than the agent's
    `max_invalid_tool_calls` (3): each is that call's error, and the session
    goes on."""
    async with target.session() as session:
        for bad in ({}, {"path": 5}, {"path": ["input.txt"]}, {"path": None}, {}):
            result = await session.call_tool("files__read_file", bad)
            check(result.is_error is True, f"{bad}: an error result: {result}")
            check("invalid arguments" in text(result), f"{bad}: says why: {text(result)}")
        result = await session.call_tool("files__read_file", {"path": "input.txt"})
        check(not result.is_error, f"a good call after the mistakes failed: {result}")
        check("the input file" in text(result), f"read: {text(result)}")
        for bad in ({"path": 5}, {}, {}):
            result = await session.call_tool("files__read_file", bad)
            check(result.is_error is True, f"{bad}: an error result: {result}")
        result = await session.call_tool("files__read_file", {"path": "input.txt"})
        check(not result.is_error, f"the session still works: {result}")


async def write_elicited(target: Target) -> None:
    async with target.session(elicit=approve_by_elicitation) as session:
        result = await session.call_tool("hostile__fs", append("elicited"))
        check(not result.is_error, f"approved write failed: {result}")
        check(effects().count("elicited") == 1, f"effects: {effects()}")


async def write_cli(target: Target) -> None:
    async with target.session() as session:
        call = asyncio.create_task(session.call_tool("hostile__fs", append("approved")))
        run, call_id = await awaiting_approval()
        check(effects().count("approved") == 0, "nothing ran before the approval")
        await asyncio.to_thread(warden, "runs", "approve", run, call_id)
        result = await call
        check(not result.is_error, f"approved write failed: {result}")
        check(effects().count("approved") == 1, f"effects: {effects()}")
        # The session goes on: a second call is in the same run.
        again = await session.call_tool("files__read_file", {"path": "effects.log"})
        check("approved" in text(again), f"read after write: {text(again)}")


async def write_operators_only(target: Target) -> None:
    """A write under `--approvals operators` (HTTP's default), from a client
    whose elicitation handler would approve anything: the client is never
    asked, the write stays parked and unmade, until an operator approves
    it from another terminal; then it is made once."""
    asked: list[str] = []

    async def would_approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with target.session(elicit=would_approve) as session:
        call = asyncio.create_task(session.call_tool("hostile__fs", append("operator")))
        run, call_id = await awaiting_approval()
        await asyncio.sleep(2)
        check(asked == [], f"the client was asked to approve its own write: {asked}")
        check(not call.done(), "the write did not wait for an operator")
        check(effects().count("operator") == 0, f"made before an operator approved: {effects()}")
        shown = await asyncio.to_thread(warden, "runs", "show", run)
        check(shown["status"] == "awaiting_approval", f"still parked: {shown['status']}")
        await asyncio.to_thread(warden, "runs", "approve", run, call_id)
        result = await call
        check(not result.is_error, f"approved write failed: {result}")
        check(asked == [], f"the client was asked: {asked}")
        check(effects().count("operator") == 1, f"effects: {effects()}")


async def progress_parked(target: Target) -> None:
    """A synchronous client (no tasks) whose write waits for approval from
    another terminal: while it is parked, the server sends
    `notifications/progress` for the call's `progressToken` at a steady
    interval (the server's `--progress-interval`, 1 s here), so a client
    timeout that progress resets (the TypeScript SDK's
    `resetTimeoutOnProgress`) does not fire while a human decides."""
    seen: list[tuple[float, float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((asyncio.get_running_loop().time(), progress, message))

    async with target.session() as session:
        call = asyncio.create_task(
            session.call_tool("hostile__fs", append("progressed"), progress_callback=on_progress)
        )
        run, call_id = await awaiting_approval()
        parked = asyncio.get_running_loop().time()
        await asyncio.sleep(4)
        during = len([at for at, _, _ in seen if at >= parked])
        await asyncio.to_thread(warden, "runs", "approve", run, call_id)
        result = await call
        check(not result.is_error, f"approved write failed: {result}")
        check(effects().count("progressed") == 1, f"effects: {effects()}")
    check(during >= 2, f"progress while parked 4 s: {seen}")
    values = [progress for _, progress, _ in seen]
    check(values == sorted(set(values)), f"progress must increase: {values}")
    check(
        all(message and "approval" in message for at, _, message in seen if at >= parked + 0.5),
        f"the messages while parked say why: {seen}",
    )


async def denied(target: Target) -> None:
    async with target.session(elicit=decline_by_elicitation) as session:
        try:
            await session.call_tool("hostile__fs", append("declined"))
            raise AssertionError("a declined write was made")
        except MCPError as error:
            check(refusal_code(error) == "approval_denied", f"declined: {error.data}")
    async with target.session() as session:
        call = asyncio.create_task(session.call_tool("hostile__fs", append("denied")))
        run, call_id = await awaiting_approval()
        await asyncio.to_thread(warden, "runs", "deny", run, call_id, "--reason", "not now")
        try:
            await call
            raise AssertionError("a denied write was made")
        except MCPError as error:
            check(refusal_code(error) == "approval_denied", f"denied: {error.data}")
            check("not now" in error.message, f"the reason reaches the client: {error.message}")
    check("declined" not in effects() and "denied" not in effects(), f"effects: {effects()}")


async def timeout(target: Target) -> None:
    async with target.session() as session:
        try:
            await session.call_tool("hostile__fs", append("unanswered"))
            raise AssertionError("an unapproved write was made")
        except MCPError as error:
            check(refusal_code(error) == "approval_timeout", f"timeout: {error.data}")
        check("unanswered" not in effects(), f"effects: {effects()}")
        # The session is still usable after the refusal.
        result = await session.call_tool("files__read_file", {"path": "input.txt"})
        check("the input file" in text(result), f"read after timeout: {text(result)}")


async def cancel_parked(target: Target) -> None:
    """A write waiting for approval, cancelled by the client (the SDK's
    `notifications/cancelled` when its task is cancelled): withdrawn at once,
    so the session's next call is not held up by it; approving it afterwards
    is refused, and it is never made."""
    async with target.session() as session:
        call = asyncio.create_task(session.call_tool("hostile__fs", append("cancelled")))
        run, call_id = await awaiting_approval()
        call.cancel()
        try:
            await call
        except (asyncio.CancelledError, MCPError):
            pass
        # The approval timeout is a minute here: this must not wait for it.
        result = await asyncio.wait_for(
            session.call_tool("files__read_file", {"path": "input.txt"}), 20
        )
        check(not result.is_error, f"the call after the cancelled one: {result}")
        late = await asyncio.to_thread(
            subprocess.run,
            [os.environ["WARDEN_BIN"], "--json", "runs", "approve", run, call_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        check(late.returncode != 0, f"a withdrawn call was approved: {late.stdout}")
    check("cancelled" not in effects(), f"effects: {effects()}")


async def end_parked(target: Target) -> None:
    """A session that ends (stdio EOF, HTTP DELETE) while a write waits for
    approval: the write is withdrawn, never made, and the session's run
    completes (a stdio server exits instead of waiting for the approval
    timeout, a minute here)."""
    started = asyncio.get_running_loop().time()
    async with target.session() as session:
        call = asyncio.create_task(session.call_tool("hostile__fs", append("abandoned")))
        run, call_id = await awaiting_approval()
    call.cancel()
    try:
        await call
    except BaseException:
        pass
    elapsed = asyncio.get_running_loop().time() - started
    check(elapsed < 40, f"the session took {elapsed:.1f}s to end")
    for _ in range(200):
        shown = await asyncio.to_thread(warden, "runs", "show", run)
        if shown["status"] == "completed":
            break
        await asyncio.sleep(0.1)
    check(shown["status"] == "completed", f"the ended session's run: {shown['status']}")
    late = await asyncio.to_thread(
        subprocess.run,
        [os.environ["WARDEN_BIN"], "--json", "runs", "approve", run, call_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    check(late.returncode != 0, f"a withdrawn call was approved: {late.stdout}")
    check("abandoned" not in effects(), f"effects: {effects()}")


async def refused(target: Target) -> None:
    """HTTP only: no token, a wrong one, another Origin, another Host."""
    url = target.first
    host = url.split("/")[2]
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "intruder", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    good = {"Authorization": f"Bearer {target.second}", **accept}
    cases = [
        ("no token", accept, 401, "unauthenticated"),
        ("a wrong token", {**accept, "Authorization": "Bearer wrong"}, 401, "unauthenticated"),
        ("another origin", {**good, "Origin": "http://evil.example"}, 403, "origin_refused"),
        ("another host", {**good, "Host": "evil.example"}, 403, "host_refused"),
    ]
    async with httpx2.AsyncClient(timeout=30) as http:
        for what, headers, status, code in cases:
            response = await http.post(url, json=initialize, headers=headers)
            check(response.status_code == status, f"{what}: {response.status_code} {response.text}")
            check(response.json()["error"]["code"] == code, f"{what}: {response.text}")
        # The same request with the token and this server's own origin passes.
        response = await http.post(url, json=initialize, headers={**good, "Origin": f"http://{host}"})
        check(response.status_code == 200, f"own origin: {response.status_code} {response.text}")
    # And the SDK's own client is refused without the token.
    try:
        async with httpx2.AsyncClient(timeout=30) as http:
            async with streamable_http_client(url, http_client=http) as (read_, write_):
                async with ClientSession(read_, write_) as session:
                    await asyncio.wait_for(session.initialize(), 30)
        raise AssertionError("the SDK client got in without a token")
    except AssertionError:
        raise
    except BaseException:
        pass


async def crash_write(target: Target) -> None:
    """Approve a write that blocks after its effect; the test kills the
    server meanwhile, so this call never returns."""
    async with target.session(elicit=approve_by_elicitation) as session:
        await session.call_tool(
            "hostile__write_then_sleep",
            {"path": "/workspace/effects.log", "content": "crash\n"},
        )
        raise AssertionError("the blocked write returned")


async def revisions(target: Target) -> None:
    """Both revisions from the same endpoint: a client that shakes hands
    (`initialize`, 2025-11-25) and one that discovers (`server/discover`,
    2026-07-28, no session), each listing the tools and reading."""
    for mode, expected in (("legacy", "2025-11-25"), ("auto", "2026-07-28")):
        async with target.client(mode) as client:
            check(client.protocol_version == expected, f"{mode}: negotiated {client.protocol_version}")
            tools = {t.name for t in (await client.list_tools()).tools}
            check("hostile__fs" in tools, f"{mode}: tools {sorted(tools)}")
            result = await client.call_tool("files__read_file", {"path": "input.txt"})
            check(not result.is_error, f"{mode}: read failed: {result}")
            check("the input file" in text(result), f"{mode}: read: {text(result)}")
            if expected == "2026-07-28":
                extensions = client.server_capabilities.extensions or {}
                check(
                    "io.modelcontextprotocol/tasks" in extensions,
                    f"{mode}: the tasks extension is not declared: {client.server_capabilities}",
                )


async def task_park(target: Target) -> None:
    """A write that needs approval, from a client that takes tasks: the call
    is answered at once with a handle, the task waits for approval
    (`input_required`), nothing is made; the handle is kept in a file and
    the client leaves."""
    async with target.client("2026-07-28", tasks=True) as client:
        handle = await client.session.call_tool("hostile__fs", append("tasked"), allow_claimed=True)
        check(isinstance(handle, TaskHandle), f"no task handle: {handle}")
        check(handle.status == "input_required", f"the seed: {handle}")
        state = await task_get(client.session, handle.task_id)
        check(state.status == "input_required", f"the parked task: {state}")
        check("warden runs approve" in (state.status_message or ""), f"says how: {state}")
        check(effects().count("tasked") == 0, f"made before approval: {effects()}")
        # A read in the same session is not held up by the parked write.
        result = await asyncio.wait_for(client.call_tool("files__read_file", {"path": "input.txt"}), 20)
        check(not result.is_error, f"a read beside the task: {result}")
        task_file().write_text(handle.task_id)


async def task_result(target: Target) -> None:
    """A new client (another session, after the server restarted) polls the
    kept handle: the approved write was made once and is the task's result."""
    task_id = task_file().read_text()
    async with target.client("2026-07-28", tasks=True) as client:
        state = await until_settled(client.session, task_id)
        check(state.status == "completed", f"the approved task: {state}")
        result = types.CallToolResult.model_validate(state.result)
        check(not result.is_error, f"the write failed: {result}")
        again = await task_get(client.session, task_id)
        check(again.status == "completed", f"read again: {again}")
    check(effects().count("tasked") == 1, f"effects: {effects()}")


async def task_cancel_parked(target: Target) -> None:
    """A task cancelled while it waits for approval: withdrawn (recorded),
    `cancelled`, refused to a later approval, never made."""
    async with target.client("2026-07-28", tasks=True) as client:
        handle = await client.session.call_tool("hostile__fs", append("cancelled-task"), allow_claimed=True)
        check(isinstance(handle, TaskHandle), f"no task handle: {handle}")
        run, call_id = await awaiting_approval()
        await task_cancel(client.session, handle.task_id)
        state = await until_settled(client.session, handle.task_id)
        check(state.status == "cancelled", f"the cancelled task: {state}")
        late = await asyncio.to_thread(
            subprocess.run,
            [os.environ["WARDEN_BIN"], "--json", "runs", "approve", run, call_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        check(late.returncode != 0, f"a cancelled task was approved: {late.stdout}")
        state = await task_get(client.session, handle.task_id)
        check(state.status == "cancelled", f"after the late approval: {state}")
    check("cancelled-task" not in effects(), f"effects: {effects()}")


async def task_client_approves(target: Target) -> None:
    """Under `--approvals client` (stdio's default) the task asks its client
    for the approval form (`inputRequests`); the client's `tasks/update`
    approves, and the write is made once."""
    async with target.client("2026-07-28", tasks=True) as client:
        handle = await client.session.call_tool("hostile__fs", append("client-approved"), allow_claimed=True)
        check(isinstance(handle, TaskHandle), f"no task handle: {handle}")
        state = await task_get(client.session, handle.task_id)
        check(state.status == "input_required", f"the parked task: {state}")
        form = (state.input_requests or {}).get("approval")
        check(form is not None and form["method"] == "elicitation/create", f"the form: {state}")
        check("hostile__fs" in form["params"]["message"], f"the form names the call: {form}")
        check(effects().count("client-approved") == 0, f"made before approval: {effects()}")
        answer = {"approval": {"action": "accept", "content": {"approve": True}}}
        await client.session.send_request(
            TaskUpdate(params=TaskUpdateParams(task_id=handle.task_id, input_responses=answer)),
            types.EmptyResult,
        )
        state = await until_settled(client.session, handle.task_id)
        check(state.status == "completed", f"the approved task: {state}")
        result = types.CallToolResult.model_validate(state.result)
        check(not result.is_error, f"the write failed: {result}")
    check(effects().count("client-approved") == 1, f"effects: {effects()}")


async def task_foreign(target: Target) -> None:
    """Another session's task: a client that did not receive the handle
    cannot read or cancel it by its run and call (a forged key), nor reach
    a run that is not a task; the owner's task is untouched."""
    async with target.client("2026-07-28", tasks=True) as owner:
        handle = await owner.session.call_tool("hostile__fs", append("foreign"), allow_claimed=True)
        check(isinstance(handle, TaskHandle), f"no task handle: {handle}")
        run, call, key = handle.task_id.split("/")
        state = await task_get(owner.session, handle.task_id)
        check(not state.input_requests, f"operators only: nothing is asked of the client: {state}")
        async with target.client("2026-07-28", tasks=True) as intruder:
            for forged in (
                f"{run}/{call}/{'0' * 32}",
                f"{run}/{call}/",
                f"{run}/{call}",
                run,
                f"run-{'f' * 32}/{call}/{key}",
            ):
                for attempt in (task_get, task_cancel):
                    try:
                        await attempt(intruder.session, forged)
                        raise AssertionError(f"{attempt.__name__} {forged!r} was answered")
                    except MCPError as error:
                        check(error.code == types.INVALID_PARAMS, f"{forged!r}: {error.code} {error.message}")
        state = await task_get(owner.session, handle.task_id)
        check(state.status == "input_required", f"the owner's task after the attempts: {state}")
        await task_cancel(owner.session, handle.task_id)
        state = await until_settled(owner.session, handle.task_id)
        check(state.status == "cancelled", f"the owner cancels its own: {state}")
    check("foreign" not in effects(), f"effects: {effects()}")


SCENARIOS = {
    "tools": tools,
    "read": read,
    "mistakes": mistakes,
    "write_elicited": write_elicited,
    "write_cli": write_cli,
    "denied": denied,
    "timeout": timeout,
    "refused": refused,
    "cancel_parked": cancel_parked,
    "end_parked": end_parked,
    "progress_parked": progress_parked,
    "write_operators_only": write_operators_only,
    "crash_write": crash_write,
    "revisions": revisions,
    "task_park": task_park,
    "task_result": task_result,
    "task_cancel_parked": task_cancel_parked,
    "task_foreign": task_foreign,
    "task_client_approves": task_client_approves,
}


async def main(argv: list[str]) -> None:
    transport, first, second, *names = argv
    target = Target(transport, first, second)
    for name in names:
        await SCENARIOS[name](target)
        print(f"ok {name}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
