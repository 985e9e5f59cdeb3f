"use strict";
// The dashboard polls api/stats every second and plots the rates it
// computes from the counters' differences.
const HISTORY = 180; // points kept: three minutes
const colors = ["#1f6feb", "#b3261e", "#1b7f3b", "#8250df", "#bf8700", "#0a7ea4", "#cf222e", "#57606a"];
const times = [];
const rates = new Map(); // "domain result" -> per-second values aligned with times
const latency = [];
let prev = null;
let rateChart = null, rateKeys = "";
let latChart = null;

function el(id) { return document.getElementById(id); }
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.append(td);
  return td;
}
function fill(tbody, rows) {
  tbody.textContent = "";
  for (const r of rows) tbody.append(r);
}
function fmt(n) { return n >= 100 ? Math.round(n).toString() : n.toFixed(1); }

function chartWidth(node) { return Math.max(400, node.parentElement.clientWidth - 10); }

function drawRates() {
  const keys = [...rates.keys()].sort();
  const data = [times.slice(), ...keys.map(k => rates.get(k).slice())];
  if (keys.join("|") !== rateKeys || !rateChart) {
    if (rateChart) rateChart.destroy();
    rateKeys = keys.join("|");
    rateChart = new uPlot({
      width: chartWidth(el("rate-chart")), height: 220,
      series: [{}, ...keys.map((k, i) => ({label: k, stroke: colors[i % colors.length], width: 2}))],
      axes: [{}, {label: "decisions/s"}],
    }, data, el("rate-chart"));
  } else {
    rateChart.setData(data);
  }
}

function drawLatency() {
  const data = [times.slice(), latency.slice()];
  if (!latChart) {
    latChart = new uPlot({
      width: chartWidth(el("latency-chart")), height: 160,
      series: [{}, {label: "mean ms", stroke: "#8250df", width: 2}],
      axes: [{}, {label: "ms"}],
    }, data, el("latency-chart"));
  } else {
    latChart.setData(data);
  }
}

function update(s) {
  const t = Date.parse(s.time) / 1000;
  el("mode").textContent = s.mode || "–";
  el("store-mode").textContent = s.mode || "–";
  el("store-errors").textContent = s.store.errors;
  const now = new Map(s.decisions.map(d => [d.domain + " " + d.result, d.total]));
  if (prev && t > prev.t) {
    const dt = t - prev.t;
    times.push(t);
    let total = 0, denied = 0;
    const rows = [];
    for (const [k, v] of now) {
      const r = Math.max(0, (v - (prev.totals.get(k) || 0)) / dt);
      if (!rates.has(k)) rates.set(k, new Array(times.length - 1).fill(null));
      rates.get(k).push(r);
      total += r;
      if (k.endsWith(" over_limit")) denied += r;
      const tr = document.createElement("tr");
      const [domain, result] = k.split(" ");
      cell(tr, domain); cell(tr, result, result === "ok" ? "ok" : "bad"); cell(tr, fmt(r), "n"); cell(tr, v, "n");
      rows.push(tr);
    }
    for (const [k, arr] of rates) if (!now.has(k)) arr.push(0);
    fill(el("rates").tBodies[0], rows);
    el("rate-total").textContent = fmt(total);
    el("rate-denied").textContent = fmt(denied);
    const calls = s.store.calls - prev.calls;
    const lat = calls > 0 ? (s.store.sum_seconds - prev.sum) / calls * 1000 : null;
    latency.push(lat);
    if (lat !== null) el("store-latency").textContent = lat.toFixed(3);
    if (times.length > HISTORY) {
      times.shift(); latency.shift();
      for (const arr of rates.values()) arr.shift();
    }
    drawRates();
    drawLatency();
  }
  prev = {t, totals: now, calls: s.store.calls, sum: s.store.sum_seconds};

  const rules = [];
  const limitText = l => l.unlimited ? "unlimited" : l.block ? "block" :
    `${l.requests_per_unit}/${l.unit_multiplier > 1 ? l.unit_multiplier + " " : ""}${l.unit} ${l.algorithm || "fixed_window"}${l.burst ? " burst " + l.burst : ""}` +
    (l.throttling === "elastic" ? ` elastic +${l.elastic_percent}%` : l.throttling === "soft" ? ` soft +${l.exceed_percent}%` : "");
  const row = (domain, path, text, line) => {
    const tr = document.createElement("tr");
    cell(tr, path); cell(tr, text); cell(tr, domain.file.split("/").pop() + ":" + line);
    rules.push(tr);
  };
  const walk = (domain, ds) => {
    for (const d of ds || []) {
      row(domain, d.path, (d.limits || []).map(limitText).join("; ") + (d.concurrency ? `; ${d.concurrency} in flight` : "") +
        (d.priority ? ` (${d.priority})` : "") + (d.shadow_mode ? " (shadow)" : ""), d.line);
      walk(domain, d.descriptors);
    }
  };
  for (const d of (s.rules && s.rules.domains) || []) {
    if (d.capacity) row(d, d.domain + " capacity", limitText(d.capacity) + " (the elastic limits' pool)", d.capacity.line);
    walk(d, d.descriptors);
  }
  fill(el("rules").tBodies[0], rules);
  el("rules-version").textContent = s.rules ? s.rules.version : "";

  fill(el("reloads").tBodies[0], s.reloads.map(e => {
    const tr = document.createElement("tr");
    cell(tr, new Date(e.time).toLocaleTimeString());
    cell(tr, e.ok ? "loaded" : "failed", e.ok ? "ok" : "bad");
    cell(tr, e.ok ? `${e.version} (${(e.domains || []).join(", ")})` : e.error);
    return tr;
  }));
}

