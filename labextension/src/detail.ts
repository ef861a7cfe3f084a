/**
 * The detail view of one job: charts, ranks, log tail, alerts, diagnosis, and the actions.
 * Reads everything through DlcApi; refreshes while visible and the job is active.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { DlcApi, DlcError } from './api';
import { JobMetrics, Taken } from './bands';
import { entry, lineChart } from './charts';
import { Downsampled, downsampledNote, FeedStatus, MetricsFeed } from './metricsfeed';
import { progressText, renderGoodputBar } from './goodput';
import { BREAKDOWN_NAMES, STEPS_REDRAW_MS, STEP_MS, stepChart, stepRows, stepsTitle } from './steps';
import { stateClass } from './listview';
import { branchCell } from './branch';
import { EngineReport, engineLimits } from './engine';
import { el } from './dom';
import { RankAsk, RankPager, RankTable } from './rankpager';
import { JobDetail, JobEntry, JobSummary, age, isActive } from './store';
import {
  Alert,
  Checkpoint,
  Diagnosis,
  LogLine,
  RANK_COLUMNS,
  RANK_SORTS,
  RankOrder,
  Verdict,
  alertLine,
  checkpointLabel,
  diagnosisParts,
  logText,
  rankCells,
  rankPagerText,
  rankStatesText,
  stragglerLines,
  verdictParts
} from './views';

const LOG_TAIL = 200;
const REFRESH_MS = 2000;
const SYSTEM_ORDER = ['gpu_util', 'gpu_mem', 'cpu_util', 'mem_used'];

export interface DetailHost {
  api: DlcApi;
  back(): void;
  select(id: string): void;
  removed(id: string): void;
  openPath(path: string): Promise<void>;
  /** The jobs the panel lists, and a comparison of some of them opened (compareview.ts). */
  jobs(): JobSummary[];
  compare(ids: string[]): void;
  /** Append a code cell to the notebook at `path` (a new notebook when null) and show it. */
  appendCell(path: string | null, text: string): Promise<void>;
  isVisible(): boolean;
}

function fmtTime(t: number | null | undefined): string {
  if (!t) {
    return '';
  }
  return new Date(t * 1000).toLocaleString();
}

class PickerBody extends Widget implements Dialog.IBodyWidget<number | null> {
  private select: HTMLSelectElement;
  constructor(checkpoints: Checkpoint[], what = 'Resume from ') {
    super();
    this.addClass('dlc-resume-picker');
    const label = el('label', '', what);
    this.select = el('select');
    this.select.className = 'dlc-resume-step';
    const latest = el('option', '', 'latest committed step');
    latest.value = '';
    this.select.appendChild(latest);
    const sorted = [...checkpoints].sort((a, b) => b.step - a.step);
    for (const c of sorted) {
      const o = el('option', '', checkpointLabel(c, fmtTime));
      o.value = String(c.step);
      this.select.appendChild(o);
    }
    label.appendChild(this.select);
    this.node.appendChild(label);
    if (checkpoints.length === 0) {
      this.node.appendChild(
        el('p', 'dlc-muted', 'No committed checkpoint: the job starts again from step 0.')
      );
    }
  }
  getValue(): number | null {
    return this.select.value === '' ? null : Number(this.select.value);
  }
}

class JobsPickerBody extends Widget implements Dialog.IBodyWidget<string[]> {
  private select: HTMLSelectElement;
  constructor(jobs: JobSummary[]) {
    super();
    this.addClass('dlc-compare-picker');
    this.select = el('select');
    this.select.multiple = true;
    this.select.size = Math.min(10, Math.max(3, jobs.length));
    this.select.className = 'dlc-compare-jobs';
    for (const j of jobs) {
      const o = el('option', '', `${j.name} (${j.id}) ${j.state}`);
      o.value = j.id;
      this.select.appendChild(o);
    }
    this.node.append(el('p', '', 'Jobs to put beside it (up to 9; Ctrl-click for several):'), this.select);
  }
  getValue(): string[] {
    return Array.from(this.select.selectedOptions).map(o => o.value);
  }
}

