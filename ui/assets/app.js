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
  const fails = Object.entries(s.fail_decisions || {}).filter(([, n]) => n > 0).sort();
  el("store-fail").textContent = fails.length ? fails.map(([m, n]) => `${m} ${n}`).join(", ") : "none";
  el("store-fail").classList.toggle("bad", fails.length > 0);
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
    `${l.requests_per_unit}/${l.unit_multiplier > 1 ? l.unit_multiplier + " " : ""}${l.unit} ${l.algorithm || "fixed_window"}${l.burst ? " burst " + l.burst : ""}${l.precision ? " precision " + l.precision : ""}` +
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
  const origin = o => o ? ` from ${o.source}, version ${o.version}` : "";
  el("rules-version").textContent = s.rules ? s.rules.version + origin(s.rules.origin) : "";

  fill(el("reloads").tBodies[0], s.reloads.map(e => {
    const tr = document.createElement("tr");
    cell(tr, new Date(e.time).toLocaleTimeString());
    cell(tr, e.ok ? "loaded" : "failed", e.ok ? "ok" : "bad");
    cell(tr, e.ok ? `${e.version}${origin(e.origin)} (${(e.domains || []).join(", ")})` : e.error);
    return tr;
  }));
}

// TOP is how many clients "most limited clients" lists, ranked by their
// denials across every domain and key counted.
const TOP = 10;
// ruleOf caches, per rules version, the rule and limit that the lookup
// names for a client: "version\0domain\0key\0value..." -> {rule, limit}.
// Only answers are cached: a lookup that failed (the store down for a
// moment) is asked again at the next poll.
const ruleOf = new Map();
let rulesVersion = "";

// keysURL is GET /v1/keys's URL for a domain and its key/value pairs:
// each part escaped once (a "/" in a value as %2F).
function keysURL(domain, pairs) {
  return "../v1/keys/" + [domain, ...pairs.flat()].map(encodeURIComponent).join("/");
}

// describe names the rule and the limit GET /v1/keys reports for one
// client, given as the descriptor it was denied with (pairs: user=alice
// and path=/login, as /v1/top remembers it), or the rules below it with
// limits when its own rule has none (a nested descriptor: the client is
// limited with more keys). A failed lookup says so and is not cached.
async function describe(domain, pairs, rules) {
  const id = [rulesVersion, domain, ...pairs.flat()].join("\0");
  if (ruleOf.has(id)) return ruleOf.get(id);
  let out = {rule: "", limit: ""};
  let r;
  try {
    r = await fetch(keysURL(domain, pairs));
  } catch (e) {
    return {rule: "", limit: "lookup failed: " + e.message};
  }
  if (!r.ok) {
    let why = "HTTP " + r.status;
    try { why = (await r.json()).error || why; } catch (e) { /* not JSON */ }
    return {rule: "", limit: "lookup failed: " + why};
  }
  // One descriptor for each prefix of pairs: the whole one is the last.
  const d = (await r.json()).descriptors.at(-1);
  if (d && d.rule) {
    out.rule = d.rule;
    out.limit = d.limit || "";
    if (!d.limit) {
      const below = rules.filter(x => x.path.startsWith(d.rule + ".") && x.limits).map(x => x.path);
      out.limit = below.length ? "in rules below: " + below.slice(0, 3).join(", ") : "none";
    }
  }
  if (ruleOf.size > 1000) ruleOf.clear();
  ruleOf.set(id, out);
  return out;
}

// flatRules lists every descriptor of the rules in force with its path
// and whether it has limits.
function flatRules(s) {
  const out = [];
  const walk = ds => {
    for (const d of ds || []) {
      out.push({path: d.path, limits: (d.limits || []).length > 0 || d.concurrency > 0});
      walk(d.descriptors);
    }
  };
  for (const d of (s.rules && s.rules.domains) || []) walk(d.descriptors);
  return out;
}

