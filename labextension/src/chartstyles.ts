/**
 * BokehJS's draws, made to leave the page's styles alone where they can: what a job view's
 * charts cost the page's one thread at each draw (benchmarks/live_view.py).
 *
 * Our charts take their line, fill and text styles from their models only; this keeps
 * BokehJS from asking the page's CSS for them at every draw.
 *
 * BokehJS 3 lets a page style a glyph with CSS variables (`--bk-line-color` and the like):
 * every read of a visual property (`VisualProperties._get_css_value`, core/visuals/visual)
 * calls `getComputedStyle(el).getPropertyValue(...)` first, for each line, axis, label and
 * legend item at each draw and each layout. In a JupyterLab page whose DOM changes many times
 * a second (the panel, the notebook's outputs), each such read after a change makes the
 * browser recompute styles then and there: in a profile of `benchmarks/live_view.py`
 * (`--cpu-profile`), 2.8 s of the page's 32 s went to `getPropertyValue`, most under the
 * axes' label extents and the plots' paint. Nothing styles our charts with CSS variables
 * (jupyter_dlc/widgets/charts.py sets every visual on the model), so for the visuals of a
 * document whose root is our charts ("dlc-charts") the answer is known: none.
 *
 * `skipChartCssLookups(Bokeh)` wraps `_get_css_value` once per page so that it answers ""
 * ("not set by CSS": BokehJS then uses the model's value, as it does for a variable no
 * stylesheet sets) for those visuals, and asks the page as before for every other plot.
 *
 * `keepUnchangedStyleSheets(Bokeh)` makes a BokehJS inline stylesheet (core/dom's
 * `InlineStyleSheet`) that is given the text it already holds leave its `<style>` element
 * alone. BokehJS rewrites some at every draw (a legend places itself with one, then reads its
 * box): each write, even of the same text, makes the browser parse the sheet and recompute
 * the styles of the plot before that read. Same text, same styles: for every plot.
 *
 * `keepJobChartLegends(Bokeh)`: BokehJS 3's legend builds its items again (new elements, a
 * new canvas each) on any change of anything its items reach, the renderers' data sources
 * included: at every point streamed to a line (`LegendView`'s transitive change of `items`,
 * models/annotations/legend; 415 rebuilds in a five-second run of the benchmark), and each
 * rebuild left the page's styles to recompute. For our charts' legends it rebuilds only when
 * what a legend shows changed (`legendKey`: its items' labels and visibility, their
 * renderers and those renderers' visibility and glyph styles); a new point changes none.
 */
import { BokehRequire, CHARTS_ROOT } from './chartechoes';

interface BokehModel {
  document: { get_model_by_name(name: string): unknown } | null;
}

/**
 * Wrap members of a BokehJS prototype once per page: `wrap` runs unless `mark` is already
 * set; a member that is not there (a BokehJS that moved it) throws, naming it and `where`.
 * True when this call wrapped them.
 */
function wrapOnce(proto: object, mark: symbol, members: string[], where: string, wrap: () => void): boolean {
  const marked = proto as Record<string | symbol, unknown>;
  const gone = members.filter(name => typeof marked[name] !== 'function');
  if (gone.length) {
    throw new Error(`BokehJS: ${gone.join(', ')} is gone (${where})`);
  }
  if (marked[mark]) {
    return false;
  }
  wrap();
  marked[mark] = true;
  return true;
}

interface VisualPropertiesPrototype {
  _get_css_value(this: { obj: { model: BokehModel } }, name: string): string;
}

const SKIPPED = Symbol.for('jupyter-dlc.chart-css-lookups-skipped');

/** True for a model of a job view's charts document (looked up once per model). */
function ofJobCharts(model: BokehModel, known: WeakMap<BokehModel, boolean>): boolean {
  let ours = known.get(model);
  if (ours === undefined) {
    const doc = model.document;
    if (doc == null) {
      return false; // not attached yet: ask again once it is
    }
    ours = doc.get_model_by_name(CHARTS_ROOT) != null;
    known.set(model, ours);
  }
  return ours;
}

