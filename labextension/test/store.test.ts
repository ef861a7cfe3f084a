import {
  JobSummary,
  SseParser,
  age,
  backoffMs,
  initialState,
  matches,
  noticeFor,
  parseAlert,
  reduce,
  sparklinePath,
  State,
  Action,
  Notice,
  visibleIds
} from '../src/store';

function job(id: string, over: Partial<JobSummary> = {}): JobSummary {
  return {
    id,
    name: over.name ?? `job-${id}`,
    state: 'RUNNING',
    attempt: 1,
    nodes: 2,
    nproc_per_node: 2,
    created: 1000,
    started: 1001,
    ended: null,
    reason: null,
    last_step: null,
    last_loss: null,
    engine: 'local',
    source: { kind: 'cli', path: '/tmp/train.py' },
    job_dir: `/data/jobs/${id}`,
    stop_requested: null,
    storage: null,
    ...over
  };
}

function run(state: State, ...actions: Action[]): { state: State; notices: Notice[] } {
  const notices: Notice[] = [];
  for (const a of actions) {
    const r = reduce(state, a);
    state = r.state;
    notices.push(...r.notices);
  }
  return { state, notices };
}

describe('reduce', () => {
  it('loads a snapshot without notifying about jobs that ended before we looked', () => {
    const { state, notices } = run(initialState(), {
      type: 'snapshot',
      jobs: [job('a', { state: 'FAILED' }), job('b', { state: 'SUCCEEDED' })]
    });
    expect(state.loaded).toBe(true);
    expect(state.jobs.size).toBe(2);
    expect(notices).toEqual([]);
  });

  it('notifies once when a running job fails, naming the reason', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a')] }).state;
    const failed = job('a', { state: 'FAILED', reason: 'rank 1 exited 1' });
    const { state, notices } = run(s0, { type: 'job', job: failed }, { type: 'job', job: failed });
    expect(notices).toHaveLength(1);
    expect(notices[0].kind).toBe('error');
    expect(notices[0].jobId).toBe('a');
    expect(notices[0].message).toContain('rank 1 exited 1');
    expect(state.jobs.get('a')!.job.state).toBe('FAILED');
  });

  it('notifies success on SUCCEEDED and nothing on STOPPED', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a'), job('b')] }).state;
    const { notices } = run(
      s0,
      { type: 'job', job: job('a', { state: 'SUCCEEDED' }) },
      { type: 'job', job: job('b', { state: 'STOPPED' }) }
    );
    expect(notices.map(n => [n.jobId, n.kind])).toEqual([['a', 'success']]);
  });

  it('notifies about a failure that happened while the stream was down (via the next snapshot)', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a')] }).state;
    const { notices } = run(
      s0,
      { type: 'connection', status: 'down', message: 'Launcher unreachable' },
      { type: 'snapshot', jobs: [job('a', { state: 'FAILED' })] }
    );
    expect(notices).toHaveLength(1);
    expect(notices[0].kind).toBe('error');
  });

  it('notifies about a resumed attempt that fails again', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a', { state: 'FAILED' })] }).state;
    const { notices } = run(
      s0,
      { type: 'job', job: job('a', { state: 'QUEUED', attempt: 2 }) },
      { type: 'job', job: job('a', { state: 'RUNNING', attempt: 2 }) },
      { type: 'job', job: job('a', { state: 'FAILED', attempt: 2 }) }
    );
    expect(notices.map(n => n.kind)).toEqual(['error']);
  });

  it('bumps the rev of a changed job only, and returns the same state for a repeat', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a'), job('b')] }).state;
    const revB = s0.jobs.get('b')!.rev;
    const r1 = reduce(s0, { type: 'job', job: job('a', { last_step: 10, last_loss: 0.5 }) });
    expect(r1.state.jobs.get('a')!.rev).toBe(s0.jobs.get('a')!.rev + 1);
    expect(r1.state.jobs.get('b')!.rev).toBe(revB);
    // progress does not reorder or refilter the list
    expect(r1.state.listRev).toBe(s0.listRev);
    const r2 = reduce(r1.state, { type: 'job', job: job('a', { last_step: 10, last_loss: 0.5 }) });
    expect(r2.state).toBe(r1.state);
    // a state change does
    const r3 = reduce(r2.state, { type: 'job', job: job('a', { state: 'FAILED', last_step: 10, last_loss: 0.5 }) });
    expect(r3.state.listRev).toBe(r2.state.listRev + 1);
  });

  it('keeps a bounded loss history for the sparkline and restarts it on a resume to an older step', () => {
    let s = run(initialState(), { type: 'snapshot', jobs: [job('a')] }).state;
    for (let i = 1; i <= 100; i++) {
      s = reduce(s, { type: 'job', job: job('a', { last_step: i, last_loss: 1 / i }) }).state;
    }
    const h = s.jobs.get('a')!.history;
    expect(h.length).toBe(60);
    expect(h[h.length - 1]).toEqual({ step: 100, loss: 0.01 });
    s = reduce(s, { type: 'job', job: job('a', { attempt: 2, last_step: 50, last_loss: 0.02 }) }).state;
    const h2 = s.jobs.get('a')!.history;
    expect(h2[h2.length - 1]).toEqual({ step: 50, loss: 0.02 });
    expect(h2.every(p => p.step <= 50)).toBe(true);
    // NaN loss is not plotted
    s = reduce(s, { type: 'job', job: job('a', { attempt: 2, last_step: 51, last_loss: NaN }) }).state;
    expect(s.jobs.get('a')!.history.length).toBe(h2.length);
  });

  it('drops jobs missing from a snapshot, and a removed selected job unselects', () => {
    let s = run(initialState(), { type: 'snapshot', jobs: [job('a'), job('b')] }, { type: 'select', id: 'b' }).state;
    s = reduce(s, { type: 'snapshot', jobs: [job('a')] }).state;
    expect([...s.jobs.keys()]).toEqual(['a']);
    expect(s.selected).toBeNull();
    s = run(s, { type: 'select', id: 'a' }, { type: 'removed', id: 'a' }).state;
    expect(s.jobs.size).toBe(0);
    expect(s.selected).toBeNull();
  });

  it('raises an alert notice once per episode and clears it on alert_resolved', () => {
    const s0 = run(initialState(), { type: 'snapshot', jobs: [job('a', { name: 'mlp' })] }).state;
    const fire = {
      seq: 7, job_id: 'a', t: 1, attempt: 1, type: 'alert', state: null,
      reason: 'gpu_util < 0.3 for 15m', data: JSON.stringify({ rule: 'gpu_util < 0.3 for 15m' })
    };
    const { state, notices } = run(s0, { type: 'alert', alert: fire }, { type: 'alert', alert: { ...fire, seq: 8 } });
    expect(notices).toHaveLength(1);
    expect(notices[0].kind).toBe('warning');
    expect(notices[0].message).toContain('mlp');
    expect(notices[0].message).toContain('gpu_util < 0.3 for 15m');
    expect(Object.keys(state.jobs.get('a')!.alerts)).toEqual(['gpu_util < 0.3 for 15m']);
    const resolved = run(state, { type: 'alert', alert: { ...fire, seq: 9, type: 'alert_resolved' } });
    expect(resolved.notices).toEqual([]);
    expect(Object.keys(resolved.state.jobs.get('a')!.alerts)).toEqual([]);
  });

  it('keeps the connection line and its start time', () => {
    let s = initialState();
    s = reduce(s, { type: 'connection', status: 'down', message: 'Launcher unreachable (503)', t: 5 }).state;
    expect(s.connection).toEqual({ status: 'down', message: 'Launcher unreachable (503)', since: 5 });
    s = reduce(s, { type: 'connection', status: 'down', message: 'again', t: 9 }).state;
    expect(s.connection.since).toBe(5);
    s = reduce(s, { type: 'connection', status: 'live', t: 10 }).state;
    expect(s.connection.status).toBe('live');
    expect(s.connection.message).toBe('');
  });
});

