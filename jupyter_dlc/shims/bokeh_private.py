"""jupyter_bokeh's private APIs.

`BokehModel._sync_model(self, model, content, buffers)`: the widget's handler for every
message the page sends back (document patches, events). The live charts flow only from the
kernel to the page, so a subclass replaces it to drop them (widgets/charts.py says why).
"""

from __future__ import annotations

SYNC_MODEL = "_sync_model"


def ignore_page_events(cls: type) -> type:
    """Class decorator for a BokehModel subclass: page-sent changes are dropped."""
    from jupyter_bokeh.widgets import BokehModel

    if not issubclass(cls, BokehModel) or not callable(getattr(BokehModel, SYNC_MODEL, None)):
        raise RuntimeError(f"jupyter_bokeh.BokehModel has no {SYNC_MODEL}(): the shim "
                           "jupyter_dlc/shims/bokeh_private.py needs updating for this version")

    def _sync_model(self, model, content, buffers):
        return None

    setattr(cls, SYNC_MODEL, _sync_model)
    return cls