export class DetailView {
  readonly node: HTMLElement;
  private id: string | null = null;
  private entry: JobEntry | null = null;
  /** what the job's engine can do for it (the detail's `engine`): gates buttons */
  private engine: EngineReport | undefined = undefined;
  private metrics = new JobMetrics(0);
  private timer: number | null = null;
  private loading = false;
  private lastFullRev = -1;
  /** a branch's parent up to the branch step, per train metric (readParent) */
  private parentCurves = new Map<string, [number, number][]>();
  private parentLabel = '';
  private logRank = '';
  /** What each part of the detail was last drawn from (JSON): a refresh that brings the same
   * leaves its DOM alone. Each rebuilt part is style and layout work on the page's one
   * thread, which the charts' live points wait behind (benchmarks/live_view.py). */
  private drawnFrom = new Map<string, string>();
  private parts: Record<string, HTMLElement> = {};
  /** the job's metric points: pushed by the launcher, polled while the stream is down */
  feed: MetricsFeed | null = null;
  private chartFrame: number | null = null;
  /** the step chart's next draw (at most one a STEPS_REDRAW_MS), and when it last drew */
  private stepsTimer: number | null = null;
  private stepsDrawnAt = 0;
  /** the rank table's order and page, read from the launcher a page at a time */
  private ranks = new RankPager();

  constructor(private host: DetailHost) {
    this.node = el('div', 'dlc-detail');
    const head = el('div', 'dlc-detail-head');
    const back = el('button', 'jp-Button dlc-back', 'Close');
    back.onclick = () => this.host.back();
    head.appendChild(back);
    this.parts.title = el('span', 'dlc-detail-title');
    this.parts.badge = el('span', 'dlc-badge');
    head.append(this.parts.badge, this.parts.title);
    this.node.appendChild(head);

    this.parts.meta = el('div', 'dlc-detail-meta');
    this.parts.reason = el('div', 'dlc-detail-reason');
    this.parts.goodput = el('div', 'dlc-goodput-box');
    this.node.append(this.parts.meta, this.parts.reason, this.parts.goodput);

    const actions = el('div', 'dlc-actions');
    const button = (label: string, cls: string, fn: () => Promise<void>) => {
      const b = el('button', `jp-Button dlc-action ${cls}`, label);
      b.dataset.action = cls.replace('dlc-action-', '');
      b.onclick = () => {
        b.disabled = true;
        fn()
          .catch(e => Notification.error(`DLC: ${label} failed: ${(e as Error).message}`, { autoClose: 8000 }))
          .finally(() => {
            b.disabled = false;
            this.updateButtons();
            void this.refresh(true);
          });
      };
      actions.appendChild(b);
      this.parts[cls] = b;
      return b;
    };
    button('Stop', 'dlc-action-stop', () => this.stop());
    button('Resume', 'dlc-action-resume', () => this.resume());
    button('Clone', 'dlc-action-clone', () => this.clone());
    button('Branch', 'dlc-action-branch', () => this.branch());
    button('Compare', 'dlc-action-compare', () => this.compare());
    button('Delete', 'dlc-action-delete', () => this.remove());
    button('Open source', 'dlc-action-open', () => this.openSource());
    this.node.appendChild(actions);

    this.parts.alerts = el('div', 'dlc-alerts');
    this.parts.stragglers = el('div', 'dlc-stragglers');
    this.parts.engine = el('div', 'dlc-engine-limits');
    this.parts.diagnosis = el('div', 'dlc-diagnosis');
    this.parts.charts = el('div', 'dlc-charts');
    this.parts.steps = el('div', 'dlc-steps');
    const ranksBox = el('details', 'dlc-section');
    ranksBox.open = true;
    ranksBox.appendChild(el('summary', '', 'Ranks'));
    const bar = el('div', 'dlc-rank-bar');
    const order = el('select', 'dlc-rank-sort');
    for (const [value, label] of RANK_SORTS) {
      const o = el('option', '', label);
      o.value = value;
      order.appendChild(o);
    }
    order.onchange = () => this.turnRanks({ order: order.value as RankOrder });
    const prev = el('button', 'jp-Button dlc-rank-prev', '◀');
    prev.onclick = () => this.turnRanks({ by: -1 });
    const next = el('button', 'jp-Button dlc-rank-next', '▶');
    next.onclick = () => this.turnRanks({ by: +1 });
    this.parts.rankPages = el('span', 'dlc-rank-pages');
    this.parts.rankStates = el('span', 'dlc-rank-states');
    this.parts.rankPrev = prev;
    this.parts.rankNext = next;
    bar.append(order, prev, this.parts.rankPages, next, this.parts.rankStates);
    ranksBox.appendChild(bar);
    this.parts.ranks = el('div', 'dlc-ranks');
    ranksBox.appendChild(this.parts.ranks);
    const logBox = el('details', 'dlc-section');
    logBox.open = true;
    const logSummary = el('summary', '', 'Log tail ');
    const rankSel = el('select', 'dlc-log-rank');
    rankSel.onchange = () => {
      this.logRank = rankSel.value;
      void this.refresh(true);
    };
    rankSel.onclick = ev => ev.stopPropagation();
    this.parts.logRank = rankSel;
    logSummary.appendChild(rankSel);
    logBox.appendChild(logSummary);
    this.parts.logs = el('pre', 'dlc-logs');
    logBox.appendChild(this.parts.logs);
    this.parts.retention = el('div', 'dlc-retention-note');
    this.node.append(this.parts.engine, this.parts.stragglers, this.parts.alerts, this.parts.diagnosis, this.parts.charts, this.parts.steps, this.parts.retention, ranksBox, logBox);
  }

