import { BOKEH_BUNDLES, LOADED_CLASS, bokehUrl, loadBokehJS } from '../src/bokehjs';

type WithBokeh = Window & { Bokeh?: { version: string } };

// jsdom does not fetch scripts: the test plays the browser, firing load/error on each tag.
function tags(): HTMLScriptElement[] {
  return Array.from(document.querySelectorAll<HTMLScriptElement>('script[data-dlc-bokehjs]'));
}

async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}

async function loadEach(fail?: string): Promise<void> {
  for (let i = 0; i < BOKEH_BUNDLES.length; i++) {
    await settle();
    const tag = tags()[i];
    expect(tag).toBeDefined();
    if (fail && tag.src.endsWith(`${fail}.min.js`)) {
      tag.dispatchEvent(new Event('error'));
      return;
    }
    if (i === 0) {
      (window as WithBokeh).Bokeh = { version: 'test' };
    }
    tag.dispatchEvent(new Event('load'));
  }
}

beforeEach(() => {
  jest.resetModules();
  document.head.innerHTML = '';
  document.body.className = '';
  delete (window as WithBokeh).Bokeh;
});

test('the URL is under {baseUrl}dlc/static/bokeh/', () => {
  expect(bokehUrl('/user/a/', 'bokeh')).toBe('/user/a/dlc/static/bokeh/bokeh.min.js');
  expect(bokehUrl('http://h:8888', 'bokeh-widgets')).toBe(
    'http://h:8888/dlc/static/bokeh/bokeh-widgets.min.js'
  );
});

test('loads core then plugins, in order, once per page', async () => {
  const { loadBokehJS: load } = await import('../src/bokehjs');
  const first = load('/base/');
  const second = load('/base/');
  await loadEach();
  await Promise.all([first, second]);
  expect(tags().map(t => t.getAttribute('data-dlc-bokehjs'))).toEqual(
    BOKEH_BUNDLES.map(b => `/base/dlc/static/bokeh/${b}.min.js`)
  );
  expect(tags().every(t => t.async === false)).toBe(true);
  expect(document.body.classList.contains(LOADED_CLASS)).toBe(true);
  expect(document.getElementById('dlc-bokehjs-style')?.textContent).toContain('.dlc-needs-bokehjs');
  await load('/base/');
  expect(tags()).toHaveLength(BOKEH_BUNDLES.length);
});

test('a failed file rejects with the route, and a later call retries', async () => {
  const { loadBokehJS: load } = await import('../src/bokehjs');
  const attempt = load('/');
  const failing = loadEach('bokeh');
  await expect(attempt).rejects.toThrow('/dlc/static/bokeh/bokeh.min.js');
  await failing;
  expect(tags()).toHaveLength(0);
  expect(document.body.classList.contains(LOADED_CLASS)).toBe(false);
  const retry = load('/');
  await loadEach();
  await retry;
  expect(document.body.classList.contains(LOADED_CLASS)).toBe(true);
});

test('an existing window.Bokeh from elsewhere is used as is', async () => {
  (window as WithBokeh).Bokeh = { version: 'other' };
  await loadBokehJS('/');
  expect(tags()).toHaveLength(0);
  expect(document.body.classList.contains(LOADED_CLASS)).toBe(true);
});
