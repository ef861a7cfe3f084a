/**
 * The wire contract, from the panel's side: REAL launcher payloads, captured by
 * tests/test_openapi.py from a real launcher after a real job that succeeded (good.py: six
 * steps, a checkpoint at step 4) and one that failed (bad.py: rank 1 raises ValueError), go
 * through the panel's parsers. A field the launcher renames makes one of these fail.
 * Refresh the fixtures with: DLC_UPDATE_FIXTURES=1 pytest tests/test_openapi.py -k fixtures
 */
import * as fs from 'fs';
import * as path from 'path';

import { JobMetrics } from '../src/bands';
import { engineLimits } from '../src/engine';
import { RankPager } from '../src/rankpager';
import {
  JOB_STATES,
  JobDetail,
  JobSummary,
  Schemas,
  TERMINAL,
  initialState,
  noticeFor,
  reduce,
  streamAction
} from '../src/store';
import {
  alertLine,
  checkpointLabel,
  diagnosisParts,
  logText,
  rankCells,
  rankPagerText,
  rankStatesText,
  stragglerLines,
  verdictParts
} from '../src/views';

interface Fixtures {
  jobs: Schemas['JobList'];
  job_succeeded: JobDetail;
  job_failed: JobDetail;
  job_rank_page: JobDetail;
  stream_job: JobSummary;
  diagnosis_failed: Schemas['Diagnoses'];
  diagnosis_succeeded: Schemas['Diagnoses'];
  checkpoints: Schemas['Checkpoints'];
  logs: Schemas['Logs'];
  metrics: Schemas['Metrics'];
  metrics_band: Schemas['Metrics'];
  metrics_band_stream: Schemas['Metrics'];
  events: Schemas['Events'];
  alerts: Schemas['Alerts'];
  script: Schemas['Script'];
  error: Schemas['Error'];
}

const fx = JSON.parse(
  fs.readFileSync(path.join(__dirname, 'fixtures', 'launcher.json'), 'utf8')
) as Fixtures;

