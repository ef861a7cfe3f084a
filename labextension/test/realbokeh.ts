/**
 * The real BokehJS of the installed bokeh package (the one our server extension serves),
 * loaded into jsdom for the tests of our BokehJS shims (chartechoes.ts, chartstyles.ts).
 */
import { execFileSync } from 'child_process';
import { readFileSync } from 'fs';
import * as path from 'path';
import { MessageChannel } from 'worker_threads';

/* eslint-disable @typescript-eslint/no-explicit-any */
export type Bokeh = { require(name: string): any; Models: any };

/** BokehJS on this test file's window; `close` (in afterAll) lets jest end. */
export function loadRealBokehJS(): { Bokeh: Bokeh; close: () => void } {
  const channels: MessageChannel[] = [];
  const python = process.env.PYTHON || 'python3';
  const dir = execFileSync(python, ['-c', 'import bokeh.util.paths as p; print(p.bokehjs_path())'])
    .toString()
    .trim();
  const code = readFileSync(path.join(dir, 'js', 'bokeh.min.js'), 'utf8');
  // BokehJS schedules with MessageChannel, which jsdom lacks (Node's serves), and probes a
  // 2D canvas context as it loads, which jsdom has not: one that draws nothing serves, as
  // nothing is drawn here
  (window as any).MessageChannel = class extends MessageChannel {
    constructor() {
      super();
      channels.push(this); // closed after the tests, or they keep jest running
    }
  };
  const noop: any = new Proxy(() => noop, { get: (_t, key) => (key === 'then' ? undefined : noop) });
  HTMLCanvasElement.prototype.getContext = (() => noop) as any;
  (window as any).eval(code);
  return {
    Bokeh: (window as any).Bokeh as Bokeh,
    close: () => channels.forEach(c => (c.port1.close(), c.port2.close()))
  };
}