describe('filter and order', () => {
  const s = run(initialState(), {
    type: 'snapshot',
    jobs: [
      job('a', { name: 'resnet', created: 1, state: 'FAILED' }),
      job('b', { name: 'bert-large', created: 3 }),
      job('c', { name: 'BERT-small', created: 2, state: 'SUCCEEDED' })
    ]
  }).state;

  it('lists newest first', () => {
    expect(visibleIds(s)).toEqual(['b', 'c', 'a']);
  });
  it('filters by state, active, and name (case-insensitive)', () => {
    expect(visibleIds(reduce(s, { type: 'filter', state: 'FAILED' }).state)).toEqual(['a']);
    expect(visibleIds(reduce(s, { type: 'filter', state: 'active' }).state)).toEqual(['b']);
    expect(visibleIds(reduce(s, { type: 'filter', search: 'bert' }).state)).toEqual(['b', 'c']);
    expect(matches(job('x', { name: 'foo' }), { state: '', search: 'zzz' })).toBe(false);
  });
});

describe('helpers', () => {
  it('parses SSE across arbitrary chunk boundaries, skipping comments', () => {
    const text =
      'retry: 2000\n: connected\n\nevent: job\ndata: {"id":"a"}\n\n: ping\n\nevent: alert\r\ndata: {"x":\r\ndata: 1}\r\n\r\nevent: deleted\ndata: {"id":"a"}\n\n';
    for (const size of [1, 2, 3, 7, 1000]) {
      const p = new SseParser();
      const out: { event: string; data: string }[] = [];
      for (let i = 0; i < text.length; i += size) {
        out.push(...p.feed(text.slice(i, i + size)));
      }
      expect(out).toEqual([
        { event: 'job', data: '{"id":"a"}' },
        { event: 'alert', data: '{"x":\n1}' },
        { event: 'deleted', data: '{"id":"a"}' }
      ]);
    }
  });

  it('backs off exponentially, capped, longer while hidden', () => {
    expect([0, 1, 2, 3].map(a => backoffMs(a))).toEqual([1000, 2000, 4000, 8000]);
    expect(backoffMs(10)).toBe(10000);
    expect(backoffMs(10, true)).toBe(30000);
  });

  it('formats age', () => {
    expect(age(100, 130_000)).toBe('30s');
    expect(age(0, 7_200_000)).toBe('2h');
    expect(age(null, 0)).toBe('');
  });

  it('draws a sparkline inside its box, flat series in the middle', () => {
    const d = sparklinePath([3, 1, 2], 64, 16);
    const nums = d.replace(/[ML]/g, ' ').trim().split(/\s+/).map(Number);
    expect(nums.length).toBe(6);
    nums.forEach((v, i) => expect(v).toBeLessThanOrEqual(i % 2 === 0 ? 64 : 16));
    expect(nums[1]).toBeCloseTo(1); // max at the top
    expect(nums[3]).toBeCloseTo(15); // min at the bottom
    expect(sparklinePath([], 10, 10)).toBe('');
    expect(sparklinePath([5, 5], 10, 10)).toBe('M1.0 5.0 L9.0 5.0');
  });

  it('noticeFor ignores unknown previous state and same state', () => {
    expect(noticeFor(undefined, job('a', { state: 'FAILED' }))).toBeNull();
    expect(noticeFor(job('a'), job('a'))).toBeNull();
  });

  it('parseAlert reads object or JSON-text data and rejects garbage', () => {
    expect(parseAlert(null)).toBeNull();
    expect(parseAlert({ type: 'alert' })).toBeNull();
    expect(parseAlert({ job_id: 'j', type: 'alert', data: { rule: 'loss is nan' } })!.rule).toBe('loss is nan');
    expect(parseAlert({ job_id: 'j', type: 'alert_resolved', reason: 'r' })!.state).toBe('resolved');
  });
});
