"""Handlers of the jupyter-dlc server extension (see the package docstring for the routes)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import httpclient, web
from tornado.ioloop import PeriodicCallback
from tornado.iostream import StreamClosedError

AUTH_RESOURCE = "dlc"
STREAM_KEEPALIVE_S = 15.0
STREAM_RETRY_MS = 2000

# Order in which a page has to load the BokehJS bundles (bokeh first, then its plugins).
BOKEH_BUNDLES = ("bokeh", "bokeh-gl", "bokeh-widgets", "bokeh-tables", "bokeh-mathjax")


class LauncherUnavailable(Exception):
    """The launcher could neither be reached nor started."""


class LauncherProxy:
    """One LauncherClient per Jupyter server, replaced when the launcher stops answering.

    The client is synchronous (urllib); its calls run on a small thread pool so that the
    server's event loop never blocks, also not while the launcher is being started.
    """

    def __init__(self, log=None, client_factory=None):
        self.log = log
        self._client = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dlc-proxy")
        self._factory = client_factory
        self.last_error: str | None = None

    # -- runs on the pool -------------------------------------------------------------
    def _connect(self, drop=None):
        with self._lock:
            if drop is not None and self._client is drop:
                self._client = None
            if self._client is None:
                factory = self._factory
                if factory is None:
                    from jupyter_dlc.client import LauncherClient

                    factory = lambda: LauncherClient.connect(start=True)  # noqa: E731
                try:
                    self._client = factory()
                except Exception as e:  # the launcher could not be found nor started
                    self.last_error = f"{type(e).__name__}: {e}"
                    raise LauncherUnavailable(self.last_error) from e
                self.last_error = None
            return self._client

    def _request(self, method, path, body=None, params=None):
        """(status, data) of the launcher's answer; errors it answers are answers too."""
        from jupyter_dlc.client import LauncherError, LauncherUnavailable as Unreachable

        client = self._connect()
        for attempt in (1, 2):
            try:
                status, data = client.request(method, path, body=body, params=params)
            except Unreachable as e:  # refused, reset, timed out: gone or restarting
                if attempt == 2:
                    self.last_error = str(e)
                    raise LauncherUnavailable(self.last_error) from e
                client = self._connect(drop=client)
                continue
            except LauncherError as e:
                if e.status == 401:
                    if attempt == 2:
                        self.last_error = "the launcher refuses the token of its connection file"
                        raise LauncherUnavailable(self.last_error) from e
                    # a restarted launcher has a new token: read the connection file again
                    client = self._connect(drop=client)
                    continue
                return e.status or 502, {"error": str(e)}
            return status, data
        raise AssertionError("unreachable")

    def _address(self):
        client = self._connect()
        return launcher_address(client), client

    # -- async face -------------------------------------------------------------------
    async def request(self, method, path, body=None, params=None):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._request, method, path, body, params)

    async def address(self, drop=None):
        loop = asyncio.get_running_loop()
        if drop is not None:
            await loop.run_in_executor(self._pool, self._connect, drop)
        return await loop.run_in_executor(self._pool, self._address)


def launcher_address(client) -> tuple[str, str]:
    """(base URL, token) of a LauncherClient."""
    url = None
    for name in ("url", "base_url", "address"):
        url = getattr(client, name, None)
        if isinstance(url, str) and url:
            break
    token = getattr(client, "token", None)
    if not url or token is None:
        raise LauncherUnavailable("LauncherClient exposes no url/token for the event stream")
    return url.rstrip("/"), token


class _DlcMixin:
    auth_resource = AUTH_RESOURCE

    @property
    def proxy(self) -> LauncherProxy:
        return self.settings["dlc_proxy"]

    def get_login_url(self) -> str:
        # never redirect to a login page: a request without credentials is refused outright
        if not self.current_user:
            raise web.HTTPError(403)
        return super().get_login_url()


