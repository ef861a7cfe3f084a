"""Live-view latency: from a metric logged in a rank to the point drawn in the browser.

Real parts end to end: JupyterLab with the jupyter_dlc server extension and labextension,
headless Chromium (Playwright), a `%%dlc --nodes 2 --nproc-per-node 1` cell logging `loss`
at about 20 steps/s. For every step of rank 0:

  logged  the rank's time.time() when `runtime.log()` was called (the point's `t`)
  stored  when a poller in this process first saw the point in the launcher (every 20 ms)
  drawn   the page's Date.now() at the first animation frame where BokehJS's data source
          "dlc-train-0" holds that step (a requestAnimationFrame loop in the page)

Everything runs on one machine, so the clocks agree. Prints the median and p95 of
drawn - logged, and of the two parts (stored - logged: the rank's report batching;
drawn - stored: the view's poll, the kernel -> browser comm, BokehJS), p95 last; appends the
result and the command to benchmarks/RESULTS.md.

    python benchmarks/live_view.py [--steps 400] [--rate 20] [--no-append]

BokehJS comes from the labextension (its activate() calls loadBokehJS, which loads it from
/dlc/static/bokeh/); the script stops with an error when the page never gets the body class
dlc-bokehjs-loaded. Lab runs through tests/labserver.py's running_lab, as in the browser tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from labserver import CHROMIUM, CHROMIUM_ARGS, running_lab, wait_until  # noqa: E402

TOKEN = "bench-" + os.urandom(4).hex()

CELL = """%%dlc --nodes 2 --nproc-per-node 1 --name liveview
import time
from jupyter_dlc import runtime
runtime.init()
for step in range(1, {steps} + 1):
    runtime.log(step, loss=1.0 / step)
    time.sleep({sleep})
"""

# Records, for each step newly present in rank 0's source, the Date.now() of the frame.
OBSERVE_JS = """() => {
  window.__dlcDrawn = {};
  const tick = () => {
    const B = window.Bokeh;
    if (B && B.index) {
      for (const view of B.index) {
        const doc = view.model && view.model.document;
        const source = doc && doc.get_model_by_name('dlc-train-0');
        if (!source) continue;
        const xs = source.data.get ? source.data.get('x') : source.data.x;
        const now = Date.now();
        for (let i = xs.length - 1; i >= 0 && !(xs[i] in window.__dlcDrawn); i--) {
          window.__dlcDrawn[xs[i]] = now;
        }
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""

def percentile(values, q):
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0, help="steps per second (approx.)")
    parser.add_argument("--no-append", action="store_true", help="do not append to RESULTS.md")
    args = parser.parse_args()

    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "%load_ext jupyter_dlc"},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": CELL.format(steps=args.steps, sleep=1.0 / args.rate)}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    stored: dict[int, float] = {}
    with running_lab("dlc-bench-view-", "/", TOKEN, timeout=120, quiet_build=True) as lab:
        url, env, tmp = lab["url"], lab["env"], lab["tmp"]
        (lab["root"] / "live.ipynb").write_text(json.dumps(nb))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{url}lab/tree/live.ipynb?reset&token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120000)
            try:
                page.wait_for_function("document.body.classList.contains('dlc-bokehjs-loaded')",
                                       timeout=20000)
            except Exception:
                raise SystemExit("live_view: the labextension did not load BokehJS (body has no "
                                 "dlc-bokehjs-loaded class)") from None
            page.evaluate(OBSERVE_JS)
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            cells.nth(0).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            page.wait_for_function("() => /\\[\\d+\\]/.test(document.querySelectorAll("
                                   "'.jp-Notebook .jp-CodeCell .jp-InputPrompt')[0].textContent)",
                                   timeout=120000)
            cells.nth(1).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")

            # the launcher this Lab started (its connection file is in our runtime dir)
            os.environ.update(JUPYTER_RUNTIME_DIR=env["JUPYTER_RUNTIME_DIR"],
                              DLC_DATA_DIR=env["DLC_DATA_DIR"])
            from jupyter_dlc.client import LauncherClient

            client = wait_until(lambda: LauncherClient.from_connection_file(), 120, "the launcher")
            job_id = wait_until(lambda: next((j["id"] for j in client.jobs()), None), 120, "the job")
            done = threading.Event()

            def poll_store():
                seq = 0
                while not done.is_set():
                    answer = client.metrics(job_id, since=seq)
                    now = time.time()
                    for point in answer["points"]:
                        if point["rank"] == 0 and point["name"] == "loss":
                            stored.setdefault(int(point["step"]), now)
                    seq = answer["last_seq"]
                    time.sleep(0.02)

            poller = threading.Thread(target=poll_store, daemon=True)
            poller.start()
            client.wait(job_id, timeout=args.steps / args.rate * 4 + 120)
            time.sleep(3)
            done.set()
            drawn = {int(k): v / 1000.0 for k, v in page.evaluate("window.__dlcDrawn").items()}
            page.screenshot(path=str(tmp / "live_view.png"))
            browser.close()
        points = [p for p in client.metrics(job_id)["points"] if p["rank"] == 0 and p["name"] == "loss"]
        logged = {int(p["step"]): p["t"] for p in points}

    steps = sorted(s for s in logged if s in drawn)
    if len(steps) < len(logged) * 0.9:
        raise SystemExit(f"live_view: only {len(steps)} of {len(logged)} logged steps were drawn")
    total = [drawn[s] - logged[s] for s in steps]
    batching = [stored[s] - logged[s] for s in steps if s in stored]
    view = [drawn[s] - stored[s] for s in steps if s in stored]
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    lines = [
        f"steps drawn: {len(steps)} of {len(logged)} logged (rank 0, ~{args.rate:g} steps/s, 2x1 ranks)",
        f"rank -> launcher (report batching): median {ms(statistics.median(batching))}, "
        f"p95 {ms(percentile(batching, 0.95))}",
        f"launcher -> drawn (view poll + comm + BokehJS): median {ms(statistics.median(view))}, "
        f"p95 {ms(percentile(view, 0.95))}",
        f"logged -> drawn: median {ms(statistics.median(total))}",
        f"logged -> drawn: p95 {ms(percentile(total, 0.95))} (target < 1000 ms)",
    ]
    print("\n".join(lines))
    if not args.no_append:
        command = "python benchmarks/live_view.py " + " ".join(sys.argv[1:])
        with open(REPO / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(f"\n## Live view latency ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
                    f"`{command.strip()}`\n\n" + "".join(f"- {line}\n" for line in lines))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as error:  # wait_until's timeouts: one line, as before
        raise SystemExit(f"live_view: {error}") from None
