// Measures how long a `gpumem report` page takes to load in headless Chromium, in real time
// (not the virtual time of --dump-dom): launches Chromium with the DevTools protocol, opens
// the page, waits until its script has built everything, and prints the page's own figure
// (performance.now() since navigation start) and the wall time from navigation to that point.
// Usage: node --experimental-websocket scripts/bench/report-load-time.mjs report.html [runs]
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';

const file = resolve(process.argv[2] || 'report.html');
const runs = Number(process.argv[3] || 3);
const port = 9300 + Math.floor(Math.random() * 500);
const browser = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
  '--disable-dev-shm-usage', `--remote-debugging-port=${port}`, `--user-data-dir=/tmp/gpumem-cdp-${port}`, 'about:blank'],
{ stdio: 'ignore' });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let targets;
for (let i = 0; i < 100; i++) {
  try { targets = await (await fetch(`http://127.0.0.1:${port}/json`)).json(); break; } catch { await sleep(100); }
}
const page = targets.find((t) => t.type === 'page');
const ws = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((r) => ws.addEventListener('open', r));
let id = 0;
const pending = new Map();
ws.addEventListener('message', (m) => {
  const msg = JSON.parse(m.data);
  if (msg.id && pending.has(msg.id)) { pending.get(msg.id)(msg); pending.delete(msg.id); }
});
const send = (method, params = {}) => new Promise((r) => { const i = ++id; pending.set(i, r); ws.send(JSON.stringify({ id: i, method, params })); });
const evaluate = async (expr) => (await send('Runtime.evaluate', { expression: expr, returnByValue: true })).result.result.value;
for (let k = 0; k < runs; k++) {
  await send('Page.navigate', { url: 'about:blank' });
  await sleep(300);
  const t0 = Date.now();
  await send('Page.navigate', { url: 'file://' + file + '#selftest' });
  let loaded;
  for (let i = 0; i < 600; i++) {
    loaded = await evaluate('document.body && document.body.dataset.loadedMs');
    if (loaded) break;
    await sleep(20);
  }
  const wall = Date.now() - t0;
  const result = await evaluate("(document.getElementById('selftest-result') || {}).textContent || ''");
  const phases = await evaluate('document.body.dataset.phases');
  console.log(`run ${k + 1}: page built ${loaded} ms after navigation start, ${wall} ms wall; self-test: ${result.replace('\n', '; ')}; ${phases}`);
}
ws.close();
browser.kill();
