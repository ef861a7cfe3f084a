"""Jupyter server extension: authenticated routes under ``{base_url}/dlc/``.

Routes (every one requires Jupyter's auth; a request without it gets 403):

``{base_url}/dlc/api/<rest>``         GET/POST/DELETE forwarded to the launcher's ``/api/<rest>``
``{base_url}/dlc/healthz``            the launcher's ``/healthz`` (503 when it cannot be reached)
``{base_url}/dlc/stream``             server-sent events relayed from the launcher's ``/api/stream``
``{base_url}/dlc/jobs/<job>/metrics/stream``  a job's pushed metric points, relayed from the
                                      launcher's ``/api/jobs/<job>/metrics/stream?since=``
``{base_url}/dlc/bokeh.json``         the BokehJS version and the URLs of its files, below
``{base_url}/dlc/static/bokeh/<f>``   BokehJS from the installed ``bokeh`` package (no CDN)

The launcher is found through :class:`jupyter_dlc.client.LauncherClient` and started when none
answers. A launcher that restarts comes back on a new port with a new token; the proxy notices
(connection refused or 401 from the launcher) and connects again.
"""

from __future__ import annotations

from .handlers import handler_specs, setup_handlers

__all__ = ["handler_specs", "setup_handlers", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points():
    return [{"module": "jupyter_dlc.server"}]


def _load_jupyter_server_extension(server_app):
    """Register the /dlc/ handlers on the running Jupyter server."""
    setup_handlers(server_app.web_app, log=server_app.log)
    server_app.log.info(
        "jupyter_dlc: /dlc/ routes registered under %s", server_app.web_app.settings["base_url"]
    )


# jupyter_server < 2 / notebook name
load_jupyter_server_extension = _load_jupyter_server_extension
