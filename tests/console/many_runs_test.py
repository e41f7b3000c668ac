"""The console over a few thousand runs, in a real Chromium driven by
Playwright (tests/tests/all/console.rs runs it on SQLite and on
PostgreSQL). Arguments: the server's address, an operator's token, the
demo's folder, the `warden` binary, the store, where to save screenshots,
and how many runs were seeded (`seed-00000`…, labels `batch=b0`…`b6`).

The store holds the seeded runs and a few real ones, the newest: `plan-0`
(a planner whose children completed), `plan-1` (a planner parked on its
writer child `plan-1.call-2-1`, awaiting approval) and `watched` (a
priced notes run parked on its write).

It pages the list newest first (buttons and keys), searches by label and
by id, filters on the parked statuses, opens the parked child from its
parent, reads a cost in dollars, approves from the inbox, and saves the
run's timeline chart and the overview as screenshots (the docs' copies
under the screenshots folder's docs/)."""

from __future__ import annotations

import re
import sys

from playwright.sync_api import expect, sync_playwright

from console_common import Console

console = Console(*sys.argv[1:7])
seeded = int(sys.argv[7])
base = console.base


def rows(page):
    return page.locator("table.runs tbody tr[data-run]")


def ids(page) -> list[str]:
    return rows(page).evaluate_all("rs => rs.map(r => r.dataset.run)")


def created(page) -> list[str]:
    return rows(page).evaluate_all("rs => rs.map(r => r.querySelector('time')?.getAttribute('datetime'))")


def search(page, text: str) -> None:
    box = page.get_by_label("Search runs by id or label")
    box.fill(text)
    box.press("Enter")


