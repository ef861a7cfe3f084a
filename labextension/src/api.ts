/**
 * Talking to `{base_url}/dlc/` (the server extension), with Jupyter's auth, and keeping the
 * store fed: the event stream while it works, a list poll with backoff while it does not.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { RankQuery } from './rankpager';
import { Action, JobDetail, Schemas, SseParser, backoffMs, streamAction } from './store';

/** `GET /api/jobs/{job}/<what>` → its answer, as the launcher's OpenAPI document types it. */
export interface SubRoutes {
  metrics: Schemas['Metrics'];
  logs: Schemas['Logs'];
  events: Schemas['Events'];
  checkpoints: Schemas['Checkpoints'];
  diagnosis: Schemas['Diagnoses'];
  goodput: Schemas['Goodput'];
  alerts: Schemas['Alerts'];
  script: Schemas['Script'];
}

/** `POST /api/jobs/{job}/<what>` → its body. */
export interface ActionBodies {
  stop: Schemas['StopBody'];
  resume: Schemas['ResumeBody'];
  clone: Schemas['EmptyBody'];
}

export class DlcError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

export class DlcApi {
  readonly settings: ServerConnection.ISettings;

  constructor(settings?: ServerConnection.ISettings) {
    this.settings = settings ?? ServerConnection.makeSettings();
  }