// updateTop lists the clients denied most in the last minute, across
// every domain and key counted, each with the rule and limit that a
// lookup of it names and a button that looks it up.
async function updateTop(s) {
  rulesVersion = s.rules ? s.rules.version : "";
  const hits = [];
  await Promise.all(s.keys.map(async k => {
    const q = new URLSearchParams({domain: k.domain, key: k.key, by: "denied", window: "1m", n: String(TOP)});
    const r = await fetch("../v1/top?" + q);
    if (!r.ok) return;
    const top = await r.json();
    for (const c of top.clients) {
      // The descriptor the client was denied with, when /v1/top remembers
      // it (user=alice with path=/login), else its key and value alone.
      const pairs = c.descriptor && c.descriptor.length ? c.descriptor.map(e => [e.key, e.value]) : [[k.key, c.value]];
      if (c.count > 0) hits.push({domain: k.domain, key: k.key, value: c.value, pairs, truncated: c.truncated, count: c.count, bound: top.error_bound});
    }
  }));
  hits.sort((a, b) => b.count - a.count || a.domain.localeCompare(b.domain) || a.key.localeCompare(b.key) || a.value.localeCompare(b.value));
  const rules = flatRules(s);
  const rows = await Promise.all(hits.slice(0, TOP).map(async h => {
    const tr = document.createElement("tr");
    tr.className = "top-row";
    cell(tr, h.domain);
    cell(tr, h.key + "=" + h.value + (h.truncated ? "…" : ""), "client");
    cell(tr, h.count + (h.bound ? " ±" + h.bound : ""), "n");
    const d = h.truncated ? {rule: "", limit: ""} : await describe(h.domain, h.pairs, rules);
    cell(tr, d.rule, "rule"); cell(tr, d.limit, "limit");
    const b = document.createElement("button");
    b.type = "button"; b.className = "why"; b.textContent = "why?";
    b.disabled = h.truncated;
    b.addEventListener("click", () => lookupOf(h.domain, h.pairs));
    tr.insertCell().append(b);
    return tr;
  }));
  fill(el("top").tBodies[0], rows);
  el("top-note").textContent = rows.length ? "Counts from a count-min sketch: never below the true count, at most the bound above it (98% confidence). \"why?\" looks the client up below." : "No client over a limit in the last minute.";
}

// addPair adds a key and a value field to the lookup form.
function addPair(key, value) {
  const k = document.createElement("input"), v = document.createElement("input");
  k.type = v.type = "text";
  k.className = "lookup-key"; v.className = "lookup-value";
  k.placeholder = "key (user)"; v.placeholder = "value, as sent (alice, /login)";
  k.setAttribute("aria-label", "key"); v.setAttribute("aria-label", "value");
  k.value = key || ""; v.value = value || "";
  el("lookup-entries").append(k, v);
}

// lookupOf fills the lookup form with domain and pairs and looks it up.
function lookupOf(domain, pairs) {
  el("lookup-domain").value = domain;
  el("lookup-entries").textContent = "";
  for (const [k, v] of pairs) addPair(k, v);
  el("lookup").requestSubmit();
  el("lookup").scrollIntoView();
}

// lookup shows one client's state from GET /v1/keys (a take of cost 0):
// the domain and each key/value pair as typed, a value taken literally.
async function lookup(ev) {
  ev.preventDefault();
  const keys = [...document.querySelectorAll("#lookup .lookup-key")].map(i => i.value.trim());
  const values = [...document.querySelectorAll("#lookup .lookup-value")].map(i => i.value);
  const pairs = keys.map((k, i) => [k, values[i]]).filter(([k]) => k !== "");
  if (!el("lookup-domain").value.trim() || pairs.length === 0) {
    el("lookup-note").textContent = "Give a domain and at least one key.";
    return;
  }
  const r = await fetch(keysURL(el("lookup-domain").value.trim(), pairs));
  const body = await r.json();
  if (!r.ok) {
    el("lookup-note").textContent = body.error;
    fill(el("lookup-result").tBodies[0], []);
    return;
  }
  el("lookup-note").textContent = body.unknown_domain ? "No rules for this domain: its requests pass unlimited." : "";
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
addPair();
el("lookup-more").addEventListener("click", () => addPair());
el("lookup").addEventListener("submit", lookup);

async function poll() {
  try {
    const r = await fetch("api/stats", {cache: "no-store"});
    if (!r.ok) throw new Error(r.status);
    const s = await r.json();
    update(s);
    await updateTop(s);
    el("status").textContent = "live " + new Date().toLocaleTimeString();
  } catch (e) {
    el("status").textContent = "error: " + e.message;
  }
}
poll();
setInterval(poll, 1000);
