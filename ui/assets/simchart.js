"use strict";
// renderSimulation draws into el one chart per simulated limit the traffic
// reached (res.series[i].reached), and lists the others: each column adds
// up res.step seconds, admitted (green) with denied (red) stacked on it,
// every chart on one scale, the traffic's. res is a simulate.Result.
function renderSimulation(el, res) {
  window.simResult = res;
  el.textContent = "";
  const step = res.step || 1;
  const cols = Math.ceil(res.seconds / step);
  const xs = Array.from({length: cols}, (_, i) => i * step);
  const sum = v => Array.from({length: cols}, (_, c) => v.slice(c * step, (c + 1) * step).reduce((a, b) => a + b, 0));
  const total = v => v.reduce((a, b) => a + b, 0);
  let top = 1;
  const columns = res.series.map(s => {
    const a = sum(s.admitted), d = sum(s.denied);
    const stacked = a.map((x, i) => x + d[i]);
    top = Math.max(top, ...stacked);
    return {a, d, stacked};
  });
  const per = step === 1 ? "a second" : step < 60 ? `per ${step} s` : `per ${step / 60} min`;
  const others = res.series.filter(s => !s.reached);
  if (others.length) {
    const note = document.createElement("div");
    note.className = "card sim-others";
    const h = document.createElement("h2");
    h.textContent = others.length === res.series.length ? "The traffic reached no limit" : "Limits the traffic did not reach";
    const p = document.createElement("div");
    p.className = "muted";
    p.textContent = "Each admitted every request, none to its last (not charted):";
    const ul = document.createElement("ul");
    for (const s of others) {
      const li = document.createElement("li");
      li.textContent = `${s.name}: most admitted in one period ${s.max_admitted_window}`;
      ul.append(li);
    }
    note.append(h, p, ul);
    el.append(note);
  }
  res.series.forEach((s, i) => {
    if (!s.reached) return;
    const card = document.createElement("div");
    card.className = "card sim-card";
    const h = document.createElement("h2");
    h.textContent = s.name;
    const p = document.createElement("div");
    p.className = "muted sim-summary";
    p.textContent = `admitted ${total(s.admitted)}, denied ${total(s.denied)}; most admitted in one second ${s.max_admitted}, in one period ${s.max_admitted_window}`;
    const chart = document.createElement("div");
    card.append(h, p, chart);
    el.append(card);
    const bars = uPlot.paths.bars({size: [0.9, 40], align: 0});
    const c = columns[i];
    // The denied stand on the admitted: the red series is the column's
    // whole, drawn first; its legend says the denied alone.
    new uPlot({
      width: Math.max(480, Math.min(900, el.clientWidth / 2 - 30)), height: 220,
      scales: {x: {time: false}, y: {range: [0, top]}},
      axes: [{label: "second"}, {label: "requests " + per}],
      series: [{label: "s"},
        {label: "denied", stroke: "#b3261e", fill: "rgba(179,38,30,.5)", paths: bars, value: (u, v, si, k) => k == null ? "--" : c.d[k]},
        {label: "admitted", stroke: "#1b7f3b", fill: "rgba(27,127,59,.6)", paths: bars}],
    }, [xs, c.stacked, c.a], chart);
  });
}
