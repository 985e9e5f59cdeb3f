"use strict";
// renderSimulation draws one chart per simulated limit into el: admitted
// and denied per second, side by side. res is a simulate.Result.
function renderSimulation(el, res) {
  window.simResult = res;
  el.textContent = "";
  const xs = Array.from({length: res.seconds}, (_, i) => i);
  for (const s of res.series) {
    const card = document.createElement("div");
    card.className = "card sim-card";
    const h = document.createElement("h2");
    h.textContent = s.name;
    const p = document.createElement("div");
    p.className = "muted sim-summary";
    const admitted = s.admitted.reduce((a, b) => a + b, 0);
    const denied = s.denied.reduce((a, b) => a + b, 0);
    p.textContent = `admitted ${admitted}, denied ${denied}; most admitted in one second ${s.max_admitted}, in one period ${s.max_admitted_window}`;
    const chart = document.createElement("div");
    card.append(h, p, chart);
    el.append(card);
    // Admitted on the left of each second, denied on its right.
    const left = uPlot.paths.bars({size: [0.45, 20], align: -1});
    const right = uPlot.paths.bars({size: [0.45, 20], align: 1});
    new uPlot({
      width: Math.max(480, Math.min(900, el.clientWidth / 2 - 30)), height: 220,
      scales: {x: {time: false}},
      axes: [{label: "second"}, {label: "requests"}],
      series: [{label: "s"},
        {label: "admitted", stroke: "#1b7f3b", fill: "rgba(27,127,59,.5)", paths: left},
        {label: "denied", stroke: "#b3261e", fill: "rgba(179,38,30,.5)", paths: right}],
    }, [xs, s.admitted, s.denied], chart);
  }
}
