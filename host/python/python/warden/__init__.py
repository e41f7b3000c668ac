"""Warden from Python: embed the durable agent runtime in an application.

Every guarantee is the Rust engine's (the sandbox, the event log,
approvals, budgets, recovery); this package only drives it, and holds
nothing but handles. ``AsyncRuntime`` is the asyncio API; ``Runtime`` is
the same verbs, synchronous. A run started here can be operated by the
``warden`` command line over the same store, and the other way round.

    import warden

    rt = warden.Runtime.open(".warden/warden.db")
    agent = rt.load_agent("examples/agents/notes.toml")
    run = rt.start(agent, "Summarise my notes")
    if rt.drive(run, agent) == "awaiting_approval":
        rt.approve(run, rt.show(run)["awaiting"]["call_id"])
        rt.drive(run, agent)

Values cross as plain JSON (dicts, lists, str, int, float, bool, None);
failures raise ``warden.errors`` exceptions carrying the engine's stable
``code`` and ``details``. docs/python.md in the repository is the guide.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import traceback
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

from . import _native
from ._native import Agent
from .errors import (
    AgentError,
    CallbackError,
    InvalidError,
    ProviderError,
    ReplayError,
    RunStateError,
    StoreError,
    UnknownRunError,
    WardenError,
    error_class,
)

__version__: str = _native.__version__

# The engine's threads stop before the interpreter finalizes.
atexit.register(_native._shutdown)

JSON = Any
"""A plain JSON value: dict, list, str, int, float, bool or None."""

Decision = Union[None, str, Dict[str, str]]
"""A policy's answer: ``None`` or ``"allow"``, ``deny(reason)``, ``feedback(message)``."""

Policy = Callable[[Dict[str, Any]], Union[Decision, Awaitable[Decision]]]
"""A policy: called with the request (``run_id``, ``agent``, ``policy``,
``hook`` and the hook's subject), answers a decision; may be ``async``."""

ExternalTool = Callable[[Dict[str, Any]], Union[JSON, Awaitable[JSON]]]
"""An external tool's handler: called with the call's arguments, returns
the output the run records; may be ``async``."""

_T = TypeVar("_T")


def allow() -> Dict[str, str]:
    """A policy's answer: go on."""
    return {"verdict": "allow"}


def deny(reason: str) -> Dict[str, str]:
    """A policy's answer: stop. At ``before_tool_call`` the reason is the
    tool's result the model sees; at any other hook the run fails."""
    return {"verdict": "deny", "reason": reason}


def feedback(message: str) -> Dict[str, str]:
    """A policy's answer at ``before_finish``: tell the model ``message``
    and ask it again."""
    return {"verdict": "feedback", "message": message}


class AsyncTurn:
    """A live turn: an async iterator of event dicts (``text_delta``,
    ``tool_call_started``, ``tool_call_finished``, ``approval_needed``, and
    last ``finished`` with its ``outcome``). ``cancel()`` interrupts it."""

    def __init__(self, native: _native.Turn) -> None:
        self._native = native

    @property
    def run_id(self) -> str:
        """The turn's run."""
        return self._native.run_id

    def __aiter__(self) -> "AsyncTurn":
        return self

    async def __anext__(self) -> Dict[str, Any]:
        return await self._native.__anext__()

    async def cancel(self, reason: Optional[str] = None) -> None:
        """Cancels the turn: the model stream or tool call in flight is
        interrupted and the cancellation recorded."""
        await self._native.cancel(reason)


