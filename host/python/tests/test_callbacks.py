"""Host callbacks from Python, recorded as native ones: a Python policy
(the engine's `Policy` hook) allowing and denying tool calls, failing
closed with its traceback recorded when it raises; an external tool
performed by the application (`complete_external`), by hand and through
`drive(external=...)`; and a live turn streamed and cancelled."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

import warden
from conftest import log_agent


def with_policy(agent: Path, hooks: str = '["before_tool_call"]') -> Path:
    agent.write_text(agent.read_text() + f"\n[policies.guard]\nhooks = {hooks}\n")
    return agent


def decisions(rt: warden.Runtime, run: str) -> List[Dict[str, Any]]:
    return [e["event"] for e in rt.events(run) if e["event"]["type"] == "policy_decided"]


def test_a_python_policy_denies_a_tool_and_its_decisions_are_recorded(
    store: str, notes: Path, cache_dir: str
) -> None:
    asked: List[Dict[str, Any]] = []

    def guard(request: Dict[str, Any]) -> warden.Decision:
        asked.append(request)
        if request["tool"] == "fs__write_file":
            return warden.deny("this application never writes notes")
        return None

    rt = warden.Runtime.open(store, cache_dir=cache_dir, policies={"guard": guard})
    agent = rt.load_agent(str(with_policy(notes)))
    run = rt.start(agent, "Summarise my notes")
    # Denied by the policy before approval is asked: the run completes.
    assert rt.drive(run, agent) == "completed"
    assert "was not allowed" in rt.show(run)["output"]
    assert not (notes.parent / "notes" / "SUMMARY.md").exists()
    assert [r["tool"] for r in asked] == ["fs__list_dir", "fs__read_file", "fs__write_file"]
    assert {r["hook"] for r in asked} == {"before_tool_call"}
    assert asked[2]["arguments"]["path"] == "SUMMARY.md"
    assert asked[2]["effect"] == "write"
    assert asked[2]["run_id"] == run and asked[2]["policy"] == "guard"
    recorded = decisions(rt, run)
    assert [(d["policy"], d["decision"]) for d in recorded] == [
        ("guard", "allow"),
        ("guard", "allow"),
        ("guard", "deny"),
    ]
    assert recorded[2]["reason"] == "this application never writes notes"
    assert "approval_requested" not in [e["event"]["type"] for e in rt.events(run)]

    # Recovery reads the recorded decisions: the policy is not asked again.
    asked.clear()
    assert rt.recover(run, agent) == "completed"
    assert asked == []


def test_a_policy_that_raises_fails_closed_with_its_traceback_recorded(
    store: str, notes: Path, cache_dir: str
) -> None:
    def guard(request: Dict[str, Any]) -> warden.Decision:
        if request["tool"] == "fs__read_file":
            raise ValueError("the guard cannot read its rules")
        return "allow"

    rt = warden.Runtime.open(store, cache_dir=cache_dir, policies={"guard": guard})
    agent = rt.load_agent(str(with_policy(notes)))
    run = rt.start(agent, "Summarise my notes")
    assert rt.drive(run, agent) == "failed"
    failed = decisions(rt, run)[-1]
    assert failed["decision"] == "failed"
    assert failed["reason"].startswith("the policy failed: Traceback (most recent call last):")
    assert "in guard" in failed["reason"]
    assert failed["reason"].endswith("ValueError: the guard cannot read its rules")
    error = rt.show(run)["error"]
    assert error["code"] == "policy_failed"
    # The call the policy was asked about never ran.
    events = [e["event"] for e in rt.events(run)]
    assert [e["tool"]["tool"] for e in events if e["type"] == "tool_call_intent"] == ["list_dir"]


def test_an_answer_of_the_wrong_shape_fails_closed(
    store: str, notes: Path, cache_dir: str
) -> None:
    rt = warden.Runtime.open(
        store, cache_dir=cache_dir, policies={"guard": lambda request: 42}
    )
    agent = rt.load_agent(str(with_policy(notes)))
    run = rt.start(agent, "Summarise my notes")
    assert rt.drive(run, agent) == "failed"
    assert "the policy answered a int" in decisions(rt, run)[-1]["reason"]


def test_an_async_policy_runs_on_the_event_loop(
    store: str, notes: Path, cache_dir: str
) -> None:
    async def main() -> None:
        seen: List[str] = []

        async def guard(request: Dict[str, Any]) -> warden.Decision:
            await asyncio.sleep(0)
            seen.append(request["hook"])
            if request["hook"] == "before_finish":
                return warden.deny("no summary today")
            return warden.allow()

        rt = await warden.AsyncRuntime.open(
            store, cache_dir=cache_dir, policies={"guard": guard}
        )
        agent = rt.load_agent(str(with_policy(notes, '["run_start", "before_finish"]')))
        run = await rt.start(agent, "Summarise my notes")
        assert await rt.drive(run, agent) == "awaiting_approval"
        call = (await rt.show(run))["awaiting"]["call_id"]
        await rt.approve(run, call)
        assert await rt.drive(run, agent) == "failed"
        assert seen == ["run_start", "before_finish"]
        assert (await rt.show(run))["error"]["code"] == "policy_denied"

    asyncio.run(main())


def invoice_agent(dir: Path) -> Path:
    (dir / "invoice.transcript.toml").write_text(
        textwrap.dedent(
            """
            [[turns]]
            text = "Paying it."
            [[turns.tool_calls]]
            name = "pay_invoice"
            arguments = { invoice_id = "inv-7", amount = 120 }

            [[turns]]
            text = "Paid invoice inv-7."
            text_after_error = "The payment did not go through."
            """
        )
    )
    file = dir / "invoice.toml"
    file.write_text(
        textwrap.dedent(
            """
            name = "payer"
            instructions = "Pay the invoice."

            [model]
            provider = "scripted"
            name = "demo"
            transcript = "invoice.transcript.toml"

            [external_tools.pay_invoice]
            description = "Pay an invoice"
            arguments_schema = '{"type": "object", "required": ["invoice_id", "amount"]}'
            output_schema = '{"type": "object", "required": ["invoice_id", "paid"]}'
            must_match = ["invoice_id"]
            """
        )
    )
    return file


def test_an_external_tool_is_completed_by_the_application(
    store: str, tmp_path: Path, cache_dir: str
) -> None:
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(str(invoice_agent(tmp_path)))

    # By hand: the run parks, the application reports the output.
    run = rt.start(agent, "Pay inv-7")
    assert rt.drive(run, agent) == "awaiting_external"
    awaiting = rt.show(run)["awaiting"]
    assert awaiting["kind"] == "external" and awaiting["tool"] == "pay_invoice"
    assert awaiting["arguments"] == {"invoice_id": "inv-7", "amount": 120}
    with pytest.raises(warden.InvalidError) as mismatch:
        rt.complete_external(run, awaiting["call_id"], {"invoice_id": "inv-8", "paid": True})
    assert mismatch.value.code == "external_mismatch"
    assert mismatch.value.details["field"] == "invoice_id"
    with pytest.raises(warden.InvalidError) as rejected:
        rt.complete_external(run, awaiting["call_id"], {"invoice_id": "inv-7"})
    assert rejected.value.code == "output_rejected"
    rt.complete_external(run, awaiting["call_id"], {"invoice_id": "inv-7", "paid": True}, by="app")
    assert rt.drive(run, agent) == "completed"
    events = [e["event"] for e in rt.events(run)]
    completed = [e for e in events if e["type"] == "external_call_completed"]
    assert completed[0]["output"] == {"invoice_id": "inv-7", "paid": True}
    assert completed[0]["by"] == "app"

    # Through a handler: called with the arguments, its answer recorded.
    paid: List[Dict[str, Any]] = []

    def pay(arguments: Dict[str, Any]) -> Dict[str, Any]:
        paid.append(arguments)
        return {"invoice_id": arguments["invoice_id"], "paid": True}

    second = rt.start(agent, "Pay inv-7")
    assert rt.drive(second, agent, external={"pay_invoice": pay}) == "completed"
    assert paid == [{"invoice_id": "inv-7", "amount": 120}]
    assert rt.show(second)["output"] == "Paid invoice inv-7."
    shape = lambda r: [e["event"]["type"] for e in rt.events(r)]
    assert shape(second) == shape(run)


def test_an_external_handler_that_raises_fails_closed(
    store: str, tmp_path: Path, cache_dir: str
) -> None:
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(str(invoice_agent(tmp_path)))

    def pay(arguments: Dict[str, Any]) -> Dict[str, Any]:
        raise ConnectionError("the bank is closed")

    run = rt.start(agent, "Pay inv-7")
    with pytest.raises(warden.CallbackError) as raised:
        rt.drive(run, agent, external={"pay_invoice": pay})
    assert raised.value.code == "callback_failed"
    assert isinstance(raised.value.__cause__, ConnectionError)
    shown = rt.show(run)
    assert shown["status"] == "cancelled"
    cancelled = [e["event"] for e in rt.events(run)][-1]
    assert cancelled["type"] == "run_cancelled"
    assert cancelled["reason"].startswith("external tool `pay_invoice` raised:\nTraceback")
    assert cancelled["reason"].endswith("ConnectionError: the bank is closed")
    assert "external_call_completed" not in [e["event"]["type"] for e in rt.events(run)]


def test_a_live_turn_is_streamed_and_cancelled(
    store: str, tmp_path: Path, cache_dir: str
) -> None:
    turns = 400
    file = log_agent(tmp_path, turns)

    async def main() -> None:
        rt = await warden.AsyncRuntime.open(store, cache_dir=cache_dir)
        agent = rt.load_agent(str(file))
        turn = await rt.start_turn(agent, "Write the log")
        seen: List[Dict[str, Any]] = []
        async for event in turn:
            seen.append(event)
            if event["type"] == "tool_call_finished" and len(seen) < 50:
                await turn.cancel("the user pressed stop")
        types = [e["type"] for e in seen]
        assert types[0] == "text_delta" and seen[0]["text"] == "Turn "
        assert "tool_call_started" in types
        started = next(e for e in seen if e["type"] == "tool_call_started")
        assert started["tool"] == "fs__edit_file" and started["effect"] == "write"
        finished = next(e for e in seen if e["type"] == "tool_call_finished")
        assert finished["receipt"]["outcome"] is not None
        assert seen[-1] == {
            "type": "finished",
            "outcome": "cancelled",
            "reason": "the user pressed stop",
        }
        assert types.count("finished") == 1
        last = (await rt.events(turn.run_id))[-1]["event"]
        assert last["type"] == "run_cancelled"
        assert (await rt.show(turn.run_id))["status"] == "cancelled"
        written = [
            l for l in (tmp_path / "work" / "log.md").read_text().splitlines() if l.startswith("turn-")
        ]
        assert 1 <= len(written) < turns

    asyncio.run(main())


def test_a_sync_turn_streams_to_its_end(store: str, notes: Path, cache_dir: str) -> None:
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(str(notes))
    turn = rt.start_turn(agent, "Summarise my notes")
    events = list(turn)
    assert events[-1] == {"type": "finished", "outcome": "parked", "status": "awaiting_approval"}
    needed = [e for e in events if e["type"] == "approval_needed"]
    assert needed[0]["tool"] == "fs__write_file"
    rt.approve(turn.run_id, needed[0]["call_id"])
    rest = list(rt.continue_turn(turn.run_id, agent))
    assert rest[-1]["type"] == "finished" and rest[-1]["outcome"] == "completed"
    assert "three open items" in rest[-1]["output"]
