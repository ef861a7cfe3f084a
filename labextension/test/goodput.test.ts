/**
 * The goodput bar, percentage and progress text the panel draws (src/goodput.ts): from a
 * ledger of known parts, and from the real launcher's answer in the contract fixtures.
 */
import * as fs from 'fs';
import * as path from 'path';

import { Goodput, goodputSegments, percentText, progressText, renderGoodputBar } from '../src/goodput';
import { JobListView } from '../src/listview';
import { JobSummary, initialState, reduce } from '../src/store';

const parts = {
  waiting: 1, startup: 6, productive: 20, data_wait: 8, checkpoint_stall: 1, lost_work: 3,
  restart_downtime: 1, hung: 0, stopped: 0, shutdown: 0
};
const ledger: Goodput = {
  job: 'j1', state: 'RUNNING', wall_seconds: 40, goodput: 0.5, parts, steps_counted: 300,
  breakdown_rank: 0,
  progress: { step: 256, total_steps: 400, steps_per_second: 20, eta_seconds: 7.2 }
};

describe('goodput', () => {
  it('draws one stacked bar whose segments are the parts that took time, in shares of the wall', () => {
    const box = renderGoodputBar(ledger);
    expect(box.querySelector('.dlc-goodput-value')!.textContent).toBe('50%');
    const segs = Array.from(box.querySelectorAll<HTMLElement>('.dlc-goodput-bar .dlc-goodput-part'));
    expect(segs.map(s => s.dataset.part)).toEqual([
      'productive', 'data_wait', 'checkpoint_stall', 'startup', 'waiting', 'lost_work', 'restart_downtime'
    ]);
    expect(segs.map(s => s.style.width)).toEqual(['50.000%', '20.000%', '2.500%', '15.000%', '2.500%', '7.500%', '2.500%']);
    expect(segs[5].title).toBe('lost work: 3 s (7.5%)');
    expect(box.querySelector('.dlc-goodput-legend')!.textContent).toContain('restart downtime: 1 s (2.5%)');
    const shares = goodputSegments(ledger).reduce((sum, s) => sum + s.share, 0);
    expect(shares).toBeCloseTo(100, 6);
  });

  it('says the progress with its ETA, and the percentage', () => {
    expect(progressText(ledger.progress)).toBe('step 256 / 400, ETA 7 s');
    expect(progressText({ step: 12, total_steps: null, steps_per_second: null, eta_seconds: null })).toBe('step 12');
    expect(progressText(null)).toBe('');
    expect(percentText(0.0512)).toBe('5.1%');
    expect(percentText(null)).toBe('');
  });

  it('shows the goodput and progress in the job list row', () => {
    const job = {
      id: 'j1', name: 'job-1', state: 'RUNNING', attempt: 1, nodes: 2, nproc_per_node: 2,
      created: 1000, started: null, ended: null, reason: null, last_step: 256, last_loss: 0.5,
      engine: 'local', source: {}, job_dir: '/d', stop_requested: null, storage: null,
      goodput: 0.834, progress: ledger.progress
    } as JobSummary;
    const view = new JobListView(() => undefined);
    view.render(reduce(initialState(), { type: 'snapshot', jobs: [job] }).state, 2_000_000);
    const row = view.node.querySelector('[data-job-id="j1"]')!;
    expect(row.querySelector('.dlc-goodput-cell')!.textContent).toBe('goodput 83%');
    expect(row.querySelector('.dlc-step')!.textContent).toBe('step 256 / 400, ETA 7 s · loss 0.5000');
  });

  it('renders the real launcher answer of the contract fixtures', () => {
    const file = path.join(__dirname, 'fixtures', 'launcher.json');
    const real = JSON.parse(fs.readFileSync(file, 'utf8')).goodput as Goodput;
    const box = renderGoodputBar(real);
    const drawn = Array.from(box.querySelectorAll<HTMLElement>('.dlc-goodput-part'));
    expect(drawn.length).toBeGreaterThan(1);
    expect(drawn.map(d => d.dataset.part)).toContain('productive');
    expect(box.querySelector('.dlc-goodput-value')!.textContent).toBe(percentText(real.goodput));
  });
});
