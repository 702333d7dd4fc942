// conch report: renders the JSON block #report-data (built by conch/report/html.py). No network.
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
const fmt = (v, d = 3) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : esc(v));
const secs = (s) => (s >= 120 ? (s / 60).toFixed(1) + " min" : s >= 1 ? s.toFixed(1) + " s" : (1000 * s).toFixed(1) + " ms");

function renderSummary() {
  const run = D.run || {};
  const s = run.summary || {};
  let h = `<div class="cols"><div>`;
  const rows = [];
  if (s.pass_rate) {
    rows.push(["pass rate", s.pass_rate], ["tests passed (mean)", s.tests_passed_mean]);
    if (s.heldout_families) rows.push(["heldout pass rate", s.heldout_families.pass_rate], ["heldout tests passed", s.heldout_families.tests_passed_mean]);
    if (s.eval_errors && Object.values(s.eval_errors).some((v) => v)) rows.push(["errors (not counted)", s.eval_errors]);
  }
  if (rows.length) {
    h += `<table id="summary-table"><thead><tr><th></th><th class="num">init</th><th class="num">warm</th><th class="num">final</th></tr></thead><tbody>`;
    const f3 = (v, count) => (typeof v === "number" ? (count ? String(v) : v.toFixed(3)) : "–");
    for (const [label, d] of rows) h += `<tr><td>${label}</td>${["init", "warm", "final"].map((k) => `<td class="num">${f3(d[k], label.startsWith("errors"))}</td>`).join("")}</tr>`;
    h += `</tbody></table>`;
  } else if (run.evals && Object.keys(run.evals).length) {
    h += `<table id="summary-table"><thead><tr><th>evaluation</th><th class="num">pass rate</th><th class="num">tests passed</th><th class="num">samples</th><th class="num">errors</th></tr></thead><tbody>`;
    for (const [n, e] of Object.entries(run.evals)) h += `<tr><td>${esc(n)}</td><td class="num">${fmt(e.pass_rate)}</td><td class="num">${fmt(e.tests_passed_mean)}</td><td class="num">${fmt(e.samples)}</td><td class="num">${fmt(e.errors ?? 0)}</td></tr>`;
    h += `</tbody></table>`;
  } else {
    const n = D.trajectories.length, solved = D.trajectories.filter((t) => t.outcome === "solved").length;
    h += `<p>${n} trajectories from <code>${esc(D.source)}</code>; ${solved} solved (${n ? ((100 * solved) / n).toFixed(1) : 0}%).</p>`;
  }
  h += `</div>`;
  if (run.times && Object.keys(run.times).length) {
    h += `<div><table><thead><tr><th>time per stage</th><th class="num"></th></tr></thead><tbody>`;
    for (const [k, v] of Object.entries(run.times)) h += `<tr><td>${esc(k)}</td><td class="num">${secs(v)}</td></tr>`;
    h += `</tbody></table></div>`;
  }
  const info = [["source", D.source], ["PPO iterations logged", run.iterations], ["trajectories kept", D.trajectories.length]];
  if (s.mismatch) for (const [k, v] of Object.entries(s.mismatch)) info.push(["final " + k, fmt(v, 5)]);
  h += `<div class="kv">${info.filter((r) => r[1] !== undefined).map(([k, v]) => `<span class="muted">${esc(k)}</span><span>${typeof v === "number" ? v : esc(v)}</span>`).join("")}</div></div>`;
  if (run.config) h += `<details><summary>config</summary><pre>${esc(run.config)}</pre></details>`;
  $("#summary-body").innerHTML = h;
}

function renderCurves() {
  const grid = $("#curve-grid");
  if (!D.panels.length) { grid.innerHTML = `<p class="muted">No curves: this is a rollout file, not a run folder.</p>`; return; }
  for (const p of D.panels) {
    const div = document.createElement("div");
    div.className = "plot"; div.id = "curve-" + p.id;
    grid.appendChild(div);
    const traces = p.series.map((s) => ({ name: s.name, x: s.x, y: s.y, type: "scatter", mode: s.x.length < 40 ? "lines+markers" : "lines", connectgaps: true }));
    const shapes = p.vlines.map(([x]) => ({ type: "line", x0: x, x1: x, yref: "paper", y0: 0, y1: 1, line: { dash: "dash", width: 1, color: "#888" } }));
    const xs = p.series.flatMap((s) => s.x), span = xs.length ? Math.max(...xs) - Math.min(...xs) : 0;
    const empty = p.series.every((s) => s.y.every((v) => v === null));
    const layout = { title: { text: p.title + (empty ? " — no finite values (NaN) yet" : ""), font: { size: 14 }, x: 0.02, xanchor: "left" }, margin: { l: 50, r: 12, t: 36, b: 40 }, shapes,
      xaxis: { title: { text: p.xlabel, font: { size: 11 } }, dtick: Math.max(1, Math.ceil(span / 8)) }, legend: { orientation: "h", y: -0.25, font: { size: 10 } }, showlegend: p.series.length > 1,
      annotations: p.note ? [{ text: p.note, xref: "paper", yref: "paper", x: 0, y: 1.02, showarrow: false, font: { size: 10, color: "#6b7480" }, xanchor: "left" }] : [] };
    Plotly.newPlot(div, traces, layout, { displaylogo: false, responsive: true, displayModeBar: false });
    // What plotly holds after drawing (tests read this back to compare with metrics.jsonl).
    div.dataset.plotted = JSON.stringify(div.data.map((t) => ({ name: t.name, x: Array.from(t.x), y: Array.from(t.y) })));
  }
}

