"""Views of a job with 4,096 ranks (issue 14): the notebook view and the panel's detail tab
show the mean with a min-max band plus the outlier rank, and a rank table that pages and
sorts, fed by 4,096 simulated ranks through the real report route.

A real launcher and a real job of 64 nodes x 64 processes: its engine is the Kubernetes
engine against the API stand-in of tests/k8s_standin.py (a stand-in, because no cluster can
run here), so its 64 pods are records, not processes, and no torch starts. The launcher
makes its 4,096 rank rows as for any job; the test then posts one report per rank, as a
rank's runtime does, with the launcher's token: steps 1 and 2 from every rank, step 3 from
every rank but 4000 (the slow one); rank 1234's loss diverges from step 2; rank 17 reports
first (the oldest heartbeat).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import LauncherEnv, wait_for

WORLD, NODES, NPROC = 4096, 64, 64
SLOW, DIVERGING, OLDEST = 4000, 1234, 17

pytest.importorskip("kubernetes")


def simulated_job(client, cluster: str) -> str:
    """Submit the 4,096-rank job to the stand-in's profile and return its id once RUNNING
    (the test plays the cluster: it starts the pods)."""
    job = client.submit({"code": "print('simulated')\n", "nodes": NODES, "nproc_per_node": NPROC,
                         "cluster": cluster, "engine": "kubernetes", "name": "ranks4096",
                         "heartbeat_interval": "60s", "heartbeat_misses": 10})
    return job["id"]


def run_pods(standin, client, job_id: str) -> None:
    def workload():
        with standin.lock:
            names = [name for (plural, _, name) in standin.objects if plural in
                     ("jobs", "pytorchjobs", "trainjobs") and job_id.lower() in name]
        return names[0] if names else None

    name = wait_for(workload, timeout=60, what="the job's workload in the stand-in")
    wait_for(lambda: len(standin.pods(name)) == NODES, timeout=60, what="its 64 pods")
    standin.run(name)
    wait_for(lambda: client.job(job_id)["state"] == "RUNNING", timeout=90, what="RUNNING")
    wait_for(lambda: len(client.job(job_id)["ranks"]) == WORLD, timeout=30, what="4,096 rank rows")


def detail_query(url: str) -> dict | None:
    """The query of a panel's read of a job's detail (`/dlc/api/jobs/<id>`), else None."""
    parts = urllib.parse.urlsplit(url)
    segments = parts.path.rstrip("/").split("/")
    if segments[-4:-1] != ["dlc", "api", "jobs"]:
        return None
    return dict(urllib.parse.parse_qsl(parts.query))


def loss(rank: int, step: int) -> float:
    value = 1.0 / step + (rank % 7) * 1e-3
    return value + 10.0 if rank == DIVERGING and step >= 2 else value


def post(client, job_id: str, rank: int, steps, t0: float) -> int:
    """One report of `rank` through the real report route, as the runtime posts it."""
    body = {"rank": rank, "node": rank // NPROC, "attempt": 1, "pid": 100000 + rank,
            "t": time.time(), "metrics": [{"t": t0 + step, "step": step,
                                           "values": {"loss": loss(rank, step)}}
                                          for step in steps]}
    req = urllib.request.Request(f"{client.url}/api/jobs/{job_id}/report",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"token {client.token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status


def report_all(client, job_id: str) -> None:
    """One report per rank through the real report route, as the runtime posts them."""
    t0 = time.time()

    def post_steps(rank: int) -> int:
        return post(client, job_id, rank, (1, 2) if rank == SLOW else (1, 2, 3), t0)

    assert post_steps(OLDEST) == 200
    time.sleep(1.1)  # heartbeats are stored in seconds: the others are visibly younger
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(post_steps, [r for r in range(WORLD) if r != OLDEST]))
    assert statuses == [200] * (WORLD - 1)


@pytest.fixture
def k8s_profile(tmp_path, monkeypatch):
    """The stand-in, and a cluster profile for it in DLC_CLUSTERS (set before any launcher
    starts, so the launcher reads it)."""
    from k8s_standin import Standin

    from jupyter_dlc import clusters

    monkeypatch.setenv("DLC_CLUSTERS", str(tmp_path / "dlc_clusters.yaml"))
    with Standin() as standin:
        clusters.put_profile("sim", {"engine": "kubernetes", "namespace": "ml",
                                     "kubeconfig": standin.kubeconfig(str(tmp_path / "kubeconfig")),
                                     "launcher_url": "http://127.0.0.1:9"})
        yield standin


def test_notebook_view_of_4096_ranks(k8s_profile, tmp_path):
    from jupyter_dlc.widgets import JobView

    env = LauncherEnv(str(tmp_path / "launcher"))
    try:
        client = env.client
        job_id = simulated_job(client, "sim")
        run_pods(k8s_profile, client, job_id)
        report_all(client, job_id)
        view = JobView(client, job_id)
        view.start()  # pushed points, as under a cell
        try:
            mean = "dlc-train-mean"
            wait_for(lambda: view.charts.train_sources.get("mean") is not None
                     and list(view.charts.train_sources["mean"].data["x"]) == [1, 2]
                     and DIVERGING in view.charts.train_sources, timeout=120,
                     what="the band of steps 1-2 and the diverging rank's line")
            band = view.charts.train_sources["mean"].data
            assert view.charts.train_sources["mean"].name == mean
            assert band["hi"][1] == pytest.approx(loss(DIVERGING, 2))
            assert band["lo"][1] == pytest.approx(0.5)
            assert view.charts.train.outliers == [DIVERGING], "only the diverging rank stands out"
            # its line starts where it stood out, and holds step 3, which waits for rank 4000
            assert list(view.charts.train_sources[DIVERGING].data["x"]) == [2, 3]
            assert view.points_pushed == WORLD * 3 - 1
            # the launcher sent the train points folded per step (bands.py), not one by one
            assert view.band_rows and view.band_rows < 50
            # an outlier now, rank 1234 is read as points: the stream reconnected asking for it
            # (folded into a row of one value, it would never reach its line)
            assert post(client, job_id, DIVERGING, (4,), time.time()) == 200
            wait_for(lambda: list(view.charts.train_sources[DIVERGING].data["x"]) == [2, 3, 4],
                     timeout=60, what="rank 1234's step 4 on its own line")
            assert view._push is not None and view._push.drops == 0

            started = time.perf_counter()
            job = view.refresh_now()
            refresh_s = time.perf_counter() - started
            # the view reads one page of ranks, sorted by the launcher, and the count of all
            assert job is not None and len(job["ranks"]) == 50
            assert job["rank_page"]["total"] == WORLD and job["rank_page"]["states"] == {"running": WORLD}
            table = view.rank_table.value
            assert table.count('class="dlc-rank"') == 50
            assert "page 1 of 82" in view.rank_pages.value and view.rank_bar.layout.display == ""
            view.rank_next.click()
            assert "page 2 of 82" in view.rank_pages.value
            assert 'data-rank="50"' in view.rank_table.value
            view.rank_sort.value = "step"
            first = view.rank_table.value.split('class="dlc-rank" data-rank="')[1].split('"')[0]
            assert first == str(SLOW) and "page 1 of 82" in view.rank_pages.value
            view.rank_sort.value = "heartbeat"
            first = view.rank_table.value.split('class="dlc-rank" data-rank="')[1].split('"')[0]
            assert first == str(OLDEST)
            print(f"4,096 ranks: one view refresh took {refresh_s * 1000:.0f} ms")
        finally:
            view.close()
        client.stop(job_id, grace=1)
    finally:
        env.close()


def test_panel_detail_of_4096_ranks(k8s_profile):
    from labserver import CHROMIUM, CHROMIUM_ARGS, running_lab, wait_until
    from playwright.sync_api import expect, sync_playwright

    from jupyter_dlc.client import LauncherClient

    token = "many-" + os.urandom(4).hex()
    with running_lab("dlc-many-ranks-", "/", token, timeout=120, quiet_build=True) as lab:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            detail_reads = []  # the query of each read of the job's detail, in order
            page.on("request", lambda r: detail_reads.append(detail_query(r.url)))
            page.goto(f"{lab['url']}lab?reset&token={token}")
            # the panel's first request starts the launcher (with the stand-in's profile)
            os.environ.update(JUPYTER_RUNTIME_DIR=lab["env"]["JUPYTER_RUNTIME_DIR"],
                              DLC_DATA_DIR=lab["env"]["DLC_DATA_DIR"])
            client = wait_until(lambda: LauncherClient.from_connection_file(), 120, "the launcher")
            job_id = simulated_job(client, "sim")
            run_pods(k8s_profile, client, job_id)
            report_all(client, job_id)
            page.wait_for_function("""(id) => {
              if (!document.querySelector('.dlc-detail-tab')) {
                window.jupyterDlc.dispatch({type: 'select', id});
              }
              return !!document.querySelector('.dlc-detail-tab .dlc-detail');
            }""", arg=job_id, timeout=60000, polling=200)
            detail = page.locator(".dlc-detail-tab .dlc-detail")
            chart = detail.locator('svg[data-chart="loss"]')
            expect(chart.locator("path.dlc-chart-band")).to_have_count(1, timeout=60000)
            expect(chart.locator("path.dlc-chart-mean")).to_have_count(1)
            expect(chart.locator(f'path.dlc-chart-outlier[data-label="rank {DIVERGING} (outlier)"]')
                   ).to_have_count(1)
            expect(chart.locator("path.dlc-chart-outlier")).to_have_count(1)
            # the launcher folded the other ranks' points (band=1); the diverging rank's line
            # starts where it stood out and holds step 3, which waits for rank 4000
            outlier = chart.locator("path.dlc-chart-outlier")
            expect(outlier).to_have_attribute("data-last-x", "3")
            expect(detail).to_have_attribute("data-outlier-ranks", str(DIVERGING))
            feed = "(id) => { const f = window.jupyterDlc.feed(id); return [f.query(), f.reopened]; }"
            asked, reopened = page.evaluate(feed, job_id)
            assert asked == {"band": 1, "ranks": str(DIVERGING)}, asked
            assert reopened >= 1, "the stream was not reopened to ask for the outlier rank's points"
            # every value applied once: band rows read by both the poll and the stream added once
            def applied():
                return sum(int(detail.get_attribute(a) or 0) for a in ("data-pushed", "data-polled"))
            wait_until(lambda: applied() >= WORLD * 3 - 1, 30, "every value in the chart")
            assert applied() == WORLD * 3 - 1
            pages = detail.locator(".dlc-rank-pages")
            expect(pages).to_have_text("4096 ranks · page 1 of 82", timeout=30000)
            expect(detail.locator(".dlc-rank-table tr[data-rank]")).to_have_count(50)
            # counts of all 4,096 ranks, from the launcher's rank_page (the panel holds 50)
            expect(detail.locator(".dlc-rank-states")).to_have_text(f"{WORLD} running")
            # turning the page reads that page from the launcher
            with page.expect_request(lambda r: (detail_query(r.url) or {}).get("rank_page") == "1"):
                detail.locator(".dlc-rank-next").click()
            expect(pages).to_have_text("4096 ranks · page 2 of 82")
            expect(detail.locator(".dlc-rank-table tr[data-rank]").first).to_have_attribute("data-rank", "50")
            detail.locator("select.dlc-rank-sort").select_option("step")
            expect(detail.locator(".dlc-rank-table tr[data-rank]").first).to_have_attribute("data-rank", str(SLOW))
            # the rows are the launcher's page in its order, not sorted by the panel
            shown = detail.locator(".dlc-rank-table tr[data-rank]").evaluate_all(
                "rows => rows.map(r => Number(r.dataset.rank))")
            assert shown == [r["rank"] for r in client.job(job_id, rank_sort="step", rank_page=0)["ranks"]]
            detail.locator("select.dlc-rank-sort").select_option("heartbeat")
            expect(detail.locator(".dlc-rank-table tr[data-rank]").first).to_have_attribute("data-rank", str(OLDEST))
            page.screenshot(path=str(lab["tmp"] / "many-ranks.png"))
            browser.close()
            # every read of the detail asked for one page of 50: never all 4,096 ranks
            reads = [q for q in detail_reads if q is not None]
            assert reads and all(q.get("rank_page_size") == "50" and "rank_page" in q
                                 and q.get("rank_sort") in ("rank", "step", "heartbeat") for q in reads), reads
            assert not errors, errors
            client.stop(job_id, grace=1)
