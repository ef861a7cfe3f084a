/**
 * Warm pools in the side panel: one row per pool (shape, state, jobs served, node-hours held)
 * with a Release button. Polls `GET /dlc/api/pools` while the panel shows; Release is
 * `DELETE /dlc/api/pools/{id}`. Pools change rarely (pool up, a job, idle release): a poll
 * every few seconds is enough, and keeps the event stream about jobs only.
 */
import { Schemas } from './store';

export type Pool = Schemas['Pool'];

/** What the view needs from the launcher (DlcApi in the panel). */
export interface PoolSource {
  request<T>(method: string, path: string): Promise<T>;
}

export const POOL_POLL_MS = 5000;

/** One line of text for a pool, as `pool status` prints its columns. */
export function poolLine(pool: Pool): string {
  const what = pool.state === 'busy' && pool.job ? `busy with ${pool.job}` : pool.state;
  return `${pool.id}: ${what}, ${pool.jobs_served} served, ${pool.node_hours.toFixed(2)} node-h`;
}

export class PoolsView {
  readonly node: HTMLElement;
  private timer: number | null = null;
  private error = ''; // a failed Release, shown once with the next render

  constructor(
    private source: PoolSource,
    private isVisible: () => boolean = () => true
  ) {
    this.node = document.createElement('div');
    this.node.className = 'dlc-pools';
  }

  /** Poll while the panel shows; the first fetch at once. */
  start(): void {
    if (this.timer === null) {
      void this.refresh();
      this.timer = window.setInterval(() => {
        if (this.isVisible()) {
          void this.refresh();
        }
      }, POOL_POLL_MS);
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
  }

  async refresh(): Promise<void> {
    let pools: Pool[] = [];
    try {
      pools = (await this.source.request<Schemas['Pools']>('GET', 'api/pools')).pools;
    } catch {
      // The panel's status line already says when the launcher cannot be reached.
    }
    this.render(pools);
    this.error = '';
  }

  async release(id: string): Promise<void> {
    try {
      await this.source.request<Schemas['Released']>('DELETE', `api/pools/${encodeURIComponent(id)}`);
    } catch (e) {
      this.error = (e as Error).message;
    }
    await this.refresh();
  }

  render(pools: Pool[]): void {
    this.node.replaceChildren();
    this.node.hidden = pools.length === 0 && !this.error;
    if (this.node.hidden) {
      return;
    }
    const title = document.createElement('div');
    title.className = 'dlc-pools-title';
    title.textContent = 'Warm pools';
    this.node.append(title);
    for (const pool of pools) {
      const row = document.createElement('div');
      row.className = 'dlc-pool';
      row.dataset.poolId = pool.id;
      const text = document.createElement('span');
      text.textContent = poolLine(pool);
      const button = document.createElement('button');
      button.className = 'dlc-pool-release';
      button.textContent = 'Release';
      button.title = `Release ${pool.id}: its agents exit (a job running on it keeps running)`;
      button.onclick = () => {
        button.disabled = true;
        void this.release(pool.id);
      };
      row.append(text, button);
      this.node.append(row);
    }
    if (this.error) {
      const line = document.createElement('div');
      line.className = 'dlc-pools-error';
      line.textContent = `pools: ${this.error}`;
      this.node.append(line);
    }
  }
}
