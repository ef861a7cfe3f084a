/**
 * The panel's comparison of jobs (compare.ts), as a main-area tab: the values table, one
 * metric's curves by step and by wall time (charts.ts), the fields that differ and each
 * job's code diffed against the first's. Read when opened and on Refresh; everything shown
 * came from jobs, so it is set as text, never as markup.
 */
import { Widget } from '@lumino/widgets';

import { DlcApi } from './api';
import { lineChart } from './charts';
import { curves, differences, lineDiff, valueText, PointLike } from './compare';
import { el } from './dom';
import { JobDetail } from './store';

interface Loaded {
  job: JobDetail;
  script: string;
  byStep: [number, number][];
  byTime: [number, number][];
}

export function compareTabId(ids: string[]): string {
  return `jupyter-dlc-compare-${ids.join('-').replace(/[^A-Za-z0-9_-]/g, '_')}`;
}

export class CompareTab extends Widget {
  private body = el('div', 'dlc-compare-body');

  constructor(
    private api: DlcApi,
    private ids: string[],
    private metric = 'loss'
  ) {
    super();
    this.id = compareTabId(ids);
    this.addClass('dlc-compare-tab');
    this.title.label = `DLC: compare ${ids.length} jobs`;
    this.title.caption = ids.join(', ');
    this.title.closable = true;
    const refresh = el('button', 'jp-Button dlc-action dlc-compare-refresh', 'Refresh');
    refresh.onclick = () => void this.load();
    this.node.append(refresh, this.body);
    this.node.style.overflow = 'auto';
    void this.load();
  }

  async load(): Promise<void> {
    this.node.dataset.state = 'loading';
    try {
      const loaded = await Promise.all(this.ids.map(id => this.read(id)));
      this.render(loaded);
      this.node.dataset.state = 'loaded';
    } catch (e) {
      this.body.replaceChildren(el('div', 'dlc-error', `compare: ${(e as Error).message}`));
      this.node.dataset.state = 'error';
    }
  }

  private async read(id: string): Promise<Loaded> {
    const job = await this.api.job(id);
    const points: PointLike[] = [];
    let since = 0;
    for (;;) {
      const page = await this.api.sub(id, 'metrics', { since });
      points.push(...page.points);
      if (!page.points.length || page.last_seq <= since) {
        break;
      }
      since = page.last_seq;
    }
    const { script } = await this.api.sub(id, 'script');
    return { job, script, ...curves(points, this.metric, job.created) };
  }

  private render(jobs: Loaded[]): void {
    const values = el('table', 'dlc-compare');
    const head = el('tr');
    for (const h of ['job', 'state', 'steps', `last ${this.metric}`, `best ${this.metric}`]) {
      head.appendChild(el('th', '', h));
    }
    values.appendChild(head);
    const bests = jobs.map(j => (j.byStep.length ? Math.min(...j.byStep.map(p => p[1])) : null));
    const best = Math.min(...bests.filter((b): b is number => b !== null));
    jobs.forEach((j, i) => {
      const row = el('tr', 'dlc-compared');
      row.dataset.job = j.job.id;
      if (bests[i] === best) {
        row.dataset.best = '1';
      }
      const last = j.byStep.length ? j.byStep[j.byStep.length - 1] : null;
      for (const cell of [j.job.id, j.job.state, last ? String(last[0]) : '-', valueText(last?.[1]), valueText(bests[i])]) {
        row.appendChild(el('td', '', cell));
      }
      values.appendChild(row);
    });
    const charts = el('div', 'dlc-charts');
    const byStep = lineChart(`${this.metric} by step`, jobs.map(j => ({ label: j.job.id, points: j.byStep })),
      { width: 420, height: 200, xLabel: 'step' });
    byStep.dataset.chart = 'compare-step';
    const byTime = lineChart(`${this.metric} by wall time`, jobs.map(j => ({ label: j.job.id, points: j.byTime })),
      { width: 420, height: 200, xLabel: 'seconds since submit' });
    byTime.dataset.chart = 'compare-time';
    charts.append(byStep, byTime);

    const found = differences(jobs.map(j => (j.job.spec ?? {}) as Record<string, unknown>));
    let fields: HTMLElement;
    if (found.length) {
      fields = el('table', 'dlc-differences');
      const top = el('tr');
      top.appendChild(el('th', '', 'differs'));
      jobs.forEach(j => top.appendChild(el('th', '', j.job.id)));
      fields.appendChild(top);
      for (const { field, values: vs } of found) {
        const row = el('tr');
        row.dataset.field = field;
        row.appendChild(el('td', '', field));
        vs.forEach(v => row.appendChild(el('td', '', valueText(v))));
        fields.appendChild(row);
      }
    } else {
      fields = el('p', 'dlc-muted', 'no spec field differs');
    }
    const diffs = jobs.slice(1).map(other => {
      const pre = el('pre', 'dlc-code-diff');
      pre.dataset.job = other.job.id;
      const lines = lineDiff(jobs[0].script, other.script);
      if (!lines.length) {
        pre.textContent = `the code of ${other.job.id} is the same as ${jobs[0].job.id}'s`;
        return pre;
      }
      pre.appendChild(el('div', 'dlc-diff-head', `--- ${jobs[0].job.id}\n+++ ${other.job.id}`));
      for (const line of lines) {
        const cls = line.op === '+' ? 'dlc-diff-add' : line.op === '-' ? 'dlc-diff-del' : 'dlc-diff-same';
        pre.appendChild(el('div', cls, `${line.op}${line.text}`));
      }
      return pre;
    });
    this.body.replaceChildren(values, charts, fields, ...diffs);
  }
}
