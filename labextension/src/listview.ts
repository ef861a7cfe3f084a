/**
 * The job list: one keyed row per job, plain DOM. `render(state)` touches only the rows
 * whose entry changed (`rev`) and moves rows only when the visible order changed, so a
 * stream of events against 500 jobs costs one row each. No JupyterLab imports (jest-tested).
 */
import { percentText, progressText } from './goodput';
import { JobEntry, State, age, sparklinePath, visibleTree } from './store';

const SVG_NS = 'http://www.w3.org/2000/svg';
export const SPARK_W = 64;
export const SPARK_H = 16;

interface Row {
  el: HTMLElement;
  rev: number;
  name: HTMLElement;
  branch: HTMLElement;
  state: HTMLElement;
  attempt: HTMLElement;
  shape: HTMLElement;
  step: HTMLElement;
  goodput: HTMLElement;
  spark: SVGPathElement;
  age: HTMLElement;
  created: number | null;
}

export function stateClass(state: string): string {
  return 'dlc-state-' + state.toLowerCase().replace(/[^a-z]/g, '');
}

function fmtLoss(x: number | string | null | undefined): string {
  if (typeof x !== 'number' || !isFinite(x)) {
    return x === null || x === undefined ? '' : String(x);
  }
  return Math.abs(x) >= 1000 || (Math.abs(x) < 0.001 && x !== 0) ? x.toExponential(2) : x.toFixed(4);
}

export class JobListView {
  readonly node: HTMLElement;
  private rows = new Map<string, Row>();
  private order: string[] = [];
  private listRev = -1;
  /** how many row renders happened: for tests and the perf check */
  rowRenders = 0;

  constructor(private onSelect: (id: string) => void) {
    this.node = document.createElement('div');
    this.node.className = 'dlc-joblist';
    this.node.setAttribute('role', 'list');
    this.node.addEventListener('click', ev => {
      const row = (ev.target as HTMLElement).closest('[data-job-id]') as HTMLElement | null;
      if (row) {
        this.onSelect(row.dataset.jobId!);
      }
    });
  }

  render(state: State, nowMs: number = Date.now()): void {
    // rows of jobs that are gone
    for (const [id, row] of this.rows) {
      if (!state.jobs.has(id)) {
        row.el.remove();
        this.rows.delete(id);
      }
    }
    // changed rows
    for (const [id, entry] of state.jobs) {
      let row = this.rows.get(id);
      if (!row) {
        row = this.makeRow(id);
        this.rows.set(id, row);
      }
      if (row.rev !== entry.rev) {
        this.fill(row, entry, nowMs);
      }
    }
    // order and filter, only when something relevant changed
    if (state.listRev !== this.listRev) {
      this.listRev = state.listRev;
      const tree = visibleTree(state);
      const ids = tree.map(row => row.id);
      if (!sameArray(ids, this.order)) {
        this.reorder(ids);
        this.order = ids;
      }
      for (const { id, depth } of tree) {
        // a branch sits indented under the job it started from
        const el = this.rows.get(id)!.el;
        if (el.dataset.depth !== String(depth)) {
          el.dataset.depth = String(depth);
          if (depth) {
            el.style.paddingLeft = `${Math.min(depth, 6) * 14}px`;
          } else {
            el.style.removeProperty('padding-left');
          }
        }
      }
    }
  }

  /** Refresh the age column (called on a slow timer). */
  tick(nowMs: number = Date.now()): void {
    for (const row of this.rows.values()) {
      const a = age(row.created, nowMs);
      if (row.age.textContent !== a) {
        row.age.textContent = a;
      }
    }
  }

  get visibleCount(): number {
    return this.order.length;
  }

  private reorder(ids: string[]): void {
    const want = new Set(ids);
    for (const id of this.order) {
      if (!want.has(id)) {
        this.rows.get(id)?.el.remove();
      }
    }
    // walk the wanted order, moving only rows that are out of place
    let cursor: ChildNode | null = this.node.firstChild;
    for (const id of ids) {
      const el = this.rows.get(id)!.el;
      if (el === cursor) {
        cursor = cursor.nextSibling;
      } else {
        this.node.insertBefore(el, cursor);
      }
    }
    while (cursor) {
      const next: ChildNode | null = cursor.nextSibling;
      cursor.remove();
      cursor = next;
    }
  }

