// gpumem report: draws the timelines (uPlot) and rebuilds the memory map of any event from the
// packed arrays. The map logic mirrors crates/gpumem/src/report/map.rs (MemoryMap::at, cells).
(function () {
  'use strict';
  // Milliseconds since navigation start at each step of building the page (in data-phases).
  const phases = { script: performance.now() };
  const D = JSON.parse(document.getElementById('gpumem-data').textContent);
  phases.parsed = performance.now();
  const NEVER32 = 4294967295;
  const STATE_COLORS = ['#2f8f46', '#e5a00d', '#7fb3e6', '#a774c9', '#e4e7ec'];
  const SERIES_COLORS = ['#3559c7', '#d9480f', '#2f9e44', '#ae3ec9', '#0c8599', '#e67700', '#5c7cfa'];
  const $ = (id) => document.getElementById(id);
  const status = $('status');

  function fmtBytes(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = Math.abs(b), i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    const s = i === 0 ? String(Math.round(v)) : (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
    return (b < 0 ? '-' : '') + s + ' ' + u[i];
  }
  // Byte-axis ticks at round multiples of a binary unit (0, 2 GiB, 4 GiB, ... rather than
  // 2.33 GiB, 4.66 GiB): a step of 1, 2 or 5 × 10^k of the largest unit below the range.
  function byteSplits(u, axisIdx, min, max) {
    const range = Math.max(max - min, 1);
    let unit = 1;
    while (unit * 1024 <= range) unit *= 1024;
    const raw = range / unit / 4, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const r = raw / mag, step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag * unit;
    const out = [];
    for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(v);
    return out;
  }
  // A byte tick without trailing zeros: 2 GiB, 1.5 GiB.
  function tickBytes(b) { return fmtBytes(b).replace(/\.?0+ /, (m) => (m.startsWith('.') ? ' ' : m)).replace(/(\.\d*[1-9])0+ /, '$1 '); }
  function pct(v, digits) { return v === 0 ? '0 %' : (v * 100).toFixed(digits) + ' %'; }
  function hex(x) { return '0x' + x.toString(16); }
  function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c])); }

  async function inflate(b64) {
    let u8;
    if (Uint8Array.fromBase64) {
      u8 = Uint8Array.fromBase64(b64);
    } else {
      const bin = atob(b64);
      const n = bin.length;
      u8 = new Uint8Array(n);
      for (let i = 0; i < n; i++) u8[i] = bin.charCodeAt(i);
    }
    const stream = new Blob([u8]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).arrayBuffer();
  }
  function view(buf, d) {
    if (d.t === 'f64') return new Float64Array(buf, d.o, d.n);
    if (d.t === 'u32') return new Uint32Array(buf, d.o, d.n);
    return new Int32Array(buf, d.o, d.n);
  }
  function views(buf, obj) {
    const out = {};
    for (const k of Object.keys(obj)) out[k] = view(buf, obj[k]);
    return out;
  }

  // ---------------------------------------------------------------- memory map (mirror of map.rs)
  // Appends span s, merging it into the last one when both have the same state and block.
  function push(out, s) {
    const l = out[out.length - 1];
    if (l && l[2] === s[2] && l[3] === s[3] && l[0] + l[1] === s[0]) { l[1] += s[1]; return; }
    out.push(s);
  }
  function paint(under, ivs, state) {
    // under: [[off, bytes, state, block, requested]], ivs: sorted disjoint [off, bytes, block, requested]
    const out = [];
    let i = 0;
    for (const s of under) {
      let at = s[0];
      const end = s[0] + s[1];
      while (i < ivs.length && at < end) {
        const o = ivs[i][0], ivEnd = ivs[i][0] + ivs[i][1];
        if (ivEnd <= at) { i++; continue; }
        if (o >= end) break;
        if (o > at) { push(out, [at, o - at, s[2], s[3], s[4]]); at = o; }
        const stop = Math.min(ivEnd, end);
        push(out, [at, stop - at, state, ivs[i][2], ivs[i][3]]);
        at = stop;
        if (ivEnd <= end) i++;
      }
      if (at < end) push(out, [at, end - at, s[2], s[3], s[4]]);
    }
    return out;
  }
  function lowerBound(arr, x, key) {
    let lo = 0, hi = arr.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (key(arr[m]) < x) lo = m + 1; else hi = m; }
    return lo;
  }

  function buildMap(A, e) {
    const B = D.blocksV;
    const liveAt = (from, to) => from <= e && (to === NEVER32 || e < to);
    const R = A.regionsV, M = A.mappingsV, P = A.placementsV;
    const regions = [];
    for (let i = 0; i < R.base.length; i++) if (liveAt(R.created[i], R.released[i])) regions.push(i);
    regions.sort((a, b) => R.base[a] - R.base[b]);
    const live = [];
    const n = P.addr.length;
    for (let i = 0; i < n; i++) {
      const a = P.addr[i];
      if (a < 0) continue;
      const fe = B.free_event[i];
      if (B.alloc_event[i] <= e && (fe === NEVER32 || e < fe)) live.push(i);
    }
    live.sort((a, b) => P.addr[a] - P.addr[b]);
    const maps = [];
    for (let i = 0; i < M.va.length; i++) if (liveAt(M.mapped[i], M.unmapped[i])) maps.push(i);
    maps.sort((a, b) => M.va[a] - M.va[b]);
    const rows = [];
    for (const r of regions) {
      const base = R.base[r], bytes = R.bytes[r], end = base + bytes;
      const lo = lowerBound(live, base, (i) => P.addr[i]);
      const hi = lowerBound(live, end, (i) => P.addr[i]);
      const ivs = [];
      for (let k = lo; k < hi; k++) {
        const i = live[k], a = P.addr[i];
        ivs.push([a - base, Math.min(P.allocated[i], end - a), i, B.requested[i]]);
      }
      if (R.kind[r] === 0) {
        const free = ivs.length === 0 ? 2 : 1;
        rows.push({ kind: 'segment', regionBase: base, base, bytes, shown: bytes, spans: paint([[0, bytes, free, -1, 0]], ivs, 0) });
      } else {
        const ml = lowerBound(maps, base, (i) => M.va[i]);
        const mh = lowerBound(maps, end, (i) => M.va[i]);
        const mapped = [];
        for (let k = ml; k < mh; k++) { const i = maps[k]; mapped.push([M.va[i] - base, Math.min(M.bytes[i], end - M.va[i]), -1, 0]); }
        const spans = paint(paint([[0, bytes, 4, -1, 0]], mapped, 3), ivs, 0);
        for (const [ws, we] of A.clusters[r]) {
          const w = [];
          for (const sp of spans) {
            if (sp[0] >= we || sp[0] + sp[1] <= ws) continue;
            const a = Math.max(sp[0], ws), b = Math.min(sp[0] + sp[1], we);
            w.push([a - ws, b - a, sp[2], sp[3], sp[4]]);
          }
          rows.push({ kind: 'VA range', regionBase: base, base: base + ws, bytes, shown: we - ws, spans: w });
        }
      }
    }
    return { rows };
  }
  function totals(map) {
    const t = [0, 0, 0, 0, 0];
    const ids = new Set();
    let anonymous = 0;
    for (const r of map.rows) for (const s of r.spans) {
      t[s[2]] += s[1];
      if (s[2] === 0) { if (s[3] >= 0) ids.add(s[3]); else anonymous++; }
    }
    return { t, blocks: ids.size + anonymous };
  }
  function cellBytes(map, width, maxLines) {
    const budget = width * maxLines;
    let cell = 512;
    for (;;) {
      let cells = 0;
      for (const r of map.rows) cells += Math.max(1, Math.ceil(r.shown / cell)) + 1;
      if (cells <= budget || cell >= 2 ** 50) return cell;
      cell *= 2;
    }
  }
  // Cells: Uint8Array of state+1 (0 = gap between rows), plus the row of each cell and its start.
  function cells(map, cell) {
    let total = 0;
    for (const r of map.rows) total += Math.max(1, Math.ceil(r.shown / cell)) + 1;
    const st = new Uint8Array(total), row = new Int32Array(total).fill(-1), first = [];
    let at = 0;
    map.rows.forEach((r, ri) => {
      if (ri > 0) at++;
      const n = Math.max(1, Math.ceil(r.shown / cell));
      first.push(at);
      const acc = new Float64Array(n * 5);
      for (const s of r.spans) {
        let p = s[0];
        const end = s[0] + s[1];
        while (p < end) {
          const c = Math.floor(p / cell);
          const stop = Math.min((c + 1) * cell, end);
          if (c < n) acc[c * 5 + s[2]] += stop - p;
          p = stop;
        }
      }
      for (let c = 0; c < n; c++) {
        let best = 4, bb = 0;
        for (let k = 0; k < 5; k++) if (acc[c * 5 + k] > bb) { bb = acc[c * 5 + k]; best = k; }
        st[at + c] = best + 1;
        row[at + c] = ri;
      }
      at += n;
    });
    return { st: st.subarray(0, at), row, first, cell };
  }

  const CELL_W = 3, CELL_H = 9;
  function drawMap(canvas, map, maxLines) {
    const wrap = canvas.parentElement;
    const cssW = Math.max(240, Math.floor(wrap.clientWidth || 900));
    const cols = Math.max(8, Math.floor(cssW / CELL_W));
    const cell = cellBytes(map, cols, maxLines);
    const c = cells(map, cell);
    const lines = Math.max(1, Math.ceil(c.st.length / cols));
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = cols * CELL_W + 'px';
    canvas.style.height = lines * CELL_H + 'px';
    canvas.width = Math.ceil(cols * CELL_W * dpr);
    canvas.height = Math.ceil(lines * CELL_H * dpr);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cols * CELL_W, lines * CELL_H);
    for (let i = 0; i < c.st.length; i++) {
      const s = c.st[i];
      if (s === 0) continue;
      ctx.fillStyle = STATE_COLORS[s - 1];
      ctx.fillRect((i % cols) * CELL_W, Math.floor(i / cols) * CELL_H, CELL_W - (s === 1 ? 0 : 0.5), CELL_H - 1);
    }
    canvas._map = { map, c, cols };
    return c;
  }
  function legend(el, t) {
    el.innerHTML = D.states.map((name, k) => (k === 0 || t[k] > 0)
      ? '<span><i style="background:' + STATE_COLORS[k] + '"></i>' + esc(name) + ' ' + fmtBytes(t[k]) + '</span>' : '').join('');
  }

  // ---------------------------------------------------------------- hover
  const tip = $('tooltip');
  function spanAt(row, off) {
    const k = lowerBound(row.spans, off + 1, (s) => s[0]) - 1;
    return k >= 0 ? row.spans[k] : null;
  }
  function frames(stackId, n) {
    if (stackId < 0 || !D.stacks.stacks[stackId]) return '';
    const f = D.stacks.stacks[stackId].map((i) => D.stacks.frames[i]);
    const more = f.length > n ? '\n… ' + (f.length - n) + ' more frames' : '';
    return '<div class="frames">' + f.slice(0, n).map(esc).join('\n') + esc(more) + '</div>';
  }
  function hover(ev, canvas, withBlocks) {
    const m = canvas._map;
    if (!m) return;
    const rect = canvas.getBoundingClientRect();
    const x = Math.floor((ev.clientX - rect.left) / CELL_W), y = Math.floor((ev.clientY - rect.top) / CELL_H);
    const i = y * m.cols + x;
    if (x < 0 || x >= m.cols || i < 0 || i >= m.c.st.length || m.c.row[i] < 0) { tip.hidden = true; return; }
    const ri = m.c.row[i];
    const row = m.map.rows[ri];
    const off = (i - m.c.first[ri]) * m.c.cell;
    // The cell's largest live block if it holds one, else what lies at its middle.
    let s = null;
    for (let k = Math.max(0, lowerBound(row.spans, off + 1, (x) => x[0]) - 1); k < row.spans.length && row.spans[k][0] < off + m.c.cell; k++) {
      const x = row.spans[k];
      if (x[2] === 0 && x[0] + x[1] > off && (!s || x[1] > s[1])) s = x;
    }
    if (!s) s = spanAt(row, Math.min(off + m.c.cell / 2, Math.max(0, row.shown - 1)));
    let h = '<b>' + esc(row.kind) + '</b> ' + hex(row.regionBase) + ', ' + fmtBytes(row.bytes) +
      (row.kind !== 'segment' ? ' (showing ' + hex(row.base) + ' to ' + hex(row.base + row.shown) + ', the pages it ever mapped)' : '') +
      '\ncell ' + hex(row.base + off) + ' (one cell = ' + fmtBytes(m.c.cell) + ')';
    if (s) {
      h += '\n<b>' + esc(D.states[s[2]]) + '</b>: ' + hex(row.base + s[0]) + ', ' + fmtBytes(s[1]);
      if (s[2] === 0) {
        h += ', requested ' + fmtBytes(s[4]);
        if (withBlocks && s[3] >= 0) {
          const b = s[3], B = D.blocksV;
          const fe = B.free_event[b];
          h += '\nallocated at event ' + B.alloc_event[b] + ', freed ' + (fe === NEVER32 ? 'never' : 'at event ' + fe);
          h += frames(B.stack[b], 8);
        }
      }
    }
    tip.innerHTML = h;
    tip.hidden = false;
    const w = tip.offsetWidth, hh = tip.offsetHeight;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - w - 8) + 'px';
    tip.style.top = (ev.clientY + 16 + hh > window.innerHeight ? ev.clientY - hh - 10 : ev.clientY + 16) + 'px';
  }

  // ---------------------------------------------------------------- charts
  const charts = [];
  let current = 0;
  function xs() {
    const f = D.columns, n = f.length, out = new Float64Array(2 * n);
    for (let c = 0; c < n; c++) {
      const next = c + 1 < n ? f[c + 1] : D.events;
      out[2 * c] = f[c];
      out[2 * c + 1] = f[c] + Math.max(0, (next - f[c]) / 2);
    }
    return out;
  }
  function interleave(pair) {
    const [mn, mx] = pair, out = new Float64Array(2 * mn.length);
    for (let c = 0; c < mn.length; c++) { out[2 * c] = mn[c]; out[2 * c + 1] = mx[c]; }
    return out;
  }
  function doubled(v) {
    const out = new Float64Array(2 * v.length);
    for (let c = 0; c < v.length; c++) { out[2 * c] = v[c]; out[2 * c + 1] = v[c]; }
    return out;
  }
  // Index in a chart's data of the largest value of the column that holds event `e`: the
  // data are (smallest, largest) pairs, one per column, and `D.columns` the first events.
  function columnOf(e) {
    const c = Math.max(0, lowerBound(D.columns, e + 1, (v) => v) - 1);
    return 2 * c + 1;
  }
  // Without the pointer over a chart, its legend shows the values at the map's event.
  function legendAtCurrent(u) {
    if (u.cursor.idx == null && u.data[0].length > 0) u.setLegend({ idx: columnOf(current) });
  }
  // Steps between the event axis's ticks: whole events (a trace of a few events got 0.2, 0.4).
  const EVENT_STEPS = [];
  for (let m = 1; m <= 1e9; m *= 10) EVENT_STEPS.push(m, 2 * m, 5 * m);
  // yRange: a fixed [min, max] of the y axis (default: fitted to the data).
  function makeChart(title, seriesList, fmt, log, tickFmt, splits, extraDraw, yRange) {
    tickFmt = tickFmt || fmt;
    const el = document.createElement('div');
    $('charts').appendChild(el);
    const w = Math.max(300, Math.floor(($('charts').clientWidth - 16) / 2));
    const x = xs();
    const data = [x].concat(seriesList.map((s) => s.y));
    const opts = {
      title, width: w, height: 200,
      scales: log ? { x: { time: false }, y: { distr: 3, log: 10 } } : Object.assign({ x: { time: false } }, yRange ? { y: { range: yRange } } : {}),
      legend: { live: true },
      cursor: { sync: { key: 'gpumem' }, drag: { x: true, y: false } },
      axes: [
        { label: 'event', size: 40, incrs: EVENT_STEPS, values: (u, v) => v.map((x) => x >= 1e6 ? (x / 1e6) + 'M' : x >= 1e3 ? (x / 1e3) + 'k' : x) },
        log
          ? { size: 70, values: (u, v) => v.map((x) => (Math.abs(Math.log10(x) - Math.round(Math.log10(x))) < 1e-9 ? tickFmt(x) : '')) }
          : Object.assign({ size: 70, values: (u, v) => v.map(tickFmt) }, splits ? { splits } : {}),
      ],
      // The events of the column under the pointer (a column spans one or more events).
      series: [{
        label: 'event', value: (u, v, si, idx) => {
          if (idx == null) return '';
          const c = idx >> 1, first = D.columns[c];
          const next = c + 1 < D.columns.length ? D.columns[c + 1] : D.events;
          return next - first > 1 ? first + '–' + (next - 1) : String(first);
        },
      }].concat(seriesList.map((s, i) => ({
        label: s.label, stroke: s.color || SERIES_COLORS[i % SERIES_COLORS.length], width: s.width || 1.25, points: { show: false },
        dash: s.dash, value: (u, v) => v == null ? (s.nullText || '') : fmt(v),
      }))),
      hooks: {
        setCursor: [legendAtCurrent],
        draw: [(u) => {
          const ctx = u.ctx, px = u.valToPos(current, 'x', true);
          ctx.save();
          ctx.strokeStyle = '#c92a2a'; ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
          ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height); ctx.stroke();
          ctx.restore();
          if (extraDraw) extraDraw(u);
        }],
      },
    };
    const u = new uPlot(opts, data, el);
    legendAtCurrent(u);
    u.over.addEventListener('click', () => {
      if (u.cursor.left == null || u.cursor.left < 0) return;
      setEvent(Math.round(u.posToVal(u.cursor.left, 'x')));
    });
    charts.push(u);
  }
  function buildCharts() {
    const A = D.allocators;
    const flat = (v) => { const o = new Float64Array(2 * D.columns.length); o.fill(v); return o; };
    const reserved = [{ label: 'requested', y: interleave(A[0].series.requested), color: '#111', width: 1.5 }]
      .concat(A.map((a, i) => ({ label: a.name, y: interleave(a.series.reserved), color: SERIES_COLORS[i % 7] })))
      .concat(D.recorded.map((r) => ({ label: 'PyTorch peak (' + r.conf + ')', y: flat(r.reserved_peak_bytes), color: '#8a4b00', dash: [6, 4] })));
    if (D.capacity_limit != null) {
      reserved.push({ label: 'capacity', y: flat(D.capacity_limit), color: '#7f7f7f', dash: [3, 3] });
    }
    // Allocations that ran out of memory: a tick per event above the x axis, in the
    // allocator's colour, one row of ticks per allocator.
    const failed = A.map((a) => {
      const out = [];
      for (let i = 0; i < a.placementsV.addr.length; i++) {
        if (a.placementsV.addr[i] < 0) out.push(D.blocksV.alloc_event[i]);
      }
      return out;
    });
    const anyFailed = failed.some((f) => f.length > 0);
    const ticks = (u) => {
      const ctx = u.ctx, dpr = window.devicePixelRatio || 1, bottom = u.bbox.top + u.bbox.height;
      ctx.save();
      ctx.lineWidth = 1.5 * dpr;
      failed.forEach((f, i) => {
        if (!f.length) return;
        ctx.strokeStyle = SERIES_COLORS[i % 7];
        const y0 = bottom - 3 * i * dpr;
        ctx.beginPath();
        for (const e of f) { const px = u.valToPos(e, 'x', true); ctx.moveTo(px, y0); ctx.lineTo(px, y0 - 8 * dpr); }
        ctx.stroke();
      });
      ctx.restore();
    };
    makeChart(anyFailed ? 'Reserved bytes (ticks: failed allocations)' : 'Reserved bytes (from the device)',
      reserved, fmtBytes, false, tickBytes, byteSplits, anyFailed ? ticks : null);
    const allocated = [{ label: 'requested', y: interleave(A[0].series.requested), color: '#111', width: 1.5 }]
      .concat(A.map((a, i) => ({ label: a.name, y: interleave(a.series.allocated), color: SERIES_COLORS[i % 7] })))
      .concat(D.recorded.filter((r) => r.allocated_peak_bytes != null).map((r) => ({ label: 'PyTorch peak (' + r.conf + ')', y: flat(r.allocated_peak_bytes), color: '#8a4b00', dash: [6, 4] })));
    makeChart('Allocated bytes (live blocks after rounding)', allocated, fmtBytes, false, tickBytes, byteSplits);
    makeChart('External fragmentation (1 − largest free / free)', A.map((a, i) => ({ label: a.name, y: interleave(a.series.fragmentation), color: SERIES_COLORS[i % 7] })), (v) => pct(v, 1), false, (v) => pct(v, 0), null, null, [0, 1]);
    // Log scale: pools differ by orders of magnitude; no call yet is left out (a gap).
    const calls = (a) => Array.from(doubled(a.series.driver_calls), (v) => (v >= 1 ? v : null));
    // Ticks are powers of ten: 1, 10, 100, 1k, 10k, 1M (not 1.0k, 100.0k as the legend's values).
    const powerTick = (v) => v >= 1e6 ? Math.round(v / 1e6) + 'M' : v >= 1e3 ? Math.round(v / 1e3) + 'k' : String(Math.round(v));
    makeChart('Driver calls (cumulative, log scale)', A.map((a, i) => ({ label: a.name, y: calls(a), color: SERIES_COLORS[i % 7], nullText: '0' })), (v) => v >= 1e6 ? (v / 1e6).toFixed(2) + 'M' : v >= 1e3 ? (v / 1e3).toFixed(1) + 'k' : String(Math.round(v)), true, powerTick);
  }

  // ---------------------------------------------------------------- the map section
  let draws = 0;
  function setEvent(e) {
    e = Math.max(0, Math.min(D.events - 1, Math.round(e) || 0));
    current = e;
    $('map-slider').value = String(e);
    $('map-event-input').value = String(e);
    redrawMap();
    for (const u of charts) { u.redraw(false, false); legendAtCurrent(u); }
  }
  function redrawMap() {
    const ai = Number($('map-allocator').value) || 0;
    const A = D.allocators[ai];
    const map = buildMap(A, current);
    drawMap($('map-canvas'), map, 70);
    const { t, blocks } = totals(map);
    legend($('map-legend'), t);
    const segs = map.rows.filter((r) => r.kind === 'segment').length;
    const vas = new Set(map.rows.filter((r) => r.kind !== 'segment').map((r) => r.regionBase)).size;
    const tags = [];
    if (current === A.peak_reserved_event) tags.push('peak reserved of ' + A.name);
    if (current === D.peak_requested_event) tags.push('peak requested');
    $('map-caption').textContent = A.name + ' after event ' + current + ' of ' + D.events + (tags.length ? ' (' + tags.join(', ') + ')' : '') + ': ' +
      counted(segs, 'segment') + ', ' + counted(vas, 'VA range') + '; ' + fmtBytes(t[0]) + ' live in ' + counted(blocks, 'block') + '. Hover for details.';
    draws++;
  }
  // `n` and `noun`, plural unless n is 1 (as the terminal map: 1 VA range, 2 segments).
  function counted(n, noun) { return n + ' ' + noun + (n === 1 ? '' : 's'); }
  function setupMap() {
    const sel = $('map-allocator');
    D.allocators.forEach((a, i) => {
      const o = document.createElement('option');
      o.value = String(i); o.textContent = a.name; sel.appendChild(o);
    });
    const slider = $('map-slider');
    slider.max = String(Math.max(0, D.events - 1));
    $('map-event-input').max = String(Math.max(0, D.events - 1));
    slider.addEventListener('input', () => setEvent(Number(slider.value)));
    $('map-event-input').addEventListener('change', (ev) => setEvent(Number(ev.target.value)));
    sel.addEventListener('change', () => redrawMap());
    $('btn-peak-reserved').addEventListener('click', () => setEvent(D.allocators[Number(sel.value) || 0].peak_reserved_event));
    $('btn-peak-requested').addEventListener('click', () => setEvent(D.peak_requested_event));
    const c = $('map-canvas');
    c.addEventListener('mousemove', (ev) => hover(ev, c, true));
    c.addEventListener('mouseleave', () => { tip.hidden = true; });
    window.addEventListener('keydown', (ev) => {
      if (ev.target && ev.target.tagName === 'INPUT' && ev.target.type === 'number') return;
      if (ev.key === 'ArrowRight') setEvent(current + (ev.shiftKey ? 100 : 1));
      if (ev.key === 'ArrowLeft') setEvent(current - (ev.shiftKey ? 100 : 1));
    });
    sel.value = String(Math.max(0, D.allocators.findIndex((a) => a.name === 'torch')));
  }
  function staticMap(canvasId, captionId, m, what) {
    const canvas = $(canvasId);
    if (!m) { canvas.parentElement.hidden = true; return; }
    const map = { rows: m.rows.map((r) => ({ kind: r.kind === 'segment' ? 'segment' : 'VA range', regionBase: r.region_base, base: r.base, bytes: r.bytes, shown: r.shown, spans: r.spans.map((s) => [s[0], s[1], s[2], -1, s[3]]) })) };
    drawMap(canvas, map, 40);
    const { t, blocks } = totals(map);
    $(captionId).textContent = what + ': ' + counted(map.rows.length, 'segment') + ', ' + fmtBytes(t[0]) + ' live in ' + counted(blocks, 'block') + ', ' + fmtBytes(t[1]) + ' split remainder, ' + fmtBytes(t[2]) + ' free (cached)';
    canvas.addEventListener('mousemove', (ev) => hover(ev, canvas, false));
    canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
  }

  // ---------------------------------------------------------------- self-test (#selftest)
  function selftest(loadMs) {
    const problems = [];
    D.allocators.forEach((A) => {
      const m = buildMap(A, A.peak_reserved_event);
      const { t, blocks } = totals(m);
      for (let k = 0; k < 5; k++) if (t[k] !== A.peak_totals[k]) problems.push(A.name + ': ' + D.states[k] + ' ' + t[k] + ' in the page, ' + A.peak_totals[k] + ' in gpumem');
      if (blocks !== A.peak_live_blocks) problems.push(A.name + ': ' + blocks + ' live spans in the page, ' + A.peak_live_blocks + ' in gpumem');
    });
    const slider = $('map-slider');
    const before = draws;
    const target = Math.floor((D.events - 1) / 3);
    slider.value = String(target);
    const moved = performance.now();
    slider.dispatchEvent(new Event('input'));
    const rebuildMs = performance.now() - moved;
    if (draws !== before + 1) problems.push('moving the slider did not redraw the map');
    if (!$('map-caption').textContent.includes('after event ' + target + ' ')) problems.push('the caption does not show event ' + target);
    if (charts.length !== 4) problems.push(charts.length + ' charts drawn, expected 4');
    // Each allocator's caption counts in words that agree with the number (1 VA range).
    const sel = $('map-allocator'), was = sel.value;
    D.allocators.forEach((A, i) => {
      sel.value = String(i);
      sel.dispatchEvent(new Event('change'));
      const caption = $('map-caption').textContent;
      if (/\b1 (segments|VA ranges|blocks)\b/.test(caption)) problems.push(A.name + ': ' + caption);
    });
    sel.value = was;
    sel.dispatchEvent(new Event('change'));
    // The driver calls' ticks are written as round powers of ten (it wrote 1.0k and 100.0k).
    const callTicks = charts[3] && charts[3].axes[1]._values ? charts[3].axes[1]._values.filter((x) => x !== '') : [];
    if (callTicks.some((x) => !/^1(0*)(k|M)?$/.test(x))) problems.push('driver-call ticks: ' + callTicks.join(', '));
    // Events are whole: the event axis ticks at whole events only.
    for (const u of charts) {
      const bad = (u.axes[0]._splits || []).filter((x) => !Number.isInteger(x));
      const title = u.root.querySelector('.u-title');
      if (bad.length) problems.push((title ? title.textContent : 'a chart') + ': event ticks at ' + bad.join(', '));
    }
    // Every legend entry of the driver calls has a value: none yet (a gap on the log scale) is 0, not blank.
    if (charts[3]) {
      const blank = charts[3].series.slice(1).filter((sr) => typeof sr.value === 'function' && sr.value(charts[3], null, 1, 0) === '').map((sr) => sr.label);
      if (blank.length) problems.push('driver-call legend without a value for no call: ' + blank.join(', '));
    }
    // A fraction is drawn on 0-100 %, whatever the data (all zero gave an axis to 10000 %).
    const frag = charts[2];
    if (frag && (frag.scales.y.min !== 0 || frag.scales.y.max !== 1)) problems.push('the fragmentation axis spans ' + frag.scales.y.min + '..' + frag.scales.y.max + ', expected 0..1 (0-100 %)');
    // Hover the first live cell of the map: the tooltip must describe the block.
    const canvas = $('map-canvas'), m = canvas._map;
    const liveCell = m ? m.c.st.indexOf(1) : -1;
    if (liveCell >= 0) {
      const rect = canvas.getBoundingClientRect();
      canvas.dispatchEvent(new MouseEvent('mousemove', {
        clientX: rect.left + (liveCell % m.cols) * CELL_W + 1, clientY: rect.top + Math.floor(liveCell / m.cols) * CELL_H + 1, bubbles: true,
      }));
      if (tip.hidden || !tip.textContent.includes('live:') || !tip.textContent.includes('allocated at event')) problems.push('hovering a live cell shows no block: ' + tip.textContent);
      tip.hidden = true;
    }
    const errs = window.__gpumemErrors;
    for (const e of errs) problems.push('console: ' + e);
    const out = document.createElement('pre');
    out.id = 'selftest-result';
    out.textContent = (problems.length ? 'FAIL\n' + problems.join('\n') : 'PASS') + '\nloaded in ' + loadMs.toFixed(0) + ' ms; map rebuilt for a new event in ' + rebuildMs.toFixed(0) + ' ms';
    document.body.appendChild(out);
  }

  async function main() {
    const buf = await inflate(D.packed);
    phases.inflated = performance.now();
    D.blocksV = views(buf, D.blocks);
    for (const A of D.allocators) {
      A.regionsV = views(buf, A.regions);
      A.mappingsV = views(buf, A.mappings);
      A.placementsV = views(buf, A.placements);
      const R = A.regionsV, M = A.mappingsV;
      // Clusters of the pages the run ever mapped in each VA range (mirror of map.rs va_clusters).
      A.clusters = [];
      const byVa = Array.from(M.va.keys()).sort((a, b) => M.va[a] - M.va[b]);
      for (let r = 0; r < R.base.length; r++) {
        if (R.kind[r] !== 1) { A.clusters.push(null); continue; }
        const base = R.base[r], end = base + R.bytes[r];
        const iv = [];
        for (let k = lowerBound(byVa, base, (i) => M.va[i]); k < byVa.length && M.va[byVa[k]] < end; k++) {
          const i = byVa[k];
          iv.push([M.va[i] - base, Math.min(M.va[i] + M.bytes[i], end) - base]);
        }
        iv.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
        const out = [];
        for (const [s0, e0] of iv) {
          const l = out[out.length - 1];
          if (l && s0 <= l[1] + D.va_gap_merge_bytes) l[1] = Math.max(l[1], e0); else out.push([s0, e0]);
        }
        if (!out.length) out.push([0, 0]);
        A.clusters.push(out);
      }
    }
    phases.arrays = performance.now();
    buildCharts();
    phases.charts = performance.now();
    setupMap();
    staticMap('snap-recorded', 'snap-caption-recorded', D.snapshot_map, 'PyTorch, recorded at dump time');
    staticMap('snap-emulated', 'snap-caption-emulated', D.torch_end_map, 'torch emulation after the last event');
    // Deep links: #allocator=paged&event=1234.
    const h = new URLSearchParams(location.hash.replace(/^#/, ''));
    const want = D.allocators.findIndex((a) => a.name === h.get('allocator'));
    if (want >= 0) $('map-allocator').value = String(want);
    const ai = Number($('map-allocator').value) || 0;
    setEvent(h.has('event') ? Number(h.get('event')) : D.allocators[ai].peak_reserved_event);
    // Since navigation start: includes reading and parsing the page itself.
    const loadMs = performance.now();
    phases.map = loadMs;
    document.body.dataset.phases = Object.entries(phases).map(([k, v]) => k + ' ' + v.toFixed(0)).join(', ');
    document.body.dataset.loadedMs = loadMs.toFixed(0);
    status.textContent = 'Page built in ' + loadMs.toFixed(0) + ' ms (' + D.events + ' events, ' + D.blocksV.requested.length + ' blocks, ' + D.allocators.length + ' allocators).';
    // Charts and map follow the window's width.
    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        const w = Math.max(300, Math.floor(($('charts').clientWidth - 16) / 2));
        for (const u of charts) u.setSize({ width: w, height: u.height });
        redrawMap();
      }, 150);
    });
    if (location.hash.includes('selftest')) {
      // uPlot sets its scales in a microtask after the charts are made: let it run first.
      await new Promise((r) => setTimeout(r, 0));
      selftest(loadMs);
    }
  }
  main().catch((e) => {
    window.__gpumemErrors.push('report: ' + (e && e.stack || e));
    status.textContent = 'The page could not be built: ' + e;
    if (location.hash.includes('selftest')) selftest(performance.now());
  });
})();
