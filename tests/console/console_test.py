"""The web console as a person uses it, in a real Chromium driven by
Playwright (tests/tests/all/console.rs runs it). Arguments: the server's
address, an operator's token, the demo's folder, the `warden` binary, the
store, and where to save screenshots.

It logs in (a wrong token first), watches a run started from the command
line appear and stream, approves its parked write from the inbox and sees
it complete, denies another with a reason, answers a suspended run through
the form generated from its recorded schema, finds the decisions in the
audit view, and checks the page's defences: the Content-Security-Policy,
a state-changing request without (or with a replayed) CSRF token refused,
and a logged-out session refused."""

from __future__ import annotations

import json
import sys

from playwright.sync_api import expect, sync_playwright

from console_common import Console

console = Console(*sys.argv[1:7])
base, token, demo_dir = console.base, console.token, console.demo_dir
warden, shot, doc_shot = console.warden, console.shot, console.doc_shot


def start_parked(agent: str, run_id: str, text: str) -> None:
    # Without a terminal the run parks (approval or input) and exits 4.
    done = warden("run", agent, text, "--run-id", run_id)
    assert done.returncode == 4, (done.returncode, done.stderr)


with sync_playwright() as p:
    browser, page, errors = console.page(p, 1100, 900)

    # The page carries a strict policy and no secret.
    response = page.goto(f"{base}/console/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
    assert token not in page.content()

    # Log in: a wrong token is refused, the right one opens the runs list.
    page.get_by_label("Token").fill("not-a-token")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("not accepted")
    console.log_in(page)
    expect(page.locator("#me-name")).to_contain_text("olive (operator)")
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["warden_console"]
    assert session["httpOnly"] and session["sameSite"] == "Strict", session

    # A run started elsewhere appears in the list while we watch.
    start_parked("notes.toml", "watched", "Summarise my notes")
    row = page.locator('tr[data-run="watched"]')
    expect(row).to_contain_text("awaiting approval", timeout=20_000)
    shot(page, "01-runs")
    doc_shot(page, "console-runs")
    row.get_by_role("link", name="watched").click()
    expect(page.get_by_role("heading", name="Run watched")).to_be_visible()
    timeline = page.get_by_role("list", name="Timeline")
    expect(timeline.locator('li[data-type="run_started"]')).to_have_count(1)
    expect(timeline.locator('li[data-type="approval_requested"]')).to_have_count(1)
    expect(page.get_by_role("heading", name="Approve fs__write_file?")).to_be_visible()
    shot(page, "02-run-parked")
    doc_shot(page, "console-run-parked")

    # Approve it from the inbox; the run completes and streams to the end.
    page.get_by_role("link", name="Inbox").click()
    card = page.locator('article[data-run="watched"]')
    expect(card).to_contain_text("SUMMARY.md")
    shot(page, "03-inbox")
    doc_shot(page, "console-inbox")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0, timeout=20_000)
    page.goto(f"{base}/console/#/run/watched")
    expect(page.get_by_role("list", name="Timeline").locator('li[data-type="run_completed"]')).to_have_count(1, timeout=20_000)
    expect(page.locator(".status").first).to_have_text("completed")
    shot(page, "04-run-completed")
    assert (demo_dir / "notes" / "SUMMARY.md").read_text().startswith("# Summary")

    # Deny another with a reason: nothing is written, the reason is recorded.
    (demo_dir / "notes" / "SUMMARY.md").unlink()
    start_parked("notes.toml", "refused", "Summarise my notes")
    page.get_by_role("link", name="Inbox").click()
    card = page.locator('article[data-run="refused"]')
    card.get_by_role("button", name="Deny").click()
    expect(page.locator("#notice")).to_contain_text("needs a reason")
    card.get_by_label("Reason for denying").fill("not this week")
    card.get_by_role("button", name="Deny").click()
    expect(card).to_have_count(0, timeout=20_000)
    page.goto(f"{base}/console/#/run/refused")
    expect(page.get_by_role("list", name="Timeline").locator('li[data-type="run_completed"]')).to_have_count(1, timeout=20_000)
    assert not (demo_dir / "notes" / "SUMMARY.md").exists()

    # A suspended run is answered through the form its schema generates:
    # a value of the wrong type is refused, the right one resumes it.
    start_parked("ask.toml", "asked", "How many?")
    page.goto(f"{base}/console/#/run/asked")
    form = page.get_by_role("form", name="Resume")
    expect(form).to_be_visible(timeout=20_000)
    shot(page, "05-resume-form")
    doc_shot(page, "console-resume-form")
    form.get_by_label("count").fill("3")
    form.get_by_label("note").fill("three, counted by hand")
    form.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("list", name="Timeline").locator('li[data-type="run_completed"]')).to_have_count(1, timeout=20_000)
    listed = warden("--json", "runs", "events", "asked")
    assert listed.returncode == 0, listed.stderr
    events = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    resumed = [e["event"] for e in events if e["event"]["type"] == "resumed"]
    assert resumed and resumed[0]["input"] == {"count": 3, "note": "three, counted by hand"}, resumed
    assert resumed[0]["by"] == "api:olive", resumed

    # The audit view lists who decided what.
    page.get_by_role("link", name="Audit").click()
    table = page.get_by_role("table", name="Decisions")
    expect(table).to_contain_text("not this week", timeout=20_000)
    expect(table).to_contain_text("api:olive")
    shot(page, "06-audit")
    doc_shot(page, "console-audit")

    # Narrow screen: the inbox and runs stay usable.
    page.set_viewport_size({"width": 380, "height": 800})
    page.get_by_role("link", name="Runs").click()
    expect(page.locator('tr[data-run="asked"]')).to_be_visible()
    shot(page, "07-narrow")

    # The session's cookie alone cannot change anything: without the CSRF
    # token, or with another one, a decision is refused.
    api = page.context.request
    no_csrf = api.post(f"{base}/api/v1/runs/asked/cancel", data={"reason": "x"})
    assert no_csrf.status == 403 and no_csrf.json()["error"]["code"] == "csrf_refused", no_csrf.text()
    csrf = page.evaluate("() => fetch('/console/session').then(r => r.json()).then(j => j.csrf)")
    wrong = api.post(
        f"{base}/api/v1/runs/asked/cancel", data={"reason": "x"}, headers={"X-Warden-CSRF": "0" * 64}
    )
    assert wrong.status == 403, wrong.text()
    # Logging out ends the session: its CSRF token, replayed with its old
    # cookie, is refused.
    old_cookie = f"warden_console={session['value']}"
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    replay = api.post(
        f"{base}/api/v1/runs/asked/cancel", data={"reason": "x"},
        headers={"X-Warden-CSRF": csrf, "Cookie": old_cookie},
    )
    assert replay.status == 401 and replay.json()["error"]["code"] == "unauthenticated", replay.text()

    assert not errors, errors
    browser.close()
print("console test passed")
