/**
 * muteChartEchoes on the real BokehJS of the installed bokeh package (the one our server
 * extension serves), run in jsdom: documents and their change events need no canvas.
 */
import { CHARTS_ROOT, muteChartEchoes } from '../src/chartechoes';
import { loadRealBokehJS } from './realbokeh';

/* eslint-disable @typescript-eslint/no-explicit-any */

const { Bokeh, close } = loadRealBokehJS();
afterAll(close);
const { Document } = Bokeh.require('document');
const { ColumnsStreamedEvent, ModelChangedEvent, RootAddedEvent, TitleChangedEvent } =
  Bokeh.require('document/events');

/** A document shaped like a job view's: a root layout named `rootName`, a named source. */
function chartsDocument(rootName: string): { doc: any; source: any } {
  const doc = new Document();
  const source = new Bokeh.Models.ColumnDataSource({ data: { x: [], y: [] }, name: 'dlc-train-0' });
  doc.add_root(new Bokeh.Models.Row({ name: rootName, children: [] }));
  doc.add_root(source);
  return { doc, source };
}

function record(doc: any, allowBatches?: boolean): { events: any[]; listener: (e: any) => void } {
  const events: any[] = [];
  const listener = (event: any) => events.push(event);
  doc.on_change(listener, allowBatches);
  return { events, listener };
}

test('installs once per page', () => {
  expect(muteChartEchoes(Bokeh)).toBe(true);
  expect(muteChartEchoes(Bokeh)).toBe(false);
});

test("a job chart document's model changes do not reach jupyter_bokeh's kind of listener", () => {
  muteChartEchoes(Bokeh);
  const { doc, source } = chartsDocument(CHARTS_ROOT);
  const page = record(doc); // as jupyter_bokeh's BokehView registers it
  const batches = record(doc, true); // as BokehJS's server session registers it
  source.stream({ x: [1, 2], y: [0.5, 0.4] }, 100);
  source.data = { x: [1], y: [0.5] };
  expect(page.events).toHaveLength(0);
  expect(batches.events.some(e => e instanceof ColumnsStreamedEvent)).toBe(true);
  expect(batches.events.some(e => e instanceof ModelChangedEvent)).toBe(true);
  // the document's structure still reaches it (BokehJS's embedding renders added roots)
  doc.set_title('job');
  doc.add_root(new Bokeh.Models.ColumnDataSource({ data: {} }));
  expect(page.events.map(e => e.constructor)).toEqual([TitleChangedEvent, RootAddedEvent]);
  doc.remove_on_change(page.listener);
  doc.set_title('again');
  expect(page.events).toHaveLength(2);
});

test('other documents are left as they are', () => {
  muteChartEchoes(Bokeh);
  const { doc, source } = chartsDocument('someone-elses-layout');
  const page = record(doc);
  source.stream({ x: [1], y: [0.5] }, 100);
  expect(page.events.some(e => e instanceof ColumnsStreamedEvent)).toBe(true);
});
