// hbm-doctor memory view: renders the embedded `analyze --format json` report(s).
// Vanilla JS, canvas drawing, no network. Test hooks: window.hbmView, html[data-ready].
(function () {
  'use strict';
  var errors = [];
  function fail(msg) {
    errors.push(String(msg));
    var e = document.getElementById('error');
    if (e) { e.hidden = false; e.textContent = 'The viewer hit an error: ' + msg; }
  }
  window.addEventListener('error', function (ev) { fail(ev.message); });

  function $(id) { return document.getElementById(id); }
  function readJSON(id) { var el = $(id); return el ? JSON.parse(el.textContent) : null; }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  var KIB = 1024, MIB = KIB * 1024, GIB = MIB * 1024;
  // Sizes as every human output of hbm-doctor prints them (crates/hbm_doctor_units/src/size.rs,
  // its tests/vectors.json): 512B, 4.0K (one decimal in K), 528.00M, 28.50G; ties to even.
  function fixedEven(v, d) {
    var m = Math.pow(10, d), x = v * m, f = Math.floor(x);
    var r = x - f === 0.5 ? (f % 2 === 0 ? f : f + 1) : Math.round(x);
    return (r / m).toFixed(d);
  }
  function fmt(b) {
    if (b === null || b === undefined) return '–';
    var a = Math.abs(b), sign = b < 0 ? '-' : '';
    if (a < KIB) return b + 'B';
    var units = ['K', 'M', 'G', 'T', 'P', 'E'], v = a / KIB, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return sign + fixedEven(v, u === 0 ? 1 : 2) + units[u];
  }
  function fmtDelta(d) { return (d > 0 ? '+' : d < 0 ? '−' : '±') + fmt(Math.abs(d)); }
  function pct(d, base) { return base ? ((d > 0 ? '+' : d < 0 ? '−' : '') + Math.abs(100 * d / base).toFixed(1) + '%') : ''; }
  function num(n) { return Number(n).toLocaleString('en-US'); }
  var COLORS = { parameter: '#4f7fe0', output: '#9262d4', constant: '#9aa1ab', temp: '#f0a030', thread_local: '#62b38a' };
  var KIND_LABEL = { parameter: 'arguments', output: 'outputs', constant: 'constants', temp: 'temporaries', thread_local: 'thread-local' };
  function kindColor(k) { return COLORS[k] || '#7c8796'; }

  // Splits an op_name at '/' outside parentheses and brackets (as analyze does).
  function opParts(op) {
    var out = [], depth = 0, start = 0;
    for (var i = 0; i < op.length; i++) {
      var c = op[i];
      if (c === '(' || c === '[') depth++;
      else if (c === ')' || c === ']') depth--;
      else if (c === '/' && depth <= 0) { out.push(op.slice(start, i)); start = i + 1; }
    }
    out.push(op.slice(start));
    return out;
  }
  function opPath(b) { return b.op_name ? b.op_name : '(' + b.name + ')'; }
  function underPrefix(path, key) {
    if (path === key) return true;
    if (path.length <= key.length || path.slice(0, key.length) !== key) return false;
    return path[key.length] === '/' && opParts(path).slice(0, opParts(key).length).join('/') === key;
  }

  var META = readJSON('hbm-view-meta') || { mode: 'single', labels: [], chips: [] };
  var REPORTS = META.mode === 'diff' ? [readJSON('hbm-report-before'), readJSON('hbm-report-after')] : [readJSON('hbm-report')];
  var DIFF = META.mode === 'diff';

  var S = {
    side: DIFF ? 1 : 0, module: null, color: 0, limit: null, selected: null, hover: null,
    filter: '', kind: '', group: null, sortKey: 'size_bytes', sortAsc: false, ganttOrder: 'size',
    chartHover: null
  };

  function modulesOf(side) { return (REPORTS[side] && REPORTS[side].modules) || []; }
  function moduleNames() {
    var names = [];
    var order = DIFF ? [1, 0] : [0];
    order.forEach(function (s) { modulesOf(s).forEach(function (m) { if (names.indexOf(m.name) < 0) names.push(m.name); }); });
    return names;
  }
  function findModule(side, name) {
    var ms = modulesOf(side);
    for (var i = 0; i < ms.length; i++) if (ms[i].name === name) return ms[i];
    return null;
  }
  function curModule() { return findModule(S.side, S.module) || findModule(1 - S.side, S.module); }
  function curSide() { return findModule(S.side, S.module) ? S.side : 1 - S.side; }
  function spaceOf(m, color) {
    if (!m) return null;
    for (var i = 0; i < m.memory_spaces.length; i++) if (m.memory_spaces[i].color === color) return m.memory_spaces[i];
    return null;
  }
  function curSpace() { return spaceOf(curModule(), S.color); }
  function otherSpace() {
    if (!DIFF) return null;
    return spaceOf(findModule(1 - curSide(), S.module), S.color);
  }
  function limitBytes() {
    if (S.color !== 0 || S.limit === null) return null;
    return S.limit;
  }
  function scheduleLen(sp) {
    if (!sp) return 0;
    if (sp.timeline && sp.timeline.length) return sp.timeline.length;
    var n = 0;
    (sp.largest_buffers || sp.buffers_at_peak || []).forEach(function (b) { if (b.live) n = Math.max(n, b.live[1] + 1); });
    return n;
  }
  var lookupCache = null;
  function lookup(name) {
    var sp = curSpace();
    if (!sp || name === null) return null;
    if (!lookupCache || lookupCache.sp !== sp) {
      var map = new Map();
      (sp.largest_buffers || []).forEach(function (b) { map.set(b.name, { b: b, atPeak: false }); });
      sp.buffers_at_peak.forEach(function (b) { map.set(b.name, { b: b, atPeak: true }); });
      lookupCache = { sp: sp, map: map };
    }
    return lookupCache.map.get(name) || null;
  }

  function setupCanvas(c, cssH) {
    var dpr = window.devicePixelRatio || 1;
    var w = c.clientWidth || c.parentNode.clientWidth || 800;
    c.style.height = cssH + 'px';
    c.width = Math.round(w * dpr); c.height = Math.round(cssH * dpr);
    var g = c.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, cssH);
    return { g: g, w: w, h: cssH };
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }
  function showTip(tip, wrap, x, y, text) {
    tip.hidden = false; tip.textContent = text;
    var w = wrap.clientWidth, tw = tip.offsetWidth, th = tip.offsetHeight;
    var left = x + 14; if (left + tw > w) left = Math.max(0, x - tw - 14);
    var top = y + 12; if (wrap.clientHeight && top + th > wrap.scrollTop + wrap.clientHeight + 40) top = Math.max(0, y - th - 10);
    tip.style.left = left + 'px'; tip.style.top = top + 'px';
  }

  // ---------- header and controls ----------
  function fillSelect(sel, items, value) {
    sel.textContent = '';
    items.forEach(function (it) {
      var o = el('option', null, it.label); o.value = String(it.value);
      if (String(it.value) === String(value)) o.selected = true;
      sel.appendChild(o);
    });
  }
  function renderControls() {
    var names = moduleNames();
    fillSelect($('sel-module'), names.map(function (n) {
      var m = findModule(DIFF ? 1 : 0, n) || findModule(0, n);
      var hbm = spaceOf(m, 0);
      return { value: n, label: n + (hbm ? ' · ' + fmt(hbm.total_bytes) : '') };
    }), S.module);
    $('sel-module').disabled = names.length < 2;
    var m = curModule();
    var spaces = m ? m.memory_spaces.filter(function (s) { return s.total_bytes > 0 || s.peak_bytes > 0; }) : [];
    fillSelect($('sel-space'), spaces.map(function (s) { return { value: s.color, label: s.space + ' · ' + fmt(s.total_bytes) }; }), S.color);
    var items = [{ value: 'none', label: 'none' }];
    var rep = REPORTS[curSide()];
    var budget = rep && rep.diagnosis ? rep.diagnosis.budget_bytes : null;
    var chipMatch = false;
    (META.chips || []).forEach(function (c) {
      if (budget !== null && c.usable_bytes === budget) chipMatch = true;
      items.push({ value: c.usable_bytes, label: c.name + ' · ' + fmt(c.usable_bytes) });
    });
    if (budget !== null && budget !== undefined && !chipMatch) items.splice(1, 0, { value: budget, label: 'budget · ' + fmt(budget) });
    fillSelect($('sel-limit'), items, S.limit === null ? 'none' : S.limit);
    $('sel-limit').disabled = S.color !== 0;
    if (DIFF) { $('side-wrap').hidden = false; $('sel-side').value = String(S.side); }
  }
  function renderTitle() {
    var sp = curSpace();
    var t = (S.module || 'no module') + (sp ? ' · ' + sp.space : '');
    if (DIFF) t += ' · ' + (S.side ? 'after' : 'before') + ' (diff ' + META.labels.join(' → ') + ')';
    else if (META.labels && META.labels[0]) t += ' · ' + META.labels[0];
    $('title').textContent = t;
    document.title = 'hbm-doctor view: ' + t;
  }

  // ---------- diagnosis ----------
  function causeList(causes) {
    var ol = el('ol', 'causes');
    causes.forEach(function (c) {
      var li = el('li');
      li.appendChild(el('span', 'cause', c.cause));
      if (c.savings_bytes !== null && c.savings_bytes !== undefined) {
        li.appendChild(document.createTextNode(' '));
        var s = el('span', 'save', 'saves ~' + fmt(c.savings_bytes)); s.dataset.bytes = c.savings_bytes; li.appendChild(s);
      }
      li.appendChild(document.createTextNode(': ' + (c.evidence || '')));
      if (c.what_if) {
        var w = c.what_if;
        li.appendChild(el('div', 'hint', 'what if: peak ' + fmt(w.peak_before_bytes) + ' → ' + fmt(w.peak_bytes) +
          ' (' + w.buffers + ' buffers changed)' + (w.fits === true ? ', fits' : w.fits === false ? ', still does not fit' : '')));
      }
      if (c.actions && c.actions.length) {
        var ul = el('ul');
        c.actions.forEach(function (a) { ul.appendChild(el('li', null, a)); });
        li.appendChild(ul);
      }
      ol.appendChild(li);
    });
    return ol;
  }
  function renderDiagnosis() {
    var box = $('diagnosis'); box.textContent = '';
    var rep = REPORTS[curSide()];
    if (!rep) return;
    var d = rep.diagnosis || {};
    var head = el('div', 'card-head');
    head.appendChild(el('h2', null, DIFF ? 'Diagnosis (' + (curSide() ? 'after' : 'before') + ')' : 'Diagnosis'));
    var badges = el('div');
    var cat = el('span', 'badge', d.category || 'unknown'); cat.id = 'category'; badges.appendChild(cat);
    var m = curModule();
    if (m && m.estimate) badges.appendChild(el('span', 'badge est', 'estimate: ' + m.method));
    if (m && m.num_partitions > 1) badges.appendChild(el('span', 'badge', m.num_partitions + ' partitions, per-device figures'));
    head.appendChild(badges);
    box.appendChild(head);
    var v = el('p', 'verdict' + (d.fits === false ? ' bad' : d.fits === true ? ' ok' : ''), d.summary || '');
    v.id = 'verdict';
    box.appendChild(v);
    var ledger = d.ledger || [];
    if (ledger.length && !DIFF) {
      var lt = el('table', 'ledger'); lt.id = 'ledger';
      lt.innerHTML = '<thead><tr><th>ledger</th><th class="num">bytes</th><th>what</th></tr></thead>';
      var lb = el('tbody');
      ledger.forEach(function (l) {
        var tr = el('tr');
        tr.appendChild(el('td', null, l.part));
        var td = el('td', 'num', fmt(l.bytes)); td.dataset.bytes = l.bytes; tr.appendChild(td);
        tr.appendChild(el('td', 'hint', l.note));
        lb.appendChild(tr);
      });
      lt.appendChild(lb);
      box.appendChild(lt);
    }
    var causes = d.causes || [];
    if (!causes.length) box.appendChild(el('p', 'hint', 'No known waste found: the detectors (replication, debug prints, donation, padding, precision, remat, batch size) did not fire.'));
    else box.appendChild(causeList(causes));
    if (m && m.causes && m.causes.length && rep.modules.length > 1 &&
        JSON.stringify(m.causes) !== JSON.stringify(causes)) {
      box.appendChild(el('h2', 'sub', 'Found in module ' + m.name));
      box.appendChild(causeList(m.causes));
    }
  }

  // ---------- diff ----------
  var FIGS = [
    ['total_bytes', 'total reserved'], ['peak_bytes', 'peak live'], ['arguments_bytes', 'arguments'],
    ['outputs_bytes', 'outputs'], ['aliased_bytes', 'aliased (donated)'], ['temp_bytes', 'temporaries'],
    ['padding_bytes', 'padding at peak'], ['fragmentation_bytes', 'fragmentation']
  ];
  function sig(b) { return [b.kind, b.shape, b.op_name || '', b.source || ''].join('\u0001'); }
  function renderDiff() {
    var box = $('diff');
    if (!DIFF) { box.hidden = true; return; }
    box.hidden = false; box.textContent = '';
    var before = spaceOf(findModule(0, S.module), S.color), after = spaceOf(findModule(1, S.module), S.color);
    var head = el('div', 'card-head');
    head.appendChild(el('h2', null, 'What changed: ' + META.labels[0] + ' → ' + META.labels[1]));
    box.appendChild(head);
    if (!before || !after) {
      box.appendChild(el('p', 'hint', 'Module ' + S.module + ' (' + (spaceOf(curModule(), S.color) || {}).space + ') exists only in the ' + (before ? 'before' : 'after') + ' dump.'));
      return;
    }
    var dp = after.peak_bytes - before.peak_bytes, dt = after.total_bytes - before.total_bytes;
    var v = el('p', 'verdict ' + (dt < 0 ? 'ok' : dt > 0 ? 'bad' : ''));
    v.id = 'diff-verdict';
    v.textContent = 'total ' + fmt(before.total_bytes) + ' → ' + fmt(after.total_bytes) + ' (' + fmtDelta(dt) + ', ' + pct(dt, before.total_bytes) + '); peak ' +
      fmt(before.peak_bytes) + ' → ' + fmt(after.peak_bytes) + ' (' + fmtDelta(dp) + ')';
    v.style.fontWeight = '650'; v.style.margin = '0 0 8px';
    box.appendChild(v);
    var grid = el('div', 'diffgrid');
    var t = el('table', 'diff');
    t.innerHTML = '<thead><tr><th></th><th class="num">before</th><th class="num">after</th><th class="num">change</th></tr></thead>';
    var tb = el('tbody');
    FIGS.forEach(function (f) {
      var a = before[f[0]] || 0, b = after[f[0]] || 0, d = b - a;
      var tr = el('tr');
      tr.appendChild(el('td', null, f[1]));
      tr.appendChild(el('td', 'num', fmt(a)));
      tr.appendChild(el('td', 'num', fmt(b)));
      var td = el('td', 'num ' + (d < 0 ? 'down' : d > 0 ? 'up' : 'same'), d ? fmtDelta(d) + ' ' + pct(d, a) : 'same');
      td.dataset.bytes = d;
      tr.appendChild(td); tb.appendChild(tr);
    });
    t.appendChild(tb);
    var left = el('div'); left.appendChild(t);
    // Causes fixed, kept, new.
    var cb = (REPORTS[0].diagnosis.causes || []).map(function (c) { return c.cause; });
    var ca = (REPORTS[1].diagnosis.causes || []).map(function (c) { return c.cause; });
    var ul = el('ul'); ul.style.paddingLeft = '18px';
    cb.forEach(function (c) {
      var li = el('li'); var fixed = ca.indexOf(c) < 0;
      li.appendChild(el('span', 'tag ' + (fixed ? 'fixed' : 'kept'), fixed ? 'fixed' : 'still there'));
      li.appendChild(document.createTextNode(' ' + c)); ul.appendChild(li);
    });
    ca.forEach(function (c) {
      if (cb.indexOf(c) >= 0) return;
      var li = el('li'); li.appendChild(el('span', 'tag new', 'new'));
      li.appendChild(document.createTextNode(' ' + c)); ul.appendChild(li);
    });
    if (cb.length || ca.length) { left.appendChild(el('h2', 'sub', 'Causes')); left.appendChild(ul); }
    grid.appendChild(left);
    // Buffers at the peak, matched by kind, shape, op_name and source line.
    var agg = new Map();
    [[before, 0], [after, 1]].forEach(function (p) {
      p[0].buffers_at_peak.forEach(function (b) {
        var k = sig(b), e = agg.get(k);
        if (!e) { e = { b: b, n: [0, 0], bytes: [0, 0] }; agg.set(k, e); }
        e.n[p[1]]++; e.bytes[p[1]] += b.size_bytes;
      });
    });
    var rows = Array.from(agg.values()).filter(function (e) { return e.bytes[0] !== e.bytes[1]; });
    rows.sort(function (x, y) { return Math.abs(y.bytes[1] - y.bytes[0]) - Math.abs(x.bytes[1] - x.bytes[0]); });
    var right = el('div');
    right.appendChild(el('h2', 'sub', 'Buffers at the peak that changed (' + num(rows.length) + ')'));
    right.firstChild.style.marginTop = '0';
    var t2 = el('table', 'diff'); t2.id = 'diff-buffers';
    t2.innerHTML = '<thead><tr><th>kind · shape</th><th>op_name / source</th><th class="num">before</th><th class="num">after</th></tr></thead>';
    var tb2 = el('tbody');
    rows.slice(0, 25).forEach(function (e) {
      var tr = el('tr');
      tr.appendChild(el('td', 'mono', e.b.kind + ' ' + e.b.shape));
      var o = el('td', null, (e.b.op_name || '(' + e.b.name + ')') + (e.b.source ? ' (' + e.b.source + ')' : ''));
      o.style.maxWidth = '340px'; o.style.overflow = 'hidden'; o.style.textOverflow = 'ellipsis'; o.style.whiteSpace = 'nowrap'; o.title = o.textContent;
      tr.appendChild(o);
      tr.appendChild(el('td', 'num', e.n[0] ? e.n[0] + '× ' + fmt(e.bytes[0]) : '–'));
      tr.appendChild(el('td', 'num ' + (e.bytes[1] < e.bytes[0] ? 'down' : 'up'), e.n[1] ? e.n[1] + '× ' + fmt(e.bytes[1]) : 'gone'));
      tb2.appendChild(tr);
    });
    t2.appendChild(tb2); right.appendChild(t2);
    if (rows.length > 25) right.appendChild(el('p', 'hint', (rows.length - 25) + ' smaller changes not listed.'));
    grid.appendChild(right);
    box.appendChild(grid);
  }

  // ---------- figures ----------
  function renderFigures() {
    var box = $('figures'); box.textContent = '';
    var sp = curSpace(), other = otherSpace(), lim = limitBytes();
    if (!sp) { box.appendChild(el('p', 'hint', 'No memory space with allocations in this module.')); return; }
    var figs = FIGS.slice();
    figs.push(['buffers', 'buffers at the peak']);
    figs.forEach(function (f) {
      var card = el('div', 'fig'); card.id = 'fig-' + f[0].replace('_bytes', '');
      var val = f[0] === 'buffers' ? sp.buffers_at_peak.length : sp[f[0]];
      card.appendChild(el('div', 'k', f[1]));
      var v = el('div', 'v', f[0] === 'buffers' ? num(val) : fmt(val));
      v.dataset.bytes = val; v.title = num(val) + (f[0] === 'buffers' ? ' buffers' : ' bytes');
      card.appendChild(v);
      if ((f[0] === 'total_bytes' || f[0] === 'peak_bytes') && lim !== null) {
        var over = val - lim;
        if (over > 0) card.className += ' over';
        card.appendChild(el('div', 'd ' + (over > 0 ? 'up' : 'down'), over > 0 ? fmt(over) + ' over the limit' : fmt(-over) + ' under the limit'));
      } else if (f[0] === 'peak_bytes' && sp.peak_time !== null && sp.peak_time !== undefined) {
        var d0 = el('div', 'd same', '#' + sp.peak_time + ' ' + (sp.peak_instruction || ''));
        d0.style.overflow = 'hidden'; d0.style.textOverflow = 'ellipsis'; d0.style.whiteSpace = 'nowrap'; d0.title = d0.textContent;
        card.appendChild(d0);
      }
      if (other) {
        var ov = f[0] === 'buffers' ? other.buffers_at_peak.length : other[f[0]];
        var d = val - ov;
        var sideName = curSide() ? 'before' : 'after';
        card.appendChild(el('div', 'd ' + (d < 0 ? 'down' : d > 0 ? 'up' : 'same'),
          d === 0 ? 'same as ' + sideName : (f[0] === 'buffers' ? (d > 0 ? '+' : '−') + Math.abs(d) : fmtDelta(d)) + ' vs ' + sideName));
      }
      box.appendChild(card);
    });
  }

  // ---------- memory chart ----------
  var chartGeom = null;
  function seriesOf(sp) {
    if (!sp) return [];
    if (sp.timeline_by_kind && sp.timeline_by_kind.length) return sp.timeline_by_kind;
    return sp.timeline && sp.timeline.length ? [{ kind: 'temp', bytes: sp.timeline }] : [];
  }
  function columns(n, plotW) {
    // One column per position when they fit, else one per pixel holding the position with the most bytes.
    var cols = [];
    if (n <= plotW) { for (var i = 0; i < n; i++) cols.push({ a: i, b: i + 1 }); return cols; }
    var W = Math.floor(plotW);
    for (var px = 0; px < W; px++) {
      var a = Math.floor(px * n / W), b = Math.max(a + 1, Math.floor((px + 1) * n / W));
      cols.push({ a: a, b: b });
    }
    return cols;
  }
  function drawChart() {
    var c = $('chart'), sp = curSpace();
    var legend = $('chart-legend'); legend.textContent = '';
    var cv = setupCanvas(c, 300), g = cv.g;
    chartGeom = null;
    var series = seriesOf(sp);
    var tl = sp ? sp.timeline || [] : [];
    var n = tl.length;
    c.dataset.peakBytes = sp ? sp.peak_bytes : '';
    c.dataset.peakTime = sp && sp.peak_time !== null ? sp.peak_time : '';
    c.dataset.positions = n;
    var lim = limitBytes();
    c.dataset.limitBytes = lim === null ? '' : lim;
    if (!sp || !n) {
      g.fillStyle = '#6b7280'; g.font = '14px system-ui, sans-serif';
      g.fillText(sp ? 'No live ranges in this dump: only the totals above are known (see the notes below).' : 'No data.', 20, 40);
      $('chart-hint').textContent = '';
      return;
    }
    var other = otherSpace();
    var otl = other ? other.timeline || [] : [];
    var L = 74, R = 14, T = 16, B = 30, W = cv.w - L - R, H = cv.h - T - B;
    var ymax = Math.max(sp.peak_bytes, lim || 0, otl.length ? Math.max.apply(null, otl.length > 50000 ? [other.peak_bytes] : otl) : 0);
    for (var q = 0; q < n; q++) if (tl[q] > ymax) ymax = tl[q];
    ymax = ymax * 1.1 || 1;
    var unit = ymax >= GIB ? GIB : ymax >= MIB ? MIB : ymax >= KIB ? KIB : 1;
    var uname = { 1: 'B' }; uname[KIB] = 'K'; uname[MIB] = 'M'; uname[GIB] = 'G';
    var step = niceStep(ymax / unit / 5) * unit;
    function X(i) { return L + i / n * W; }
    function Y(b) { return T + H - b / ymax * H; }
    chartGeom = { L: L, W: W, T: T, H: H, n: n, X: X, Y: Y };
    // grid and y axis
    g.font = '11px system-ui, sans-serif'; g.textBaseline = 'middle'; g.textAlign = 'right';
    for (var y = 0; y <= ymax; y += step) {
      g.strokeStyle = '#eef0f3'; g.lineWidth = 1; g.beginPath(); g.moveTo(L, Math.round(Y(y)) + .5); g.lineTo(L + W, Math.round(Y(y)) + .5); g.stroke();
      g.fillStyle = '#6b7280'; g.fillText((y / unit).toFixed(step / unit < 1 ? 1 : 0) + ' ' + uname[unit], L - 6, Y(y));
    }
    // x axis
    g.textAlign = 'center'; g.textBaseline = 'top';
    var xs = niceStep(Math.max(1, n / 8));
    for (var x = 0; x < n; x += xs) { g.fillStyle = '#6b7280'; g.fillText('#' + x, X(x), T + H + 6); }
    g.textAlign = 'right'; g.fillText('program order (HLO schedule position), not time', L + W, T + H + 18);
    // limit shading
    if (lim !== null && lim < ymax) {
      g.fillStyle = 'rgba(214,39,40,.06)'; g.fillRect(L, T, W, Y(lim) - T);
    }
    // stacked kinds
    var cols = columns(n, W);
    var sel = S.selected !== null ? lookup(S.selected) : null;
    var selLive = sel && sel.b.live ? sel.b.live : null;
    var dim = selLive ? 0.55 : 1;
    cols.forEach(function (col) {
      var best = col.a;
      for (var i = col.a + 1; i < col.b; i++) if (tl[i] > tl[best]) best = i;
      col.best = best;
      var x0 = X(col.a), x1 = Math.max(X(col.b), x0 + 1), acc = 0;
      if (n > W) { x0 = Math.floor(x0); x1 = Math.ceil(x1); }
      series.forEach(function (s) {
        var v = s.bytes[best] || 0;
        if (!v) return;
        g.globalAlpha = dim; g.fillStyle = kindColor(s.kind);
        var ya = Y(acc + v), yb = Y(acc);
        g.fillRect(x0, ya, x1 - x0 + (n <= W ? 0.5 : 0), yb - ya);
        acc += v;
      });
      g.globalAlpha = 1;
    });
    // the selected buffer: its live range and its share on top of the stack
    if (selLive) {
      var sx0 = X(selLive[0]), sx1 = Math.max(X(selLive[1] + 1), sx0 + 2);
      g.fillStyle = 'rgba(224,36,94,.08)'; g.fillRect(sx0, T, sx1 - sx0, H);
      g.fillStyle = 'rgba(224,36,94,.85)';
      cols.forEach(function (col) {
        if (col.b <= selLive[0] || col.a > selLive[1]) return;
        var t = Math.min(Math.max(col.best, selLive[0]), selLive[1]);
        var tot = tl[t], h = Math.min(sel.b.size_bytes, tot);
        var x0 = Math.max(X(col.a), sx0), x1 = Math.min(Math.max(X(col.b), X(col.a) + 1), sx1);
        g.fillRect(x0, Y(tot), x1 - x0 + (n <= W ? 0.5 : 0), Math.max(2, Y(tot - h) - Y(tot)));
      });
      g.strokeStyle = '#e0245e'; g.lineWidth = 1; g.setLineDash([3, 3]);
      g.beginPath(); g.moveTo(sx0 + .5, T); g.lineTo(sx0 + .5, T + H); g.moveTo(sx1 - .5, T); g.lineTo(sx1 - .5, T + H); g.stroke(); g.setLineDash([]);
    }
    // other side of a diff: its total as a line, over the same fraction of its program
    if (otl.length) {
      var on = otl.length, ocols = columns(on, W);
      g.strokeStyle = '#1d2330'; g.lineWidth = 1.5; g.setLineDash([5, 3]); g.beginPath();
      ocols.forEach(function (col, k) {
        var m = otl[col.a];
        for (var i = col.a + 1; i < col.b; i++) if (otl[i] > m) m = otl[i];
        var x0 = L + col.a / on * W, x1 = L + col.b / on * W;
        if (k === 0) g.moveTo(x0, Y(m)); else g.lineTo(x0, Y(m));
        g.lineTo(x1, Y(m));
      });
      g.stroke(); g.setLineDash([]);
    }
    // limit line
    if (lim !== null) {
      var ly = Math.round(Y(lim)) + .5;
      g.strokeStyle = '#d62728'; g.lineWidth = 1.5; g.setLineDash([7, 4]);
      g.beginPath(); g.moveTo(L, ly); g.lineTo(L + W, ly); g.stroke(); g.setLineDash([]);
      g.fillStyle = '#d62728'; g.textAlign = 'left'; g.textBaseline = 'bottom'; g.font = '600 11px system-ui, sans-serif';
      var opt = $('sel-limit').selectedOptions[0];
      g.fillText('limit ' + (opt ? opt.textContent : fmt(lim)), L + 6, ly - 3);
    }
    // peak marker
    if (sp.peak_time !== null && sp.peak_time !== undefined && sp.peak_time < n) {
      var px = X(sp.peak_time + 0.5), py = Y(sp.peak_bytes);
      g.strokeStyle = '#141a26'; g.lineWidth = 1; g.setLineDash([2, 3]);
      g.beginPath(); g.moveTo(px, py); g.lineTo(px, T + H); g.stroke(); g.setLineDash([]);
      g.fillStyle = '#141a26'; g.beginPath(); g.arc(px, py, 4.5, 0, 2 * Math.PI); g.fill();
      var label = 'peak ' + fmt(sp.peak_bytes) + ' at #' + sp.peak_time + (sp.peak_instruction ? ' ' + sp.peak_instruction : '');
      g.font = '600 12px system-ui, sans-serif'; g.textBaseline = 'bottom';
      var tw = g.measureText(label).width;
      var lx = px + 8; if (lx + tw > L + W) { lx = px - 8 - tw; }
      var ly2 = Math.max(T + 14, py - 6);
      g.fillStyle = 'rgba(255,255,255,.85)'; g.fillRect(lx - 3, ly2 - 15, tw + 6, 17);
      g.fillStyle = '#141a26'; g.textAlign = 'left'; g.fillText(label, lx, ly2);
      c.dataset.peakX = Math.round(px); c.dataset.peakY = Math.round(py);
    }
    // hover crosshair
    if (S.chartHover !== null && S.chartHover < n) {
      var hx = X(S.chartHover + 0.5);
      g.strokeStyle = 'rgba(20,26,38,.5)'; g.lineWidth = 1; g.beginPath(); g.moveTo(hx, T); g.lineTo(hx, T + H); g.stroke();
    }
    g.strokeStyle = '#c8ced8'; g.lineWidth = 1; g.beginPath(); g.moveTo(L + .5, T); g.lineTo(L + .5, T + H + .5); g.lineTo(L + W, T + H + .5); g.stroke();
    // legend
    series.forEach(function (s) {
      var item = el('span'); var sw = el('i'); sw.style.background = kindColor(s.kind);
      item.appendChild(sw); item.appendChild(document.createTextNode(KIND_LABEL[s.kind] || s.kind)); legend.appendChild(item);
    });
    if (otl.length) { var it = el('span', null, '- - ' + (curSide() ? 'before' : 'after') + ' (total, same fraction of its program)'); legend.appendChild(it); }
    if (lim !== null) { var li = el('span', null, '- - limit'); li.style.color = '#d62728'; legend.appendChild(li); }
    $('chart-hint').textContent = num(n) + ' schedule positions' + (n > W ? ' (each pixel shows the position with the most bytes)' : '') +
      '. Hover for what is live; click to select the largest buffer live there.';
  }
  function liveAt(sp, t) {
    var list = (sp.largest_buffers && sp.largest_buffers.length ? sp.largest_buffers : sp.buffers_at_peak);
    var out = [];
    for (var i = 0; i < list.length; i++) {
      var b = list[i];
      if (b.live && b.live[0] <= t && t <= b.live[1]) out.push(b);
    }
    return out;
  }
  function chartIndex(ev) {
    if (!chartGeom) return null;
    var r = $('chart').getBoundingClientRect(), x = ev.clientX - r.left;
    if (x < chartGeom.L || x > chartGeom.L + chartGeom.W) return null;
    return Math.min(chartGeom.n - 1, Math.max(0, Math.floor((x - chartGeom.L) / chartGeom.W * chartGeom.n)));
  }
  function bindChart() {
    var c = $('chart'), tip = $('chart-tip');
    c.addEventListener('mousemove', function (ev) {
      var t = chartIndex(ev), sp = curSpace();
      if (t === null || !sp) { tip.hidden = true; S.chartHover = null; drawChart(); return; }
      S.chartHover = t; drawChart();
      var m = curModule();
      var lines = ['#' + t + (m && m.schedule && m.schedule[t] ? ' ' + m.schedule[t] : '') + ': ' + fmt(sp.timeline[t])];
      seriesOf(sp).forEach(function (s) { if (s.bytes[t]) lines.push('  ' + (KIND_LABEL[s.kind] || s.kind) + ' ' + fmt(s.bytes[t])); });
      var live = liveAt(sp, t).filter(function (b) { return b.kind === 'temp'; }).slice(0, 4);
      if (live.length) { lines.push('largest temporaries live here:'); live.forEach(function (b) { lines.push('  ' + fmt(b.size_bytes) + ' ' + b.name + ' ' + b.shape); }); }
      var r = c.getBoundingClientRect();
      showTip(tip, c.parentNode, ev.clientX - r.left, ev.clientY - r.top, lines.join('\n'));
    });
    c.addEventListener('mouseleave', function () { tip.hidden = true; S.chartHover = null; drawChart(); });
    c.addEventListener('click', function (ev) {
      var t = chartIndex(ev), sp = curSpace();
      if (t === null || !sp) return;
      var live = liveAt(sp, t);
      var temps = live.filter(function (b) { return b.kind === 'temp'; });
      var pick = (temps.length ? temps : live)[0];
      if (pick) select(pick.name, 'chart');
    });
  }

  // ---------- table ----------
  var COLS = [
    { key: 'size_bytes', label: 'size', num: true, fmt: fmt },
    { key: 'unpadded_bytes', label: 'unpadded', num: true, fmt: fmt },
    { key: 'pad', label: 'padding', num: true, get: function (b) { return b.size_bytes - b.unpadded_bytes; }, fmt: function (v) { return v ? fmt(v) : '–'; } },
    { key: 'kind', label: 'kind' },
    { key: 'name', label: 'buffer' },
    { key: 'shape', label: 'shape' },
    { key: 'op_name', label: 'op_name' },
    { key: 'source', label: 'file:line' }
  ];
  var ROW_H = 24;
  var view = [];
  function colVal(col, b) { return col.get ? col.get(b) : b[col.key]; }
  function renderHead() {
    var h = $('thead'); h.textContent = '';
    var tr = el('div', 'tr');
    COLS.forEach(function (col) {
      var s = el('span', (col.num ? 'num' : '') + (S.sortKey === col.key ? ' sorted' + (S.sortAsc ? ' asc' : '') : ''), col.label);
      s.dataset.key = col.key;
      s.title = 'sort by ' + col.label;
      tr.appendChild(s);
    });
    h.appendChild(tr);
  }
  function computeView() {
    var sp = curSpace();
    var list = sp ? sp.buffers_at_peak : [];
    var f = S.filter.toLowerCase(), k = S.kind, grp = S.group;
    view = [];
    for (var i = 0; i < list.length; i++) {
      var b = list[i];
      if (k && b.kind !== k) continue;
      if (grp) {
        if (grp.type === 'source' && (b.source || '(no source line)') !== grp.key) continue;
        if (grp.type === 'op' && !underPrefix(opPath(b), grp.key)) continue;
      }
      if (f) {
        var hay = (b.name + ' ' + b.shape + ' ' + b.kind + ' ' + (b.op_name || '') + ' ' + (b.source || '') + ' ' + (b.layout_shape || '')).toLowerCase();
        if (hay.indexOf(f) < 0) continue;
      }
      view.push(b);
    }
    var col = COLS.filter(function (c) { return c.key === S.sortKey; })[0] || COLS[0];
    var dir = S.sortAsc ? 1 : -1;
    view.sort(function (a, b) {
      var x = colVal(col, a), y = colVal(col, b);
      if (x === null || x === undefined) x = col.num ? -1 : '';
      if (y === null || y === undefined) y = col.num ? -1 : '';
      var r = col.num ? x - y : (x < y ? -1 : x > y ? 1 : 0);
      if (r === 0) r = b.size_bytes - a.size_bytes || (a.name < b.name ? -1 : 1) * (S.sortAsc ? 1 : -1) * -1;
      return r * (col.num || r !== 0 ? dir : 1);
    });
    var total = 0;
    for (var j = 0; j < view.length; j++) total += view[j].size_bytes;
    var all = sp ? sp.buffers_at_peak.length : 0;
    $('table-foot').textContent = num(view.length) + (view.length !== all ? ' of ' + num(all) : '') + ' buffers, ' + fmt(total) +
      '. Click a row to select it; ↑/↓ move the selection; click a header to sort.';
    $('table').dataset.rows = view.length;
    $('table').dataset.bytes = total;
    $('sizer').style.height = (view.length * ROW_H) + 'px';
    var chip = $('group-chip');
    if (grp) { chip.hidden = false; chip.textContent = (grp.type === 'op' ? 'op_name ' : 'source ') + grp.key + '  ✕'; chip.title = 'clear: ' + grp.key; }
    else chip.hidden = true;
    $('table-title').textContent = 'Buffers live at the peak' + (sp && sp.peak_time !== null && sp.peak_time !== undefined ? ' (#' + sp.peak_time + ')' : '');
  }
  function renderRows() {
    var body = $('tbody'), rows = $('rows');
    var first = Math.max(0, Math.floor(body.scrollTop / ROW_H) - 5);
    var last = Math.min(view.length, first + Math.ceil((body.clientHeight || 430) / ROW_H) + 10);
    rows.style.transform = 'translateY(' + (first * ROW_H) + 'px)';
    rows.textContent = '';
    for (var i = first; i < last; i++) {
      var b = view[i];
      var tr = el('div', 'tr' + (b.name === S.selected ? ' sel' : '') + (b.name === S.hover ? ' hover' : ''));
      tr.dataset.name = b.name; tr.dataset.index = i;
      COLS.forEach(function (col) {
        var v = colVal(col, b);
        var s = el('span', col.num ? 'num' : (col.key === 'shape' || col.key === 'name' ? 'mono' : ''));
        if (col.key === 'kind') { var k = el('i', 'kind'); k.style.background = kindColor(v); s.appendChild(k); s.appendChild(document.createTextNode(v)); }
        else s.textContent = col.fmt ? col.fmt(v) : (v === null || v === undefined ? '' : v);
        if (col.key === 'size_bytes') s.dataset.bytes = v;
        if (!col.num) s.title = v === null || v === undefined ? '' : String(v);
        tr.appendChild(s);
      });
      rows.appendChild(tr);
    }
  }
  function refreshTable() { computeView(); renderHead(); renderRows(); }
  function scrollTableTo(name) {
    for (var i = 0; i < view.length; i++) {
      if (view[i].name === name) {
        var body = $('tbody'), top = i * ROW_H;
        if (top < body.scrollTop || top + ROW_H > body.scrollTop + body.clientHeight) body.scrollTop = Math.max(0, top - body.clientHeight / 3);
        return;
      }
    }
  }
  function bindTable() {
    $('tbody').addEventListener('scroll', renderRows);
    $('thead').addEventListener('click', function (ev) {
      var k = ev.target.dataset && ev.target.dataset.key;
      if (!k) return;
      if (S.sortKey === k) S.sortAsc = !S.sortAsc; else { S.sortKey = k; S.sortAsc = !(COLS.filter(function (c) { return c.key === k; })[0].num); }
      refreshTable();
    });
    $('rows').addEventListener('click', function (ev) {
      var tr = ev.target.closest('.tr');
      if (tr) select(tr.dataset.name === S.selected ? null : tr.dataset.name, 'table');
    });
    $('rows').addEventListener('mouseover', function (ev) {
      var tr = ev.target.closest('.tr');
      if (tr && tr.dataset.name !== S.hover) { S.hover = tr.dataset.name; drawGantt(); drawIcicle(); }
    });
    $('rows').addEventListener('mouseleave', function () { S.hover = null; drawGantt(); drawIcicle(); });
    var timer = null;
    $('filter').addEventListener('input', function () {
      clearTimeout(timer);
      timer = setTimeout(function () { S.filter = $('filter').value; $('tbody').scrollTop = 0; refreshTable(); }, view.length > 20000 ? 150 : 0);
    });
    $('kind-filter').addEventListener('change', function () { S.kind = $('kind-filter').value; refreshTable(); });
    $('group-chip').addEventListener('click', function () { S.group = null; refreshTable(); drawIcicle(); renderSources(); });
    $('table').addEventListener('keydown', function (ev) {
      if (ev.key !== 'ArrowDown' && ev.key !== 'ArrowUp') return;
      ev.preventDefault();
      var i = -1;
      for (var k = 0; k < view.length; k++) if (view[k].name === S.selected) { i = k; break; }
      i = Math.max(0, Math.min(view.length - 1, i + (ev.key === 'ArrowDown' ? 1 : -1)));
      if (view[i]) select(view[i].name, 'key');
    });
  }
  function renderKindFilter() {
    var sp = curSpace(), kinds = [];
    (sp ? sp.buffers_at_peak : []).forEach(function (b) { if (kinds.indexOf(b.kind) < 0) kinds.push(b.kind); });
    fillSelect($('kind-filter'), [{ value: '', label: 'all kinds' }].concat(kinds.map(function (k) { return { value: k, label: k }; })), S.kind);
  }

  // ---------- icicle of op_name paths ----------
  var icicle = null;
  function layoutIcicle(sp) {
    var groups = sp ? sp.by_op_name || [] : [];
    var total = 0, nodes = [], stack = [], maxDepth = 0;
    groups.forEach(function (gq) { if (gq.depth === 0) total += gq.bytes; });
    var cursor = 0;
    groups.forEach(function (gq) {
      var node = { key: gq.key, depth: gq.depth, bytes: gq.bytes, buffers: gq.buffers, leaf: opParts(gq.key).pop() };
      var w = total ? gq.bytes / total : 0;
      if (gq.depth === 0) { node.x0 = cursor; cursor += w; }
      else {
        var parent = stack[gq.depth - 1];
        if (!parent) return;
        node.x0 = parent.cur; parent.cur += w;
      }
      node.x1 = node.x0 + w; node.cur = node.x0; node.top = opParts(gq.key)[0];
      stack[gq.depth] = node; stack.length = gq.depth + 1;
      maxDepth = Math.max(maxDepth, gq.depth);
      nodes.push(node);
    });
    return { sp: sp, nodes: nodes, total: total, depth: Math.min(maxDepth, 11) + 1 };
  }
  var ICE_H = 22;
  function hueOf(s) { var h = 0; for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0; return h % 360; }
  function drawIcicle() {
    var sp = curSpace();
    if (!icicle || icicle.sp !== sp) icicle = layoutIcicle(sp);
    var c = $('icicle'), cv = setupCanvas(c, Math.max(ICE_H, icicle.depth * ICE_H)), g = cv.g;
    icicle.w = cv.w;
    var selPath = null;
    var who = S.hover !== null ? lookup(S.hover) : S.selected !== null ? lookup(S.selected) : null;
    if (who) selPath = opPath(who.b);
    g.font = '11px system-ui, sans-serif'; g.textBaseline = 'middle';
    // Boxes narrower than a pixel are merged with their sub-pixel neighbours into one grey box.
    var blocks = [], acc = [];
    function flush(d) {
      var a = acc[d];
      if (!a) return;
      acc[d] = null;
      blocks.push({ agg: true, depth: d, x0: a.x0, x1: a.x1, n: a.n, bytes: a.bytes, buffers: a.buffers });
    }
    icicle.nodes.forEach(function (nd) {
      if (nd.depth >= icicle.depth) return;
      var w = (nd.x1 - nd.x0) * cv.w;
      if (w < 1) {
        var a = acc[nd.depth];
        if (a && Math.abs(a.x1 - nd.x0) < 1e-9) { a.x1 = nd.x1; a.n++; a.bytes += nd.bytes; a.buffers += nd.buffers; }
        else { flush(nd.depth); acc[nd.depth] = { x0: nd.x0, x1: nd.x1, n: 1, bytes: nd.bytes, buffers: nd.buffers }; }
        return;
      }
      flush(nd.depth);
      blocks.push(nd);
    });
    for (var d = 0; d < acc.length; d++) flush(d);
    icicle.blocks = blocks;
    blocks.forEach(function (nd) {
      var x0 = nd.x0 * cv.w, x1 = nd.x1 * cv.w;
      if (x1 - x0 < 0.5) return;
      var y = nd.depth * ICE_H;
      if (nd.agg) {
        g.fillStyle = '#d5d9e0'; g.fillRect(x0 + .5, y + .5, Math.max(0.5, x1 - x0 - 1), ICE_H - 1);
        if (x1 - x0 > 60) {
          var t = num(nd.n) + ' small paths ' + fmt(nd.bytes);
          while (t.length > 3 && g.measureText(t).width > x1 - x0 - 8) t = t.slice(0, -2);
          g.fillStyle = '#4b5563'; g.fillText(t, x0 + 4, y + ICE_H / 2);
        }
        return;
      }
      var on = selPath && underPrefix(selPath, nd.key);
      var filt = S.group && S.group.type === 'op' && underPrefix(nd.key, S.group.key);
      g.fillStyle = 'hsl(' + hueOf(nd.top) + ',55%,' + Math.min(88, 62 + nd.depth * 4) + '%)';
      g.globalAlpha = (selPath && !on) ? 0.45 : 1;
      g.fillRect(x0 + .5, y + .5, Math.max(0.5, x1 - x0 - 1), ICE_H - 1);
      g.globalAlpha = 1;
      if (on || filt) { g.strokeStyle = on ? '#e0245e' : '#2563eb'; g.lineWidth = 2; g.strokeRect(x0 + 1.5, y + 1.5, Math.max(1, x1 - x0 - 3), ICE_H - 3); }
      if (x1 - x0 > 40) {
        var label = nd.leaf + ' ' + fmt(nd.bytes);
        g.fillStyle = '#1d2330';
        var room = x1 - x0 - 8;
        while (label.length > 3 && g.measureText(label).width > room) label = label.slice(0, -2);
        if (label !== nd.leaf + ' ' + fmt(nd.bytes)) label = label.slice(0, -1) + '…';
        g.fillText(label, x0 + 4, y + ICE_H / 2);
      }
    });
    if (!icicle.nodes.length) { g.fillStyle = '#6b7280'; g.fillText('no buffers at the peak', 6, 11); }
  }
  function icicleHit(ev) {
    if (!icicle) return null;
    var r = $('icicle').getBoundingClientRect(), x = (ev.clientX - r.left) / r.width, d = Math.floor((ev.clientY - r.top) / ICE_H);
    var list = icicle.blocks || icicle.nodes;
    for (var i = 0; i < list.length; i++) {
      var nd = list[i];
      if (nd.depth === d && nd.x0 <= x && x < nd.x1) return nd;
    }
    return null;
  }
  function bindIcicle() {
    var c = $('icicle'), tip = $('icicle-tip');
    c.addEventListener('mousemove', function (ev) {
      var nd = icicleHit(ev);
      if (!nd) { tip.hidden = true; return; }
      var r = c.getBoundingClientRect();
      if (nd.agg) {
        showTip(tip, c.parentNode, ev.clientX - r.left, ev.clientY - r.top, num(nd.n) + ' op_name paths narrower than a pixel: ' + fmt(nd.bytes) + ' in ' + num(nd.buffers) + ' buffers');
        return;
      }
      showTip(tip, c.parentNode, ev.clientX - r.left, ev.clientY - r.top,
        nd.key + '\n' + fmt(nd.bytes) + ' in ' + num(nd.buffers) + ' buffer' + (nd.buffers > 1 ? 's' : '') + (icicle.total ? ' (' + (100 * nd.bytes / icicle.total).toFixed(1) + '% of the buffers at the peak)' : ''));
    });
    c.addEventListener('mouseleave', function () { tip.hidden = true; });
    c.addEventListener('click', function (ev) {
      var nd = icicleHit(ev);
      if (nd && nd.agg) return;
      S.group = nd && !(S.group && S.group.key === nd.key) ? { type: 'op', key: nd.key } : null;
      $('tbody').scrollTop = 0; refreshTable(); drawIcicle(); renderSources();
    });
  }
  function renderSources() {
    var box = $('sources'); box.textContent = '';
    var sp = curSpace(), groups = sp ? sp.by_source || [] : [];
    var max = groups.length ? groups[0].bytes : 1;
    var who = S.selected !== null ? lookup(S.selected) : null;
    var selKey = who ? (who.b.source || '(no source line)') : null;
    groups.slice(0, 15).forEach(function (gq) {
      var row = el('div', 'bar' + (gq.key === selKey || (S.group && S.group.type === 'source' && S.group.key === gq.key) ? ' sel' : ''));
      var lab = el('div', 'lab'); var fill = el('div', 'fill'); fill.style.width = (100 * gq.bytes / max).toFixed(1) + '%';
      lab.appendChild(fill); lab.appendChild(el('span', 'txt mono', gq.key + '  ·  ' + num(gq.buffers)));
      lab.title = gq.key;
      row.appendChild(lab); var v = el('div', 'num', fmt(gq.bytes)); v.style.textAlign = 'right'; row.appendChild(v);
      row.addEventListener('click', function () {
        S.group = S.group && S.group.key === gq.key ? null : { type: 'source', key: gq.key };
        $('tbody').scrollTop = 0; refreshTable(); drawIcicle(); renderSources();
      });
      box.appendChild(row);
    });
    if (groups.length > 15) box.appendChild(el('p', 'hint', (groups.length - 15) + ' more source lines.'));
    if (!groups.length) box.appendChild(el('p', 'hint', 'No source lines (the dump has no HLO text or no metadata).'));
  }

  // ---------- Gantt ----------
  var G_ROW = 18, G_LABEL = 300, G_AXIS = 22;
  var gantt = null;
  function ganttRows(sp) {
    var rows = ((sp.largest_buffers && sp.largest_buffers.length) ? sp.largest_buffers : sp.buffers_at_peak).slice();
    if (S.ganttOrder === 'start') rows.sort(function (a, b) { return (a.live ? a.live[0] : -1) - (b.live ? b.live[0] : -1) || b.size_bytes - a.size_bytes; });
    return rows;
  }
  function drawGantt() {
    var sp = curSpace(), c = $('gantt');
    if (!sp) { setupCanvas(c, 40); return; }
    var rows = ganttRows(sp), n = Math.max(1, scheduleLen(sp));
    var cv = setupCanvas(c, G_AXIS + rows.length * G_ROW + 6), g = cv.g;
    var L = G_LABEL, W = cv.w - L - 12;
    function X(i) { return L + i / n * W; }
    gantt = { rows: rows, X: X, L: L, W: W, n: n };
    var active = S.hover !== null ? S.hover : S.selected;
    g.font = '11px system-ui, sans-serif'; g.textBaseline = 'middle';
    // axis
    g.fillStyle = '#6b7280'; g.textAlign = 'center';
    var xs = niceStep(Math.max(1, n / 8));
    for (var x = 0; x < n; x += xs) {
      g.fillText('#' + x, X(x), 10);
      g.strokeStyle = '#f0f1f4'; g.beginPath(); g.moveTo(Math.round(X(x)) + .5, G_AXIS); g.lineTo(Math.round(X(x)) + .5, cv.h); g.stroke();
    }
    rows.forEach(function (b, i) {
      var y = G_AXIS + i * G_ROW;
      var isSel = b.name === S.selected, isHov = b.name === S.hover;
      if (isSel || isHov) { g.fillStyle = isSel ? '#fde7ee' : '#f4f7ff'; g.fillRect(0, y, cv.w, G_ROW); }
      g.textAlign = 'left'; g.fillStyle = '#1d2330';
      var name = b.name; g.font = '11px ui-monospace, "DejaVu Sans Mono", monospace';
      while (name.length > 4 && g.measureText(name).width > L - 72) name = name.slice(0, -2);
      if (name !== b.name) name = name.slice(0, -1) + '…';
      g.fillText(name, 4, y + G_ROW / 2);
      g.textAlign = 'right'; g.font = '11px system-ui, sans-serif'; g.fillStyle = '#6b7280';
      g.fillText(fmt(b.size_bytes), L - 8, y + G_ROW / 2);
      var s = b.live ? b.live[0] : 0, e = b.live ? b.live[1] : n - 1;
      var x0 = X(s), x1 = Math.max(X(e + 1), x0 + 2);
      g.globalAlpha = active !== null && b.name !== active ? 0.35 : 1;
      g.fillStyle = kindColor(b.kind);
      g.fillRect(x0, y + 3, x1 - x0, G_ROW - 6);
      g.globalAlpha = 1;
      if (b.name === active) { g.strokeStyle = '#e0245e'; g.lineWidth = 2; g.strokeRect(x0 - 1, y + 2, x1 - x0 + 2, G_ROW - 4); }
    });
    if (sp.peak_time !== null && sp.peak_time !== undefined) {
      var px = Math.round(X(sp.peak_time + 0.5)) + .5;
      g.strokeStyle = '#141a26'; g.setLineDash([3, 3]); g.lineWidth = 1;
      g.beginPath(); g.moveTo(px, G_AXIS - 4); g.lineTo(px, cv.h); g.stroke(); g.setLineDash([]);
      g.fillStyle = '#141a26'; g.textAlign = 'left'; g.font = '600 11px system-ui, sans-serif'; g.fillText('peak', px + 4, G_AXIS - 4);
    }
    c.dataset.rows = rows.length;
    c.dataset.selected = S.selected || '';
    var total = sp.buffer_count || rows.length;
    $('gantt-title').textContent = 'Lifetimes of the ' + num(rows.length) + ' largest buffers';
    $('gantt-foot').textContent = (total > rows.length ? 'The ' + num(rows.length) + ' largest of ' + num(total) + ' buffers in ' + sp.space + ' (smaller ones are not drawn). ' : '') +
      'Bars span a buffer\'s live range in program order; arguments and outputs live throughout. Hover or click a bar.';
  }
  function ganttHit(ev) {
    if (!gantt) return null;
    var r = $('gantt').getBoundingClientRect(), y = ev.clientY - r.top - G_AXIS;
    var i = Math.floor(y / G_ROW);
    return i >= 0 && i < gantt.rows.length ? gantt.rows[i] : null;
  }
  function bindGantt() {
    var c = $('gantt'), tip = $('gantt-tip');
    c.addEventListener('mousemove', function (ev) {
      var b = ganttHit(ev);
      if (!b) { tip.hidden = true; if (S.hover !== null) { S.hover = null; drawGantt(); drawIcicle(); } return; }
      if (S.hover !== b.name) { S.hover = b.name; drawGantt(); drawIcicle(); }
      var r = c.getBoundingClientRect();
      showTip(tip, c.parentNode, ev.clientX - r.left, ev.clientY - r.top + c.parentNode.scrollTop * 0,
        b.name + '\n' + fmt(b.size_bytes) + ' ' + b.kind + ' ' + (b.layout_shape || b.shape) + '\n' + (b.live ? 'live #' + b.live[0] + '–#' + b.live[1] : 'live throughout') +
        (b.op_name ? '\n' + b.op_name : '') + (b.source ? '\n' + b.source : ''));
    });
    c.addEventListener('mouseleave', function () { tip.hidden = true; S.hover = null; drawGantt(); drawIcicle(); });
    c.addEventListener('click', function (ev) { var b = ganttHit(ev); if (b) select(b.name === S.selected ? null : b.name, 'gantt'); });
    $('gantt-order').addEventListener('change', function () { S.ganttOrder = $('gantt-order').value; drawGantt(); });
  }
  function scrollGanttTo(name) {
    if (!gantt) return;
    for (var i = 0; i < gantt.rows.length; i++) {
      if (gantt.rows[i].name === name) {
        var wrap = $('gantt-wrap'), top = G_AXIS + i * G_ROW;
        if (top < wrap.scrollTop || top + G_ROW > wrap.scrollTop + wrap.clientHeight) wrap.scrollTop = Math.max(0, top - wrap.clientHeight / 3);
        return;
      }
    }
  }

  // ---------- selection ----------
  function renderSelected() {
    var box = $('selected');
    var who = S.selected !== null ? lookup(S.selected) : null;
    box.dataset.name = who ? who.b.name : '';
    if (!who) { box.hidden = true; box.textContent = ''; return; }
    var b = who.b;
    box.hidden = false; box.textContent = '';
    var close = el('button', 'close', '✕'); close.title = 'clear the selection';
    close.addEventListener('click', function () { select(null, 'close'); });
    box.appendChild(close);
    var h = el('h2', null, b.name); h.id = 'selected-name'; h.className = 'mono'; h.style.fontSize = '14px';
    box.appendChild(h);
    var row = el('div', 'row');
    function item(k, v, id) { var s = el('span'); s.appendChild(el('b', null, k + ' ')); var t = el('span', null, v); if (id) t.id = id; s.appendChild(t); row.appendChild(s); return t; }
    var sz = item('size', fmt(b.size_bytes) + (b.unpadded_bytes !== b.size_bytes ? ' (unpadded ' + fmt(b.unpadded_bytes) + ')' : ''), 'selected-size');
    sz.dataset.bytes = b.size_bytes;
    item('kind', b.kind);
    item('shape', b.layout_shape || b.shape);
    if (b.opcode) item('opcode', b.opcode);
    item('live', b.live ? '#' + b.live[0] + ' – #' + b.live[1] : 'throughout');
    item('at the peak', who.atPeak ? 'yes' : 'no');
    if (b.allocation !== null && b.allocation !== undefined) item('allocation', String(b.allocation));
    box.appendChild(row);
    var row2 = el('div', 'row'); row2.style.marginTop = '4px';
    row = row2;
    if (b.op_name) item('op_name', b.op_name);
    if (b.source) item('source', (b.source_path || b.source) + (b.source_path && b.source ? ' (' + b.source.split(':').pop() + ')' : '') + (b.function ? ' in ' + b.function : ''));
    box.appendChild(row2);
  }
  function select(name, from) {
    S.selected = name;
    var sp = curSpace();
    $('chart').dataset.selected = name || '';
    renderRows();
    if (name && from !== 'table' && from !== 'key') scrollTableTo(name);
    if (name && from !== 'key') { renderRows(); }
    if (name && from === 'key') { scrollTableTo(name); renderRows(); }
    drawChart(); drawIcicle(); renderSources(); drawGantt();
    if (name && from !== 'gantt') scrollGanttTo(name);
    renderSelected();
    if (name && location.hash !== '#' + encodeURIComponent(name) && sp) history.replaceState(null, '', '#' + encodeURIComponent(name));
  }

  // ---------- notes ----------
  function renderNotes() {
    var m = curModule(), ul = $('notes'); ul.textContent = '';
    var notes = m ? (m.notes || []).slice() : [];
    if (m && m.xla && m.xla.live_range_peak_bytes !== null && m.xla.live_range_peak_bytes !== undefined) {
      notes.push('XLA\'s own live-range peak (logical sizes, all memory spaces): ' + fmt(m.xla.live_range_peak_bytes) + ' at #' + m.xla.live_range_peak_time +
        (m.xla.recomputed_peak_bytes === m.xla.live_range_peak_bytes ? ', reproduced exactly by hbm-doctor' : ''));
    }
    notes.forEach(function (n) { ul.appendChild(el('li', null, n)); });
    $('notes-card').hidden = !notes.length;
  }

  // ---------- wiring ----------
  function renderAll() {
    lookupCache = null; icicle = null;
    var m = curModule();
    if (m && !spaceOf(m, S.color)) S.color = m.memory_spaces.length ? m.memory_spaces[0].color : 0;
    if (S.selected !== null && !lookup(S.selected)) S.selected = null;
    renderControls(); renderTitle(); renderDiagnosis(); renderDiff(); renderFigures();
    renderKindFilter(); refreshTable(); drawChart(); drawIcicle(); renderSources(); drawGantt(); renderSelected(); renderNotes();
  }
  function init() {
    if (!REPORTS[0] || (DIFF && !REPORTS[1])) { fail('no embedded report'); return; }
    var names = moduleNames();
    // Start on the module the diagnosis is about (largest HBM total), or the one asked for.
    var best = null, bestBytes = -1;
    names.forEach(function (n) {
      var hbm = spaceOf(findModule(S.side, n) || findModule(1 - S.side, n), 0);
      if (hbm && hbm.total_bytes > bestBytes) { best = n; bestBytes = hbm.total_bytes; }
    });
    S.module = best || names[0] || null;
    if (META.module) {
      var want = names.filter(function (n) { return n.indexOf(META.module) >= 0; })[0];
      if (want) S.module = want;
    }
    var rep = REPORTS[DIFF ? 1 : 0];
    if (META.limit_bytes !== null && META.limit_bytes !== undefined) S.limit = META.limit_bytes;
    else if (rep.diagnosis && rep.diagnosis.budget_bytes) S.limit = rep.diagnosis.budget_bytes;
    $('sel-module').addEventListener('change', function () { S.module = $('sel-module').value; S.group = null; S.selected = null; renderAll(); });
    $('sel-space').addEventListener('change', function () { S.color = Number($('sel-space').value); S.group = null; S.selected = null; renderAll(); });
    $('sel-limit').addEventListener('change', function () { var v = $('sel-limit').value; S.limit = v === 'none' ? null : Number(v); renderFigures(); drawChart(); });
    $('sel-side').addEventListener('change', function () { S.side = Number($('sel-side').value); S.group = null; S.selected = null; renderAll(); });
    bindChart(); bindTable(); bindIcicle(); bindGantt();
    renderAll();
    if (location.hash.length > 1) {
      var name = decodeURIComponent(location.hash.slice(1));
      if (lookup(name)) select(name, 'hash');
    }
    var rt = null;
    window.addEventListener('resize', function () { clearTimeout(rt); rt = setTimeout(function () { drawChart(); drawIcicle(); drawGantt(); }, 80); });
  }

  // Test and scripting hooks.
  window.hbmView = {
    errors: errors,
    state: function () {
      var sp = curSpace();
      return {
        mode: META.mode, module: S.module, space: sp ? sp.space : null, side: S.side, selected: S.selected,
        peak_bytes: sp ? sp.peak_bytes : null, total_bytes: sp ? sp.total_bytes : null, limit_bytes: limitBytes(),
        table_rows: view.length, gantt_rows: gantt ? gantt.rows.length : 0, icicle_nodes: icicle ? icicle.nodes.length : 0
      };
    },
    select: function (name) { select(name, 'api'); },
    tableRowRect: function (name) {
      scrollTableTo(name); renderRows();
      var tr = document.querySelector('#rows .tr[data-name="' + CSS.escape(name) + '"]');
      if (!tr) return null;
      tr.scrollIntoView({ block: 'center' });
      return tr.getBoundingClientRect().toJSON();
    },
    ganttBarRect: function (name) {
      if (!gantt) return null;
      for (var i = 0; i < gantt.rows.length; i++) {
        var b = gantt.rows[i];
        if (b.name !== name) continue;
        scrollGanttTo(name);
        var wrap = $('gantt-wrap'), wr = wrap.getBoundingClientRect();
        if (wr.top < 0 || wr.bottom > window.innerHeight) wrap.scrollIntoView({ block: 'center' });
        var r = $('gantt').getBoundingClientRect();
        var s = b.live ? b.live[0] : 0, e = b.live ? b.live[1] : gantt.n - 1;
        var x0 = gantt.X(s), x1 = Math.max(gantt.X(e + 1), x0 + 2);
        return { x: r.left + x0, y: r.top + G_AXIS + i * G_ROW + 3, width: x1 - x0, height: G_ROW - 6 };
      }
      return null;
    }
  };
  try { init(); } catch (e) { fail(e && e.stack ? e.stack : e); }
  document.documentElement.dataset.ready = errors.length ? 'error' : '1';
})();