  private makeRow(id: string): Row {
    const el = document.createElement('div');
    el.className = 'dlc-row';
    el.dataset.jobId = id;
    el.setAttribute('role', 'listitem');
    el.tabIndex = 0;
    const cell = (cls: string, parent: HTMLElement = el) => {
      const c = document.createElement('span');
      c.className = cls;
      parent.appendChild(c);
      return c;
    };
    const top = document.createElement('div');
    top.className = 'dlc-row-top';
    el.appendChild(top);
    const state = cell('dlc-badge', top);
    const name = cell('dlc-name', top);
    const branch = cell('dlc-branch', top);
    // in the top row: the bottom one's step, progress and loss need its width
    const goodput = cell('dlc-goodput-cell', top);
    const ageEl = cell('dlc-age', top);
    const bottom = document.createElement('div');
    bottom.className = 'dlc-row-bottom';
    el.appendChild(bottom);
    const shape = cell('dlc-shape', bottom);
    const attempt = cell('dlc-attempt', bottom);
    const step = cell('dlc-step', bottom);
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('class', 'dlc-spark');
    svg.setAttribute('width', String(SPARK_W));
    svg.setAttribute('height', String(SPARK_H));
    svg.setAttribute('viewBox', `0 0 ${SPARK_W} ${SPARK_H}`);
    const spark = document.createElementNS(SVG_NS, 'path');
    svg.appendChild(spark);
    bottom.appendChild(svg);
    return { el, rev: -1, name, branch, state, attempt, shape, step, goodput, spark, age: ageEl, created: null };
  }

  private fill(row: Row, entry: JobEntry, nowMs: number): void {
    this.rowRenders++;
    const j = entry.job;
    row.rev = entry.rev;
    row.created = j.created;
    row.el.dataset.state = j.state;
    setText(row.name, j.name);
    row.name.title = `${j.name} (${j.id})`;
    setText(row.branch, j.parent ? `⑂ @${j.parent.step}` : '');
    row.branch.title = j.parent ? `branched from ${j.parent.job} at step ${j.parent.step}` : '';
    setText(row.state, j.state);
    row.state.className = `dlc-badge ${stateClass(j.state)}`;
    setText(row.attempt, `attempt ${j.attempt}`);
    setText(row.shape, `${j.nodes}×${j.nproc_per_node}`);
    row.shape.title = `${j.nodes} nodes × ${j.nproc_per_node} processes`;
    setText(
      row.step,
      j.last_step === null || j.last_step === undefined
        ? ''
        : `${progressText(j.progress) || `step ${j.last_step}`}` +
            `${j.last_loss !== null && j.last_loss !== undefined ? ` · loss ${fmtLoss(j.last_loss)}` : ''}`
    );
    const goodput = percentText(j.goodput);
    setText(row.goodput, goodput ? `goodput ${goodput}` : '');
    row.goodput.title = goodput ? 'productive step time over wall time since submit' : '';
    const d = sparklinePath(
      entry.history.map(p => p.loss),
      SPARK_W,
      SPARK_H
    );
    if (row.spark.getAttribute('d') !== d) {
      row.spark.setAttribute('d', d);
    }
    setText(row.age, age(j.created, nowMs));
    const nAlerts = Object.keys(entry.alerts).length;
    row.el.classList.toggle('dlc-has-alert', nAlerts > 0);
    row.el.title = j.reason ? `${j.state}: ${j.reason}` : j.state;
  }
}

function setText(el: HTMLElement, text: string): void {
  if (el.textContent !== text) {
    el.textContent = text;
  }
}

function sameArray(a: string[], b: string[]): boolean {
  if (a.length !== b.length) {
    return false;
  }
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      return false;
    }
  }
  return true;
}

export { fmtLoss };
