import { JobListView } from '../src/listview';
import { JobSummary, State, initialState, reduce } from '../src/store';

function job(i: number, over: Partial<JobSummary> = {}): JobSummary {
  return {
    id: `j${i}`, name: `job-${i}`, state: 'RUNNING', attempt: 1, nodes: 2, nproc_per_node: 4,
    created: 1000 + i, started: null, ended: null, reason: null, last_step: null, last_loss: null,
    engine: 'local', source: {}, job_dir: `/data/jobs/j${i}`, stop_requested: null, storage: null,
    ...over
  };
}

function load(n: number): State {
  const jobs = Array.from({ length: n }, (_, i) => job(i));
  return reduce(initialState(), { type: 'snapshot', jobs }).state;
}

describe('JobListView', () => {
  it('renders one keyed row per job, newest first, with state colour and shape', () => {
    const view = new JobListView(() => undefined);
    view.render(load(3), 2_000_000);
    const rows = Array.from(view.node.querySelectorAll<HTMLElement>('.dlc-row'));
    expect(rows.map(r => r.dataset.jobId)).toEqual(['j2', 'j1', 'j0']);
    expect(rows[0].querySelector('.dlc-badge')!.className).toContain('dlc-state-running');
    expect(rows[0].querySelector('.dlc-shape')!.textContent).toBe('2×4');
  });

  it('puts each branch under the job it started from, indented, with its step', () => {
    const view = new JobListView(() => undefined);
    const jobs = [job(0), job(1, { parent: { job: 'j0', step: 10 } }), job(2),
      job(3, { parent: { job: 'j0', step: 20 } }), job(4, { parent: { job: 'j1', step: 15 } }),
      job(5, { parent: { job: 'gone', step: 5 } })];
    let s = reduce(initialState(), { type: 'snapshot', jobs }).state;
    view.render(s);
    const rows = () => Array.from(view.node.querySelectorAll<HTMLElement>('.dlc-row'));
    expect(rows().map(r => `${r.dataset.jobId}:${r.dataset.depth}`)).toEqual(
      ['j5:0', 'j2:0', 'j0:0', 'j3:1', 'j1:1', 'j4:2']);
    const j4 = rows()[5];
    expect(j4.querySelector('.dlc-branch')!.textContent).toBe('⑂ @15');
    expect((j4.querySelector('.dlc-branch') as HTMLElement).title).toBe('branched from j1 at step 15');
    expect(j4.style.paddingLeft).toBe('28px');
    expect(rows()[1].querySelector('.dlc-branch')!.textContent).toBe('');
    // the parent deleted: its branches move to the top level
    s = reduce(s, { type: 'removed', id: 'j0' }).state;
    view.render(s);
    expect(rows().map(r => `${r.dataset.jobId}:${r.dataset.depth}`)).toEqual(
      ['j5:0', 'j3:0', 'j2:0', 'j1:0', 'j4:1']);
    expect(rows().map(r => r.style.paddingLeft)).toEqual(['', '', '', '', '14px']);
  });

  it('an event for one of 500 jobs re-renders exactly one row and moves none', () => {
    const view = new JobListView(() => undefined);
    let s = load(500);
    view.render(s);
    expect(view.node.children.length).toBe(500);
    const before = view.rowRenders;
    const observer = new MutationObserver(() => undefined);
    observer.observe(view.node, { childList: true });
    s = reduce(s, { type: 'job', job: job(250, { last_step: 7, last_loss: 0.25 }) }).state;
    view.render(s);
    expect(view.rowRenders - before).toBe(1);
    expect(observer.takeRecords()).toEqual([]); // no row was inserted, moved or removed
    const row = view.node.querySelector<HTMLElement>('[data-job-id="j250"]')!;
    expect(row.querySelector('.dlc-step')!.textContent).toBe('step 7 · loss 0.2500');
    expect(row.querySelector('path')!.getAttribute('d')).not.toBe('');
  });

  it('filters without re-rendering rows, and a state change moves the row out of the filter', () => {
    const view = new JobListView(() => undefined);
    let s = reduce(load(500), { type: 'filter', state: 'RUNNING', search: 'job-49' }).state;
    view.render(s);
    // job-49, job-490..499
    expect(view.visibleCount).toBe(11);
    expect(view.node.children.length).toBe(11);
    const renders = view.rowRenders;
    s = reduce(s, { type: 'job', job: job(495, { state: 'FAILED' }) }).state;
    view.render(s);
    expect(view.rowRenders - renders).toBe(1);
    expect(view.visibleCount).toBe(10);
    expect(view.node.querySelector('[data-job-id="j495"]')).toBeNull();
    s = reduce(s, { type: 'removed', id: 'j499' }).state;
    view.render(s);
    expect(view.visibleCount).toBe(9);
  });

  it('selects a job on click', () => {
    const picked: string[] = [];
    const view = new JobListView(id => picked.push(id));
    view.render(load(2));
    view.node.querySelector<HTMLElement>('[data-job-id="j1"] .dlc-name')!.click();
    expect(picked).toEqual(['j1']);
  });

  // What keeps a long list fast is that a render fills only the rows whose job changed
  // since the last render (no timing here: that is for benchmarks, not tests).
  it('500 jobs and 5000 progress events: each render fills only the rows changed since the last', () => {
    const view = new JobListView(() => undefined);
    const proto = JobListView.prototype as unknown as { fill: (...args: unknown[]) => void };
    const fill = jest.spyOn(proto, 'fill');
    let s = load(500);
    view.render(s);
    let expected = 500;
    expect(fill).toHaveBeenCalledTimes(expected);
    let changed = new Set<number>();
    for (let k = 0; k < 5000; k++) {
      const i = (k * 7) % 500;
      s = reduce(s, { type: 'job', job: job(i, { last_step: k, last_loss: 1 / (k + 1) }) }).state;
      changed.add(i);
      if (k % 10 === 9) { // one render per animation frame, many events per frame
        view.render(s);
        expected += changed.size;
        changed = new Set();
        expect(fill).toHaveBeenCalledTimes(expected);
      }
    }
    view.render(s); // nothing new since the last render: nothing filled
    expect(fill).toHaveBeenCalledTimes(expected);
    expect(view.node.querySelectorAll('.dlc-row').length).toBe(500);
    fill.mockRestore();
  });
});
