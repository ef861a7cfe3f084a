"""jupyter_bokeh's private APIs.

`BokehModel._sync_model(self, model, content, buffers)`: the widget's handler for every
message the page sends back (document patches, events). The live charts flow only from the
kernel to the page, so a subclass replaces it to drop them (widgets/charts.py says why).

`BokehModel._document_patched(self, event)`: called for every change of the widget's bokeh
document; jupyter_bokeh 4.1 sends each as its own PATCH-DOC, i.e. 3 comm messages (header,
metadata, content) plus 2 per binary buffer, and the page parses and applies each one. A
subclass may instead collect a burst of changes and send them with `send_patch`, which
writes the same comm messages jupyter_bokeh's page code (`BokehView._consume_patch`, a
bokeh `Receiver`) reads, for ONE PATCH-DOC holding all of them.
"""

from __future__ import annotations

import json

SYNC_MODEL = "_sync_model"
DOCUMENT_PATCHED = "_document_patched"


def _check(name: str) -> None:
    from jupyter_bokeh.widgets import BokehModel

    if not callable(getattr(BokehModel, name, None)):
        raise RuntimeError(f"jupyter_bokeh.BokehModel has no {name}(): the shim "
                           "jupyter_dlc/shims/bokeh_private.py needs updating for this version")


def ignore_page_events(cls: type) -> type:
    """Class decorator for a BokehModel subclass: page-sent changes are dropped (counted in
    `page_messages`: our labextension keeps the page from sending them at all)."""
    _check(SYNC_MODEL)

    def _sync_model(self, model, content, buffers):
        self.page_messages = getattr(self, "page_messages", 0) + 1

    setattr(cls, SYNC_MODEL, _sync_model)
    return cls


def route_document_patches(cls: type) -> type:
    """Class decorator for a BokehModel subclass: every change of its document goes to the
    subclass's `document_patched(event)` (changes the page made itself excepted, as in
    jupyter_bokeh), which sends them with `send_patch` when it likes."""
    _check(DOCUMENT_PATCHED)

    def _document_patched(self, event):
        if event.setter is not self:
            self.document_patched(event)

    setattr(cls, DOCUMENT_PATCHED, _document_patched)
    return cls


def send_patch(widget, events: list) -> None:
    """Send `events` (bokeh DocumentPatchedEvents of one document, in order) over `widget`'s
    comm as one PATCH-DOC, in jupyter_bokeh 4.1's framing (see its `_document_patched`)."""
    from bokeh.protocol import Protocol

    msg = Protocol().create("PATCH-DOC", events)
    widget.send({"msg": "patch", "payload": msg.header_json})
    widget.send({"msg": "patch", "payload": msg.metadata_json})
    widget.send({"msg": "patch", "payload": msg.content_json})
    for buffer in msg.buffers:
        widget.send({"msg": "patch", "payload": json.dumps(buffer.ref)})
        widget.send({"msg": "patch"}, [buffer.to_bytes()])
