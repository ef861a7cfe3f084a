/**
 * jupyter-dlc JupyterLab extension: the "DLC jobs" side panel, and notifications when a
 * job fails, finishes or raises an alert (also while the panel is closed).
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { DlcApi, LiveFeed } from './api';
import { loadBokehJS } from './bokehjs';
import { CompareTab, compareTabId } from './compareview';
import { DetailTab, detailTabId } from './detailtab';
import { DlcPanel } from './panel';
import { Action, Notice, State, initialState, reduce } from './store';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
<g class="jp-icon3" fill="#616161"><rect x="1" y="2" width="6" height="5" rx="1"/><rect x="9" y="2" width="6" height="5" rx="1"/>
<rect x="1" y="9" width="6" height="5" rx="1"/><rect x="9" y="9" width="6" height="5" rx="1"/></g></svg>`;

export const dlcIcon = new LabIcon({ name: 'jupyter-dlc:jobs', svgstr: ICON_SVG });

const COMMAND_OPEN = 'jupyter-dlc:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-dlc:plugin',
  description: 'DLC jobs panel: every job of the launcher, live',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, labShell: ILabShell | null) => {
    const api = new DlcApi(app.serviceManager.serverSettings);
    // The notebook job views draw with BokehJS, served by our server extension (no CDN).
    loadBokehJS(app.serviceManager.serverSettings.baseUrl).catch(error =>
      console.warn('jupyter-dlc: BokehJS could not be loaded; job charts stay empty', error)
    );
    let state: State = initialState();
    let panel: DlcPanel | null = null;
    const tabs = new Map<string, DetailTab>();

    /** A job's detail: its main-area tab, opened or brought forward. */
    const openDetail = (id: string) => {
      const entry = state.jobs.get(id);
      if (!entry) {
        return;
      }
      let tab = tabs.get(id);
      if (!tab || tab.isDisposed) {
        tab = new DetailTab(
          {
            api,
            select: other => dispatch({ type: 'select', id: other }),
            removed: gone => dispatch({ type: 'removed', id: gone }),
            openPath: async path => {
              await app.commands.execute('docmanager:open', { path });
            },
            appendCell: (path, text) => appendCell(app, path, text),
            jobs: () => [...state.jobs.values()].map(e => e.job),
            compare: ids => openCompare(ids)
          },
          entry
        );
        tabs.set(id, tab);
        tab.disposed.connect(() => {
          if (tabs.get(id) === tab) {
            tabs.delete(id);
          }
        });
        // beside what the user works on (the notebook that runs the job); later details
        // open as tabs next to the first one
        const other = [...tabs.values()].find(t => t !== tab && !t.isDisposed && t.isAttached);
        app.shell.add(tab, 'main', other ? { mode: 'tab-after', ref: other.id } : { mode: 'split-right' });
      }
      app.shell.activateById(detailTabId(id));
    };

    /** Jobs side by side: a main-area tab of their own (compareview.ts). */
    const openCompare = (ids: string[]) => {
      const id = compareTabId(ids);
      if (!document.getElementById(id)) {
        app.shell.add(new CompareTab(api, ids), 'main', { mode: 'split-bottom' });
      }
      app.shell.activateById(id);
    };

    const notify = (n: Notice) => {
      const actions = [
        {
          label: 'Show',
          callback: () => {
            dispatch({ type: 'select', id: n.jobId });
            void app.commands.execute(COMMAND_OPEN);
          }
        }
      ];
      const options = { autoClose: n.kind === 'success' ? (5000 as const) : (false as const), actions };
      if (n.kind === 'error') {
        Notification.error(n.message, options);
      } else if (n.kind === 'warning') {
        Notification.warning(n.message, options);
      } else if (n.kind === 'success') {
        Notification.success(n.message, options);
      } else {
        Notification.info(n.message, options);
      }
    };

    const dispatch = (a: Action) => {
      const r = reduce(state, a);
      const changed = r.state !== state;
      const before = state;
      state = r.state;
      r.notices.forEach(notify);
      if (changed) {
        panel?.scheduleRender();
        for (const [id, tab] of tabs) {
          const entry = state.jobs.get(id);
          if (!entry) {
            tab.close(); // the job was deleted
          } else if (entry !== before.jobs.get(id)) {
            tab.update_(entry);
          }
        }
      }
      if (a.type === 'select' && a.id) {
        openDetail(a.id);
      }
    };

    const feed = new LiveFeed(api, dispatch, () => !panel || !panel.isVisible);

    panel = new DlcPanel({
      api,
      getState: () => state,
      dispatch,
      openPath: async path => {
        await app.commands.execute('docmanager:open', { path });
      },
      onVisible: () => feed.poke()
    });
    panel.title.icon = dlcIcon;
    app.shell.add(panel, 'left', { rank: 600 });

    app.commands.addCommand(COMMAND_OPEN, {
      label: 'Show DLC jobs',
      execute: () => {
        if (panel) {
          app.shell.activateById(panel.id);
        }
      }
    });
    feed.start();
    // for tests and debugging in the browser console
    (window as Window & { jupyterDlc?: unknown }).jupyterDlc = {
      getState: () => state,
      dispatch,
      feed: (id: string) => tabs.get(id)?.view.feed ?? null
    };
    void labShell;
  }
};

export default plugin;


/** What appendCell needs of a notebook panel (JupyterLab's NotebookPanel), without
 * depending on @jupyterlab/notebook at build time: it is there at run time. */
interface NotebookLike {
  context: { ready: Promise<void> };
  content: {
    model: { sharedModel: { insertCell(index: number, cell: { cell_type: string; source: string }): void };
      cells: { length: number } } | null;
    activeCellIndex: number;
    scrollToItem?(index: number): Promise<void>;
  };
}

/** Open the notebook at `path` (a new untitled one when null), append a code cell holding
 * `text` and make it the active cell: "Branch from here" in the job detail. */
async function appendCell(app: JupyterFrontEnd, path: string | null, text: string): Promise<void> {
  let target = path;
  if (target === null) {
    const created = (await app.commands.execute('docmanager:new-untitled', { type: 'notebook', path: '' })) as {
      path: string;
    };
    target = created.path;
  }
  const panel = (await app.commands.execute('docmanager:open', { path: target })) as NotebookLike;
  await panel.context.ready;
  const model = panel.content.model;
  if (!model) {
    throw new Error(`${target} did not open as a notebook`);
  }
  const index = model.cells.length;
  model.sharedModel.insertCell(index, { cell_type: 'code', source: text });
  panel.content.activeCellIndex = index;
  await panel.content.scrollToItem?.(index);
}