async function updateTop(keys) {
  const rows = [];
  let bound = 0;
  for (const k of keys.slice(0, 8)) {
    const q = new URLSearchParams({domain: k.domain, key: k.key, by: "denied", window: "1m", n: "5"});
    const r = await fetch("../v1/top?" + q);
    if (!r.ok) continue;
    const top = await r.json();
    bound = Math.max(bound, top.error_bound);
    for (const c of top.clients) {
      const tr = document.createElement("tr");
      tr.className = "top-row";
      cell(tr, k.domain); cell(tr, k.key); cell(tr, c.value + (c.truncated ? "…" : ""), "client");
      cell(tr, c.count, "n"); cell(tr, "±" + top.error_bound, "n muted");
      rows.push(tr);
    }
  }
  fill(el("top").tBodies[0], rows);
  el("top-note").textContent = rows.length ? "Counts from a count-min sketch: never below the true count, at most the bound above it (98% confidence)." : "No client over a limit in the last minute.";
}

// lookup shows one client's state from GET /v1/keys (a take of cost 0).
async function lookup(ev) {
  ev.preventDefault();
  const parts = el("lookup-path").value.split("/").filter(p => p !== "").map(encodeURIComponent);
  const r = await fetch("../v1/keys/" + parts.join("/"));
  const body = await r.json();
  if (!r.ok) {
    el("lookup-note").textContent = body.error;
    fill(el("lookup-result").tBodies[0], []);
    return;
  }
  el("lookup-note").textContent = "";
  // One row per limit of each descriptor's rule, each with its own state.
  fill(el("lookup-result").tBodies[0], body.descriptors.flatMap(d => {
    const limits = d.limits && d.limits.length ? d.limits : [null];
    return limits.map(l => {
      const tr = document.createElement("tr");
      cell(tr, d.entries.map(e => e.key + "=" + e.value).join(", "));
      cell(tr, (d.rule || "no rule") + (d.shadow ? " (shadow)" : ""));
      if (!l) {
        cell(tr, ""); cell(tr, ""); cell(tr, ""); cell(tr, "admitted", "ok");
        return tr;
      }
      const note = l.replaced ? " (replaced)" : l.elastic ?
        ` elastic: ${l.elastic.excess_remaining} of excess, ${l.elastic.pool_remaining} of pool ${l.elastic.pool}` :
        l.regions ? " global, used by region: " + l.regions.map(r => `${r.region} ${r.count}`).join(", ") : "";
      cell(tr, l.limit + (l.throttling ? " " + l.throttling : "") + note);
      cell(tr, l.unlimited || l.replaced ? "" : l.remaining, "n");
      cell(tr, l.unlimited || l.replaced ? "" : l.reset_after);
      cell(tr, l.denies_next ? "denied" : "admitted", l.denies_next ? "bad" : "ok");
      return tr;
    });
  }));
}
el("lookup").addEventListener("submit", lookup);

async function poll() {
  try {
    const r = await fetch("api/stats", {cache: "no-store"});
    if (!r.ok) throw new Error(r.status);
    const s = await r.json();
    update(s);
    await updateTop(s.keys);
    el("status").textContent = "live " + new Date().toLocaleTimeString();
  } catch (e) {
    el("status").textContent = "error: " + e.message;
  }
}
poll();
setInterval(poll, 1000);