class ApiForwardHandler(_DlcMixin, APIHandler):
    """``/dlc/api/<rest>`` → launcher ``/api/<rest>``."""

    def _params(self) -> dict[str, str]:
        return {
            k: self.decode_argument(v[-1]) if isinstance(v[-1], bytes) else v[-1]
            for k, v in self.request.query_arguments.items()
        }

    def _body(self):
        if not self.request.body:
            return None
        try:
            return json.loads(self.request.body)
        except ValueError:
            raise web.HTTPError(400, "request body must be JSON") from None

    async def _forward(self, method: str, rest: str):
        try:
            status, data = await self.proxy.request(
                method, "/api/" + rest, body=(self._body() or {}) if method == "POST" else None,
                params=self._params() or None,
            )
        except LauncherUnavailable as e:
            self.set_status(503)
            self.finish(json.dumps({"error": f"launcher unreachable: {e}", "launcher": "down"}))
            return
        self.set_status(status, reason=None if status in _KNOWN else "Launcher")
        if status == 204 or data is None:
            self.finish()
        else:
            self.finish(json.dumps(data))

    @web.authenticated
    @authorized("read")
    async def get(self, rest):
        await self._forward("GET", rest)

    @web.authenticated
    @authorized("write")
    async def post(self, rest):
        await self._forward("POST", rest)

    @web.authenticated
    @authorized("write")
    async def delete(self, rest):
        await self._forward("DELETE", rest)


class HealthHandler(_DlcMixin, APIHandler):
    """``/dlc/healthz``: is the launcher up (starting it when none answers)?"""

    @web.authenticated
    @authorized("read")
    async def get(self):
        try:
            status, data = await self.proxy.request("GET", "/healthz")
        except LauncherUnavailable as e:
            self.set_status(503)
            self.finish(json.dumps({"ok": False, "launcher": "down", "error": str(e)}))
            return
        self.set_status(status if status in _KNOWN else 502)
        self.finish(json.dumps(data))


class StreamHandler(_DlcMixin, APIHandler):
    """``/dlc/stream``: the launcher's ``/api/stream`` relayed as server-sent events.

    When the launcher's stream ends (launcher stopped or restarting), the relay sends
    ``event: launcher`` with ``{"state": "down"}`` and closes; the panel reconnects.
    """

    _track_activity = False  # an open stream is not user activity

    def on_connection_close(self):
        self._dlc_closed = True

    def _send(self, text: str):
        if getattr(self, "_dlc_closed", False):
            raise StreamClosedError()
        self.write(text)
        return self.flush()

    def upstream(self, *args) -> str:
        """The launcher path (with its query) this relay follows."""
        return "/api/stream"

    @web.authenticated
    @authorized("read")
    async def get(self, *args):
        self._dlc_closed = False
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        try:
            (url, token), client = await self.proxy.address()
        except LauncherUnavailable as e:
            self.set_status(503)
            self.finish(
                json.dumps({"error": f"launcher unreachable: {e}", "launcher": "down"}),
                set_content_type="application/json",
            )
            return

        await self._send(f"retry: {STREAM_RETRY_MS}\n: connected to the launcher\n\n")

        def on_chunk(chunk: bytes):
            if self._dlc_closed:
                raise StreamClosedError()  # aborts the upstream request
            self.write(chunk)
            self.flush()

        def keepalive():
            try:
                self._send(": keepalive\n\n")
            except StreamClosedError:
                self._dlc_closed = True

        ka = PeriodicCallback(keepalive, STREAM_KEEPALIVE_S * 1000)
        ka.start()
        http = httpclient.AsyncHTTPClient(force_instance=True, max_body_size=2**40)
        reason = "stream ended"
        started = time.time()
        try:
            await http.fetch(
                httpclient.HTTPRequest(
                    url + self.upstream(*args),
                    headers={"Authorization": f"token {token}", "Accept": "text/event-stream"},
                    streaming_callback=on_chunk,
                    connect_timeout=5,
                    request_timeout=0,
                ),
                raise_error=True,
            )
        except httpclient.HTTPClientError as e:
            reason = f"launcher answered {e.code}"
            if e.code == 401:  # new launcher, new token
                await self._drop(client)
        except StreamClosedError:
            return
        except Exception as e:  # refused, reset: the launcher went away
            reason = f"{type(e).__name__}: {e}"
            await self._drop(client)
        finally:
            ka.stop()
            http.close()
        if self._dlc_closed:
            return
        self.log.info("dlc stream relay ended after %.0fs: %s", time.time() - started, reason)
        try:
            payload = json.dumps({"state": "down", "reason": reason})
            await self._send(f"event: launcher\ndata: {payload}\n\n")
        except StreamClosedError:
            return
        self.finish(set_content_type="text/event-stream; charset=utf-8")

    async def _drop(self, client):
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.proxy._pool, lambda: self.proxy._connect(drop=client) and None
            )
        except LauncherUnavailable:
            pass