class AsyncRuntime:
    """The runtime over one store; every verb is a coroutine."""

    def __init__(self, native: _native.Runtime) -> None:
        self._native = native

    @classmethod
    async def open(
        cls,
        store: str,
        *,
        cache_dir: Optional[str] = None,
        policies: Optional[Mapping[str, Policy]] = None,
        record_prompts: bool = False,
        witness: Optional[str] = None,
    ) -> "AsyncRuntime":
        """Opens ``store`` (a SQLite file, ``sqlite:PATH``, or a
        ``postgres://`` URL; a SQLite file is created when missing).
        ``cache_dir`` keeps compiled plugins between processes;
        ``policies`` maps the names agents enable to Python policies;
        ``witness`` (default: ``WARDEN_WITNESS``) is a witness ``warden
        store witness`` wrote: a run rolled back past it is refused
        (``rolled_back``) by every verb that records on it."""
        native = await _native.Runtime.open(
            store,
            cache_dir=cache_dir,
            policies=dict(policies) if policies else None,
            record_prompts=record_prompts,
            witness=witness,
        )
        return cls(native)

    def load_agent(self, path: str) -> Agent:
        """Loads and validates the agent file at ``path``."""
        return self._native.load_agent(path)

    def agent_from_dict(
        self, spec: Mapping[str, Any], *, base_dir: Optional[str] = None
    ) -> Agent:
        """Builds and validates an agent from a dict shaped like an agent
        file; relative paths in it resolve against ``base_dir`` (default:
        the working directory)."""
        return self._native.agent_from_dict(dict(spec), base_dir=base_dir)

    async def start(
        self,
        agent: Agent,
        input: JSON,
        *,
        run_id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        session: Optional[str] = None,
    ) -> str:
        """Records a new run; returns its id. Drive it afterwards."""
        return await self._native.start(
            agent,
            input,
            run_id=run_id,
            labels=dict(labels) if labels else None,
            session=session,
        )

    async def step(self, run_id: str, agent: Agent) -> bool:
        """One operation of the run; ``True`` while there may be more."""
        return await self._native.step(run_id, agent)

    async def drive(
        self,
        run_id: str,
        agent: Agent,
        *,
        external: Optional[Mapping[str, ExternalTool]] = None,
    ) -> str:
        """Steps the run until it is terminal or parked; returns its status.

        ``external`` maps external tools (``[external_tools.<name>]``) to
        handlers: each time the run waits for one of them, its handler is
        called with the arguments and its return value recorded as the
        output (``complete_external``), then the run goes on. A handler that
        raises fails closed: the run is cancelled with the traceback as the
        recorded reason, and ``CallbackError`` is raised from the exception.
        """
        status = await self._native.drive(run_id, agent)
        while status == "awaiting_external" and external:
            awaiting = (await self._native.show(run_id)).get("awaiting") or {}
            handler = external.get(awaiting.get("tool", ""))
            if handler is None:
                break
            try:
                output = handler(awaiting.get("arguments"))
                if inspect.isawaitable(output):
                    output = await output
            except Exception as exc:
                text = "".join(traceback.format_exception(exc)).rstrip()
                reason = f"external tool `{awaiting['tool']}` raised:\n{text}"
                await self._native.cancel(run_id, reason=reason)
                raise CallbackError(
                    "callback_failed",
                    f"external tool `{awaiting['tool']}` raised {type(exc).__name__}: {exc}",
                    {"run_id": run_id, "call_id": awaiting.get("call_id"), "traceback": text},
                ) from exc
            await self._native.complete_external(run_id, awaiting["call_id"], output)
            status = await self._native.drive(run_id, agent)
        return status

    async def recover(self, run_id: str, agent: Agent) -> str:
        """Replays the log, checking every recorded decision, then goes on
        live; a write with no recorded outcome is never repeated."""
        return await self._native.recover(run_id, agent)

    async def approve(self, run_id: str, call_id: str, *, by: str = "python") -> None:
        """Approves the call awaiting approval; drive afterwards."""
        await self._native.approve(run_id, call_id, by=by)

    async def deny(
        self, run_id: str, call_id: str, reason: str, *, by: str = "python"
    ) -> None:
        """Denies the call awaiting approval; drive afterwards."""
        await self._native.deny(run_id, call_id, reason, by=by)

    async def resume(
        self, run_id: str, agent: Agent, input: JSON, *, by: Optional[str] = None
    ) -> str:
        """Gives a suspended run its input (or a run over budget its
        extension); returns its status. Drive afterwards."""
        return await self._native.resume(run_id, agent, input, by=by)

    async def complete_external(
        self, run_id: str, call_id: str, output: JSON, *, by: Optional[str] = None
    ) -> None:
        """Records the output of the external call the run waits for."""
        await self._native.complete_external(run_id, call_id, output, by=by)

    async def resolve(
        self, run_id: str, output: JSON, *, by: str = "python", note: Optional[str] = None
    ) -> None:
        """Records by hand the outcome of a write whose completion is
        missing; recover afterwards."""
        await self._native.resolve(run_id, output, by=by, note=note)

    async def cancel(
        self, run_id: str, *, reason: Optional[str] = None, by: Optional[str] = None
    ) -> None:
        """Cancels the run (interrupting it when this runtime drives it)."""
        await self._native.cancel(run_id, reason=reason, by=by)

    async def abandon(self, run_id: str, reason: str, *, by: str = "python") -> None:
        """Ends the run for good, whatever it waits for."""
        await self._native.abandon(run_id, reason, by=by)

    async def list_runs(
        self,
        *,
        status: Optional[Sequence[str]] = None,
        agent: Optional[str] = None,
        session: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
    ) -> List[Dict[str, Any]]:
        """The store's runs, as dicts."""
        return await self._native.list_runs(
            status=list(status) if status else None,
            agent=agent,
            session=session,
            labels=dict(labels) if labels else None,
            limit=limit,
        )

    async def show(self, run_id: str) -> Dict[str, Any]:
        """How the run stands: ``status``, ``awaiting`` (what a parked run
        waits for, with its ``call_id``), ``input``, ``output``, ``error``."""
        return await self._native.show(run_id)

    async def sessions(self) -> List[Dict[str, Any]]:
        """Every session, by name: ``runs``, ``active_run`` and
        ``active_status`` (set while it is busy), ``created_ms``,
        ``updated_ms``."""
        return await self._native.sessions()

    async def session_runs(self, session: str) -> List[Dict[str, Any]]:
        """The runs of ``session`` in the order they started: ``status``,
        ``input``, ``output``, ``position``, ``history_runs``."""
        return await self._native.session_runs(session)

    async def events(self, run_id: str) -> List[Dict[str, Any]]:
        """The run's log, ``{"seq", "event"}`` per event, in order."""
        return await self._native.events(run_id)

    async def start_turn(
        self, agent: Agent, input: JSON, *, session: Optional[str] = None
    ) -> AsyncTurn:
        """Starts a run and drives it in the background, as a live turn."""
        return AsyncTurn(await self._native.start_turn(agent, input, session=session))

    async def continue_turn(self, run_id: str, agent: Agent) -> AsyncTurn:
        """Drives a parked run again (after a human acted), as a live turn."""
        return AsyncTurn(await self._native.continue_turn(run_id, agent))


