"""The notes demo from Python, offline: a run parks for approval of its
write, a Python policy is asked before every tool call, and the
application approves the write; then the same run's log is read back.

    python examples/python/notes.py            # from the repository root

It copies examples/agents/notes.toml (the built-in `fs` plugin over a notes
folder, driven by a scripted model) into .warden/python-demo/ so the write
lands there, and keeps its runs in .warden/python-demo.db.
"""

import shutil
from pathlib import Path

import warden

HERE = Path(__file__).resolve().parent
DEMO = Path(".warden/python-demo")


def copy_agent() -> Path:
    source = HERE.parent / "agents"
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    for name in ("notes.toml", "notes.transcript.toml"):
        shutil.copy(source / name, DEMO / name)
    shutil.copytree(source / "notes", DEMO / "notes")
    (DEMO / "out").mkdir()
    # Enable a policy the application registers under the name `audit`.
    agent = DEMO / "notes.toml"
    agent.write_text(agent.read_text() + '\n[policies.audit]\nhooks = ["before_tool_call"]\n')
    return agent


def audit(request: dict) -> warden.Decision:
    """Asked before each tool call; its answer is recorded in the log."""
    print(f"  policy: {request['tool']} {request['arguments']}")
    if request["tool"] == "fs__search":
        return warden.deny("searching is not needed here")
    return warden.allow()


def main() -> None:
    rt = warden.Runtime.open(
        ".warden/python-demo.db", cache_dir=".warden/cache", policies={"audit": audit}
    )
    agent = rt.load_agent(str(copy_agent()))
    run = rt.start(agent, "Summarise my notes")
    status = rt.drive(run, agent)
    print(f"run {run} is {status}")

    awaiting = rt.show(run)["awaiting"]
    print(f"  it asks to {awaiting['tool']} {awaiting['arguments']['path']}")
    rt.approve(run, awaiting["call_id"], by="notes.py")
    status = rt.drive(run, agent)
    print(f"run {run} is {status}: {rt.show(run)['output']}")

    for line in rt.events(run):
        print(f"  {line['seq']:>3} {line['event']['type']}")
    try:
        rt.approve(run, awaiting["call_id"])
    except warden.RunStateError as error:
        print(f"approving again: {error.code}: {error.message}")
    rt.close()


if __name__ == "__main__":
    main()
