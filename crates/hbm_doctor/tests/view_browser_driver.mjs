// Drives headless Chromium over the DevTools protocol with Node's built-in WebSocket (Node 20+
// with --experimental-websocket, 22+ without): loads a `hbm-doctor view` page, records every
// network request, clicks like a person, and prints what it saw as one JSON object.
// usage: node --experimental-websocket driver.mjs CHROMIUM PAGE.html SHOT.png SCENARIO
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [chromium, page, shot, scenario] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'hbm-view-chromium-'));
const chrome = spawn(chromium, [
  '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--disable-quic', '--hide-scrollbars',
  '--user-data-dir=' + profile, '--remote-debugging-port=0', '--window-size=1400,1000', 'about:blank',
], { stdio: ['ignore', 'ignore', 'pipe'] });
const deadline = setTimeout(() => { finish({ fatal: 'timeout after 90 s' }); }, 90000);
let done = false;
function finish(out) {
  if (done) return;
  done = true;
  clearTimeout(deadline);
  process.stdout.write(JSON.stringify(out) + '\n');
  try { chrome.kill('SIGKILL'); } catch (e) { /* gone */ }
  setTimeout(() => { try { rmSync(profile, { recursive: true, force: true }); } catch (e) { /* busy */ } process.exit(0); }, 300);
}
const wsUrl = await new Promise((resolve, reject) => {
  let buf = '';
  chrome.stderr.on('data', (d) => {
    buf += d.toString();
    const m = buf.match(/DevTools listening on (ws:\/\/\S+)/);
    if (m) resolve(m[1]);
  });
  chrome.on('exit', (c) => reject(new Error('chromium exited ' + c + ': ' + buf.slice(-2000))));
}).catch((e) => { finish({ fatal: String(e) }); return null; });
if (!wsUrl) await new Promise(() => {});