class Turn:
    """A live turn, synchronous: an iterator of event dicts."""

    def __init__(self, turn: AsyncTurn, loop: asyncio.AbstractEventLoop) -> None:
        self._turn = turn
        self._loop = loop

    @property
    def run_id(self) -> str:
        """The turn's run."""
        return self._turn.run_id

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        try:
            return self._loop.run_until_complete(self._turn.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self, reason: Optional[str] = None) -> None:
        """Cancels the turn."""
        self._loop.run_until_complete(self._turn.cancel(reason))


class Runtime:
    """The runtime's verbs, synchronous: each runs ``AsyncRuntime``'s
    coroutine to completion on a private event loop (the GIL released while
    the engine works). Not for use inside a running event loop: use
    ``AsyncRuntime`` there."""

    def __init__(self, runtime: AsyncRuntime, loop: asyncio.AbstractEventLoop) -> None:
        self._async = runtime
        self._loop = loop

    @classmethod
    def open(
        cls,
        store: str,
        *,
        cache_dir: Optional[str] = None,
        policies: Optional[Mapping[str, Policy]] = None,
        record_prompts: bool = False,
        witness: Optional[str] = None,
    ) -> "Runtime":
        """Opens ``store``; see ``AsyncRuntime.open``."""
        loop = asyncio.new_event_loop()
        runtime = loop.run_until_complete(
            AsyncRuntime.open(
                store,
                cache_dir=cache_dir,
                policies=policies,
                record_prompts=record_prompts,
                witness=witness,
            )
        )
        return cls(runtime, loop)

    def _run(self, coroutine: Awaitable[_T]) -> _T:
        return self._loop.run_until_complete(coroutine)

    def close(self) -> None:
        """Closes the private event loop."""
        self._loop.close()

    def load_agent(self, path: str) -> Agent:
        """Loads and validates the agent file at ``path``."""
        return self._async.load_agent(path)

    def agent_from_dict(
        self, spec: Mapping[str, Any], *, base_dir: Optional[str] = None
    ) -> Agent:
        """Builds an agent from a dict; see ``AsyncRuntime.agent_from_dict``."""
        return self._async.agent_from_dict(spec, base_dir=base_dir)

    def start(
        self,
        agent: Agent,
        input: JSON,
        *,
        run_id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        session: Optional[str] = None,
    ) -> str:
        """Records a new run; returns its id."""
        return self._run(
            self._async.start(agent, input, run_id=run_id, labels=labels, session=session)
        )

    def step(self, run_id: str, agent: Agent) -> bool:
        """One operation of the run; ``True`` while there may be more."""
        return self._run(self._async.step(run_id, agent))

    def drive(
        self,
        run_id: str,
        agent: Agent,
        *,
        external: Optional[Mapping[str, ExternalTool]] = None,
    ) -> str:
        """Steps the run until terminal or parked; see ``AsyncRuntime.drive``."""
        return self._run(self._async.drive(run_id, agent, external=external))

    def recover(self, run_id: str, agent: Agent) -> str:
        """Replays the log and goes on live."""
        return self._run(self._async.recover(run_id, agent))

    def approve(self, run_id: str, call_id: str, *, by: str = "python") -> None:
        """Approves the call awaiting approval."""
        self._run(self._async.approve(run_id, call_id, by=by))

    def deny(self, run_id: str, call_id: str, reason: str, *, by: str = "python") -> None:
        """Denies the call awaiting approval."""
        self._run(self._async.deny(run_id, call_id, reason, by=by))

    def resume(
        self, run_id: str, agent: Agent, input: JSON, *, by: Optional[str] = None
    ) -> str:
        """Gives a suspended run its input; returns its status."""
        return self._run(self._async.resume(run_id, agent, input, by=by))

    def complete_external(
        self, run_id: str, call_id: str, output: JSON, *, by: Optional[str] = None
    ) -> None:
        """Records the output of the external call the run waits for."""
        self._run(self._async.complete_external(run_id, call_id, output, by=by))

    def resolve(
        self, run_id: str, output: JSON, *, by: str = "python", note: Optional[str] = None
    ) -> None:
        """Records by hand the outcome of a write whose completion is missing."""
        self._run(self._async.resolve(run_id, output, by=by, note=note))

    def cancel(
        self, run_id: str, *, reason: Optional[str] = None, by: Optional[str] = None
    ) -> None:
        """Cancels the run."""
        self._run(self._async.cancel(run_id, reason=reason, by=by))

    def abandon(self, run_id: str, reason: str, *, by: str = "python") -> None:
        """Ends the run for good."""
        self._run(self._async.abandon(run_id, reason, by=by))

    def list_runs(
        self,
        *,
        status: Optional[Sequence[str]] = None,
        agent: Optional[str] = None,
        session: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
    ) -> List[Dict[str, Any]]:
        """The store's runs, as dicts."""
        return self._run(
            self._async.list_runs(
                status=status, agent=agent, session=session, labels=labels, limit=limit
            )
        )

    def show(self, run_id: str) -> Dict[str, Any]:
        """How the run stands."""
        return self._run(self._async.show(run_id))

    def sessions(self) -> List[Dict[str, Any]]:
        """Every session, by name."""
        return self._run(self._async.sessions())

    def session_runs(self, session: str) -> List[Dict[str, Any]]:
        """The runs of ``session`` in the order they started."""
        return self._run(self._async.session_runs(session))

    def events(self, run_id: str) -> List[Dict[str, Any]]:
        """The run's log, ``{"seq", "event"}`` per event."""
        return self._run(self._async.events(run_id))

    def start_turn(self, agent: Agent, input: JSON, *, session: Optional[str] = None) -> Turn:
        """Starts a run driven in the background, as a live turn."""
        return Turn(self._run(self._async.start_turn(agent, input, session=session)), self._loop)

    def continue_turn(self, run_id: str, agent: Agent) -> Turn:
        """Drives a parked run again, as a live turn."""
        return Turn(self._run(self._async.continue_turn(run_id, agent)), self._loop)


__all__ = [
    "Agent",
    "AsyncRuntime",
    "AsyncTurn",
    "Runtime",
    "Turn",
    "allow",
    "deny",
    "feedback",
    "JSON",
    "Decision",
    "Policy",
    "ExternalTool",
    "WardenError",
    "InvalidError",
    "UnknownRunError",
    "RunStateError",
    "ReplayError",
    "AgentError",
    "ProviderError",
    "StoreError",
    "CallbackError",
    "error_class",
]