const T = D.trajectories;
function options(sel, values, all) {
  sel.innerHTML = `<option value="">${all}</option>` + values.map((v) => `<option>${esc(v)}</option>`).join("");
}
function uniq(xs) { return [...new Set(xs)]; }

function renderBrowser() {
  options($("#f-when"), uniq(T.map((t) => t.when)), "all stages");
  options($("#f-family"), uniq(T.map((t) => t.family)).sort(), "all families");
  options($("#f-outcome"), ["solved", "partial", "failed", "error"].filter((o) => T.some((t) => t.outcome === o)), "any outcome");
  for (const id of ["#f-when", "#f-family", "#f-outcome", "#f-task"]) $(id).addEventListener("input", fillTable);
  fillTable();
}

function fillTable() {
  const w = $("#f-when").value, f = $("#f-family").value, o = $("#f-outcome").value, q = $("#f-task").value.trim();
  const rows = T.filter((t) => (!w || t.when === w) && (!f || t.family === f) && (!o || t.outcome === o) && (!q || t.task.includes(q)));
  $("#f-count").textContent = `${rows.length} of ${T.length} trajectories` + (T.length > D.max_detailed ? ` (details embedded for ${Object.keys(D.details).length})` : "");
  const body = $("#traj-table tbody");
  body.innerHTML = rows.slice(0, 2000).map((t) => `<tr data-i="${t.i}"><td>${esc(t.when)}</td><td>${esc(t.task)}</td><td class="num">${t.sample}</td>` +
    `<td class="o-${t.outcome}">${t.outcome === "error" ? "error" : `${t.n_passed}/${t.n_total}`}</td><td class="num">${fmt(t.reward, 2)}</td><td class="num">${t.turns}</td><td>${esc(t.stop)}</td></tr>`).join("");
  for (const tr of body.querySelectorAll("tr")) tr.addEventListener("click", () => openTrajectory(Number(tr.dataset.i)));
}

function tokenColour(d) {
  // |trainer - sampler| log-prob: white at 0, red at >= 1 nat (log scale in between).
  if (d === null) return "transparent";
  const a = Math.min(1, Math.max(0, (Math.log10(d + 1e-6) + 4) / 4));
  return `rgba(220, 38, 38, ${(0.08 + 0.85 * a).toFixed(3)})`;
}

function tokenView(det) {
  let h = `<div class="legend">token view (sampled tokens): colour = |trainer − sampler log-prob| `;
  h += [1e-4, 1e-3, 1e-2, 1e-1, 1].map((v) => `<span class="tok" style="background:${tokenColour(v)}">${v}</span>`).join(" ");
  h += ` nats; <span class="tok route">outlined</span> = trainer routed a layer differently (hover: layers)` + (det.has_trainer ? "" : ". No trainer log-probs for this trajectory (evaluation): colour shows nothing; hover shows the sampler's log-prob") + `</div>`;
  for (const [k, s] of det.steps.entries()) {
    if (!s.tokens.length) continue;
    h += `<div class="muted">turn ${k + 1}</div><div class="tokens">`;
    for (const [id, slp, tlp, layers] of s.tokens) {
      const text = D.vocab[id] !== undefined ? D.vocab[id] : `⟨${id}⟩`;
      const diff = tlp === null ? null : Math.abs(tlp - slp);
      const title = `id ${id}  sampler ${slp}` + (tlp === null ? "" : `  trainer ${tlp}  |Δ| ${diff.toFixed(3)}`) + (layers ? `  routing differs at layers ${layers.join(",")}` : "");
      h += `<span class="tok${layers ? " route" : ""}" style="background:${tokenColour(diff)}" title="${esc(title)}">${esc(text)}</span>`;
    }
    h += `</div>`;
  }
  return h;
}