/** Install the wrapper on this BokehJS (once; true when this call installed it). */
export function skipChartCssLookups(bokeh: BokehRequire): boolean {
  const { VisualProperties } = bokeh.require('core/visuals/visual') as {
    VisualProperties: { prototype: VisualPropertiesPrototype };
  };
  const proto = VisualProperties.prototype;
  return wrapOnce(proto, SKIPPED, ['_get_css_value'], 'core/visuals/visual VisualProperties', () => {
    const known = new WeakMap<BokehModel, boolean>();
    const getCssValue = proto._get_css_value;
    proto._get_css_value = function (name: string): string {
      return ofJobCharts(this.obj.model, known) ? '' : getCssValue.call(this, name);
    };
  });
}

interface InlineStyleSheetPrototype {
  el: HTMLStyleElement;
  _update(this: InlineStyleSheetPrototype, css: string): void;
}

const KEPT = Symbol.for('jupyter-dlc.unchanged-stylesheets-kept');

/** Install the check on this BokehJS (once; true when this call installed it). */
export function keepUnchangedStyleSheets(bokeh: BokehRequire): boolean {
  const { InlineStyleSheet } = bokeh.require('core/dom') as {
    InlineStyleSheet: { prototype: InlineStyleSheetPrototype };
  };
  const proto = InlineStyleSheet.prototype;
  return wrapOnce(proto, KEPT, ['_update'], 'core/dom InlineStyleSheet', () => {
    const update = proto._update;
    proto._update = function (css: string): void {
      if (this.el.textContent !== css) {
        update.call(this, css);
      }
    };
  });
}

interface LegendItemModel {
  label: unknown;
  visible: boolean;
  index: number | null;
  renderers: { id: string; visible: boolean; muted: boolean; glyph: Record<string, unknown> }[];
}

/** The glyph properties a legend entry is drawn with. */
const ENTRY_STYLE = ['line_color', 'line_alpha', 'line_width', 'line_dash', 'fill_color', 'fill_alpha'];

/**
 * What a legend with these items shows, as a string; null when that depends on the data
 * (a label from a column, an item of one index), where the legend must follow every change.
 */
export function legendKey(items: LegendItemModel[]): string | null {
  const parts: unknown[] = [];
  for (const item of items) {
    const label = item.label as { value?: unknown } | null;
    if ((label != null && !('value' in label)) || item.index != null) {
      return null;
    }
    parts.push([
      label?.value ?? null,
      item.visible,
      item.renderers.map(r => [r.id, r.visible, r.muted, ENTRY_STYLE.map(name => r.glyph[name] ?? null)])
    ]);
  }
  return JSON.stringify(parts);
}

interface LegendViewPrototype {
  model: BokehModel & { items: LegendItemModel[]; properties: { items: unknown } };
  _render_items(this: LegendViewPrototype): void;
  on_transitive_change(this: LegendViewPrototype, property: unknown, callback: () => void, options?: unknown): void;
}

const LEGENDS_KEPT = Symbol.for('jupyter-dlc.job-chart-legends-kept');

/** Install the filter on this BokehJS (once; true when this call installed it). */
export function keepJobChartLegends(bokeh: BokehRequire): boolean {
  const { LegendView } = bokeh.require('models/annotations/legend') as {
    LegendView: { prototype: LegendViewPrototype };
  };
  const proto = LegendView.prototype;
  const where = 'models/annotations/legend LegendView';
  return wrapOnce(proto, LEGENDS_KEPT, ['_render_items', 'on_transitive_change'], where, () => {
    const known = new WeakMap<BokehModel, boolean>();
    const shown = new WeakMap<LegendViewPrototype, string | null>(); // legendKey when last built
    const renderItems = proto._render_items;
    proto._render_items = function (): void {
      renderItems.call(this);
      if (ofJobCharts(this.model, known)) {
        shown.set(this, legendKey(this.model.items));
      }
    };
    const onTransitiveChange = proto.on_transitive_change;
    proto.on_transitive_change = function (property, callback, options): void {
      if (property !== this.model.properties.items) {
        onTransitiveChange.call(this, property, callback, options);
        return;
      }
      const unlessUnchanged = () => {
        const before = shown.get(this);
        if (before == null || before !== legendKey(this.model.items)) {
          callback();
        }
      };
      onTransitiveChange.call(this, property, unlessUnchanged, options);
    };
  });
}