  get jobId(): string | null {
    return this.id;
  }

  show(entry: JobEntry): void {
    if (this.id !== entry.job.id) {
      this.id = entry.job.id;
      this.parentCurves = new Map();
      if (entry.job.parent) {
        void this.readParent(entry.job.id, entry.job.parent.job, entry.job.parent.step);
      }
      this.metrics = new JobMetrics(entry.job.nodes * entry.job.nproc_per_node);
      this.feed?.dispose();
      const metrics = this.metrics;
      this.feed = new MetricsFeed(
        this.host.api,
        entry.job.id,
        metrics,
        (taken, downsampled) => this.answerTaken(metrics, taken, downsampled),
        status => this.feedStatus(status)
      );
      this.ranks.reset();
      this.drawnFrom.clear();
      this.lastFullRev = -1;
      this.logRank = '';
      this.parts.charts.textContent = '';
      this.cancelSteps();
      this.parts.steps.textContent = '';
      this.parts.retention.textContent = '';
      this.parts.logs.textContent = '';
      this.parts.ranks.textContent = '';
      this.parts.rankPages.textContent = '';
      this.parts.rankStates.textContent = '';
      this.parts.alerts.textContent = '';
      this.parts.stragglers.textContent = '';
      this.engine = undefined;
      this.parts.engine.textContent = '';
      this.parts.diagnosis.textContent = '';
      this.parts.goodput.textContent = '';
      (this.parts.logRank as HTMLSelectElement).textContent = '';
    }
    this.update(entry);
    this.schedule(0);
  }

