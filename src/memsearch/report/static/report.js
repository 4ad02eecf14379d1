// memsearch report: decodes the embedded payload (gzip + base64) and renders every view from
// the URL hash, so each view can be linked and tested. Test contract (keep stable):
// [data-testid=task-count] holds the number of tasks passing the filter, each visible task row
// carries data-task-id, #filter=incorrect|correct|error|regressions|improvements selects them.
"use strict";
(function () {
  const errors = [];
  const errBox = document.getElementById("errors");
  function fail(msg) { errors.push(msg); errBox.textContent = errors.join("\n"); document.body.dataset.errors = String(errors.length); }
  window.addEventListener("error", (e) => fail("error: " + e.message));
  window.addEventListener("unhandledrejection", (e) => fail("error: " + (e.reason && e.reason.stack || e.reason)));

  // PREVIEW: characters of a long text shown before its "show all"; CELL: characters of a table
  // cell (a longer value is cut there and read whole in its episode). Every text is put in the page
  // once and at most this long until asked for: a 30 MB prediction made a 58 MB page (issue 54).
  const ROW_H = 26, OVERSCAN = 8, PREVIEW = 1500, CELL = 200;
  const FILTERS = ["all", "correct", "incorrect", "error", "invalid", "truncated", "length", "regressions", "improvements"];
  let P = null, S = null, view = [], fullTexts = [];

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const fmt = (v) => v == null ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : Math.abs(v) < 0.01 ? v.toExponential(2) : v.toFixed(3)) : String(v);
  const reEsc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  // Every lookup by a key that comes from the URL hash or the data (run names, task ids, evidence
  // ids) goes through own(): a plain obj[key] finds Object.prototype's members for "__proto__",
  // "constructor", "toString", ..., and the page would take them for a run or an episode.
  const has = (obj, key) => obj != null && Object.prototype.hasOwnProperty.call(obj, key);
  const own = (obj, key) => has(obj, key) ? obj[key] : undefined;

  async function decode() {
    const b64 = $("payload").textContent.trim();
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  // ---- state in the URL hash ----
  function parseHash(h) {
    const st = { view: "tasks", run: P.run_order[0], vs: P.run_order[1] || "", filter: "all", q: "", sort: "", dir: 1, task: "" };
    for (const part of (h || "").replace(/^#/, "").split("&")) {
      if (!part) continue;
      const i = part.indexOf("=");
      const k = decodeURIComponent(i < 0 ? part : part.slice(0, i)), v = i < 0 ? "" : decodeURIComponent(part.slice(i + 1));
      if (k === "dir") st.dir = v === "-1" ? -1 : 1; else if (has(st, k)) st[k] = v;
    }
    if (!own(P.runs, st.run)) st.run = P.run_order[0];
    // vs "-" means "compare with nothing" (an empty value would fall back to the default run).
    if (st.vs && st.vs !== "-" && (!own(P.runs, st.vs) || st.vs === st.run)) st.vs = P.run_order.find((r) => r !== st.run) || "";
    if (!FILTERS.includes(st.filter)) st.filter = "all";
    return st;
  }
  function hashOf(st) {
    const d = parseHash("");
    return Object.keys(st).filter((k) => st[k] !== d[k] && st[k] !== "").map((k) => k + "=" + encodeURIComponent(st[k])).join("&");
  }
  function go(patch) { const st = Object.assign({}, S, patch); const h = hashOf(st); if (location.hash.replace(/^#/, "") !== h) location.hash = h; else apply(h); }

  // ---- gold highlighting ----
  function goldRe(tid) {
    const facts = (own(P.labels, tid) || {}).supporting_facts || [];
    return facts.length ? new RegExp("(" + facts.map(reEsc).join("|") + ")(?![0-9])", "g") : null;
  }
  function hl(text, re) { const e = esc(text); return re ? e.replace(re, '<mark class="gold" data-testid="gold">$1</mark>') : e; }
  // Long texts are collapsed, never cut: "show all" swaps in the whole text. ``tag``: the element
  // holding it (a div by default; "b" or "span" inline).
  function longText(text, re, cls, tag) {
    text = text == null ? "" : String(text);
    tag = tag || "div";
    if (text.length <= PREVIEW) return `<${tag} class="${cls || "text"}">${hl(text, re)}</${tag}>`;
    fullTexts.push([text, re]);
    return `<${tag} class="${cls || "text"}">${hl(text.slice(0, PREVIEW), re)}<span class="muted"> … ${text.length - PREVIEW} more characters</span>` +
      `<button class="showall" data-full="${fullTexts.length - 1}">show all</button></${tag}>`;
  }
  const inline = (text, cls) => longText(text, null, cls || "inline", "span");

  // ---- header, run bar, compare summary ----
  function kv(obj) { return '<table class="kv">' + Object.keys(obj || {}).map((k) => `<tr><th>${esc(k)}</th><td>${esc(typeof obj[k] === "object" && obj[k] ? JSON.stringify(obj[k]) : fmt(obj[k]))}</td></tr>`).join("") + "</table>"; }
  function renderRunbar() {
    const opts = (sel) => P.run_order.map((r) => `<option ${r === sel ? "selected" : ""}>${esc(r)}</option>`).join("");
    $("runbar").innerHTML = `run <select id="runsel">${opts(S.run)}</select>` +
      (P.run_order.length > 1 ? ` compared with <select id="vssel"><option value="-">(none)</option>${opts(S.vs)}</select>` : "");
    $("runsel").onchange = (e) => go({ run: e.target.value, task: "" });
    if ($("vssel")) $("vssel").onchange = (e) => go({ vs: e.target.value });
  }
  function renderHeader() {
    const h = P.runs[S.run].header, m = h.metrics || {};
    const metrics = Object.create(null);  // keyed by the run's metric names: no inherited keys
    for (const k of Object.keys(m)) { const ci = own(h.ci, k); metrics[k] = fmt(m[k]) + (ci ? `  [${fmt(ci[0])}, ${fmt(ci[1])}]` : ""); }
    const ident = { agent: h.agent, backends: h.backends, models: h.models, tokenizer: h.tokenizer, budgets: h.budgets,
      "data manifest sha256": h.data && h.data.manifest_sha256, "data kind/split": h.data && (h.data.kind + " / " + h.data.split),
      evaluator: h.evaluator_version, engine: h.engine_version, prompts: h.prompt_version,
      "memory written by": h.memory_backend, "memsearch source": h.memsearch_source };
    const state = { complete: h.complete, usable_for_comparison: h.usable_for_comparison, tasks: h.tasks, request_errors: h.request_errors, context_truncated: h.context_truncated, note: h.note };
    // What the numbers are not (eval.caveats): shown once, outside the collapsed details.
    const caveats = (h.caveats || []).length ? `<ul class="caveats" data-testid="caveats">${h.caveats.map((c) => `<li>${esc(c)}</li>`).join("")}</ul>` : "";
    const line = `run <b>${esc(S.run)}</b> · EM ${fmt(m.em)} · F1 ${fmt(m.f1)} · ${h.complete ? "complete" : "<span class=bad>INCOMPLETE</span>"}` +
      ` · ${h.usable_for_comparison ? "usable for comparison" : "<span class=bad>not usable for comparison</span>"} · evaluator ${esc(h.evaluator_version)}, prompts ${esc(h.prompt_version)}`;
    $("header").innerHTML = `<details><summary>${line} (config, model, data, CIs, tokens)</summary><div class="cols"><div><h3>run ${esc(S.run)}</h3>${kv(ident)}</div><div><h3>completeness</h3>${kv(state)}` +
      `<h3>tokens reported</h3>${kv(h.tokens_reported)}<h3>tokens estimated</h3>${kv(h.tokens_estimated)}</div>` +
      `<div><h3>metrics (mean [95% bootstrap CI])</h3>${kv(metrics)}</div></div></details>` + caveats;
  }
  function comparison() { return S.vs && S.vs !== "-" ? own(P.comparisons, S.run + "|" + S.vs) || null : null; }
  function renderCompare() {
    const c = comparison();
    if (!c) { $("compare").innerHTML = ""; return; }
    $("compare").innerHTML = `<b>${esc(S.run)} → ${esc(S.vs)}</b> on ${c.n} shared tasks: ` +
      `mean ΔEM ${fmt(c.mean_delta.em)}, ΔF1 ${fmt(c.mean_delta.f1)}; ` +
      `<a href="#" data-go="regressions">regressions <span data-testid="regression-count">${c.regressions.length}</span></a>, ` +
      `<a href="#" data-go="improvements">improvements <span data-testid="improvement-count">${c.improvements.length}</span></a>` +
      (c.only_a || c.only_b ? ` <span class="muted">(${c.only_a} only in ${esc(S.run)}, ${c.only_b} only in ${esc(S.vs)})</span>` : "");
  }

  // ---- task table (windowed) ----
  function columns() {
    const cols = [["task_id", "id", 1.3], ["question", "question", 4], ["gold", "gold", 1.5], ["prediction", "prediction", 1.5]];
    const SHORT = { sub_em: "subEM", searches: "srch", invalid_actions: "invalid", request_errors: "req err", memory_truncations: "mem cut", latency_s: "latency" };
    for (const c of P.columns) cols.push([c, own(SHORT, c) || c.replace(/_/g, " "), 0.8]);
    if (comparison()) cols.push(["vs_prediction", S.vs + " prediction", 1.5], ["vs_em", S.vs + " em", 0.7], ["d_f1", "ΔF1", 0.7]);
    return cols;
  }
  function rowsOf() {
    const c = comparison(), vs = c ? new Map(P.runs[S.vs].tasks.map((t) => [t.task_id, t])) : null;
    return P.runs[S.run].tasks.map((t) => {
      const r = Object.assign({}, t);
      if (c) { const b = vs.get(t.task_id) || {}; r.vs_prediction = b.prediction; r.vs_em = b.em; r.d_f1 = (own(c.deltas, t.task_id) || {}).f1; }
      return r;
    });
  }
  function passes(r, c, sets) {
    switch (S.filter) {
      case "correct": return r.em === 1;
      case "incorrect": return r.em === 0;
      case "error": return r.status !== "ok";
      case "invalid": return r.invalid_actions > 0;
      case "truncated": return r.memory_truncations > 0 || r.chunks_cut > 0;
      case "length": return r.length_cut;
      case "regressions": return !!sets && sets.reg.has(r.task_id);
      case "improvements": return !!sets && sets.imp.has(r.task_id);
      default: return true;
    }
  }
  function computeView() {
    const c = comparison(), sets = c ? { reg: new Set(c.regressions), imp: new Set(c.improvements) } : null;
    const q = S.q.toLowerCase();
    view = rowsOf().filter((r) => passes(r, c, sets) && (!q || [r.task_id, r.question, r.gold, r.prediction].join("\u0001").toLowerCase().includes(q)));
    if (S.sort) {
      const k = S.sort, d = S.dir;
      view.sort((a, b) => {
        const x = own(a, k), y = own(b, k);
        if (x == null || y == null) return x == null ? (y == null ? 0 : 1) : -1;  // missing values last
        return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * d;
      });
    }
  }
  function renderControls() {
    $("controls").innerHTML = `<input id="q" type="search" placeholder="search id, question, gold, prediction" value="${esc(S.q)}">` +
      `<select id="filter">${FILTERS.map((f) => `<option ${f === S.filter ? "selected" : ""}>${f}</option>`).join("")}</select>` +
      `<span><span class="count" data-testid="task-count">${view.length}</span> of ${P.runs[S.run].tasks.length} tasks</span>`;
    $("q").oninput = (e) => { S.q = e.target.value; history.replaceState(null, "", "#" + hashOf(S)); computeView(); renderTableBody(); $("controls").querySelector("[data-testid=task-count]").textContent = view.length; };
    $("filter").onchange = (e) => go({ filter: e.target.value });
  }
  function gridStyle(cols) { return "grid-template-columns:" + cols.map((c) => c[2] + "fr").join(" "); }
  function renderTable() {
    const cols = columns();
    $("table").innerHTML = `<div class="grid thead" style="${gridStyle(cols)}">` +
      cols.map((c) => `<span data-sort="${c[0]}" title="sort by ${esc(c[1])}">${esc(c[1])}${S.sort === c[0] ? (S.dir > 0 ? " ▲" : " ▼") : ""}</span>`).join("") +
      `</div><div class="viewport" id="vp"><div class="spacer" id="spacer"></div></div>`;
    $("vp").onscroll = renderTableBody;
    renderTableBody();
  }
  function cell(r, k) {
    const v = r[k];
    if (k === "em" || k === "vs_em") return `<span class="${v === 1 ? "ok" : "bad"}">${fmt(v)}</span>`;
    if (k === "d_f1") return `<span class="${v > 0 ? "ok" : v < 0 ? "bad" : ""}">${v == null ? "–" : (v > 0 ? "+" : "") + fmt(v)}</span>`;
    if (k === "latency_s" && v != null) return `<span title="${v} s">${v.toPrecision(2)}s</span>`;
    const s = fmt(v);
    // A long value once, cut, without a tooltip copy: the row opens the episode, which shows it whole.
    if (s.length > CELL) return `<span class="cut">${esc(s.slice(0, CELL))}… <span class="muted">(${s.length - CELL} more characters: open the task)</span></span>`;
    return `<span title="${esc(s)}">${esc(s)}</span>`;
  }
  function renderTableBody() {
    const vp = $("vp"), spacer = $("spacer");
    if (!vp) return;
    const cols = columns(), style = gridStyle(cols);
    spacer.style.height = view.length * ROW_H + "px";
    vp.style.height = Math.min(440, Math.max(1, view.length) * ROW_H + 2) + "px";  // no empty box under a short list
    const first = Math.max(0, Math.floor(vp.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(view.length, Math.ceil((vp.scrollTop + (vp.clientHeight || 440)) / ROW_H) + OVERSCAN);
    let html = "";
    for (let i = first; i < last; i++) {
      const r = view[i];
      html += `<div class="row grid${r.task_id === S.task ? " sel" : ""}" data-task-id="${esc(r.task_id)}" style="top:${i * ROW_H}px;${style}">` +
        cols.map((c) => cell(r, c[0])).join("") + "</div>";
    }
    spacer.innerHTML = html;
  }

  // ---- episode view ----
  function lineDiff(a, b) {
    const x = (a || "").split("\n"), y = (b || "").split("\n"), n = x.length, m = y.length;
    const L = Array.from({ length: n + 1 }, () => new Int32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    const out = [];
    let i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && x[i] === y[j]) { out.push(["same", x[i]]); i++; j++; }
      else if (j < m && (i >= n || L[i][j + 1] >= L[i + 1][j])) out.push(["add", y[j++]]);
      else out.push(["del", x[i++]]);
    }
    return out;
  }
  function diffHtml(before, after, re) {
    const d = lineDiff(before, after);
    return `<div class="diff" data-testid="memory-diff">` + d.map(([k, s]) => `<div class="${k}">${k === "add" ? "+ " : k === "del" ? "− " : "  "}${hl(s, re)}</div>`).join("") + "</div>";
  }
  function validity(e) {
    if (e.valid === true) return '<span class="badge ok">valid</span>';
    if (e.valid === false) return `<span class="badge bad invalid">invalid</span> ${inline(e.invalid_reason || e.reason || "")}`;
    return '<span class="badge">not judged</span>';
  }
  function eventCard(e, tid, re) {
    const gold = new Set((own(P.labels, tid) || {}).supporting_facts || []);
    if (e.type === "search") {
      const items = (e.shown || []).map((id) => `<li class="${gold.has(id) ? "gold" : ""}">${hl(id, re)} ${esc(own(P.evidence, id) || "")}</li>`).join("");
      return `<div class="card search"><h4>search ${e.step}</h4>query: ${longText(e.query, null)}documents: ${esc((e.doc_ids || []).join(", "))} · ` +
        `${e.evidence_tokens} evidence tokens${e.cut_sentences ? ` · <b>${e.cut_sentences} sentences cut by the budget</b>` : ""}<ul>${items}</ul></div>`;
    }
    if (e.type === "chunk") return `<div class="card chunk"><h4>chunk ${e.step}</h4>${e.tokens} tokens</div>`;
    if (e.type === "policy_call") {
      const prompt = (e.messages || []).map((m) => `<b>${esc(m.role)}</b>` + longText(m.content, re)).join("");
      return `<div class="card policy_call"><h4>policy call · ${esc(e.role)} · step ${e.step}</h4>${validity(e)} ` +
        `<span class="badge">finish ${esc(e.finish_reason)}</span><span class="badge">${e.latency_s}s</span><span class="badge">attempts ${e.attempts}</span>` +
        `<span class="badge">usage ${esc(JSON.stringify(e.usage))}</span><span class="badge">token ids ${esc(JSON.stringify(e.token_counts || {}))}</span>${e.error ? `<div class="invalid">error: ${inline(e.error)}</div>` : ""}` +
        `<details><summary>prompt (${(e.messages || []).length} messages)</summary>${prompt}</details>completion:${longText(e.text, re)}` +
        `<details><summary>parsed action</summary>${longText(JSON.stringify(e.action, null, 1), null)}</details></div>`;
    }
    if (e.type === "memory") {
      return `<div class="card memory"><h4>memory ${e.step}</h4>${e.valid ? '<span class="badge ok">applied</span>' : `<span class="badge bad invalid">rejected</span> ${inline(e.reason || "")}`} ` +
        `ops ${esc(JSON.stringify(e.executed || {}))}${e.truncated ? ' <span class="badge bad">truncated to the budget</span>' : ""}` +
        `<div class="muted">before → after</div>${diffHtml(e.before, e.after, re)}</div>`;
    }
    return `<div class="card"><h4>${esc(e.type)}</h4>${longText(JSON.stringify(e, null, 1), null)}</div>`;
  }
  function answerCard(run, tid, re) {
    const t = own(P.runs[run].episodes, tid) || {}, row = P.runs[run].tasks.find((r) => r.task_id === tid) || {}, lab = own(P.labels, tid) || {};
    const gold = new Set(lab.supporting_facts || []), bad = new Set(t.invalid_citations || []);
    const cites = (t.citations || []).map((c) => `<span class="badge ${gold.has(c) ? "" : ""}">${gold.has(c) ? `<mark class="gold" data-testid="gold">${esc(c)}</mark>` : esc(c)}` +
      `${bad.has(c) ? ' <span class="invalid" data-testid="invalid-citation">(not shown: invalid)</span>' : ""}</span>`).join("") || '<span class="muted">none</span>';
    return `<div class="card answer"><h4>answer</h4>prediction: ${inline(t.prediction, "inline prediction")} · gold: ${inline((lab.answers || []).join(" | "), "inline prediction")} ` +
      `<span class="badge ${row.em === 1 ? "ok" : "bad"}">EM ${fmt(row.em)}</span><span class="badge">F1 ${fmt(row.f1)}</span>` +
      `<div>citations: ${cites}</div><div>retrieval support recall ${fmt(row.retrieval_support_recall)} · memory support recall ${fmt(row.memory_support_recall)} · memory support precision ${fmt(row.memory_support_precision)}` +
      ` · gold facts: ${[...gold].map((g) => `<mark class="gold">${esc(g)}</mark>`).join(" ")}</div>` +
      `reader text:${longText(t.reader_text, re)}final memory:${longText(t.memory_final, re)}</div>`;
  }
  function episodeColumn(run, tid) {
    const t = own(P.runs[run].episodes, tid);
    if (!t) return `<div><h3>${esc(run)}</h3><p class="muted">this run has no episode for task ${esc(tid)}</p></div>`;
    const re = goldRe(tid);
    return `<div><h3>${esc(run)} · ${esc(t.status)}</h3>` + (t.error ? longText(t.error, null, "invalid") : "") +
      (t.events || []).map((e) => eventCard(e, tid, re)).join("") + answerCard(run, tid, re) + "</div>";
  }
  function renderEpisode() {
    fullTexts = [];
    if (!S.task) { $("episode").innerHTML = '<p class="muted">Click a task to open its episode.</p>'; return; }
    const t = own(P.runs[S.run].episodes, S.task);
    const runs = [S.run].concat(comparison() ? [S.vs] : []);
    $("episode").innerHTML = `<h2 data-testid="episode" data-episode-task="${esc(S.task)}">task ${esc(S.task)}</h2>` +
      `${longText(t ? t.question : "", null, "question")}<div class="pair ${runs.length === 1 ? "one" : ""}">${runs.map((r) => episodeColumn(r, S.task)).join("")}</div>`;
  }

  // ---- training view (inline SVG) ----
  function chart(name, series) {
    const W = 320, H = 170, pad = 52, xs = series.steps, rows = series.values;
    const stats = rows.map((vals) => { const v = vals.filter((x) => x != null); return v.length ? [Math.min(...v), v.reduce((a, b) => a + b, 0) / v.length, Math.max(...v)] : null; });
    const all = stats.filter(Boolean).flat();
    if (!all.length) return "";
    let lo = Math.min(...all), hi = Math.max(...all);
    if (hi === lo) { hi += 1; lo -= 1; }
    const x0 = Math.min(...xs), x1 = Math.max(...xs) === x0 ? x0 + 1 : Math.max(...xs);
    const X = (s) => pad + (s - x0) / (x1 - x0) * (W - pad - 8), Y = (v) => H - 20 - (v - lo) / (hi - lo) * (H - 36);
    const pts = (k) => xs.map((s, i) => stats[i] ? `${X(s).toFixed(1)},${Y(stats[i][k]).toFixed(1)}` : null).filter(Boolean);
    const band = rows[0] && rows[0].length > 1 ? `<polygon fill="#1a73e833" points="${pts(2).concat(pts(0).reverse()).join(" ")}"/>` : "";
    return `<svg class="chart" data-testid="chart" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}"><text x="${pad}" y="12" font-size="12" font-weight="bold">${esc(name)}</text>` +
      `<text x="2" y="${Y(hi) + 4}" font-size="10">${fmt(hi)}</text><text x="2" y="${Y(lo)}" font-size="10">${fmt(lo)}</text>` +
      `<text x="${W - 40}" y="${H - 4}" font-size="10">step ${x1}</text>${band}<polyline fill="none" stroke="#1a73e8" stroke-width="1.5" points="${pts(1).join(" ")}"/></svg>`;
  }
  function renderTraining() {
    const T = P.training;
    if (!T) { $("training").innerHTML = '<p class="muted">No training log in this report (memsearch report view … --train-log RUN/train_log.jsonl).</p>'; return; }
    $("training").innerHTML = `<p>${T.logs.length} log(s): ${esc(T.logs.join(", "))}${T.logs.length > 1 ? " (line: mean over logs, band: min–max)" : ""}</p>` +
      `<div class="charts">${T.order.map((k) => chart(k, own(T.metrics, k))).join("")}</div>`;
  }

  // ---- dispatch ----
  function apply(h) {
    const t = performance.now();
    S = parseHash(h);
    const tasks = S.view !== "training";
    for (const id of ["runbar", "header", "compare", "controls", "table", "episode"]) $(id).classList.toggle("hidden", !tasks);
    $("training").classList.toggle("hidden", tasks);
    document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("on", a.dataset.view === S.view));
    if (tasks) { renderRunbar(); renderHeader(); renderCompare(); computeView(); renderControls(); renderTable(); renderEpisode(); }
    else renderTraining();
    void document.body.offsetHeight;  // include layout in the measured time
    return performance.now() - t;
  }
  document.addEventListener("click", (e) => {
    const el = e.target.closest("[data-task-id],[data-sort],[data-full],[data-go]");
    if (!el) return;
    if (el.dataset.full !== undefined) { const [text, re] = fullTexts[+el.dataset.full]; el.parentElement.innerHTML = hl(text, re); }
    else if (el.dataset.sort) go({ sort: el.dataset.sort, dir: S.sort === el.dataset.sort ? -S.dir : 1 });
    else if (el.dataset.go) { e.preventDefault(); go({ filter: el.dataset.go }); }
    else go({ task: el.dataset.taskId });
  });
  window.addEventListener("hashchange", () => apply(location.hash));

  const ready = decode().then((payload) => {
    P = payload;
    $("loading").remove();
    apply(location.hash);
    document.body.dataset.loadMs = String(Math.round(performance.now()));
    document.body.dataset.ready = "1";
  });
  ready.catch((e) => fail("could not decode the report: " + e));
  // For tests and the benchmark: wait for the page, or apply a hash synchronously and get its ms.
  window.__report = { ready, apply: (h) => { history.replaceState(null, "", "#" + h); return apply(h); }, errors };
})();