  url(path: string, params?: Record<string, string | number | undefined>): string {
    let url = URLExt.join(this.settings.baseUrl, 'dlc', path);
    if (params) {
      const q = Object.entries(params)
        .filter(([, v]) => v !== undefined && v !== '')
        .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`)
        .join('&');
      if (q) {
        url += '?' + q;
      }
    }
    return url;
  }

  async request<T>(
    method: string,
    path: string,
    body?: unknown,
    params?: Record<string, string | number | undefined>
  ): Promise<T> {
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let resp: Response;
    try {
      resp = await ServerConnection.makeRequest(this.url(path, params), init, this.settings);
    } catch (e) {
      throw new DlcError(0, `Jupyter server unreachable (${(e as Error).message})`);
    }
    if (resp.status === 204) {
      return undefined as unknown as T;
    }
    const text = await resp.text();
    let data: unknown = undefined;
    try {
      data = text ? JSON.parse(text) : undefined;
    } catch {
      data = { error: text.slice(0, 200) };
    }
    if (!resp.ok) {
      const err = (data ?? {}) as { error?: unknown; message?: unknown };
      throw new DlcError(resp.status, String(err.error ?? err.message ?? resp.statusText));
    }
    return data as T;
  }

  jobs(): Promise<Schemas['JobList']> {
    return this.request('GET', 'api/jobs');
  }

  /** A job's detail; with `ranks`, only that page of its ranks and `rank_page` (rankpager.ts). */
  job(id: string, ranks?: RankQuery): Promise<JobDetail> {
    return this.request('GET', `api/jobs/${encodeURIComponent(id)}`, undefined, ranks);
  }

  sub<K extends keyof SubRoutes>(
    id: string,
    what: K,
    params?: Record<string, string | number | undefined>
  ): Promise<SubRoutes[K]> {
    return this.request('GET', `api/jobs/${encodeURIComponent(id)}/${what}`, undefined, params);
  }

  action<K extends keyof ActionBodies>(id: string, what: K, body: ActionBodies[K]): Promise<JobDetail> {
    return this.request('POST', `api/jobs/${encodeURIComponent(id)}/${what}`, body);
  }

  remove(id: string): Promise<void> {
    return this.request('DELETE', `api/jobs/${encodeURIComponent(id)}`);
  }

  /** Open an event stream (the summaries by default, or `jobs/{id}/metrics/stream`);
   * resolves once the relay answered 200, with a reader of its body. */
  async openStream(
    signal: AbortSignal,
    path = 'stream',
    params?: Record<string, string | number | undefined>
  ): Promise<ReadableStreamDefaultReader<Uint8Array>> {
    let resp: Response;
    try {
      resp = await ServerConnection.makeRequest(
        this.url(path, params),
        { method: 'GET', signal, headers: { Accept: 'text/event-stream' }, cache: 'no-store' },
        this.settings
      );
    } catch (e) {
      throw new DlcError(0, `Jupyter server unreachable (${(e as Error).message})`);
    }
    if (!resp.ok || !resp.body) {
      let msg = resp.statusText;
      try {
        const data = await resp.json();
        msg = data.error ?? data.message ?? msg;
      } catch {
        // not JSON
      }
      throw new DlcError(resp.status, msg);
    }
    return resp.body.getReader();
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function describe(e: unknown): string {
  if (e instanceof DlcError) {
    if (e.status === 0) {
      return e.message;
    }
    if (e.status === 403) {
      return 'Not allowed by the Jupyter server (403): log in again.';
    }
    if (e.status === 404) {
      return 'The jupyter-dlc server extension is not enabled on this Jupyter server.';
    }
    return `Launcher unreachable (${e.status}: ${e.message})`;
  }
  return `Launcher unreachable (${(e as Error)?.message ?? e})`;
}

/**
 * Keeps the store current: opens the stream, loads the list, applies events; when the
 * stream fails, polls the list with backoff (slower while the panel is hidden) and tries the
 * stream again. Runs while JupyterLab is open, so notifications arrive with the panel closed.
 */
export class LiveFeed {
  private abort: AbortController | null = null;
  private stopped = false;
  private wake: (() => void) | null = null;
  private attempt = 0;

  constructor(
    private api: DlcApi,
    private dispatch: (a: Action) => void,
    private isHidden: () => boolean
  ) {}

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    this.abort?.abort();
    this.wake?.();
  }

  /** Retry now (e.g. the panel became visible). */
  poke(): void {
    this.wake?.();
  }

  private sleep(ms: number): Promise<void> {
    return new Promise(resolve => {
      const t = setTimeout(done, ms);
      function done() {
        clearTimeout(t);
        resolve();
      }
      this.wake = done;
    });
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      this.abort = new AbortController();
      let streamed = false;
      try {
        const reader = await this.api.openStream(this.abort.signal);
        // stream first, then the list: nothing that changes in between is lost
        const { jobs } = await this.api.jobs();
        this.dispatch({ type: 'snapshot', jobs });
        this.dispatch({ type: 'connection', status: 'live' });
        this.attempt = 0;
        streamed = true;
        const ended = await this.consume(reader);
        if (this.stopped) {
          return;
        }
        this.dispatch({
          type: 'connection',
          status: 'down',
          message: ended ?? 'Launcher stream ended; reconnecting…'
        });
      } catch (e) {
        if (this.stopped) {
          return;
        }
        // the stream is out; is the list at least there?
        try {
          const { jobs } = await this.api.jobs();
          this.dispatch({ type: 'snapshot', jobs });
          this.dispatch({
            type: 'connection',
            status: 'polling',
            message: `Live updates unavailable (${(e as Error).message}); polling.`
          });
        } catch (e2) {
          this.dispatch({ type: 'connection', status: 'down', message: describe(e2) + ' Retrying…' });
        }
      } finally {
        this.abort.abort();
      }
      const wait = streamed ? 500 : backoffMs(this.attempt++, this.isHidden());
      await this.sleep(wait);
    }
  }

  /** Read SSE until the stream ends; returns the launcher's reason when it said one. */
  private async consume(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<string | null> {
    const parser = new SseParser();
    const decoder = new TextDecoder();
    let reason: string | null = null;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        for (const ev of parser.feed(decoder.decode(value, { stream: true }))) {
          const action = streamAction(ev.event, ev.data);
          if (action) {
            this.dispatch(action);
          } else if (ev.event === 'launcher') {
            const data = safeJson(ev.data) as { state?: string; reason?: string } | null;
            if (data?.state === 'down') {
              reason = `Launcher down or restarting (${data.reason ?? 'stream ended'}); reconnecting…`;
            }
          }
        }
      }
    } catch (e) {
      if (!this.stopped) {
        reason = `Lost the connection (${(e as Error).message}); reconnecting…`;
      }
    }
    return reason;
  }
}