with sync_playwright() as p:
    browser, page, errors = console.page(p, 1200, 900)
    page.goto(f"{base}/console/")
    console.log_in(page)

    # Newest first: the real runs, `watched` last made, then the seeded.
    expect(rows(page)).to_have_count(50, timeout=20_000)
    first = ids(page)
    assert first[0] == "watched", first[:8]
    assert "seed-%05d" % (seeded - 1) in first, first
    stamps = created(page)
    assert stamps == sorted(stamps, reverse=True), stamps
    console.shot(page, "many-01-runs")

    # The next page, by its button, then by the `n` key: older runs,
    # none seen before; `p` goes back.
    page.get_by_role("button", name="Older →").click()
    expect(rows(page).first).not_to_have_attribute("data-run", first[0])
    second = ids(page)
    assert not set(second) & set(first), second
    assert created(page)[0] <= stamps[-1]
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("n")
    expect(page.get_by_text("page 3, newest first")).to_be_visible()
    third = ids(page)
    assert not set(third) & set(second), third
    page.keyboard.press("p")
    expect(page.get_by_text("page 2, newest first")).to_be_visible()
    assert ids(page) == second

    # By label: every run shown carries it, newest first, more pages.
    page.keyboard.press("/")
    expect(page.get_by_label("Search runs by id or label")).to_be_focused()
    search(page, "batch=b3")
    expect(rows(page)).to_have_count(50)
    for label in rows(page).locator("td:nth-child(4)").all_inner_texts():
        assert "batch=b3" in label, label
    expect(page.get_by_role("button", name="Older →")).to_be_enabled()
    console.shot(page, "many-02-label")

    # By id: a prefix, then one whole id.
    search(page, "seed-0004")
    expect(rows(page)).to_have_count(10)
    assert ids(page) == ["seed-%05d" % n for n in range(49, 39, -1)], ids(page)
    search(page, "seed-01234")
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first).to_have_attribute("data-run", "seed-01234")
    expect(rows(page).first).to_contain_text("batch=b2")

    # Every parked kind: the parent waits for its child, which waits for
    # approval, as does `watched`.
    page.get_by_label("Search runs by id or label").fill("")
    page.get_by_label("Status").select_option(label="every parked kind")
    page.get_by_role("button", name="Find").click()
    expect(rows(page)).to_have_count(3)
    expect(page.locator('tr[data-run="plan-1"]')).to_contain_text("awaiting child")
    expect(page.locator('tr[data-run="plan-1.call-2-1"]')).to_contain_text("awaiting approval")

    # The parked child, from its parent, and back.
    page.locator('tr[data-run="plan-1"]').get_by_role("link", name="plan-1").click()
    expect(page.get_by_role("heading", name="Run plan-1", exact=True)).to_be_visible()
    children = page.get_by_role("region", name="Child runs")
    expect(children.locator('li[data-child="plan-1.call-2-1"]')).to_contain_text("awaiting approval")
    children.get_by_role("link", name="plan-1.call-2-1").click()
    expect(page.get_by_role("heading", name="Run plan-1.call-2-1")).to_be_visible()
    expect(page.get_by_role("heading", name="Approve fs__write_file?")).to_be_visible()
    expect(page.get_by_role("link", name="plan-1", exact=True)).to_be_visible()

    # A cost in dollars, with the digits it has.
    page.goto(f"{base}/console/#/run/watched")
    cost = page.locator('tr[data-budget="cost"] td').first
    expect(cost).to_have_text(re.compile(r"^\$\d+\.\d{2,9}$"))
    expect(page.get_by_role("table", name="Steps").locator("tr[data-step] td").nth(4)).to_have_text(re.compile(r"^\$\d+\.\d{2,9}$"))
    # The clock readings are folded away.
    readings = page.locator('ol.timeline li[data-type="clock_observed"]')
    if readings.count():
        expect(readings.first).to_be_hidden()

    # Approve it from the inbox; it completes.
    page.get_by_role("link", name="Inbox").click()
    card = page.locator('article[data-run="watched"]')
    expect(card).to_contain_text("SUMMARY.md", timeout=20_000)
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0, timeout=20_000)
    page.goto(f"{base}/console/#/run/watched")
    # Its output is delivered after it completes: the log's last events.
    expect(page.get_by_role("list", name="Timeline").locator('li[data-type="delivery_completed"]')).to_have_count(1, timeout=20_000)
    page.wait_for_timeout(1000)

    # The run's timeline chart: model calls, the tool call, the approval
    # wait, as bars on a time axis, with its figures beside.
    chart = page.locator("#timeline-chart")
    expect(chart.locator("canvas")).to_have_count(1)
    steps = chart.get_by_role("table", name="Timed steps")
    expect(steps).to_contain_text("approval of fs__write_file")
    expect(steps).to_contain_text("model call, step 1")
    chart.screenshot(path=str(console.shots_dir / "many-03-timeline-chart.png"))
    (console.shots_dir / "docs").mkdir(exist_ok=True)
    chart.locator(".plot").screenshot(path=str(console.shots_dir / "docs" / "console-timeline-chart.png"))

    # The overview of many runs: three charts, each with its figures.
    page.get_by_role("link", name="Overview").click()
    for figure in ["#status-chart", "#agent-chart", "#tool-chart"]:
        expect(page.locator(figure).locator("canvas")).to_have_count(1, timeout=20_000)
    agents = page.get_by_role("table", name="Cost and tokens per agent")
    expect(agents).to_contain_text("planner")
    expect(agents.locator("tr", has_text="notes")).to_contain_text("$")
    expect(page.get_by_role("table", name="Slowest tools")).to_contain_text("fs__")
    console.shot(page, "many-04-overview")
    page.set_viewport_size({"width": 1200, "height": 1250})
    console.doc_shot(page, "console-overview")

    # Narrow: the list and its search stay usable.
    page.set_viewport_size({"width": 380, "height": 800})
    page.get_by_role("link", name="Runs").click()
    expect(rows(page)).to_have_count(50)
    expect(page.get_by_label("Search runs by id or label")).to_be_visible()
    console.shot(page, "many-05-narrow")

    assert not errors, errors
    browser.close()
