/**
 * A job's metric points for the detail tab: pushed over `/dlc/jobs/{id}/metrics/stream`
 * (the launcher sends each point as its report is stored), and polled from
 * `api/jobs/{id}/metrics?since=` while that stream is down. One JupyterLab `Poll` drives
 * both: each tick (re)opens the stream when it is not open and fetches what came since the
 * last seq; a failed fetch makes the Poll back off (1 s doubling to 30 s), and it stands by
 * while the page is hidden. While the stream is open the ticks do nothing. Past 8 ranks both
 * read with `band=1&ranks=<outlier ranks>` (bands.ts JobMetrics says which answers apply);
 * the stream is reopened from the last seq applied when the outlier ranks change, or when a
 * poll applied its span first (its next rows would be added twice).
 */
import { Poll } from '@lumino/polling';

import { DlcApi } from './api';
import { JobMetrics, Metrics, MetricsQuery, Taken } from './bands';
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
  /** values that came by stream / by poll: points, and past 8 ranks the values folded in the
   * band rows (tests read them through the DOM's data-*) */
  pushed = 0;
  polled = 0;
  /** times the stream was reopened to ask for other outlier ranks, or to get back in step */
  reopened = 0;
  private abort: AbortController | null = null;
  private poll: Poll;
  private disposed = false;

  constructor(
    private api: DlcApi,
    readonly id: string,
    private metrics: JobMetrics,
    private onTaken: (taken: Taken, downsampled: Downsampled | null) => void,
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

  /** The query of the next read (tests, through window.jupyterDlc). */
  query(): MetricsQuery {
    return this.metrics.query();
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
    const since = this.metrics.lastSeq;
    const query = this.metrics.query();
    const answer = await this.api.sub(this.id, 'metrics', { since, ...query });
    if (this.disposed) {
      return;
    }
    // out of step (the stream was first, or the outliers changed): the stream or the next
    // tick reads it again
    const taken = this.metrics.take(answer, since, query);
    this.polled += taken.values;
    this.onTaken(taken, answer.downsampled ?? null);
  }

  private async follow(): Promise<void> {
    const abort = new AbortController();
    this.abort = abort;
    let wasLive = false;
    let reopen = false;
    try {
      let since = this.metrics.lastSeq;
      const query = this.metrics.query();
      const reader = await this.api.openStream(abort.signal, `jobs/${encodeURIComponent(this.id)}/metrics/stream`, {
        since,
        ...query
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
            // each page starts where the one before it ended
            const page = JSON.parse(ev.data) as Metrics;
            const taken = this.metrics.take(page, since, query);
            since = page.last_seq;
            this.pushed += taken.values;
            this.onTaken(taken, page.downsampled ?? null);
            if (taken.outOfStep || this.metrics.query().ranks !== query.ranks) {
              // new outliers to ask for, or a poll applied this span first: read on from the
              // last seq applied, with the ranks of now
              reopen = true;
              ended = true;
              break;
            }
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
      abort.abort(); // ends the request when we stopped reading it
      if (!this.disposed) {
        if (reopen) {
          this.reopened += 1;
          void this.follow();
        } else {
          this.setStatus('polling');
          if (wasLive) {
            void this.poll.refresh(); // fetch the gap now; a refused stream waits for the next tick
          }
        }
      }
    }
  }
}