const ws = new WebSocket(wsUrl);
await new Promise((r) => ws.addEventListener('open', r, { once: true }));
let nextId = 1;
const pending = new Map();
const requests = [];
const exceptions = [];
const consoleErrors = [];
let loaded = false;
ws.addEventListener('message', (ev) => {
  const msg = JSON.parse(ev.data);
  if (msg.id && pending.has(msg.id)) {
    const { resolve, reject } = pending.get(msg.id);
    pending.delete(msg.id);
    if (msg.error) reject(new Error(JSON.stringify(msg.error))); else resolve(msg.result);
    return;
  }
  if (msg.method === 'Network.requestWillBeSent') requests.push(msg.params.request.url);
  if (msg.method === 'Runtime.exceptionThrown') exceptions.push(msg.params.exceptionDetails.exception ? msg.params.exceptionDetails.exception.description : msg.params.exceptionDetails.text);
  if (msg.method === 'Runtime.consoleAPICalled' && msg.params.type === 'error') consoleErrors.push(msg.params.args.map((a) => a.value || a.description).join(' '));
  if (msg.method === 'Page.loadEventFired') loaded = true;
});
let session = null;
function send(method, params = {}) {
  const id = nextId++;
  const m = { id, method, params };
  if (session) m.sessionId = session;
  ws.send(JSON.stringify(m));
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function evaluate(expr) {
  const r = await send('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true });
  if (r.exceptionDetails) throw new Error('evaluate failed: ' + expr + ': ' + JSON.stringify(r.exceptionDetails));
  return r.result.value;
}
async function click(x, y) {
  await send('Input.dispatchMouseEvent', { type: 'mouseMoved', x, y });
  await send('Input.dispatchMouseEvent', { type: 'mousePressed', x, y, button: 'left', clickCount: 1 });
  await send('Input.dispatchMouseEvent', { type: 'mouseReleased', x, y, button: 'left', clickCount: 1 });
  await sleep(50);
}
async function clickRect(r) { await click(r.x + Math.min(r.width / 2, 40), r.y + r.height / 2); }

try {
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
  session = (await send('Target.attachToTarget', { targetId, flatten: true })).sessionId;
  await send('Network.enable');
  await send('Page.enable');
  await send('Runtime.enable');
  const t0 = Date.now();
  await send('Page.navigate', { url: pathToFileURL(page).href });
  let ready = null;
  for (let i = 0; i < 1200; i++) {
    ready = await evaluate('document.documentElement.dataset.ready || null').catch(() => null);
    if (ready) break;
    await sleep(50);
  }
  const loadMs = Date.now() - t0;
  const out = { ready, load_ms: loadMs, scenario };
  const snapshot = `(() => {
    const q = (s) => document.querySelector(s);
    const fig = (id) => { const e = q('#fig-' + id + ' .v'); return e ? { bytes: Number(e.dataset.bytes), text: e.textContent } : null; };
    const c = q('#chart');
    const px = (x, y) => { const g = c.getContext('2d'), d = window.devicePixelRatio || 1; return Array.from(g.getImageData(Math.round(x * d), Math.round(y * d), 1, 1).data); };
    const peakX = Number(c.dataset.peakX), peakY = Number(c.dataset.peakY);
    return {
      state: hbmView.state(), errors: hbmView.errors.slice(),
      title: q('#title').textContent, verdict: q('#verdict') ? q('#verdict').textContent : null,
      category: q('#category') ? q('#category').textContent : null,
      causes: Array.from(document.querySelectorAll('#diagnosis ol.causes > li .cause')).map((e) => e.textContent),
      figures: { total: fig('total'), peak: fig('peak'), arguments: fig('arguments'), temp: fig('temp'), padding: fig('padding'), buffers: fig('buffers') },
      chart: { peak_bytes: c.dataset.peakBytes, peak_time: c.dataset.peakTime, limit_bytes: c.dataset.limitBytes, positions: Number(c.dataset.positions),
               peak_x: peakX, peak_y: peakY, width: c.clientWidth, height: c.clientHeight,
               below_peak_pixel: isNaN(peakX) ? null : px(peakX, peakY + 8), corner_pixel: px(c.clientWidth - 3, 3) },
      legend: q('#chart-legend').textContent,
      table_rows: Number(q('#table').dataset.rows), table_bytes: Number(q('#table').dataset.bytes),
      first_rows: Array.from(document.querySelectorAll('#rows .tr')).slice(0, 3).map((r) => ({ name: r.dataset.name, bytes: Number(r.querySelector('[data-bytes]').dataset.bytes) })),
      gantt_rows: Number(q('#gantt').dataset.rows), gantt_selected: q('#gantt').dataset.selected,
      chart_selected: c.dataset.selected || '', selected_panel: q('#selected').dataset.name || '', selected_hidden: q('#selected').hidden,
      selected_size: q('#selected-size') ? Number(q('#selected-size').dataset.bytes) : null,
      selected_row: (q('#rows .tr.sel') || { dataset: {} }).dataset.name || null,
      hash: decodeURIComponent(location.hash.slice(1)),
      diff_verdict: q('#diff-verdict') ? q('#diff-verdict').textContent : null,
      diff_changed_rows: document.querySelectorAll('#diff-buffers tbody tr').length,
      resources: performance.getEntriesByType('resource').length,
      page_height: document.documentElement.scrollHeight,
    };
  })()`;
  out.initial = await evaluate(snapshot);
  // Select a buffer like a person: click its row in the table.
  const rowName = out.initial.first_rows.length > 1 ? out.initial.first_rows[1].name : null;
  if (rowName) {
    const r = await evaluate(`hbmView.tableRowRect(${JSON.stringify(rowName)})`);
    await clickRect(r);
    out.clicked_row = rowName;
    out.after_row_click = await evaluate(snapshot);
  }
  // Then a Gantt bar of another buffer.
  const ganttPick = await evaluate(`(() => {
    const want = hbmView.state().selected;
    const r = JSON.parse(document.getElementById('hbm-report') ? document.getElementById('hbm-report').textContent : document.getElementById('hbm-report-after').textContent);
    const st = hbmView.state();
    const m = r.modules.find((m) => m.name === st.module) || r.modules[0];
    const sp = m.memory_spaces.find((s) => s.space === st.space) || m.memory_spaces[0];
    const b = sp.largest_buffers.find((b) => b.name !== want && b.kind === 'temp');
    return b ? b.name : null;
  })()`);
  if (ganttPick) {
    // The first call scrolls the bar into view, the second measures it there.
    await evaluate(`hbmView.ganttBarRect(${JSON.stringify(ganttPick)})`);
    await sleep(50);
    const r = await evaluate(`hbmView.ganttBarRect(${JSON.stringify(ganttPick)})`);
    await click(r.x + Math.min(r.width / 2, 20), r.y + r.height / 2);
    out.clicked_bar = ganttPick;
    out.after_bar_click = await evaluate(snapshot);
  }
  // Type a filter.
  await evaluate(`document.getElementById('filter').focus()`);
  await send('Input.insertText', { text: scenario === 'big' ? 'fusion.9999' : 'fusion' });
  await sleep(scenario === 'big' ? 600 : 100);
  out.filter = await evaluate(`({ text: document.getElementById('filter').value, rows: Number(document.getElementById('table').dataset.rows) })`);
  // Scroll the table to the end (virtualized rows).
  const ts = Date.now();
  await evaluate(`(() => { document.getElementById('filter').value = ''; document.getElementById('filter').dispatchEvent(new Event('input')); })()`);
  await sleep(scenario === 'big' ? 600 : 100);
  await evaluate(`(() => { const b = document.getElementById('tbody'); b.scrollTop = b.scrollHeight; b.dispatchEvent(new Event('scroll')); })()`);
  out.scrolled = await evaluate(`({ rows_in_dom: document.querySelectorAll('#rows .tr').length, last: (Array.from(document.querySelectorAll('#rows .tr')).pop() || { dataset: {} }).dataset.index })`);
  out.scroll_ms = Date.now() - ts;
  await evaluate(`(() => { const b = document.getElementById('tbody'); b.scrollTop = 0; b.dispatchEvent(new Event('scroll')); hbmView.select(${JSON.stringify(out.clicked_bar || out.clicked_row || null)}); window.scrollTo(0, 0); })()`);
  await sleep(100);
  // Screenshot of the whole page.
  const h = Math.min(8000, await evaluate('document.documentElement.scrollHeight'));
  await send('Emulation.setDeviceMetricsOverride', { width: 1400, height: h, deviceScaleFactor: 1, mobile: false });
  await sleep(200);
  const png = await send('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true });
  writeFileSync(shot, Buffer.from(png.data, 'base64'));
  out.screenshot = shot;
  out.requests = requests;
  out.exceptions = exceptions;
  out.console_errors = consoleErrors;
  out.loaded = loaded;
  finish(out);
} catch (e) {
  finish({ fatal: String(e && e.stack ? e.stack : e), requests, exceptions });
}