  hide(): void {
    this.id = null;
    this.entry = null;
    this.feed?.dispose();
    this.feed = null;
    this.cancelSteps();
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** The summary of the shown job changed. */
  update(entry: JobEntry): void {
    const prevRev = this.entry?.rev;
    this.entry = entry;
    const j = entry.job;
    this.node.dataset.jobId = j.id;
    this.node.dataset.state = j.state;
    this.parts.title.textContent = j.name;
    this.parts.title.title = j.id;
    this.parts.badge.textContent = j.state;
    this.parts.badge.className = `dlc-badge ${stateClass(j.state)}`;
    const src = j.source?.path ? ` · from ${j.source.kind} ${j.source.path}` : '';
    this.parts.meta.textContent =
      `${j.id} · attempt ${j.attempt} · ${j.nodes} nodes × ${j.nproc_per_node} processes` +
      ` · ${j.engine ?? ''} · created ${age(j.created, Date.now())} ago` +
      (j.last_step !== null && j.last_step !== undefined
        ? ` · ${progressText(j.progress) || `step ${j.last_step}`}`
        : '') +
      src +
      (j.parent ? ` · branched from ${j.parent.job} at step ${j.parent.step}` : '');
    this.parts.reason.textContent = j.reason ? `${j.state}: ${j.reason}` : '';
    this.updateButtons();
    if (prevRev !== undefined && prevRev !== entry.rev) {
      this.schedule(0);
    }
  }

  private updateButtons(): void {
    const j = this.entry?.job;
    if (!j) {
      return;
    }
    const active = isActive(j.state);
    (this.parts['dlc-action-stop'] as HTMLButtonElement).disabled = !active;
    (this.parts['dlc-action-resume'] as HTMLButtonElement).disabled = active;
    const del = this.parts['dlc-action-delete'] as HTMLButtonElement;
    del.disabled = active;
    del.title = active ? 'Stop the job before deleting it' : 'Delete the job and its files';
    const open = this.parts['dlc-action-open'] as HTMLButtonElement;
    open.disabled = !j.source?.path;
    // What the job's engine cannot do (its capabilities, from the detail) stays off, saying why.
    const { disabled } = engineLimits(this.engine);
    for (const cls of ['dlc-action-branch']) {
      const b = this.parts[cls] as HTMLButtonElement;
      b.disabled = cls in disabled;
      b.title = disabled[cls] ?? '';
    }
    open.title = j.source?.path ? `Open ${j.source.path}` : 'No source recorded';
  }

  private schedule(ms: number): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
    }
    this.timer = window.setTimeout(() => {
      this.timer = null;
      void this.refresh(false).finally(() => {
        const j = this.entry?.job;
        if (this.id && j && isActive(j.state)) {
          this.schedule(this.host.isVisible() ? REFRESH_MS : REFRESH_MS * 5);
        }
      });
    }, ms);
  }

  async refresh(force: boolean): Promise<void> {
    const id = this.id;
    const entry = this.entry;
    if (!id || !entry || this.loading) {
      return;
    }
    if (!force && !this.host.isVisible()) {
      return;
    }
    if (!force && !isActive(entry.job.state) && this.lastFullRev === entry.rev) {
      return; // a finished job does not change until its summary does
    }
    this.loading = true;
    const api = this.host.api;
    const ask = this.ranks.ask();
    try {
      const [job, logs, alerts, diagnosis, goodput] = await Promise.all([
        api.job(id, ask.query),
        api.sub(id, 'logs', { tail: LOG_TAIL, rank: this.logRank === '' ? undefined : this.logRank }),
        api.sub(id, 'alerts'),
        api.sub(id, 'diagnosis'),
        api.sub(id, 'goodput')
      ]);
      if (this.id !== id) {
        return;
      }
      this.lastFullRev = entry.rev;
      this.showRanks(ask, job);
      const world = entry.job.nodes * entry.job.nproc_per_node;
      if (this.changed('logs', [logs.lines, world, this.logRank])) {
        this.renderLogs(logs.lines, world);
      }
      if (this.changed('alerts', alerts.alerts)) {
        this.renderAlerts(alerts.alerts);
      }
      if (this.changed('stragglers', job.stragglers)) {
        this.renderStragglers(job.stragglers);
      }
      this.engine = job.engine_report;
      if (this.changed('engine', job.engine_report)) {
        this.parts.engine.textContent = engineLimits(job.engine_report).line;
      }
      this.updateButtons();
      if (this.changed('diagnosis', [diagnosis.diagnoses, diagnosis.verdict ?? null])) {
        this.renderDiagnosis(diagnosis.diagnoses, diagnosis.verdict ?? null);
      }
      if (this.changed('goodput', goodput)) {
        this.parts.goodput.replaceChildren(renderGoodputBar(goodput));
      }
    } catch (e) {
      if (e instanceof DlcError && e.status === 404) {
        this.host.removed(id);
        return;
      }
      this.parts.reason.textContent = `Could not load details: ${(e as Error).message}`;
    } finally {
      this.loading = false;
    }
  }

  /** An answer came (pushed or polled): draw what it brought at the next frame. */
  private answerTaken(metrics: JobMetrics, taken: Taken, downsampled: Downsampled | null): void {
    if (metrics !== this.metrics) {
      return; // another job is shown now
    }
    const note = downsampledNote(downsampled);
    if (this.parts.retention.textContent !== note) {
      this.parts.retention.textContent = note;
    }
    if (!taken.values) {
      return;
    }
    this.node.dataset.pushed = String(this.feed?.pushed ?? 0);
    this.node.dataset.polled = String(this.feed?.polled ?? 0);
    // past 8 ranks: the ranks the feed asks for as points (its outlier lines)
    this.node.dataset.outlierRanks = metrics.band?.outliers.join(',') ?? '';
    if (this.chartFrame === null) {
      this.chartFrame = requestAnimationFrame(() => {
        this.chartFrame = null;
        this.renderCharts();
      });
    }
    if (this.stepsTimer === null && metrics.charts().includes(STEP_MS)) {
      // the step chart: at most one draw a STEPS_REDRAW_MS (200 steps of every rank's parts)
      const wait = Math.max(0, this.stepsDrawnAt + STEPS_REDRAW_MS - Date.now());
      this.stepsTimer = window.setTimeout(() => {
        this.stepsTimer = null;
        this.stepsDrawnAt = Date.now();
        if (metrics === this.metrics) {
          this.renderSteps();
        }
      }, wait);
    }
  }

  private cancelSteps(): void {
    if (this.stepsTimer !== null) {
      window.clearTimeout(this.stepsTimer);
      this.stepsTimer = null;
    }
  }

  /** "Where each step goes": hidden until a rank logs the breakdown (steps.ts). */
  private renderSteps(): void {
    const rows = stepRows(name => this.metrics.chart(name));
    const world = this.entry ? this.entry.job.nodes * this.entry.job.nproc_per_node : 0;
    this.parts.steps.replaceChildren(...(rows.length ? [stepChart(stepsTitle(this.metrics.band !== null, world), rows)] : []));
  }

  private feedStatus(status: FeedStatus): void {
    this.node.dataset.feed = status;
  }

  /** A branch's parent up to the branch step, rank 0's train metrics: its charts start with
   * them, muted. A parent that is gone leaves the branch's own lines. */
  private async readParent(id: string, parent: string, upTo: number): Promise<void> {
    const curves = new Map<string, [number, number][]>();
    let since = 0;
    try {
      for (;;) {
        const page = await this.host.api.sub(parent, 'metrics', { since });
        for (const p of page.points) {
          if (p.rank === 0 && p.kind === 'train' && p.step !== null && p.step <= upTo && typeof p.value === 'number') {
            entry(curves, p.name, () => []).push([p.step, p.value]);
          }
        }
        if (!page.points.length || page.last_seq <= since) {
          break;
        }
        since = page.last_seq;
      }
    } catch {
      return;
    }
    if (this.id === id) {
      this.parentLabel = `parent ${parent} to step ${upTo}`;
      this.parentCurves = curves;
      this.renderCharts();
    }
  }

  private renderCharts(): void {
    const box = this.parts.charts;
    box.textContent = '';
    const names = this.metrics.charts();
    // the breakdown's names have the step chart (renderSteps)
    const train = names.filter(n => !SYSTEM_ORDER.includes(n) && !BREAKDOWN_NAMES.includes(n));
    train.sort((a, b) => (a === 'loss' ? -1 : b === 'loss' ? 1 : a.localeCompare(b)));
    if (!train.includes('loss')) {
      train.unshift('loss');
    }
    for (const n of train.slice(0, 4)) {
      const { series, band } = this.metrics.chart(n);
      const parent = this.parentCurves.get(n);
      const all = parent ? [{ label: this.parentLabel, points: parent, muted: true }, ...series] : series;
      box.appendChild(lineChart(n, all, { xLabel: 'step', band }));
    }
    for (const n of SYSTEM_ORDER.filter(x => names.includes(x))) {
      box.appendChild(lineChart(n, this.metrics.chart(n).series, { xLabel: 'time' }));
    }
  }

  /** Another page or order of the rank table: read it now, not at the next refresh. */
  private turnRanks(to: { order: RankOrder } | { by: number }): void {
    const id = this.id;
    if (!id) {
      return;
    }
    this.ranks.turn(to);
    const ask = this.ranks.ask();
    this.host.api.job(id, ask.query).then(
      job => {
        if (this.id === id) {
          this.showRanks(ask, job);
        }
      },
      e => {
        if (this.id === id) {
          this.parts.reason.textContent = `Could not load the ranks: ${(e as Error).message}`;
        }
      }
    );
  }

  /** An answer with a page of ranks: drawn unless a newer one was (rankpager.ts). */
  private showRanks(ask: RankAsk, job: JobDetail): void {
    const table = this.ranks.take(ask, job);
    if (table) {
      this.renderRanks(table);
    }
  }

  private renderRanks({ ranks, page: p }: RankTable): void {
    (this.parts.rankPrev as HTMLButtonElement).disabled = p.page === 0;
    (this.parts.rankNext as HTMLButtonElement).disabled = p.page >= p.pages - 1;
    this.parts.rankPages.textContent = rankPagerText(p);
    this.parts.rankStates.textContent = rankStatesText(p.states);
    const table = el('table', 'dlc-rank-table');
    const head = el('tr');
    for (const h of RANK_COLUMNS) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    const now = Date.now();
    for (const r of ranks) {
      const tr = el('tr');
      tr.dataset.rank = String(r.rank);
      for (const c of rankCells(r, now)) {
        tr.appendChild(el('td', '', c));
      }
      if (r.state) {
        (tr.children[4] as HTMLElement).className = stateClass(String(r.state));
      }
      table.appendChild(tr);
    }
    this.parts.ranks.textContent = '';
    this.parts.ranks.appendChild(ranks.length ? table : el('div', 'dlc-muted', 'No ranks yet.'));
  }

  /** Whether `part` is to be drawn from `value`: not when it was last drawn from the same. */
  private changed(part: string, value: unknown): boolean {
    const key = JSON.stringify(value) ?? '';
    if (this.drawnFrom.get(part) === key) {
      return false;
    }
    this.drawnFrom.set(part, key);
    return true;
  }

  /** The log tail, and the filter's choice of every rank of the world (`world` ranks). */
  private renderLogs(lines: LogLine[], world: number): void {
    const sel = this.parts.logRank as HTMLSelectElement;
    if (sel.options.length !== world + 1) {
      sel.textContent = '';
      for (const v of ['', ...Array.from({ length: world }, (_, r) => String(r))]) {
        const o = el('option', '', v === '' ? 'all ranks' : `rank ${v}`);
        o.value = v;
        sel.appendChild(o);
      }
      sel.value = this.logRank;
    }
    const pre = this.parts.logs;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = logText(lines, this.logRank !== '');
    if (atBottom) {
      pre.scrollTop = pre.scrollHeight;
    }
  }

  private renderAlerts(alerts: Alert[]): void {
    const box = this.parts.alerts;
    box.textContent = '';
    if (!alerts.length) {
      return;
    }
    // The launcher lists every rule of the job with whether an episode is open now.
    box.appendChild(el('div', 'dlc-section-title', 'Alert rules'));
    for (const a of alerts) {
      const { text, firing } = alertLine(a);
      box.appendChild(el('div', `dlc-alert ${firing ? 'dlc-alert-firing' : 'dlc-alert-quiet'}`, text));
    }
  }

  /** The straggler banner (launcher/stragglers.py): who keeps the others waiting, and why. */
  private renderStragglers(stragglers: JobDetail['stragglers'] | undefined): void {
    const box = this.parts.stragglers;
    box.textContent = '';
    for (const line of stragglerLines(stragglers)) {
      box.appendChild(el('div', 'dlc-straggler', line));
    }
  }

  private renderDiagnosis(diagnoses: Diagnosis[], verdict: Verdict | null): void {
    const box = this.parts.diagnosis;
    box.textContent = '';
    if (!diagnoses.length && !verdict) {
      return;
    }
    box.appendChild(el('div', 'dlc-section-title', 'Diagnosis'));
    const items = diagnoses.map(d => ({ cls: d.class, ...diagnosisParts(d) }));
    if (verdict) {
      items.push({ cls: verdict.verdict, ...verdictParts(verdict) });
    }
    for (const { cls, head, line, hint } of items) {
      const item = el('div', 'dlc-diag');
      item.dataset.class = cls;
      item.appendChild(el('div', 'dlc-diag-head', head));
      if (line) {
        item.appendChild(el('div', 'dlc-diag-text', line));
      }
      if (hint) {
        item.appendChild(el('div', 'dlc-diag-hint', hint));
      }
      box.appendChild(item);
    }
  }

  // -- actions ----------------------------------------------------------------------
  private async stop(): Promise<void> {
    await this.host.api.action(this.id!, 'stop', {});
  }

  private async resume(): Promise<void> {
    const id = this.id!;
    const { checkpoints } = await this.host.api.sub(id, 'checkpoints');
    const body = new PickerBody(checkpoints);
    const result = await showDialog({
      title: `Resume ${this.entry?.job.name ?? id}`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Resume' })]
    });
    if (!result.button.accept) {
      return;
    }
    const step = result.value;
    await this.host.api.action(id, 'resume', step === null || step === undefined ? {} : { step });
  }

  /** "Branch from here": a committed step picked, its cell opened below the notebook's
   * cells with `--from JOB@STEP`, ready to edit and run. */
  private async branch(): Promise<void> {
    const id = this.id!;
    const job = this.entry?.job;
    const { checkpoints } = await this.host.api.sub(id, 'checkpoints');
    if (!job || checkpoints.length === 0) {
      await showDialog({
        title: 'No committed checkpoint',
        body: `${job?.name ?? id} has no committed step to branch from.`,
        buttons: [Dialog.okButton()]
      });
      return;
    }
    const body = new PickerBody(checkpoints, 'Branch from ');
    const result = await showDialog({
      title: `Branch ${job.name}`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Open cell' })]
    });
    if (!result.button.accept) {
      return;
    }
    const step = result.value ?? Math.max(...checkpoints.map(c => c.step));
    const { script } = await this.host.api.sub(id, 'script');
    const path = job.source?.kind === 'notebook' && job.source.path ? relativeToRoot(job.source.path) : null;
    await this.host.appendCell(path, branchCell(job, script, step));
  }

  /** Compare with other jobs, picked in a dialog (newest first). */
  private async compare(): Promise<void> {
    const id = this.id!;
    const others = this.host.jobs().filter(j => j.id !== id).sort((a, b) => (b.created ?? 0) - (a.created ?? 0));
    const body = new JobsPickerBody(others);
    const result = await showDialog({
      title: `Compare ${this.entry?.job.name ?? id} with`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Compare' })]
    });
    if (!result.button.accept || !result.value?.length) {
      return;
    }
    this.host.compare([id, ...result.value.slice(0, 9)]);
  }

  private async clone(): Promise<void> {
    const job: JobDetail = await this.host.api.action(this.id!, 'clone', {});
    if (job.id) {
      Notification.info(`DLC: cloned as ${job.name} (${job.id})`, { autoClose: 4000 });
      this.host.select(job.id);
    }
  }

  private async remove(): Promise<void> {
    const id = this.id!;
    const j = this.entry?.job;
    if (j && isActive(j.state)) {
      await showDialog({
        title: 'Stop the job first',
        body: `${j.name} is ${j.state}. Stop it, then delete it.`,
        buttons: [Dialog.okButton()]
      });
      return;
    }
    const result = await showDialog({
      title: `Delete ${j?.name ?? id}?`,
      body: 'This deletes the job, its logs, metrics and checkpoints from the launcher.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!result.button.accept) {
      return;
    }
    await this.host.api.remove(id);
    this.host.removed(id);
  }

  private async openSource(): Promise<void> {
    const path = this.entry?.job.source?.path;
    if (!path) {
      return;
    }
    await this.host.openPath(relativeToRoot(path));
  }
}

/** A path the contents API understands: relative to the server root when absolute. */
export function relativeToRoot(path: string): string {
  if (!path.startsWith('/')) {
    return path;
  }
  const root = (PageConfig.getOption('serverRoot') || '').replace(/\/+$/, '');
  if (root && (path === root || path.startsWith(root + '/'))) {
    return path.slice(root.length + 1);
  }
  if (root.startsWith('~')) {
    // serverRoot may be written with ~; match on the tail
    const tail = root.slice(1);
    const i = path.indexOf(tail + '/');
    if (i >= 0) {
      return path.slice(i + tail.length + 1);
    }
  }
  throw new Error(`${path} is outside the Jupyter server's root ${root}`);
}
