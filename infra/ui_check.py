"""Look at the Airflow UI as a user does: log in, open a DAG, read its runs, take a screenshot.

    cascade ui-check --dag ctr_preranking --out ui.png

Drives Debian's Chromium (``/usr/bin/chromium``, installed by ``infra/install.sh``) headless
through Playwright; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def _browser_page(timeout_ms: int, http_credentials: dict[str, str] | None = None) -> Iterator[Any]:
    """A page of a headless Chromium, closed on exit; ``http_credentials`` (username, password,
    origin) answer that origin's basic-auth challenge, as a person types them into the prompt."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1440, "height": 900}, http_credentials=http_credentials
            )
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            browser.close()


def _log_in(page: Any, url: str, username: str, password: str) -> None:
    page.goto(url)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def follow_extra_link(
    base_url: str,
    password: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    link_name: str,
    expect_text: str,
    screenshots: Path,
    *,
    username: str = "admin",
    link_credentials: dict[str, str] | None = None,
    timeout_ms: int = 90_000,
) -> dict[str, Any]:
    """Open a finished task's page, follow its extra link ``link_name`` and wait until the page
    it leads to shows ``expect_text``; screenshots of both pages go into ``screenshots``.
    ``link_credentials`` (username, password, origin) sign in to a target behind basic auth
    (the stack's MLflow)."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    screenshots.mkdir(parents=True, exist_ok=True)
    with _browser_page(timeout_ms, link_credentials) as page:
        # The task's Details tab: its extra links are there (Logs, the default tab, has none).
        task_page = (
            f"{base_url}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/{task_id}/details"
        )
        _log_in(page, task_page, username, password)
        page.wait_for_url(re.compile(rf".*/tasks/{task_id}/details.*"))
        link = page.get_by_role("link", name=link_name)
        expect(link).to_be_visible(timeout=timeout_ms)
        href = link.get_attribute("href") or ""
        page.screenshot(path=str(screenshots / f"{dag_id}_{task_id}_task.png"))
        page.goto(href)  # the link opens a new tab; the same page follows it here
        expect(page.get_by_text(expect_text).first).to_be_visible(timeout=timeout_ms)
        target = screenshots / f"{dag_id}_{task_id}_link.png"
        page.screenshot(path=str(target), full_page=True)
        return {"href": href, "url": page.url, "screenshot": str(target)}


def screenshot_page(path: Path, screenshot: Path, *, timeout_ms: int = 60_000) -> Path:
    """A full-page screenshot of a local HTML file (a ``cascade report`` page)."""
    with _browser_page(timeout_ms) as page:
        page.goto(path.resolve().as_uri())
        page.wait_for_load_state("load")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
    return screenshot


def trigger_from_form(
    base_url: str,
    password: str,
    dag_id: str,
    ds: str,
    screenshot: Path,
    *,
    username: str = "admin",
    timeout_ms: int = 90_000,
) -> dict[str, Any]:
    """Trigger ``dag_id`` from the UI's trigger form with its ``ds`` Param set to ``ds``, as a
    person starts a backfill of one partition. Returns the new run's id (from the page the UI
    opens), or the error the form shows when Airflow refuses the value (no run then)."""
    from urllib.parse import unquote

    with _browser_page(timeout_ms) as page:
        _log_in(page, f"{base_url}/dags/{dag_id}", username, password)
        page.wait_for_url(re.compile(rf".*/dags/{dag_id}.*"))
        page.get_by_role("button", name=re.compile("^Trigger")).first.click()
        dialog = page.get_by_role("dialog")
        field = dialog.locator("#element_ds")  # the form's field of the Param "ds"
        field.fill(ds)
        dialog.get_by_role("button", name="Trigger").click()
        opened = re.compile(rf".*/dags/{dag_id}/runs/(?P<run>[^/?#]+)")
        refused = dialog.get_by_text(re.compile("Invalid input for param ds"))
        for _ in range(timeout_ms // 250):
            if opened.match(page.url) or refused.count():
                break
            page.wait_for_timeout(250)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot))
        found = opened.match(page.url)
        if found:
            return {"run_id": unquote(found["run"]), "error": None, "screenshot": str(screenshot)}
        error = refused.first.inner_text() if refused.count() else dialog.inner_text()
        return {"run_id": None, "error": error, "screenshot": str(screenshot)}


def check_dag_runs(
    base_url: str,
    password: str,
    dag_id: str,
    run_id: str,
    screenshot: Path,
    *,
    username: str = "admin",
    timeout_ms: int = 90_000,
) -> dict[str, Any]:
    """Log in, open the DAG's runs list, and return what the page says about ``run_id``."""
    from playwright.sync_api import expect

    with _browser_page(timeout_ms) as page:
        _log_in(page, f"{base_url}/dags/{dag_id}/runs", username, password)
        page.wait_for_url(re.compile(rf".*/dags/{dag_id}.*"))
        row = page.get_by_role("row").filter(has_text=run_id)
        expect(row).to_be_visible(timeout=timeout_ms)
        row_text = row.inner_text()
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        return {"url": page.url, "row": row_text, "screenshot": str(screenshot)}


def main(argv: list[str] | None = None) -> int:
    from cascade.airflow_client import AirflowClient, airflow_password
    from cascade.config import load_settings

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dag", default="ctr_preranking")
    parser.add_argument("--out", type=Path, default=Path("airflow-ui.png"))
    args = parser.parse_args(argv)
    settings = load_settings()
    password = airflow_password(settings)
    if not password:
        print("no Airflow password: start the stack with `cascade up`", file=sys.stderr)
        return 2
    runs = AirflowClient(settings).dag_runs(args.dag, limit=1)
    if not runs:
        print(f"{args.dag} has no runs yet", file=sys.stderr)
        return 2
    print(
        json.dumps(
            check_dag_runs(
                settings.airflow_url, password, args.dag, runs[0]["dag_run_id"], args.out
            ),
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