function openTrajectory(i) {
  for (const tr of document.querySelectorAll("#traj-table tr")) tr.classList.toggle("sel", Number(tr.dataset.i) === i);
  const t = T[i], det = D.details[String(i)], view = $("#traj-view");
  let h = `<h3 id="traj-title">${esc(t.task)} #${t.sample} <span class="muted">${esc(t.when)}</span></h3>`;
  h += `<div class="kv"><span class="muted">outcome</span><span class="o-${t.outcome}">${t.outcome} (${t.n_passed}/${t.n_total} tests)</span>` +
       `<span class="muted">reward</span><span>${fmt(t.reward)}</span><span class="muted">stop reason</span><span>${esc(t.stop)}</span>`;
  if (!det) { view.innerHTML = h + `</div><p class="muted">Details of this trajectory are not embedded (the report embeds ${D.max_detailed}).</p>`; return; }
  if (det.error) h += `<span class="muted">error</span><span class="o-error">${esc(det.error)}</span>`;
  if (det.verifier_error) h += `<span class="muted">verifier error</span><span class="o-error">${esc(det.verifier_error)}</span>`;
  h += `<span class="muted">timings</span><span>${Object.entries(det.timings).map(([k, v]) => `${esc(k.replace("_seconds", ""))} ${v}s`).join(", ")}</span>`;
  if (det.cut.length) h += `<span class="muted">cut</span><span>${esc(det.cut.join("; "))}</span>`;
  h += `</div><h4>verifier: per-test results</h4><div class="tests" id="traj-tests">`;
  h += det.tests.length ? det.tests.map((x) => `<span class="test ${esc(x.status)}" title="${esc(x.status)}">${x.status === "passed" ? "✓" : x.status === "skipped" ? "–" : "✗"} ${esc(x.name)}</span>`).join("") : `<span class="muted">no per-test results</span>`;
  h += `</div><h4>transcript</h4><div class="term" id="traj-transcript"><span class="turn">task:</span> ${esc(det.instruction.trim())}\n`;
  for (const [k, s] of det.steps.entries()) {
    h += `\n<span class="turn">── turn ${k + 1} · gen ${fmt(s.gen_s, 2)}s · env ${fmt(s.env_s, 2)}s · ${esc(s.finish)}</span>\n`;
    if (s.text && s.text.trim()) h += `<span class="say">${esc(s.text.trim())}</span>\n`;
    if (s.parse_error) h += `<span class="perr">parse error: ${esc(s.parse_error)}</span>\n`;
    if (s.command !== null && s.command !== undefined) {
      h += `<span class="cmd">$ ${esc(s.command)}</span>\n`;
      if (s.output) h += esc(s.output.replace(/\s+$/, "")) + "\n";
      h += `<span class="${s.exit_code === 0 ? "exit0" : "exitn"}">[exit ${s.exit_code}${s.timed_out ? ", timed out" : ""}]</span>\n`;
    } else if (s.output) h += esc(s.output) + "\n";
  }
  h += `</div><h4>tokens</h4>` + tokenView(det);
  view.innerHTML = h;
}

function renderTasks() {
  const pt = D.per_task;
  if (!pt.rows.length) { $("#tasks-body").innerHTML = `<p class="muted">No evaluations.</p>`; return; }
  const up = pt.rows.filter((r) => r.change === "fail→pass").length, down = pt.rows.filter((r) => r.change === "pass→fail").length;
  let h = `<p>Between the first and last evaluation: <span class="up">${up} fail→pass</span>, <span class="down">${down} pass→fail</span> (passing: pass rate ≥ 0.5).</p>`;
  h += `<div class="list"><table id="task-table"><thead><tr><th>task</th>${pt.columns.map((c) => `<th class="num">${esc(c)}</th>`).join("")}<th>change</th></tr></thead><tbody>`;
  for (const r of pt.rows) {
    h += `<tr><td>${esc(r.task)}</td>` + pt.columns.map((c) => {
      const v = r.rates[c];
      return v === undefined || v === null ? `<td></td>` : `<td class="num"><span class="rate" style="background:rgba(26,127,55,${(0.08 + 0.5 * v).toFixed(2)})">${v.toFixed(2)}</span></td>`;
    }).join("") + `<td class="${r.change === "fail→pass" ? "up" : r.change ? "down" : ""}">${esc(r.change)}</td></tr>`;
  }
  $("#tasks-body").innerHTML = h + `</tbody></table></div>`;
}

renderSummary();
renderCurves();
renderBrowser();
renderTasks();
const m = location.hash.match(/traj=(\d+)/);
if (m) { openTrajectory(Number(m[1])); if (!/top/.test(location.hash)) document.getElementById("trajectories").scrollIntoView(); }
else if (T.length) openTrajectory(T[T.length - 1].i);
document.body.dataset.ready = "1";
