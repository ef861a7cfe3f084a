/**
 * A job's detail as a tab in JupyterLab's main area (as dask-labextension's dashboards):
 * one tab per job, opened from the sidebar list or a notification, closable; it wraps the
 * DetailView, whose charts follow the job's pushed metric points while the tab is open.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { DlcApi } from './api';
import { DetailView } from './detail';
import { JobEntry, JobSummary } from './store';

export interface DetailTabHost {
  api: DlcApi;
  select(id: string): void;
  removed(id: string): void;
  openPath(path: string): Promise<void>;
  appendCell(path: string | null, text: string): Promise<void>;
  jobs(): JobSummary[];
  compare(ids: string[]): void;
}

export function detailTabId(jobId: string): string {
  return `jupyter-dlc-job-${jobId.replace(/[^A-Za-z0-9_-]/g, '_')}`;
}

export class DetailTab extends Widget {
  readonly view: DetailView;

  constructor(host: DetailTabHost, entry: JobEntry) {
    super();
    this.id = detailTabId(entry.job.id);
    this.addClass('dlc-detail-tab');
    this.title.closable = true;
    this.view = new DetailView({
      api: host.api,
      back: () => this.close(),
      select: id => host.select(id),
      removed: id => host.removed(id),
      openPath: path => host.openPath(path),
      appendCell: (path, text) => host.appendCell(path, text),
      jobs: () => host.jobs(),
      compare: ids => host.compare(ids),
      isVisible: () => this.isVisible
    });
    this.node.appendChild(this.view.node);
    this.update_(entry);
    this.view.show(entry);
  }

  /** The job's summary changed. */
  update_(entry: JobEntry): void {
    this.title.label = `DLC: ${entry.job.name}`;
    this.title.caption = `${entry.job.name} (${entry.job.id}): ${entry.job.state}`;
    if (this.view && this.view.jobId === entry.job.id) {
      this.view.update(entry);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.view.refresh(true);
  }

  dispose(): void {
    this.view.hide();
    super.dispose();
  }
}
