/**
 * The notebook job view's charts go from the kernel to the page only; this keeps the page
 * from sending their changes back.
 *
 * jupyter_bokeh 4.1's page view listens to its BokehJS document (`Document.on_change`) and
 * sends every change to the kernel as a comm message: each patch the kernel had just sent
 * (BokehJS marks those `sync: false`; jupyter_bokeh does not look), and the ranges BokehJS
 * recomputes after new data. So every draw of the charts came back as a few messages, each
 * a kernel request with its busy/idle replies on the iopub channel, queued ahead of the next
 * draw: most of the notebook's launcher -> drawn time (benchmarks/RESULTS.md, "Live view
 * latency", 2026-11-30). The kernel drops all of them anyway (`JobChartsModel`,
 * jupyter_dlc/widgets/charts.py).
 *
 * `muteChartEchoes(Bokeh)` wraps `Document.prototype.on_change` once per page: a listener
 * registered without batches on a document whose root is our charts ("dlc-charts") gets
 * only the document's structure events (a root added or removed, the title), which BokehJS's
 * embedding needs; model changes do not reach it. Other documents, and listeners that take
 * batches (BokehJS's own server session), are left as they are.
 */

/** The name of the job view's chart layout (`Charts.layout`, jupyter_dlc/widgets/charts.py). */
export const CHARTS_ROOT = 'dlc-charts';

type Listener = (event: unknown) => void;

interface BokehDocument {
  get_model_by_name(name: string): unknown;
}

interface DocumentPrototype {
  on_change(this: BokehDocument, callback: Listener, allow_batches?: boolean): void;
  remove_on_change(this: BokehDocument, callback: Listener): void;
}

type EventClass = abstract new (...args: never[]) => unknown;

export interface BokehRequire {
  require(module: string): unknown;
}

const MUTED = Symbol.for('jupyter-dlc.chart-echoes-muted');

/** Install the filter on this BokehJS (once; true when this call installed it). */
export function muteChartEchoes(bokeh: BokehRequire): boolean {
  const { Document } = bokeh.require('document') as { Document: { prototype: DocumentPrototype } };
  const events = bokeh.require('document/events') as Record<string, EventClass | undefined>;
  const proto = Document.prototype as DocumentPrototype & { [MUTED]?: boolean };
  if (proto[MUTED]) {
    return false;
  }
  const structure = ['RootAddedEvent', 'RootRemovedEvent', 'TitleChangedEvent']
    .map(name => events[name])
    .filter((cls): cls is EventClass => typeof cls === 'function');
  const filtered = new WeakMap<Listener, Listener>();
  const onChange = proto.on_change;
  const removeOnChange = proto.remove_on_change;
  proto.on_change = function (callback: Listener, allow_batches = false): void {
    if (allow_batches || this.get_model_by_name(CHARTS_ROOT) == null) {
      onChange.call(this, callback, allow_batches);
      return;
    }
    let listener = filtered.get(callback);
    if (!listener) {
      listener = (event: unknown) => {
        if (structure.some(cls => event instanceof cls)) {
          callback(event);
        }
      };
      filtered.set(callback, listener);
    }
    onChange.call(this, listener, false);
  };
  proto.remove_on_change = function (callback: Listener): void {
    removeOnChange.call(this, filtered.get(callback) ?? callback);
    removeOnChange.call(this, callback);
  };
  proto[MUTED] = true;
  return true;
}
