"""The DLC jobs panel in a real JupyterLab, driven through real Chromium (Playwright).

One purposeful walk: open the panel; a job started from the CLI appears and changes state;
Stop and Resume (from a picked checkpoint) from the panel; the detail's "where each step
goes" chart (the runtime logs the breakdown by itself); a straggler banner for a job whose
rank 1 is slow; a failing job raises a JupyterLab notification while the panel is closed;
the launcher going away shows one line and the panel recovers by itself. Screenshots go to artifacts/panel/.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labserver import CHROMIUM, CHROMIUM_ARGS, running_lab, wait_until

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ART = REPO / "artifacts" / "panel"
BASE = "/lab-user/"
TOKEN = "panel-" + os.urandom(4).hex()

TRAIN = r'''
import os, time, torch
from jupyter_dlc import runtime
runtime.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ckpt = runtime.Checkpointer(model=model, optimizer=opt)
step = ckpt.restore()
fail_at = int(os.environ.get("FAIL_AT", "0"))
while step < 100000:
    step += 1
    x = torch.randn(16, 4)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    runtime.log(step, loss=loss.item())
    if step % 10 == 0:
        ckpt.save(step)
    if fail_at and step >= fail_at:
        raise RuntimeError(f"planned failure at step {step}")
    time.sleep(0.05)
'''

# Rank 1 works 80 ms a step (none of it in the all-reduce) while the others work 50 ms and
# wait 30 ms for it: the values the script logs win over the runtime's own breakdown. The
# detector (launcher/stragglers.py) judges windows of 20 steps: at 20 steps a second rank 1
# is named within a few seconds of its first steps.
STRAGGLE = r'''
import os, time
from jupyter_dlc import runtime
runtime.init()
rank = int(os.environ["RANK"])
step = 0
while True:
    step += 1
    runtime.log(step, loss=1.0 / step, step_ms=80.0, data_wait_ms=1.0, ckpt_stall_ms=0.0,
                grad_sync_ms=0.0 if rank == 1 else 30.0)
    time.sleep(0.05)
'''


@pytest.fixture(scope="module")
def lab():
    pytest.importorskip("playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium")
    # the panel must be built (CI runs scripts/build-labextension.sh; so does running_lab)
    with running_lab("dlc-lab-", BASE, TOKEN) as lab:
        (lab["root"] / "train.py").write_text(TRAIN)
        (lab["root"] / "straggle.py").write_text(STRAGGLE)
        ART.mkdir(parents=True, exist_ok=True)
        yield lab
        stop_launcher(lab["env"])  # its jobs too (`launcher stop` leaves them running)


def launcher_client(env):
    old = {k: os.environ.get(k) for k in ("JUPYTER_RUNTIME_DIR", "DLC_DATA_DIR")}
    os.environ.update(JUPYTER_RUNTIME_DIR=env["JUPYTER_RUNTIME_DIR"], DLC_DATA_DIR=env["DLC_DATA_DIR"])
    try:
        from jupyter_dlc import paths
        from jupyter_dlc.client import LauncherClient

        return LauncherClient.from_connection_file(
            paths.connection_file(env["DLC_DATA_DIR"], env["JUPYTER_RUNTIME_DIR"]))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stop_launcher(env):
    client = launcher_client(env)
    if client is None:
        return
    try:
        for job in client.jobs():
            if job["state"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
                client.stop(job["id"], grace=1)
        pid = client.request("GET", "/healthz")[1]["pid"]
        time.sleep(2)
        os.kill(pid, signal.SIGTERM)
    except Exception:
        pass


def cli(env, *args):
    r = subprocess.run([sys.executable, "-m", "jupyter_dlc.cli", *args], env=env, capture_output=True,
                       text=True, timeout=120, cwd=os.path.join(env["DLC_DATA_DIR"], "..", "root"))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def row(page, name):
    return page.locator(".dlc-row", has=page.locator(".dlc-name", has_text=name)).first


def open_panel(page, lab):
    """Lab with a fresh workspace, the DLC panel opened from the left side bar: (its side
    bar tab, the panel)."""
    from playwright.sync_api import expect

    page.goto(f"{lab['url']}lab?reset&token={TOKEN}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jupyter-dlc-panel"]')
    expect(tab).to_be_visible(timeout=60000)
    tab.click()
    panel = page.locator("#jupyter-dlc-panel")
    expect(panel).to_be_visible()
    return tab, panel


def test_panel_end_to_end(lab):
    from playwright.sync_api import expect, sync_playwright

    env, tmp = lab["env"], lab["tmp"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors, console = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        try:
            tab, panel = open_panel(page, lab)
            expect(panel.locator(".dlc-title")).to_have_text("DLC jobs")
            # connected: the one status line is hidden once live
            expect(panel.locator(".dlc-status")).to_be_hidden(timeout=60000)
            page.screenshot(path=str(ART / "01-panel-empty.png"))

            # -- a job from the CLI appears, then changes state ------------------------------
            out = cli(env, "run", str(tmp / "root" / "train.py"), "--nodes", "2",
                      "--nproc-per-node", "1", "--name", "panel-e2e", "--steps", "100000")
            r = row(page, "panel-e2e")
            expect(r).to_be_visible(timeout=20000)
            first_state = r.get_attribute("data-state")
            assert first_state in ("QUEUED", "PREFLIGHT", "STARTING"), (first_state, out)
            expect(r).to_have_attribute("data-state", "RUNNING", timeout=90000)
            expect(r.locator(".dlc-shape")).to_have_text("2×1")
            expect(r.locator(".dlc-step")).to_contain_text("step", timeout=60000)
            # progress against --steps with its ETA, and the goodput column (launcher/goodput.py)
            expect(r.locator(".dlc-step")).to_contain_text(" / 100000, ETA ", timeout=30000)
            expect(r.locator(".dlc-goodput-cell")).to_contain_text("goodput ", timeout=30000)
            job_id = r.get_attribute("data-job-id")
            page.screenshot(path=str(ART / "02-job-running.png"))
            # the straggler job starts now, so that it has run its windows when its detail opens
            cli(env, "run", str(tmp / "root" / "straggle.py"), "--nodes", "2", "--nproc-per-node", "2",
                "--name", "panel-straggler")

            # -- detail view: charts, ranks, logs; wait for a few checkpoints -------------------
            r.click()
            # the detail opens as a main-area tab; the sidebar keeps the list
            detail = page.locator("#jp-main-dock-panel .dlc-detail-tab .dlc-detail")
            expect(detail).to_be_visible()
            expect(detail).to_have_attribute("data-job-id", job_id)
            expect(panel.locator(".dlc-joblist")).to_be_visible()
            expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="DLC: panel-e2e")).to_be_visible()
            expect(detail.locator('svg[data-chart="loss"] path.dlc-chart-line').first).to_be_visible(timeout=30000)
            expect(detail.locator(".dlc-rank-table tr[data-rank]")).to_have_count(2, timeout=30000)
            expect(detail.locator(".dlc-rank-pages")).to_have_text("2 ranks · page 1 of 1")
            # "where each step goes": stacked bars from the breakdown the runtime logs itself
            steps = detail.locator('svg[data-chart="steps"]')
            expect(steps.locator("g.dlc-step-bar").first).to_be_visible(timeout=30000)
            expect(steps.locator(".dlc-chart-title")).to_have_text("where each step goes (median of the ranks)")
            expect(steps.locator('g.dlc-step-bar rect[data-part="compute"]').first).to_be_attached()
            # In one JS call: the chart is redrawn (replaced) up to once a second, and
            # scroll_into_view_if_needed waits for a stable element that a redraw detaches.
            steps.evaluate("e => e.scrollIntoView({block: 'center'})")
            steps.screenshot(path=str(ART / "03-step-chart.png"))
            # its names are this chart's, not line charts of their own
            expect(detail.locator('svg[data-chart="step_ms"]')).to_have_count(0)
            # points are pushed over the metrics stream; cut, it polls, then it is back
            expect(detail).to_have_attribute("data-feed", "live", timeout=30000)
            wait_until(lambda: int(detail.get_attribute("data-pushed") or 0) > 0, 30, "pushed points")
            page.evaluate("""(id) => {
                const el = document.querySelector('#jp-main-dock-panel .dlc-detail');
                window.__dlcFeed = [];
                new MutationObserver(() => window.__dlcFeed.push(el.dataset.feed))
                    .observe(el, {attributes: true, attributeFilter: ['data-feed']});
                window.jupyterDlc.feed(id).cut();
            }""", job_id)
            wait_until(lambda: page.evaluate("window.__dlcFeed.join(',')").startswith("polling,live"),
                       30, "the stream cut, polled, and back")
            client = launcher_client(env)
            wait_until(lambda: len(client.checkpoints(job_id)) >= 2, 90, "two committed checkpoints")
            # the goodput bar: productive and start-up at least, with the percentage
            part = '.dlc-goodput-bar .dlc-goodput-part[data-part="{}"]'.format
            expect(detail.locator(part("productive"))).to_be_visible(timeout=30000)
            expect(detail.locator(part("startup"))).to_have_count(1)
            expect(detail.locator(".dlc-goodput-value")).to_contain_text("%")
            page.screenshot(path=str(ART / "03-job-detail.png"))

            # -- Stop from the panel ------------------------------------------------------------
            detail.locator('[data-action="stop"]').click()
            expect(detail).to_have_attribute("data-state", "STOPPED", timeout=90000)
            assert client.job(job_id)["state"] == "STOPPED"
            expect(detail.locator('[data-action="resume"]')).to_be_enabled()
            page.screenshot(path=str(ART / "04-job-stopped.png"))

            # -- Resume from the panel, at a picked committed step -------------------------------
            steps = sorted(c["step"] for c in client.checkpoints(job_id))
            pick = steps[0]
            detail.locator('[data-action="resume"]').click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_be_visible()
            dialog.locator("select.dlc-resume-step").select_option(str(pick))
            page.screenshot(path=str(ART / "05-resume-picker.png"))
            dialog.locator("button.jp-mod-accept").click()
            expect(detail).to_have_attribute("data-state", "RUNNING", timeout=90000)
            job = client.job(job_id)
            assert job["attempt"] == 2, job
            resumed = job["attempts"][-1]["resume_path"]
            assert resumed and f"step-{pick}" in resumed, job["attempts"]
            expect(detail.locator(".dlc-detail-meta")).to_contain_text("attempt 2")
            page.screenshot(path=str(ART / "06-job-resumed.png"))
            client.stop(job_id, grace=2)
            expect(detail).to_have_attribute("data-state", "STOPPED", timeout=90000)
            detail.locator(".dlc-back").click()
            expect(detail).to_have_count(0)
            expect(panel.locator(".dlc-joblist")).to_be_visible()

            # -- a slow rank: the straggler banner, and the others' wait in the step chart --------
            r = row(page, "panel-straggler")
            straggler_id = r.get_attribute("data-job-id")
            r.click()
            detail = page.locator("#jp-main-dock-panel .dlc-detail-tab .dlc-detail")
            expect(detail).to_have_attribute("data-job-id", straggler_id)
            banner = detail.locator(".dlc-stragglers .dlc-straggler")
            expect(banner).to_have_count(1, timeout=60000)
            expect(banner).to_contain_text("straggler: rank 1 on node 0: 80 ms of its own work a step")
            expect(detail.locator('svg[data-chart="steps"] g.dlc-step-bar rect[data-part="sync"]').first
                   ).to_be_attached(timeout=30000)
            page.screenshot(path=str(ART / "07-straggler.png"))
            client.stop(straggler_id, grace=1)
            expect(detail).to_have_attribute("data-state", "STOPPED", timeout=90000)
            detail.locator(".dlc-back").click()
            expect(detail).to_have_count(0)

            # -- a failing job notifies, while the panel is closed --------------------------------
            tab.click()  # collapse the left area
            expect(panel).to_be_hidden()
            cli(env, "run", str(tmp / "root" / "train.py"), "--nodes", "1", "--nproc-per-node", "1",
                "--name", "panel-fail", "--env", "FAIL_AT=3", "--max-restarts", "0")
            toast = page.locator(".Toastify__toast", has_text="panel-fail")
            expect(toast).to_be_visible(timeout=120000)
            expect(toast).to_contain_text("failed")
            page.screenshot(path=str(ART / "08-failure-notification.png"))

            # -- the launcher goes away: one line, then recovery by itself ------------------------
            tab.click()
            expect(panel).to_be_visible()
            page.evaluate("""() => {
                window.__dlcStatuses = [];
                const el = document.querySelector('#jupyter-dlc-panel .dlc-status');
                new MutationObserver(() => window.__dlcStatuses.push(
                    [el.dataset.status, el.textContent])).observe(el, {attributes: true, childList: true});
            }""")
            pid = client.request("GET", "/healthz")[1]["pid"]
            os.kill(pid, signal.SIGTERM)
            page.wait_for_function(
                "() => window.__dlcStatuses.some(s => s[0] === 'down' || s[0] === 'polling')",
                timeout=30000)
            expect(panel.locator(".dlc-status")).to_be_hidden(timeout=60000)
            seen = page.evaluate("window.__dlcStatuses")
            assert any(s[0] in ("down", "polling") and s[1] and "\n" not in s[1] for s in seen), seen
            new_pid = launcher_client(env).request("GET", "/healthz")[1]["pid"]
            assert new_pid != pid
            # still live after the recovery: the list shows the jobs
            expect(row(page, "panel-e2e")).to_be_visible()
            expect(row(page, "panel-fail")).to_have_attribute("data-state", "FAILED")
            page.screenshot(path=str(ART / "09-recovered.png"))
            assert not errors, errors
        except Exception:
            page.screenshot(path=str(ART / "failure.png"))
            shutil.copy(tmp / "lab.log", ART / "lab.log")
            (ART / "console.log").write_text("\n".join(console + errors))
            raise
        finally:
            browser.close()


BRANCHED = """import torch
from jupyter_dlc import runtime
runtime.init()
ckpt = runtime.Checkpointer(model=torch.nn.Linear(2, 1))
for step in range(ckpt.restore() + 1, 21):
    runtime.log(step, loss=1.0 / step)
    if step % 5 == 0:
        ckpt.save(step)
