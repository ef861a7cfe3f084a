/**
 * BokehJS for the job view's charts, from our Jupyter server extension: never a CDN, never
 * inlined into the notebook.
 *
 * The job view's charts are `jupyter_bokeh.BokehModel` widgets; their view calls
 * `window.Bokeh.require(...)` as soon as it is created, so BokehJS must be on the page
 * before a notebook's widgets render. The server extension serves the installed bokeh
 * package's files at `{baseUrl}dlc/static/bokeh/<file>` (same origin, so the Jupyter login
 * cookie authorises them). `loadBokehJS` adds the script tags once per page, in order
 * (the core bundle defines `window.Bokeh`, the plugins register into it), and resolves once
 * they have all run. Calling it again returns the same promise; a page where BokehJS is
 * already loaded (by another extension) is left alone.
 *
 * Once loaded, the body gets the class `dlc-bokehjs-loaded`, which hides the job view's
 * "charts need BokehJS" note (`.dlc-needs-bokehjs`). Front ends without this extension keep
 * the note, and the view's text parts, which need no BokehJS.
 *
 * Either way, once BokehJS is there the job view's charts stop echoing back to the kernel
 * (chartechoes.ts says why); they stop asking the page's CSS for their styles, their legends
 * stop being rebuilt at every point, and BokehJS stops rewriting a stylesheet with the text
 * it holds (chartstyles.ts).
 */
import { BokehRequire, muteChartEchoes } from './chartechoes';
import { keepJobChartLegends, keepUnchangedStyleSheets, skipChartCssLookups } from './chartstyles';

/** The bundles loaded, in order: core first, then plugins other BokehModels may use.
 * bokeh-mathjax (1.8 MB) is left out: no job-view chart renders LaTeX. */
export const BOKEH_BUNDLES = ['bokeh', 'bokeh-gl', 'bokeh-widgets', 'bokeh-tables'];

export const LOADED_CLASS = 'dlc-bokehjs-loaded';
const STYLE_ID = 'dlc-bokehjs-style';
const SCRIPT_ATTR = 'data-dlc-bokehjs';
const TIMEOUT_MS = 60000;

let loading: Promise<void> | null = null;

/** `{baseUrl}dlc/static/bokeh/<bundle>.min.js`; baseUrl as PageConfig.getBaseUrl() gives it. */
export function bokehUrl(baseUrl: string, bundle: string): string {
  const base = baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`;
  return `${base}dlc/static/bokeh/${bundle}.min.js`;
}

function bokehDefined(): boolean {
  return typeof (window as Window & { Bokeh?: unknown }).Bokeh !== 'undefined';
}

function markLoaded(): void {
  const bokeh = (window as Window & { Bokeh?: Partial<BokehRequire> }).Bokeh;
  if (bokeh && typeof bokeh.require === 'function') {
    // Each shim on its own: on an unexpected BokehJS the charts still work, only as BokehJS
    // has them (each draw echoed back, or drawn at the cost chartstyles.ts describes).
    const shims: [string, (b: BokehRequire) => boolean][] = [
      ["mute the job charts' echoes", muteChartEchoes],
      ["spare the job charts' CSS lookups", skipChartCssLookups],
      ['keep unchanged stylesheets', keepUnchangedStyleSheets],
      ["keep the job charts' legends", keepJobChartLegends]
    ];
    for (const [what, install] of shims) {
      try {
        install(bokeh as BokehRequire);
      } catch (error) {
        console.warn(`jupyter-dlc: could not ${what}`, error);
      }
    }
  }
  document.body.classList.add(LOADED_CLASS);
  if (!document.getElementById(STYLE_ID)) {
    const style = document.createElement('style');
    style.id = STYLE_ID;
    style.textContent = `body.${LOADED_CLASS} .dlc-needs-bokehjs { display: none; }`;
    document.head.appendChild(style);
  }
}

function addScript(src: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const existing = document.querySelector<HTMLScriptElement>(`script[${SCRIPT_ATTR}="${src}"]`);
    if (existing && existing.dataset.loaded === 'true') {
      resolve();
      return;
    }
    const script = existing ?? document.createElement('script');
    const timer = window.setTimeout(
      () => reject(new Error(`BokehJS: ${src} did not load within ${TIMEOUT_MS / 1000}s`)),
      TIMEOUT_MS
    );
    script.addEventListener('load', () => {
      window.clearTimeout(timer);
      script.dataset.loaded = 'true';
      resolve();
    });
    script.addEventListener('error', () => {
      window.clearTimeout(timer);
      script.remove(); // a later call tries again with a fresh tag
      reject(
        new Error(
          `BokehJS: could not load ${src}; is the jupyter_dlc server extension enabled? ` +
            '(jupyter server extension list)'
        )
      );
    });
    if (!existing) {
      script.src = src;
      script.async = false; // keep the order: core before plugins
      script.setAttribute(SCRIPT_ATTR, src);
      document.head.appendChild(script);
    }
  });
}

/**
 * Inject BokehJS from `{baseUrl}dlc/static/bokeh/` once per page; resolves when
 * `window.Bokeh` is defined and every bundle has run. Rejects (and allows a retry) when a
 * file cannot be loaded.
 */
export async function loadBokehJS(baseUrl: string): Promise<void> {
  if (loading) {
    return loading;
  }
  if (bokehDefined() && !document.querySelector(`script[${SCRIPT_ATTR}]`)) {
    markLoaded(); // someone else's BokehJS: use it rather than load a second copy
    return;
  }
  loading = (async () => {
    for (const bundle of BOKEH_BUNDLES) {
      await addScript(bokehUrl(baseUrl, bundle));
      if (bundle === 'bokeh' && !bokehDefined()) {
        throw new Error(`BokehJS: ${bokehUrl(baseUrl, bundle)} ran but did not define window.Bokeh`);
      }
    }
    markLoaded();
  })();
  try {
    await loading;
  } catch (error) {
    loading = null;
    throw error;
  }
}
