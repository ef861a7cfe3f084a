/**
 * A job's metric points for the detail tab: pushed over `/dlc/jobs/{id}/metrics/stream`
 * (the launcher sends each point as its report is stored), and polled from
 * `api/jobs/{id}/metrics?since=` while that stream is down. One JupyterLab `Poll` drives
 * both: each tick (re)opens the stream when it is not open and fetches what came since the
 * last seq; a failed fetch makes the Poll back off (1 s doubling to 30 s), and it stands by
 * while the page is hidden. While the stream is open the ticks do nothing.
 */
import { Poll } from '@lumino/polling';

import { DlcApi } from './api';
import { MetricPoint } from './charts';
import { SseParser } from './store';
import { components } from './wire';

export type Downsampled = components['schemas']['Downsampled'];

/** What the detail says under its charts once retention thinned older points; '' before. */
export function downsampledNote(d: Downsampled | null | undefined): string {
  if (!d || !d.until) {
    return '';
  }
  const until = new Date(d.until * 1000).toLocaleTimeString();
  return (
    `Points logged before ${until} are downsampled (min, max and last of every ${d.bucket_seconds} s, ` +
    `NaN kept) to keep this job's storage bounded; ${d.dropped.toLocaleString()} points thinned so far.`
  );
}

export type FeedStatus = 'connecting' | 'live' | 'polling';

export class MetricsFeed {
  status: FeedStatus = 'connecting';
  /** points that came by stream / by poll (tests read them through the DOM's data-*) */
  pushed = 0;
  polled = 0;
  private abort: AbortController | null = null;
  private poll: Poll;
  private disposed = false;

  constructor(
    private api: DlcApi,
    readonly id: string,
    private lastSeq: () => number,
    private onPoints: (points: MetricPoint[], downsampled: Downsampled | null) => void,
    private onStatus: (status: FeedStatus) => void
  ) {
    this.poll = new Poll({
      factory: () => this.tick(),
      frequency: { interval: 1000, backoff: true, max: 30000 },
      standby: 'when-hidden',
      name: `jupyter-dlc:metrics:${id}`
    });
  }

  dispose(): void {
    this.disposed = true;
    this.abort?.abort();
    this.poll.dispose();
  }

  /** Drop the stream as a network failure would (tests, through window.jupyterDlc). */
  cut(): void {
    this.abort?.abort();
  }

  private setStatus(status: FeedStatus): void {
    if (this.status !== status) {
      this.status = status;
      this.onStatus(status);
    }
  }

  private async tick(): Promise<void> {
    if (this.disposed || this.abort) {
      return; // the stream is open: it brings the points
    }
    void this.follow();
    // what came while the stream was down (or before it opened); a failure backs off
    const answer = await this.api.sub(this.id, 'metrics', { since: this.lastSeq() });
    const fresh = answer.points.filter(p => p.seq > this.lastSeq());
    this.polled += fresh.length;
    this.onPoints(fresh, answer.downsampled ?? null);
  }

  private async follow(): Promise<void> {
    const abort = new AbortController();
    this.abort = abort;
    let wasLive = false;
    try {
      const reader = await this.api.openStream(abort.signal, `jobs/${encodeURIComponent(this.id)}/metrics/stream`, {
        since: this.lastSeq()
      });
      this.setStatus('live');
      wasLive = true;
      const parser = new SseParser();
      const decoder = new TextDecoder();
      let ended = false;
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        for (const ev of parser.feed(decoder.decode(value, { stream: true }))) {
          if (ev.event === 'metrics') {
            const data = JSON.parse(ev.data) as { points: MetricPoint[]; downsampled?: Downsampled | null };
            const fresh = data.points.filter(p => p.seq > this.lastSeq());
            this.pushed += fresh.length;
            this.onPoints(fresh, data.downsampled ?? null);
          } else if (ev.event === 'launcher') {
            ended = true; // the relay says the launcher went away
          }
        }
      }
    } catch {
      // refused, cut, aborted: poll until the next tick reopens it
    } finally {
      if (this.abort === abort) {
        this.abort = null;
      }
      if (!this.disposed) {
        this.setStatus('polling');
        if (wasLive) {
          void this.poll.refresh(); // fetch the gap now; a refused stream waits for the next tick
        }
      }
    }
  }
}