ckpt.wait()"""


def test_branch_and_compare_from_the_panel(lab):
    """Branch in a job's detail: a committed step picked, the job's own cell (by its source
    map) appended to the notebook it came from under `%%dlc ... --from JOB@STEP`. Compare:
    another job picked, a tab with both curves, the differing field and the code diff."""
    import nbformat
    from playwright.sync_api import expect, sync_playwright

    env, root = lab["env"], lab["root"]
    # with its kernel named, JupyterLab starts it instead of asking (a dialog over the page)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# a run to branch"),
                                         nbformat.v4.new_code_cell("%%dlc --name panel-branch\n" + BRANCHED)],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nbformat.write(nb, root / "branchme.ipynb")
    cli(env, "launcher", "start")
    client = launcher_client(env)
    lines = BRANCHED.count("\n") + 1
    job = client.submit({"code": BRANCHED, "name": "panel-branch", "workdir": str(root),
                         "source": {"kind": "notebook", "path": str(root / "branchme.ipynb"), "cell": 2,
                                    "lines": [[1, 2, 2, lines]]}})
    assert client.wait(job["id"], timeout=120)["state"] == "SUCCEEDED"
    assert [c["step"] for c in client.checkpoints(job["id"])] == [10, 15, 20]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            _, panel = open_panel(page, lab)
            row(page, "panel-branch").click()
            detail = page.locator("#jp-main-dock-panel .dlc-detail-tab .dlc-detail")
            expect(detail).to_have_attribute("data-state", "SUCCEEDED", timeout=30000)
            detail.locator('[data-action="branch"]').click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text("Branch from")
            dialog.locator("select.dlc-resume-step").select_option("15")
            dialog.locator("button.jp-mod-accept").click()
            notebook = page.locator(".jp-NotebookPanel", has=page.locator(".jp-Cell")).filter(
                has_text="a run to branch")
            cells = notebook.locator(".jp-Notebook .jp-Cell")
            expect(cells).to_have_count(3, timeout=30000)
            added = cells.last.locator(".cm-content")
            expect(added).to_contain_text(f"%%dlc --nodes 1 --nproc-per-node 1 --from {job['id']}@15")
            expect(added).to_contain_text("for step in range(ckpt.restore() + 1, 21):")
            assert "%%dlc --name panel-branch" not in added.inner_text()  # the cell, not the notebook
            expect(cells.last).to_have_class(re.compile(r"\bjp-mod-active\b"))
            page.screenshot(path=str(ART / "10-branch-cell.png"))

            # -- Compare with another job: both curves, the field and the code that differ --------
            other = client.submit({"code": BRANCHED.replace("1.0 / step", "2.0 / step"), "name": "panel-other",
                                   "workdir": str(root), "env": {"NOTE": "doubled"}})
            assert client.wait(other["id"], timeout=120)["state"] == "SUCCEEDED"
            row(page, "panel-branch").click()
            expect(detail).to_be_visible()
            detail.locator('[data-action="compare"]').click()
            dialog = page.locator(".jp-Dialog")
            dialog.locator("select.dlc-compare-jobs").select_option([other["id"]])
            dialog.locator("button.jp-mod-accept").click()
            tab = page.locator(".dlc-compare-tab")
            expect(tab).to_have_attribute("data-state", "loaded", timeout=30000)
            expect(tab.locator("tr.dlc-compared")).to_have_count(2)
            assert [tab.locator("tr.dlc-compared").nth(i).get_attribute("data-job") for i in (0, 1)] == \
                [job["id"], other["id"]]
            for chart in ("compare-step", "compare-time"):
                expect(tab.locator(f'svg[data-chart="{chart}"] path.dlc-chart-line')).to_have_count(2)
            expect(tab.locator('tr[data-field="env.NOTE"]')).to_contain_text("doubled")
            expect(tab.locator(".dlc-code-diff .dlc-diff-del")).to_contain_text("loss=1.0 / step")
            expect(tab.locator(".dlc-code-diff .dlc-diff-add")).to_contain_text("loss=2.0 / step")
            page.screenshot(path=str(ART / "11-compare.png"))

            # -- a branch's detail: the parent's curve up to the branch step, under its own -------
            child = client.submit({"code": BRANCHED, "name": "panel-child", "workdir": str(root),
                                   "branch_from": f"{job['id']}@10"})
            assert client.wait(child["id"], timeout=120)["state"] == "SUCCEEDED"
            row(page, "panel-child").click()
            child_detail = page.locator(f'#jp-main-dock-panel .dlc-detail[data-job-id="{child["id"]}"]')
            loss = child_detail.locator('svg[data-chart="loss"]')
            expect(loss.locator("path.dlc-chart-parent")).to_have_attribute("data-last-x", "10", timeout=30000)
            expect(loss.locator("path.dlc-chart-line:not(.dlc-chart-parent)").first).to_have_attribute(
                "data-last-x", "20", timeout=30000)
            expect(child_detail.locator(".dlc-detail-meta")).to_contain_text(f"branched from {job['id']} at step 10")
            expect(row(page, "panel-child")).to_have_attribute("data-depth", "1")
            expect(row(page, "panel-child").locator(".dlc-branch")).to_have_text("⑂ @10")
            page.screenshot(path=str(ART / "12-branch-detail.png"))
            assert not errors, errors
        finally:
            browser.close()
