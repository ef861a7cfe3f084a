/**
 * skipChartCssLookups on the real BokehJS of the installed bokeh package, in jsdom: a
 * visual of a job view's charts answers without asking the page's CSS; any other plot's
 * visual asks as before. Fails loudly when BokehJS moves `_get_css_value`.
 */
import { CHARTS_ROOT } from '../src/chartechoes';
import { keepJobChartLegends, keepUnchangedStyleSheets, legendKey, skipChartCssLookups } from '../src/chartstyles';
import { loadRealBokehJS } from './realbokeh';

/* eslint-disable @typescript-eslint/no-explicit-any */
const { Bokeh, close } = loadRealBokehJS();
afterAll(close);
const { Document } = Bokeh.require('document');
const { VisualProperties } = Bokeh.require('core/visuals/visual');

/** A line glyph in a document whose root layout is named `rootName`, and a visual of it as
 * BokehJS makes one (`obj` its view: the model and the element styles are read from). */
function lineVisual(rootName: string): { visual: any; el: HTMLElement } {
  const doc = new Document();
  const glyph = new Bokeh.Models.Line({ x: { field: 'x' }, y: { field: 'y' }, line_color: 'red' });
  const renderer = new Bokeh.Models.GlyphRenderer({ glyph, data_source: new Bokeh.Models.ColumnDataSource() });
  doc.add_root(new Bokeh.Models.Row({ name: rootName, children: [] }));
  doc.add_root(renderer);
  const el = document.createElement('div');
  el.style.setProperty('--bk-line-color', 'blue');
  document.body.appendChild(el);
  const visual = Object.create(VisualProperties.prototype);
  Object.assign(visual, { obj: { model: glyph, el }, prefix: '', css_prefix: '--bk-line-' });
  return { visual, el };
}

test('installs once per page, on the BokehJS it was written for', () => {
  expect(typeof VisualProperties.prototype._get_css_value).toBe('function');
  expect(skipChartCssLookups(Bokeh)).toBe(true);
  expect(skipChartCssLookups(Bokeh)).toBe(false);
});

test("a job chart's visual answers 'not set by CSS' without asking the page", () => {
  skipChartCssLookups(Bokeh);
  const { visual } = lineVisual(CHARTS_ROOT);
  const asked = jest.spyOn(window, 'getComputedStyle');
  try {
    expect(visual._get_css_value('color')).toBe('');
    expect(visual._get_css_value('width')).toBe('');
    expect(asked).not.toHaveBeenCalled();
  } finally {
    asked.mockRestore();
  }
});

test("another plot's visual still takes its CSS variables from the page", () => {
  skipChartCssLookups(Bokeh);
  const { visual, el } = lineVisual('someone-elses-layout');
  const asked = jest.spyOn(window, 'getComputedStyle');
  try {
    visual._get_css_value('color');
    expect(asked).toHaveBeenCalledWith(el);
  } finally {
    asked.mockRestore();
  }
});

test('an inline stylesheet given the text it holds leaves its <style> element alone', () => {
  expect(keepUnchangedStyleSheets(Bokeh)).toBe(true);
  expect(keepUnchangedStyleSheets(Bokeh)).toBe(false);
  const { InlineStyleSheet } = Bokeh.require('core/dom');
  const sheet = new InlineStyleSheet(':host { left: 4px; }');
  const text = sheet.el.firstChild;
  sheet.replace(':host { left: 4px; }');
  expect(sheet.el.firstChild).toBe(text); // not written: the browser has nothing to parse
  sheet.replace(':host { left: 9px; }');
  expect(sheet.el.textContent).toBe(':host { left: 9px; }');
  expect(sheet.el.firstChild).not.toBe(text);
});

test("a legend's key follows what it shows, not its lines' data", () => {
  expect(keepJobChartLegends(Bokeh)).toBe(true);
  expect(keepJobChartLegends(Bokeh)).toBe(false);
  const M = Bokeh.Models;
  const source = new M.ColumnDataSource({ data: { x: [1], y: [0.5] } });
  const glyph = new M.Line({ x: { field: 'x' }, y: { field: 'y' }, line_color: 'red' });
  const renderer = new M.GlyphRenderer({ data_source: source, glyph });
  const item = new M.LegendItem({ label: { value: 'rank 0' }, renderers: [renderer] });
  const key = legendKey([item]);
  expect(key).not.toBeNull();
  source.stream({ x: [2], y: [0.4] }, 100); // a new point: the legend shows the same
  expect(legendKey([item])).toBe(key);
  const changes: [string, () => void][] = [
    ['label', () => (item.label = { value: 'rank 0 (outlier)' })],
    ['renderer hidden', () => (renderer.visible = false)],
    ['colour', () => (glyph.line_color = 'blue')],
    ['item hidden', () => (item.visible = false)]
  ];
  let last = key;
  for (const [what, change] of changes) {
    change();
    const now = legendKey([item]);
    expect([what, now]).not.toEqual([what, last]);
    last = now;
  }
  // a label read from a column follows the data: never kept
  expect(legendKey([new M.LegendItem({ label: { field: 'x' }, renderers: [renderer] })])).toBeNull();
});

test('a BokehJS that moved a wrapped member is refused by name, and nothing is wrapped', () => {
  const moved = { require: () => ({ LegendView: { prototype: { _render_items() {} } } }) };
  expect(() => keepJobChartLegends(moved)).toThrow(/on_transitive_change is gone \(models\/annotations\/legend/);
  const stale = { require: () => ({ InlineStyleSheet: { prototype: {} } }) };
  expect(() => keepUnchangedStyleSheets(stale)).toThrow(/_update is gone \(core\/dom/);
});
