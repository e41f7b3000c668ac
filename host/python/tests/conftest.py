"""Fixtures of the package's tests: a copy of the notes demo (the agent,
its scripted transcript, its notes folder) per test, and the store each
test runs on, once on SQLite and once on PostgreSQL (the server at
WARDEN_TEST_POSTGRES, default postgres://postgres@127.0.0.1:5432/test, each
test in a fresh schema). An unreachable PostgreSQL fails the tests: run
them through `cargo test` (tests/tests/all/python_host.rs), which .ci/run
prepares."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "agents"


@pytest.fixture(scope="session")
def cache_dir() -> str:
    """Compiled plugins, shared with the Rust tests' cache."""
    path = Path(tempfile.gettempdir()) / "warden-tests-components"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """The notes demo copied into the test's folder; returns the agent file."""
    work = tmp_path / "agent"
    work.mkdir()
    for name in ("notes.toml", "notes.transcript.toml"):
        shutil.copy(EXAMPLES / name, work / name)
    shutil.copytree(EXAMPLES / "notes", work / "notes")
    (work / "out").mkdir()
    return work / "notes.toml"


def postgres_url() -> str:
    base = os.environ.get(
        "WARDEN_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test"
    )
    schema = "py_" + uuid.uuid4().hex[:16]
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's runs live: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return str(tmp_path / "store" / "warden.db")
    return postgres_url()


def log_agent(dir: Path, turns: int) -> Path:
    """An agent whose scripted model makes `turns` writes, one per turn:
    each an edit inserting `turn-N` before the `END` line of work/log.md,
    so a write performed twice shows as a repeated line. Returns its file."""
    (dir / "work").mkdir()
    (dir / "work" / "log.md").write_text("# Log\nEND\n")
    script = []
    for turn in range(1, turns + 1):
        script.append(
            f'[[turns]]\ntext = "Turn {turn}."\n[[turns.tool_calls]]\n'
            f'name = "fs__edit_file"\n'
            f'arguments = {{ path = "log.md", old = "END", new = "turn-{turn}\\nEND" }}\n'
        )
    script.append('[[turns]]\ntext = "Done."\n')
    (dir / "log.transcript.toml").write_text("\n".join(script))
    file = dir / "log.toml"
    file.write_text(
        textwrap.dedent(
            """
            name = "log-writer"
            instructions = "Append one line per turn."

            [model]
            provider = "scripted"
            name = "demo"
            transcript = "log.transcript.toml"

            [plugins.fs]
            source = "builtin:fs"
            approval = { edit_file = "never" }
            [plugins.fs.grant.mounts.workspace]
            dir = "work"
            """
        )
    )
    return file