class MetricsStreamHandler(StreamHandler):
    """``/dlc/jobs/<job>/metrics/stream?since=SEQ``: the launcher's push of one job's metric
    points, relayed as server-sent events (the panel's detail tab follows it, and polls
    ``/dlc/api/jobs/<job>/metrics`` while it is down)."""

    def upstream(self, job: str) -> str:
        query = {"since": self.get_query_argument("since", "0")}
        for name in ("band", "ranks"):  # a view past 8 ranks reads folded points (bands.py)
            value = self.get_query_argument(name, None)
            if value is not None:
                query[name] = value
        return (f"/api/jobs/{urllib.parse.quote(job, safe='')}/metrics/stream?"
                + urllib.parse.urlencode(query))


def bokeh_js_dir() -> str:
    from bokeh.util.paths import bokehjs_path

    return str(bokehjs_path() / "js")


class BokehJsonHandler(_DlcMixin, APIHandler):
    """``/dlc/bokeh.json``: ``{"version", "js_urls"}``, the files a page loads, in order."""

    @web.authenticated
    @authorized("read")
    def get(self):
        import bokeh

        base = url_path_join(self.base_url, "dlc", "static", "bokeh")
        urls = [url_path_join(base, f"{name}.min.js") for name in BOKEH_BUNDLES]
        self.finish(json.dumps({"version": bokeh.__version__, "js_urls": urls}))


class BokehStaticHandler(_DlcMixin, JupyterHandler, web.StaticFileHandler):
    """BokehJS files from the installed bokeh package, for logged-in users only."""

    @web.authenticated
    @authorized("read")
    def head(self, path):
        return web.StaticFileHandler.head(self, path)

    @web.authenticated
    @authorized("read")
    def get(self, path, include_body=True):
        return web.StaticFileHandler.get(self, path, include_body)

    def set_extra_headers(self, path):
        # versioned by the installed bokeh; let the browser revalidate
        self.set_header("Cache-Control", "no-cache")


_KNOWN = {200, 201, 202, 204, 400, 401, 403, 404, 405, 409, 410, 422, 429, 500, 502, 503}


def handler_specs(base_url: str) -> list[tuple]:
    """The (pattern, handler[, kwargs]) rules this extension registers under ``base_url``."""
    root = url_path_join(base_url, "dlc")
    return [
        (url_path_join(root, "api", "(.*)"), ApiForwardHandler),
        (url_path_join(root, "healthz"), HealthHandler),
        (url_path_join(root, "stream"), StreamHandler),
        (url_path_join(root, "jobs", "([^/]+)", "metrics", "stream"), MetricsStreamHandler),
        (url_path_join(root, "bokeh.json"), BokehJsonHandler),
        (url_path_join(root, "static", "bokeh", "(.*)"), BokehStaticHandler,
         {"path": bokeh_js_dir()}),
    ]


def setup_handlers(web_app, log=None, client_factory=None) -> list[tuple]:
    if "dlc_proxy" not in web_app.settings:
        web_app.settings["dlc_proxy"] = LauncherProxy(log=log, client_factory=client_factory)
    specs = handler_specs(web_app.settings["base_url"])
    web_app.add_handlers(".*$", specs)
    return specs
