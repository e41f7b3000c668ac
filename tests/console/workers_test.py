"""The console over a store two workers share, in a real Chromium driven by
Playwright (tests/tests/all/console.rs runs it against PostgreSQL).
Arguments: the server's address, an operator's token, the demo's folder,
the `warden` binary, the store (a PostgreSQL URL), and where to save
screenshots.

It starts two `warden worker` processes on the store, then, as a person
would in the console: starts a run of the served demo agent queued for the
workers, watches it park on its write, stops the worker that parked it
(so the approval cannot be the parking worker's business), approves the
write from the inbox, and sees the run complete, driven by the other
worker, which the workers' logs name; then forks the run from its
timeline just before it asked for approval, sees the fork reuse what the
run did and ask again, and approves the fork."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from console_common import Console

console = Console(*sys.argv[1:7])
base, demo_dir, binary, env = console.base, console.demo_dir, console.binary, console.env
warden, shot, doc_shot = console.warden, console.shot, console.doc_shot


def events_of(run: str) -> list[dict]:
    listed = warden("--json", "runs", "events", run)
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line)["event"] for line in listed.stdout.splitlines() if line.strip()]


# The workers, each logging the runs it claims.
workers: dict[str, subprocess.Popen] = {}
logs: dict[str, Path] = {}
for name in ["w1", "w2"]:
    logs[name] = demo_dir / f"{name}.log"
    workers[name] = subprocess.Popen(
        # A long claim: under load a short one can lapse and the other
        # worker take the run over, which is fine but not this test's case.
        [binary, "worker", "--id", name, "--poll", "50ms", "--claim-ttl", "30s", "--grace", "1s"],
        cwd=demo_dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=logs[name].open("w"),
        env=dict(env, RUST_LOG="warden_engine::worker=debug", NO_COLOR="1"),
    )


def claims(run: str) -> dict[str, int]:
    """How many times each worker claimed `run`, from its log."""
    pattern = re.compile(rf"claimed run.*run_id={re.escape(run)}\b")
    return {name: len(pattern.findall(path.read_text())) for name, path in logs.items()}


def wait(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


try:
    with sync_playwright() as p:
        browser, page, errors = console.page(p, 1000, 760)

        page.goto(f"{base}/console/")
        console.log_in(page)

        # Start a run of the served agent, queued for the workers, by
        # keyboard: the folded form opens from its summary.
        page.get_by_text("Start a run").focus()
        page.keyboard.press("Enter")
        form = page.get_by_role("form", name="Start a run")
        form.get_by_label("Agent").select_option("notes")
        form.get_by_label("Input").fill("Summarise my notes")
        form.get_by_label("Queue it for the workers").check()
        shot(page, "08-start-form")
        doc_shot(page, "console-start")
        form.get_by_role("button", name="Start").click()
        page.wait_for_url(re.compile(r"#/run/"))
        run = page.url.rsplit("/", 1)[1]
        expect(page.get_by_role("heading", name=f"Run {run}")).to_be_visible()

        # A worker claims it and parks it on its write.
        expect(page.get_by_role("heading", name="Approve fs__write_file?")).to_be_visible(timeout=30_000)
        parked_by = wait("a worker's claim in its log", lambda: [w for w, n in claims(run).items() if n])
        assert len(parked_by) == 1, f"both workers claimed the run before it parked: {claims(run)}"
        parker = parked_by[0]
        other = "w2" if parker == "w1" else "w1"
        started = events_of(run)[0]
        assert started["labels"]["warden.started_by"] == "api:olive", started

        # The worker that parked it stops: the approval is for whichever
        # worker holds the run next.
        workers[parker].send_signal(signal.SIGTERM)
        assert workers[parker].wait(timeout=30) == 0, logs[parker].read_text()

        page.get_by_role("link", name="Inbox").click()
        card = page.locator(f'article[data-run="{run}"]')
        expect(card).to_contain_text("SUMMARY.md")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_count(0, timeout=20_000)
        page.goto(f"{base}/console/#/run/{run}")
        timeline = page.get_by_role("list", name="Timeline")
        expect(timeline.locator('li[data-type="run_completed"]')).to_have_count(1, timeout=30_000)
        assert claims(run)[other] >= 1, (claims(run), logs[other].read_text())
        events = events_of(run)
        granted = [e for e in events if e["type"] == "approval_granted"]
        assert [g["by"] for g in granted] == ["api:olive"], granted
        writes = [e for e in events if e["type"] == "tool_call_completed" and e["call_id"] == granted[0]["call_id"]]
        assert len(writes) == 1, events
        assert (demo_dir / "notes" / "SUMMARY.md").read_text().startswith("# Summary")

        # Fork the run from its timeline just before it asked for approval:
        # the position button picks it, the fork reuses everything before.
        asked = int(timeline.locator('li[data-type="approval_requested"]').first.get_attribute("data-seq"))
        # The position before may be a clock reading, folded away until shown.
        page.get_by_label("Show the clock and random readings").check()
        timeline.get_by_role("button", name=f"Fork at position {asked - 1}", exact=True).click()
        fork_form = page.get_by_role("form", name="Fork this run")
        expect(fork_form.get_by_label("Position")).to_have_value(str(asked - 1))
        expect(fork_form.get_by_label("Position")).to_be_focused()
        shot(page, "09-fork-form")
        doc_shot(page, "console-fork")
        fork_form.get_by_role("button", name="Fork", exact=True).click()
        page.wait_for_url(lambda url: "#/run/" in url and not url.endswith(f"/{run}"))
        fork = page.url.rsplit("/", 1)[1]
        expect(page.get_by_role("heading", name="Approve fs__write_file?")).to_be_visible(timeout=30_000)
        forked = events_of(fork)
        assert forked[asked - 1]["type"] == "run_forked" and forked[asked - 1]["by"] == "api:olive", forked
        assert not [e for e in forked[asked - 1:] if e["type"].endswith("_intent")], forked
        (demo_dir / "notes" / "SUMMARY.md").unlink()
        page.get_by_role("region", name="Decision").get_by_role("button", name="Approve").click()
        expect(page.get_by_role("list", name="Timeline").locator('li[data-type="run_completed"]')).to_have_count(1, timeout=30_000)
        assert (demo_dir / "notes" / "SUMMARY.md").exists()

        assert not errors, errors
        browser.close()
finally:
    for worker in workers.values():
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
print("workers console test passed")
