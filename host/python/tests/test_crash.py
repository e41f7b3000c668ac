"""A crash: a Python process driving a run is killed with SIGKILL while it
writes, and a new process recovers the run. Each of the agent's turns makes
one write (an edit inserting the turn's line), so a write performed twice
would show as a repeated line. Whatever the moment of the kill, recovery
never repeats a write: it finishes the run, or, when the kill fell between
a write's intent and its recorded outcome, stops at `needs_reconciliation`
without touching the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import warden
from conftest import log_agent

TURNS = 40

CHILD = textwrap.dedent(
    """
    import sys
    import warden

    store, agent_file, run_id, cache_dir = sys.argv[1:5]
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    agent = rt.load_agent(agent_file)
    rt.start(agent, "Write the log", run_id=run_id)
    print("started", flush=True)
    rt.drive(run_id, agent)
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("after_events", [12, 60])
def test_a_killed_process_is_recovered_by_another_without_repeating_a_write(
    store: str, tmp_path: Path, cache_dir: str, after_events: int
) -> None:
    file = log_agent(tmp_path, TURNS)
    run = f"crash-{after_events}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, store, str(file), run, cache_dir],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"

    # Kill it once its log holds `after_events` events: mid-run, at a
    # moment that falls where it falls.
    rt = warden.Runtime.open(store, cache_dir=cache_dir)
    deadline = time.monotonic() + 60
    while len(rt.events(run)) < after_events:
        assert child.poll() is None, "the run finished before it could be killed"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.002)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    killed_at = len(rt.events(run))
    assert killed_at < 3 * TURNS, "the run was over before the kill"

    # This process is the new one: it recovers the run.
    agent_ = rt.load_agent(str(file))
    try:
        status = rt.recover(run, agent_)
    except warden.RunStateError as refused:
        assert refused.code == "needs_reconciliation"
        status = "needs_reconciliation"
    lines = (tmp_path / "work" / "log.md").read_text().splitlines()
    written = [l for l in lines if l.startswith("turn-")]
    assert len(written) == len(set(written)), f"a write ran twice: {written}"
    events = [e["event"] for e in rt.events(run)]
    intents = [e for e in events if e["type"] == "tool_call_intent"]
    assert len(intents) == len({e["call_id"] for e in intents})
    if status == "completed":
        assert written == [f"turn-{n}" for n in range(1, TURNS + 1)]
    else:
        # Killed mid-write: the write is the human's to settle, never
        # guessed; nothing after it ran.
        assert status == "needs_reconciliation"
        assert rt.show(run)["awaiting"]["kind"] == "reconciliation"
        assert len(written) in (len(intents) - 1, len(intents))
    rt.close()
