"""The job view in a real JupyterLab, driven through real Chromium (Playwright).

examples/quickstart.ipynb, copied with more steps and a short sleep per step so that there is
time to click: run its `%%dlc` cell; the loss chart gains points while the job trains (read
from BokehJS's own data source in the page); Stop -> the view shows STOPPED; Resume from the
latest committed step -> attempt 2, and the loss chart continues from that step (one point
per step, no going back). BokehJS must come from our server extension's
/dlc/static/bokeh/ route (checked on the page's requests), loaded by the labextension
(`loadBokehJS` in labextension/src/bokehjs.ts, called from the plugin's activate()).

Screenshots: artifacts/view/. Needs the built labextension (scripts/build-labextension.sh)
and the jupyter_dlc server extension. The test fails unless the labextension itself loaded
BokehJS (the body gets the class dlc-bokehjs-loaded).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from labserver import CHROMIUM, CHROMIUM_ARGS, run_cell, running_lab, wait_until

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ART = REPO / "artifacts" / "view"
BASE = "/lab-view/"
TOKEN = "view-" + os.urandom(4).hex()

# The loss chart's x column as BokehJS has it: every root view on the page, its document, the
# data source the view names "dlc-train-0" (rank 0's line). The last one wins (a re-rendered
# chart replaces its document).
CHART_STEPS_JS = """() => {
  const B = window.Bokeh;
  if (!B || !B.index) return null;
  let found = null;
  for (const view of B.index) {
    const doc = view.model && view.model.document;
    const source = doc && doc.get_model_by_name('dlc-train-0');
    if (source) found = Array.from(source.data.get ? source.data.get('x') : source.data.x);
  }
  return found;
}"""

def long_quickstart(dest: Path) -> None:
    """examples/quickstart.ipynb with 3000 steps and 20 ms of sleep per step."""
    nb = json.loads((REPO / "examples" / "quickstart.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code"
                and "".join(c["source"]).startswith("%%dlc"))
    source = "".join(cell["source"])
    assert "total_steps = 300\n" in source, "quickstart changed: update long_quickstart()"
    source = source.replace("total_steps = 300\n", "total_steps = 3000\n")
    log_line = re.search(r"^( +)runtime\.log\(step, loss=loss\.item\(\)\).*$", source, re.M)
    assert log_line, "quickstart changed: no runtime.log(step, loss=loss.item()) line"
    source = source.replace(log_line.group(0),
                            log_line.group(0) + f"\n{log_line.group(1)}time.sleep(0.02)")
    first, rest = source.split("\n", 1)
    cell["source"] = first + "\nimport time\n" + rest
    for c in nb["cells"]:
        c["outputs"] = [] if c["cell_type"] == "code" else c.get("outputs")
        if c["cell_type"] != "code":
            c.pop("outputs", None)
    dest.write_text(json.dumps(nb))


@pytest.fixture(scope="module")
def lab():
    pytest.importorskip("playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium")
    with running_lab("dlc-view-", BASE, TOKEN) as lab:
        long_quickstart(lab["root"] / "quickstart.ipynb")
        ART.mkdir(parents=True, exist_ok=True)
        yield lab


def test_view_live_stop_resume_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.on("request", lambda r: requests.append(r.url))
        try:
            _walk(page, lab)
        except BaseException:
            page.screenshot(path=str(ART / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    bokeh_requests = [u for u in requests if "bokeh" in u and u.endswith(".js")]
    assert not [u for u in bokeh_requests if "cdn.bokeh.org" in u or not u.startswith(lab["url"])]
    assert any(u.startswith(lab["url"] + "dlc/static/bokeh/bokeh.min.js") for u in bokeh_requests)


def _state(page) -> tuple[str | None, str | None]:
    return tuple(page.evaluate("""() => {
      const s = document.querySelector('.dlc-job-view .dlc-state');
      const a = document.querySelector('.dlc-job-view .dlc-attempt');
      return [s && s.dataset.state, a && a.textContent];
    }"""))


# The loss chart's legend view (BokehJS's, found through its view index): `mark` keeps its
# items' entries, else whether the same view still shows the same entries (BokehJS 3 builds
# them again at each point streamed to a line; labextension/src/chartstyles.ts keeps them).
LEGEND_JS = """(mark) => {
  const B = window.Bokeh;
  const ours = v => v.model && v.model.type === 'Legend' && v.model.items.some(
    i => i.renderers.some(r => r.data_source && r.data_source.name === 'dlc-train-0'));
  const view = [...B.index.query(ours)].pop();
  if (!view) return null;
  if (mark) { window.__dlcLegend = {view, entries: view.entries}; return true; }
  const kept = window.__dlcLegend;
  return {sameView: kept.view === view, sameEntries: kept.entries === view.entries,
          items: view.entries.length};
}"""


def _walk(page, lab) -> None:
    page.goto(f"{lab['url']}lab/tree/quickstart.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90000)

    # BokehJS: the labextension loads it from our server extension at activation
    try:
        page.wait_for_function("document.body.classList.contains('dlc-bokehjs-loaded')",
                               timeout=30000)
    except Exception:
        raise AssertionError(
            "the labextension did not load BokehJS (body has no dlc-bokehjs-loaded class): "
            "its activate() must call loadBokehJS() from labextension/src/bokehjs.ts") from None
    assert page.evaluate("typeof window.Bokeh") == "object"

    # run the %load_ext cell, then the %%dlc cell (not `%dlc wait`: a blocked kernel would
    # queue the button clicks until the job ends)
    wait_until(lambda: "| Idle" in page.locator("#jp-main-statusbar")
               .first.inner_text(), 90, "the kernel idle")
    run_cell(page, 0)
    page.wait_for_function("() => /\\[\\d+\\]/.test(document.querySelectorAll("
                           "'.jp-Notebook .jp-CodeCell .jp-InputPrompt')[0].textContent)",
                           timeout=90000)
    run_cell(page, 1)
    page.wait_for_selector(".dlc-job-view .dlc-state", timeout=60000)

    # the loss chart gains points while the job trains
    first = wait_until(lambda: (page.evaluate(CHART_STEPS_JS) or [None])[-1] or None, 120,
                       "first loss points drawn")
    later = wait_until(lambda: ((page.evaluate(CHART_STEPS_JS) or [0])[-1] or 0) > first + 30 and
                       page.evaluate(CHART_STEPS_JS)[-1], 60, "the loss chart to grow")
    assert _state(page)[0] == "RUNNING"
    # the legend is built once, not at every point
    assert page.evaluate(LEGEND_JS, True)
    wait_until(lambda: ((page.evaluate(CHART_STEPS_JS) or [0])[-1] or 0) > later + 10, 60,
               "the loss chart to grow again")
    legend = page.evaluate(LEGEND_JS, False)
    assert legend == {"sameView": True, "sameEntries": True, "items": legend["items"]} and legend["items"], legend
    # the goodput bar under the header (launcher/goodput.py): productive steps drawn, with the %
    page.wait_for_selector('.dlc-job-view .dlc-goodput-bar .dlc-goodput-part[data-part="productive"]',
                           state="visible", timeout=30000)
    assert page.locator(".dlc-job-view .dlc-goodput-value").inner_text().endswith("%")
    page.locator(".dlc-job-view").screenshot(path=str(ART / "01-running.png"))
    steps = page.evaluate(CHART_STEPS_JS)
    assert steps == sorted(steps) and steps[0] == 1 and later

    # Stop
    page.locator(".dlc-job-view button", has_text="Stop").click()
    wait_until(lambda: _state(page)[0] == "STOPPED", 60, "STOPPED in the view")
    page.wait_for_timeout(2500)  # the view's final refresh (ended_interval) re-renders the chart
    stopped_steps = page.evaluate(CHART_STEPS_JS)
    page.locator(".dlc-job-view").screenshot(path=str(ART / "02-stopped.png"))
    assert stopped_steps and stopped_steps == sorted(stopped_steps)

    # Resume from the latest committed step (the dropdown lists them, newest first)
    select = page.locator(".dlc-job-view .widget-dropdown select").nth(0)
    options = select.locator("option").all_text_contents()
    committed = [int(m.group(1)) for o in options if (m := re.match(r"step\s(\d+)", o))]
    assert committed and committed == sorted(committed, reverse=True), options
    resume_step = committed[0]
    select.select_option(index=0)
    page.locator(".dlc-job-view button", has_text="Resume").click()
    wait_until(lambda: _state(page) == ("RUNNING", "2"), 120, "attempt 2 RUNNING")
    top = max(stopped_steps)
    wait_until(lambda: max(page.evaluate(CHART_STEPS_JS) or [0]) > top + 20, 120,
               "attempt 2 points past where attempt 1 stopped")
    steps = page.evaluate(CHART_STEPS_JS)
    page.locator(".dlc-job-view").screenshot(path=str(ART / "03-resumed.png"))
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "one point per step"
    i = steps.index(resume_step)
    assert steps[i + 1] == resume_step + 1, "the chart continues from the committed step"
    assert steps[:i + 1] == list(range(1, resume_step + 1))

    # leave nothing running
    page.locator(".dlc-job-view button", has_text="Stop").click()
    wait_until(lambda: _state(page)[0] == "STOPPED", 60, "STOPPED again")


# A named data source's column as BokehJS has it, in the last document that holds it.
SOURCE_COLUMN_JS = """([name, column]) => {
  const B = window.Bokeh;
  if (!B || !B.index) return null;
  let found = null;
  for (const view of B.index) {
    const doc = view.model && view.model.document;
    const source = doc && doc.get_model_by_name(name);
    if (source) found = Array.from(source.data.get ? source.data.get(column) : source.data[column]);
  }
  return found;
}"""

TRIAL_CELL = """from jupyter_dlc import runtime
runtime.init()
lr = runtime.params(lr=0.5)["lr"]
for step in range(1, 21):
    runtime.log(step, loss=lr / step)"""


def test_sweep_and_compare_views_in_jupyterlab(lab):
    """A sweep's cell becomes its table and curves; `%dlc compare` overlays two jobs and
    shows the differing fields and the code diff, drawn by BokehJS in the page."""
    from playwright.sync_api import expect, sync_playwright

    cells = ["%load_ext jupyter_dlc",
             "%%dlc --sweep lr=0.5,0.25 --parallel 1 --name websweep --wait\n" + TRIAL_CELL,
             "%%dlc --name webedit --wait\n" + TRIAL_CELL.replace("lr / step", "lr / step ** 2"),
             "from jupyter_dlc.client import LauncherClient\n"
             "jobs = {j['name']: j['id'] for j in LauncherClient.connect().jobs()}\n"
             "A, B = jobs['websweep-0'], jobs['webedit']",
             "%dlc compare {A} {B}"]
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None}
                    for c in cells],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (lab["root"] / "sweep.ipynb").write_text(json.dumps(nb))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        try:
            page.goto(f"{lab['url']}lab/tree/sweep.ipynb?reset&token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90000)
            page.wait_for_function("document.body.classList.contains('dlc-bokehjs-loaded')", timeout=30000)
            wait_until(lambda: "| Idle" in page.locator("#jp-main-statusbar").first.inner_text(), 90,
                       "the kernel idle")
            for index in range(len(cells)):
                run_cell(page, index)
                prompt = page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-InputPrompt")
                expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=180000)

            header = page.locator(".dlc-sweep-header")
            expect(header).to_contain_text("2 trials (2 succeeded), 1 at a time")
            rows = page.locator("table.dlc-sweep tr.dlc-trial")
            expect(rows).to_have_count(2)
            assert [rows.nth(i).get_attribute("data-state") for i in range(2)] == ["SUCCEEDED"] * 2
            expect(page.locator("table.dlc-sweep tr.dlc-best")).to_have_attribute("data-trial", "1")
            for trial in (0, 1):
                xs = wait_until(lambda trial=trial: page.evaluate(SOURCE_COLUMN_JS, [f"dlc-trial-{trial}", "x"]),
                                30, f"trial {trial}'s curve drawn")
                assert xs == list(range(1, 21)), xs
            page.locator(".dlc-sweep").first.screenshot(path=str(ART / "04-sweep-table.png"))

            compared = page.locator("table.dlc-compare tr.dlc-compared")
            expect(compared).to_have_count(2)
            expect(page.locator('table.dlc-differences tr[data-field="params.lr"]')).to_be_visible()
            diff = page.locator("pre.dlc-code-diff")
            expect(diff).to_contain_text("-    runtime.log(step, loss=lr / step)")
            expect(diff).to_contain_text("+    runtime.log(step, loss=lr / step ** 2)")
            for i in (0, 1):
                for axis in ("step", "time"):
                    xs = wait_until(lambda i=i, axis=axis: page.evaluate(
                        SOURCE_COLUMN_JS, [f"dlc-compare-{axis}-{i}", "x"]), 30, f"compare {axis} {i}")
                    assert len(xs) == 20 and xs == sorted(xs)
            diff.scroll_into_view_if_needed()
            page.screenshot(path=str(ART / "05-compare.png"), full_page=True)
        except BaseException:
            page.screenshot(path=str(ART / "failure-sweep.png"), full_page=True)
            raise
        finally:
            browser.close()
