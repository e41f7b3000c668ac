"""The run view keeps up with its live stream when the stream outruns a
refresh, in a real Chromium driven by Playwright (tests/tests/all/console.rs
runs it). Arguments: the server's address, an operator's token, the demo's
folder (with the two-write agent `twice.toml`), the `warden` binary and the
store.

The run view reads the run again after each streamed event, one read at a
time. Here the read the first event asks for is answered late, with what
the server said before that event (a real answer of the server, read
earlier): meanwhile the command line approves the first write and the run
parks on the second, and the stream brings every event of that to the page.
The view must then show the second write waiting, as the log says; before
the fix it kept the first write's decision, whose call was already
approved, with nothing left to make it read the run again."""

from __future__ import annotations

import json
import re
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

from console_common import Console

console = Console(*sys.argv[1:6])
base, token, demo_dir, warden = console.base, console.token, console.demo_dir, console.warden
run = "twice-1"


def shown_by_the_server() -> bytes:
    request = urllib.request.Request(
        f"{base}/api/v1/runs/{run}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


# Without a terminal the run parks on its first write and exits 4.
started = warden("run", "twice.toml", "Write twice", "--run-id", run)
assert started.returncode == 4, (started.returncode, started.stderr)

with sync_playwright() as p:
    browser, page, errors = console.page(p, 1000, 760, console_errors=False)

    page.goto(f"{base}/console/")
    console.log_in(page)
    page.goto(f"{base}/console/#/run/{run}")
    decision = page.get_by_role("region", name="Decision")
    expect(decision.get_by_text("call call-1-1")).to_be_visible()
    timeline = page.get_by_role("list", name="Timeline")
    expect(timeline.locator('li[data-type="approval_requested"]')).to_have_count(1)

    # What the server says now: the run waits on its first write.
    before = shown_by_the_server()
    assert json.loads(before)["pending"]["call_id"] == "call-1-1", before

    # The next read of the run is held (the request waits in the browser)
    # and answered later with `before`; reads after it go through.
    held = []

    def hold(route):
        if route.request.method == "GET" and not held:
            held.append(route)
        else:
            route.continue_()

    page.route(re.compile(rf"/api/v1/runs/{re.escape(run)}$"), hold)

    # The first write is approved elsewhere; the run makes it and parks on
    # the second (exit 4 again).
    approved = warden("runs", "approve", run, "call-1-1")
    assert approved.returncode == 4, (approved.returncode, approved.stdout, approved.stderr)

    # The stream brings all of it to the page, the second request included,
    # while the read its first event asked for is still unanswered.
    expect(timeline.locator('li[data-type="approval_requested"]')).to_have_count(2, timeout=20_000)
    assert len(held) == 1, held
    held[0].fulfill(status=200, content_type="application/json", body=before)

    # The view catches up: the decision is the second write's.
    expect(decision.get_by_text("call call-2-1")).to_be_visible(timeout=10_000)
    expect(decision.get_by_text("call call-1-1")).to_have_count(0)

    # And it is the one to make: approving it completes the run.
    decision.get_by_role("button", name="Approve").click()
    expect(timeline.locator('li[data-type="run_completed"]')).to_have_count(1, timeout=30_000)
    expect(page.locator("main span.status.completed")).to_be_visible(timeout=10_000)
    assert (demo_dir / "notes" / "a.md").read_text() == "first\n"
    assert (demo_dir / "notes" / "b.md").read_text() == "second\n"

    assert not errors, errors
    browser.close()
print("live console test passed")
