"""What the console's browser tests (console_test.py, live_test.py,
workers_test.py) share: their arguments (the server's address, an
operator's token, the demo's folder, the `warden` binary, the store, and
where to save screenshots), the `warden` command on that store, Debian's
Chromium launched for a test, a page that collects the page's errors, and
logging in with the token."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from playwright.sync_api import expect

# No sandbox (the test runs as root in a container), nothing in the
# background that could reach the network or change timing.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


class Console:
    """One test's server, demo and store, from its arguments."""

    def __init__(self, addr: str, token: str, demo: str, binary: str, store: str,
                 shots: str | None = None) -> None:
        self.base = f"http://{addr}"
        self.token = token
        self.demo_dir = Path(demo)
        self.binary = binary
        self.env = dict(os.environ, WARDEN_STORE=store)
        self.env.pop("RUST_LOG", None)
        self.shots_dir = Path(shots) if shots else None
        if self.shots_dir:
            self.shots_dir.mkdir(parents=True, exist_ok=True)

    def warden(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The command line in the demo's folder, on the test's store."""
        return subprocess.run(
            [self.binary, *args], cwd=self.demo_dir, env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120,
        )

    def shot(self, page, name: str) -> None:
        page.screenshot(path=str(self.shots_dir / f"{name}.png"), full_page=True)

    def doc_shot(self, page, name: str) -> None:
        """What docs/serve.md shows (docs/images/NAME.png, reduced to a small
        palette when committed): the visible part of the page only."""
        (self.shots_dir / "docs").mkdir(exist_ok=True)
        page.screenshot(path=str(self.shots_dir / "docs" / f"{name}.png"))

    def page(self, p, width: int, height: int, console_errors: bool = True):
        """Chromium, a page of that size, and the list the page's errors
        go to (and, with `console_errors`, what it logs as an error but a
        refused token's 401). Returns the browser, the page and the list."""
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        if console_errors:
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "401" not in m.text else None)
        return browser, page, errors

    def log_in(self, page, token: str | None = None) -> None:
        """Logs in on the console's page with `token` (the test's own by
        default) and waits for the runs list."""
        page.get_by_label("Token").fill(token or self.token)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