describe('real launcher payloads through the panel', () => {
  it('job states are the enum of the document, and terminal ones are known', () => {
    for (const job of [fx.job_succeeded, fx.job_failed, ...fx.jobs.jobs]) {
      expect(JOB_STATES).toContain(job.state);
    }
    expect(fx.job_succeeded.state).toBe('SUCCEEDED');
    // What the engine can do for the job gates the detail's buttons (engine.ts).
    expect(fx.job_succeeded.engine_report.name).toBe('local');
    expect(fx.job_succeeded.engine_report.capabilities.branches).toBe(true);
    expect(engineLimits(fx.job_succeeded.engine_report)).toEqual({ line: '', disabled: {} });
    expect(TERMINAL.has(fx.job_succeeded.state)).toBe(true);
    expect(TERMINAL.has(fx.job_failed.state)).toBe(true);
  });

  it('the job list and a stream event reach the store', () => {
    const { state } = reduce(initialState(), { type: 'snapshot', jobs: fx.jobs.jobs });
    const good = state.jobs.get(fx.job_succeeded.id);
    expect(good?.job.name).toBe('good');
    expect(good?.job.last_step).toBe(6);
    expect(good?.job.nodes).toBe(1);
    expect(good?.job.nproc_per_node).toBe(2);
    expect(good?.job.engine).toBe('local');
    const action = streamAction('job', JSON.stringify(fx.stream_job));
    expect(action).toEqual({ type: 'job', job: fx.stream_job });
  });

  it('a failure becomes an error notice with its reason', () => {
    const before = { ...fx.job_failed, state: 'RUNNING' as const, reason: null };
    const notice = noticeFor(before, fx.job_failed);
    expect(notice?.kind).toBe('error');
    expect(notice?.message).toContain(fx.job_failed.reason ?? 'no reason sent');
    expect(fx.job_failed.reason).toBeTruthy();
  });

  it('a job that did not fail shows its performance verdict; an ended one names no straggler', () => {
    const v = fx.diagnosis_succeeded.verdict!;
    const parts = verdictParts(v);
    expect(parts.head).toBe('performance: healthy');
    expect(parts.line).toContain('gradient sync');
    expect(parts.hint.length).toBeGreaterThan(0);
    expect(fx.diagnosis_failed.verdict).toBeNull();
    expect(stragglerLines(fx.job_succeeded.stragglers)).toEqual([]);
  });

  it('the diagnosis shows the class, the first error line and the suggestion', () => {
    const [d] = fx.diagnosis_failed.diagnoses;
    const parts = diagnosisParts(d);
    expect(parts.head).toContain('attempt 1');
    expect(parts.head).toContain('user_exception');
    expect(parts.head).toContain('rank 1');
    expect(parts.line).toContain('ValueError: the learning rate must be positive');
    expect(parts.hint.length).toBeGreaterThan(10);
    // The same diagnosis is the failed attempt's `failure` in the job detail.
    expect(fx.job_failed.attempts[0].failure?.class).toBe('user_exception');
  });

  it('ranks render every column', () => {
    const cells = fx.job_failed.ranks.map(r => rankCells(r, Date.now()));
    expect(cells.map(c => c[0])).toEqual(['0', '1']);
    const failed = cells[1];
    expect(failed[3]).toMatch(/^\d+$/); // pid
    expect(failed[4]).not.toBe(''); // state
    expect(failed[5]).toBe('1'); // exit code
  });

  // The job of 9 ranks read as `?rank_sort=step&rank_page=1&rank_page_size=4` (the second
  // page of 4, all ranks at step 2): the launcher sorted and cut; the table shows its page.
  it('a page of ranks the launcher sorted becomes the rank table and its pager', () => {
    const pager = new RankPager(4);
    pager.turn({ order: 'step' });
    pager.turn({ by: +1 });
    const ask = pager.ask();
    expect(ask.query).toEqual({ rank_sort: 'step', rank_page: 1, rank_page_size: 4 });
    const table = pager.take(ask, fx.job_rank_page);
    expect(table?.ranks.map(r => r.rank)).toEqual([4, 5, 6, 7]);
    expect(table?.ranks.map(r => rankCells(r, Date.now())[6])).toEqual(['2', '2', '2', '2']);
    expect(rankPagerText(table!.page)).toBe('9 ranks · page 2 of 3');
    expect(rankStatesText(table!.page.states)).toBe('9 exited');
    expect(pager.page).toBe(1);
  });

  it('a detail without rank_page (a launcher older than paging) is one page of every rank', () => {
    expect(fx.job_succeeded.rank_page).toBeUndefined();
    const pager = new RankPager();
    const ask = pager.ask();
    const table = pager.take(ask, fx.job_succeeded);
    expect(table?.ranks.map(r => r.rank)).toEqual([0, 1]);
    expect(rankPagerText(table!.page)).toBe('2 ranks · page 1 of 1');
    expect(rankStatesText(table!.page.states)).toBe('2 exited');
  });

  it('logs, alerts, checkpoints and metrics read their fields', () => {
    expect(logText(fx.logs.lines, false)).toMatch(/^\[\d\] /m);
    expect(logText(fx.logs.lines, false)).toContain('done at step 6');
    expect(fx.logs.cursor.length).toBeGreaterThan(0);
    const rule = alertLine(fx.alerts.alerts[0]);
    expect(rule.text).toMatch(/ → \w+/);
    expect(rule.text.startsWith('undefined')).toBe(false);
    const [ckpt] = fx.checkpoints.checkpoints;
    expect(checkpointLabel(ckpt, () => 'T')).toBe('step 4 · T · world 2');
    expect(fx.job_succeeded.last_checkpoint?.step).toBe(4);
    const metrics = new JobMetrics(fx.job_succeeded.nodes * fx.job_succeeded.nproc_per_node);
    expect(metrics.query()).toEqual({});
    metrics.take(fx.metrics, 0, metrics.query());
    expect(metrics.charts()).toContain('loss');
    expect(metrics.lastSeq).toBe(fx.metrics.last_seq);
    expect(metrics.chart('loss').series.map(s => s.label).sort()).toEqual(['rank 0', 'rank 1']);
  });

  // A job of 9 ranks (tests/test_openapi.py: one node of 9 processes), whose rank 8 logs
  // 100.008 at steps 1 and 2 where the others log 1.000 to 1.007.
  it('past 8 ranks the band rows make the band, and the rank that stands out gets its line', () => {
    const metrics = new JobMetrics(9);
    const taken = metrics.take(fx.metrics_band, 0, metrics.query());
    expect(taken).toEqual({ values: 18, outOfStep: false });
    const { series, band } = metrics.chart('loss');
    expect(band?.rows.map(([step, , lo, hi]) => [step, lo, hi])).toEqual([[1, 1, 100.008], [2, 1, 100.008]]);
    expect(band?.rows[0][1]).toBeCloseTo(108.036 / 9);
    expect(series).toEqual([{ label: 'rank 8 (outlier)', points: [[1, 100.008], [2, 100.008]] }]);
    expect(metrics.query()).toEqual({ band: 1, ranks: '8' });
    expect(metrics.lastSeq).toBe(fx.metrics_band.last_seq);
  });

  it('the stream past 8 ranks: rows of the other ranks, and the outlier rank\'s own points', () => {
    // a panel that drew rank 8 as an outlier from an earlier read, asking ranks=8
    const metrics = new JobMetrics(9);
    const before = { rank: 8, value: 100.008 };
    const earlier = { ...fx.metrics_band, bands: [{ ...fx.metrics_band.bands![0], step: 0, outliers: [before] }], last_seq: 0 };
    metrics.take(earlier, 0, metrics.query());
    const query = metrics.query();
    expect(query).toEqual({ band: 1, ranks: '8' });
    expect(metrics.take(fx.metrics_band_stream, 0, query)).toEqual({ values: 18, outOfStep: false });
    // the same band as the read that folded all nine ranks
    const whole = new JobMetrics(9);
    whole.take(fx.metrics_band, 0, whole.query());
    // (equal but for the order of a float sum: the launcher folds the nine ranks in the order
    // their reports arrived, which differs from one real run to the next)
    const rows = metrics.chart('loss').band?.rows.slice(1) ?? [];
    const wholeRows = whole.chart('loss').band?.rows ?? [];
    expect(rows.length).toBe(wholeRows.length);
    expect(rows.length).toBeGreaterThan(0);
    rows.forEach((row, i) => row.forEach((value, j) => expect(value).toBeCloseTo(wholeRows[i][j] as number, 9)));
    expect(metrics.chart('loss').series[0].points).toEqual([[0, 100.008], [1, 100.008], [2, 100.008]]);
  });

  it('errors are one line naming the field', () => {
    expect(fx.error.error).toMatch(/^rank: rank 9 does not exist in a world of 2/);
  });
});
