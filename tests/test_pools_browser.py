"""The side panel's warm pools in a real JupyterLab through real Chromium: a pool started
from the CLI is listed with its shape's id, and its Release button releases it for real."""

from __future__ import annotations

import os

import pytest
from labserver import CHROMIUM, CHROMIUM_ARGS
from test_panel_browser import ART, cli, lab, launcher_client, open_panel  # noqa: F401 - lab: fixture

from conftest import wait_for

pytestmark = pytest.mark.browser


def test_pools_are_listed_and_released_from_the_panel(lab):  # noqa: F811 - the fixture
    from playwright.sync_api import expect, sync_playwright

    env = lab["env"]
    cli(env, "pool", "up", "--nodes", "1", "--nproc-per-node", "1")
    client = launcher_client(env)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            _, panel = open_panel(page, lab)
            row = panel.locator('.dlc-pool[data-pool-id="local-1x1"]')
            expect(row).to_be_visible(timeout=30000)
            expect(row).to_contain_text("local-1x1:")
            page.screenshot(path=str(ART / "pools-listed.png"))
            row.locator("button.dlc-pool-release").click()
            expect(row).to_have_count(0, timeout=30000)
            assert errors == []
        finally:
            browser.close()
    wait_for(lambda: client.pools() == [], 30, what="pool released by the button")
    assert not os.path.isdir(os.path.join(env["DLC_DATA_DIR"], "pools", "local-1x1"))
