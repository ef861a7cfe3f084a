/**
 * The "DLC jobs" side panel: connection line, filter, search and the keyed job list.
 * Renders from the store, at most once per animation frame. A job's detail opens as a tab
 * in the main area (detailtab.ts): the 240-pixel sidebar is too narrow for charts and tables.
 */
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { DlcApi } from './api';
import { JobListView } from './listview';
import { PoolsView } from './pools';
import { Action, JOB_STATES, State, stateCounts } from './store';

// Every state of the launcher's JobState enum (src/wire.ts), as the filter offers them.
const FILTER_STATES: [string, string][] = [
  ['', 'All states'],
  ['active', 'Active'],
  ...JOB_STATES.map((s): [string, string] => [s, s.charAt(0) + s.slice(1).toLowerCase()])
];

export interface PanelHost {
  api: DlcApi;
  getState(): State;
  dispatch(a: Action): void;
  openPath(path: string): Promise<void>;
  onVisible(): void;
}

export class DlcPanel extends Widget {
  private list: JobListView;
  private pools: PoolsView;
  private statusLine: HTMLElement;
  private filterSel: HTMLSelectElement;
  private search: HTMLInputElement;
  private empty: HTMLElement;
  private listBox: HTMLElement;
  private frame: number | null = null;
  private ageTimer: number;
  private rendered: State | null = null;

  constructor(private host: PanelHost) {
    super();
    this.id = 'jupyter-dlc-panel';
    this.addClass('dlc-panel');
    this.title.caption = 'DLC jobs';

    const header = document.createElement('div');
    header.className = 'dlc-header';
    const h = document.createElement('div');
    h.className = 'dlc-title';
    h.textContent = 'DLC jobs';
    this.statusLine = document.createElement('div');
    this.statusLine.className = 'dlc-status';
    this.statusLine.setAttribute('role', 'status');
    const tools = document.createElement('div');
    tools.className = 'dlc-tools';
    this.filterSel = document.createElement('select');
    this.filterSel.className = 'dlc-filter';
    this.filterSel.title = 'Filter by state';
    for (const [v, label] of FILTER_STATES) {
      const o = document.createElement('option');
      o.value = v;
      o.textContent = label;
      this.filterSel.appendChild(o);
    }
    this.filterSel.onchange = () => host.dispatch({ type: 'filter', state: this.filterSel.value });
    this.search = document.createElement('input');
    this.search.type = 'search';
    this.search.className = 'dlc-search';
    this.search.placeholder = 'Search by name';
    this.search.oninput = () => host.dispatch({ type: 'filter', search: this.search.value });
    tools.append(this.filterSel, this.search);
    header.append(h, tools);

    this.list = new JobListView(id => host.dispatch({ type: 'select', id }));
    this.empty = document.createElement('div');
    this.empty.className = 'dlc-empty';
    this.listBox = document.createElement('div');
    this.listBox.className = 'dlc-listbox';
    this.pools = new PoolsView(host.api, () => this.isVisible);
    this.pools.start();
    this.listBox.append(header, this.pools.node, this.empty, this.list.node);

    this.node.append(this.statusLine, this.listBox);
    this.ageTimer = window.setInterval(() => {
      if (this.isVisible) {
        this.list.tick();
      }
    }, 30000);
    this.scheduleRender();
  }

  dispose(): void {
    window.clearInterval(this.ageTimer);
    this.pools.dispose();
    if (this.frame !== null) {
      cancelAnimationFrame(this.frame);
    }
    super.dispose();
  }

  /** The store changed: render on the next frame (many events → one render). */
  scheduleRender(): void {
    if (this.frame !== null || this.isDisposed) {
      return;
    }
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      this.render();
    });
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.host.onVisible();
    this.render();
  }

  private render(): void {
    const state = this.host.getState();
    const prev = this.rendered;
    this.rendered = state;
    // connection: one line
    const c = state.connection;
    this.statusLine.textContent = c.status === 'live' ? '' : c.message;
    this.statusLine.dataset.status = c.status;
    this.statusLine.style.display = c.status === 'live' ? 'none' : '';

    if (!this.isVisible && prev) {
      // hidden: keep the list cheap; render fully when shown (onAfterShow)
      return;
    }
    this.list.render(state);
    if (!prev || prev.jobs !== state.jobs || prev.filter !== state.filter) {
      const counts = stateCounts(state);
      for (const o of Array.from(this.filterSel.options)) {
        const base = FILTER_STATES.find(([v]) => v === o.value)?.[1] ?? o.value;
        const n = o.value === '' ? state.jobs.size : o.value === 'active' ? undefined : counts[o.value] ?? 0;
        o.textContent = n === undefined ? base : `${base} (${n})`;
      }
      if (this.filterSel.value !== state.filter.state) {
        this.filterSel.value = state.filter.state;
      }
      this.empty.textContent = !state.loaded
        ? ''
        : state.jobs.size === 0
          ? 'No jobs yet. Run a cell with %%dlc, or jupyter-dlc run SCRIPT.'
          : this.list.visibleCount === 0
            ? 'No job matches the filter.'
            : '';
    }
  }
}
