"""The runtime's verbs from Python, on SQLite and PostgreSQL: the notes
demo parked for approval and approved (sync and asyncio), denied, listed,
shown and read back; bad input raising the exception that carries the
engine's code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import warden


def kinds(events: list[dict]) -> list[str]:
    return [e["event"]["type"] for e in events]


def test_the_notes_demo_parks_for_approval_and_is_approved(
    store: str, notes: Path, cache_dir: str
) -> None:
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(str(notes))
    assert agent.name == "notes"
    run = rt.start(agent, "Summarise my notes", labels={"from": "pytest"})

    assert rt.drive(run, agent) == "awaiting_approval"
    shown = rt.show(run)
    assert shown["status"] == "awaiting_approval"
    awaiting = shown["awaiting"]
    assert awaiting["kind"] == "approval"
    assert awaiting["tool"] == "fs__write_file"
    assert awaiting["arguments"]["path"] == "SUMMARY.md"
    # Nothing is written before the approval.
    assert not (notes.parent / "notes" / "SUMMARY.md").exists()

    rt.approve(run, awaiting["call_id"], by="pytest")
    assert rt.drive(run, agent) == "completed"
    assert (notes.parent / "notes" / "SUMMARY.md").read_text().startswith("# Summary")
    done = rt.show(run)
    assert done["status"] == "completed"
    assert "three open items" in done["output"]
    assert "awaiting" not in done

    events = rt.events(run)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert kinds(events)[0] == "run_started"
    assert "approval_requested" in kinds(events)
    (requested,) = [e["event"] for e in events if e["event"]["type"] == "approval_requested"]
    granted = [e["event"] for e in events if e["event"]["type"] == "approval_granted"]
    # The approval names the frozen call it approved: the request's digest.
    assert len(requested["digest"]) == 64
    assert granted == [
        {
            "type": "approval_granted",
            "call_id": awaiting["call_id"],
            "by": "pytest",
            "at_ms": granted[0]["at_ms"],
            "digest": requested["digest"],
        }
    ]
    assert "run_completed" in kinds(events)

    listed = {r["run_id"]: r for r in rt.list_runs(agent="notes")}
    assert listed[run]["status"] == "completed"
    assert listed[run]["labels"]["from"] == "pytest"
    assert rt.list_runs(status=["awaiting_approval"]) == []
    rt.close()


def test_the_asyncio_api_denies_the_write(store: str, notes: Path, cache_dir: str) -> None:
    async def main() -> None:
        rt = await warden.AsyncRuntime.open(store, cache_dir=cache_dir)
        agent = rt.load_agent(str(notes))
        run = await rt.start(agent, "Summarise my notes")
        # Two runs at once on one runtime: the event loop stays free while
        # the engine works.
        other = await rt.start(agent, "Summarise my notes")
        statuses = await asyncio.gather(rt.drive(run, agent), rt.drive(other, agent))
        assert statuses == ["awaiting_approval", "awaiting_approval"]
        call = (await rt.show(run))["awaiting"]["call_id"]
        await rt.deny(run, call, "not today")
        assert await rt.drive(run, agent) == "completed"
        shown = await rt.show(run)
        assert "was not allowed" in shown["output"]
        assert not (notes.parent / "notes" / "SUMMARY.md").exists()
        await rt.abandon(other, "a second run was not needed")
        assert (await rt.show(other))["status"] == "abandoned"

    asyncio.run(main())


def test_bad_input_raises_the_exception_carrying_its_code(
    store: str, notes: Path, cache_dir: str, tmp_path: Path
) -> None:
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(str(notes))

    with pytest.raises(warden.UnknownRunError) as unknown:
        rt.show("no-such-run")
    assert unknown.value.code == "unknown_run"
    assert unknown.value.details == {"run_id": "no-such-run"}
    assert isinstance(unknown.value, LookupError)

    with pytest.raises(warden.UnknownRunError) as malformed:
        rt.show("not a run id!")
    assert malformed.value.code == "invalid_run_id"

    with pytest.raises(warden.AgentError) as unreadable:
        rt.load_agent(str(tmp_path / "missing.toml"))
    assert unreadable.value.code == "agent_unreadable"

    broken = tmp_path / "broken.toml"
    broken.write_text('name = "Not A Valid Name"\ninstructions = "x"\n')
    with pytest.raises(warden.AgentError) as invalid:
        rt.load_agent(str(broken))
    assert invalid.value.code == "agent_invalid"
    assert invalid.value.details["key"] == "name"

    with pytest.raises(warden.InvalidError) as not_json:
        rt.start(agent, {"when": {1, 2}})
    assert not_json.value.code == "invalid"
    assert "set" in not_json.value.message

    run = rt.start(agent, "Summarise my notes")
    with pytest.raises(warden.RunStateError) as exists:
        rt.start(agent, "again", run_id=run)
    assert exists.value.code == "run_exists"
    assert rt.drive(run, agent) == "awaiting_approval"
    call = rt.show(run)["awaiting"]["call_id"]

    with pytest.raises(warden.RunStateError) as wrong_call:
        rt.approve(run, "call-9-9")
    assert wrong_call.value.code == "not_awaiting_approval"
    assert wrong_call.value.details == {
        "run_id": run,
        "call_id": "call-9-9",
        "awaiting": call,
    }

    with pytest.raises(warden.RunStateError) as not_parked:
        rt.resume(run, agent, "more input")
    assert not_parked.value.code == "not_parked"
    assert not_parked.value.details["status"] == "awaiting_approval"

    rt.cancel(run, reason="enough", by="pytest")
    with pytest.raises(warden.RunStateError) as terminal:
        rt.approve(run, call)
    assert terminal.value.code == "run_terminal"
    assert terminal.value.details == {"run_id": run, "status": "cancelled"}
    # One class per family, and every one is a WardenError.
    assert isinstance(terminal.value, warden.WardenError)
    assert warden.error_class("store_missing") is warden.StoreError
    assert warden.error_class("history_broken") is warden.StoreError
    rt.close()


def test_every_spelling_of_a_sqlite_store_opens_the_file_the_cli_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_dir: str
) -> None:
    # The command line's spellings (docs/configuration.md): a bare path,
    # sqlite:PATH and sqlite://PATH, relative to the current directory.
    monkeypatch.chdir(tmp_path)
    for spelling in ["plain.db", "sqlite:colon.db", "sqlite://slashes.db"]:
        warden.Runtime.open(spelling, cache_dir=cache_dir).close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "colon.db",
        "plain.db",
        "slashes.db",
    ]
    with pytest.raises(warden.InvalidError) as unknown:
        warden.Runtime.open("mysql://h/db", cache_dir=cache_dir)
    assert "unknown store scheme `mysql`" in unknown.value.message


def test_the_documented_example_runs_offline_and_exits_cleanly(tmp_path: Path) -> None:
    # docs/python.md's example, as a reader runs it; the process must also
    # end cleanly (a runtime dropped while Python finalizes must not abort).
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / "notes.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "is awaiting_approval" in done.stdout
    assert "is completed: I wrote SUMMARY.md" in done.stdout
    assert "policy: fs__write_file" in done.stdout
    assert "approving again: run_terminal" in done.stdout
    assert (tmp_path / ".warden" / "python-demo" / "notes" / "SUMMARY.md").exists()


def test_an_agent_built_from_a_dict_is_the_agent_file_and_runs_in_a_session(
    store: str, notes: Path, cache_dir: str
) -> None:
    import tomllib

    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    spec = tomllib.loads(notes.read_text())
    agent = rt.agent_from_dict(spec, base_dir=str(notes.parent))
    # The same definition is the same agent, whichever way it was given.
    assert agent.digest == rt.load_agent(str(notes)).digest
    assert agent.name == "notes"

    first = rt.start(agent, "Summarise my notes", session="desk")
    assert rt.drive(first, agent) == "awaiting_approval"
    (busy,) = rt.sessions()
    assert busy["session"] == "desk"
    assert busy["runs"] == 1
    assert busy["active_run"] == first
    assert busy["active_status"] == "awaiting_approval"
    # One active run per session: a second start is refused until it settles.
    with pytest.raises(warden.RunStateError) as refused:
        rt.start(agent, "again", session="desk")
    assert refused.value.code == "session_busy"

    rt.approve(first, rt.show(first)["awaiting"]["call_id"], by="pytest")
    assert rt.drive(first, agent) == "completed"
    second = rt.start(agent, "And now?", session="desk")
    runs = rt.session_runs("desk")
    assert [r["run_id"] for r in runs] == [first, second]
    assert [r["position"] for r in runs] == [0, 1]
    assert runs[0]["status"] == "completed" and "output" in runs[0]
    assert runs[1]["history_runs"] == 1
    (again,) = rt.sessions()
    assert again["runs"] == 2 and again["active_run"] == second

    # A dict is checked like a file: a misspelt key, a bad value.
    with pytest.raises(warden.AgentError) as misspelt:
        rt.agent_from_dict({**spec, "modle": {}})
    assert misspelt.value.code == "agent_invalid"
    assert "modle" in misspelt.value.message
    with pytest.raises(warden.AgentError) as invalid:
        rt.agent_from_dict({**spec, "name": "Not A Name"})
    assert invalid.value.code == "agent_invalid"
    assert invalid.value.details["key"] == "name"
    with pytest.raises(warden.InvalidError):
        rt.agent_from_dict({**spec, "labels": {"when": {1, 2}}})
    with pytest.raises(warden.UnknownRunError) as unknown:
        rt.session_runs("not a session!")
    assert unknown.value.code == "invalid_session_id"
    rt.close()
