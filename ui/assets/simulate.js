"use strict";
async function run() {
  const status = document.getElementById("status");
  const algorithms = [...document.querySelectorAll("input[name=alg]:checked")].map(e => e.value);
  status.textContent = "simulating…";
  const r = await fetch("api/simulate", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({rules: document.getElementById("rules").value, traffic: document.getElementById("traffic").value, algorithms})});
  const body = await r.json();
  if (!r.ok) {
    status.textContent = "error: " + body.error;
    return;
  }
  status.textContent = `${body.requests} requests over ${body.seconds} s`;
  renderSimulation(document.getElementById("charts"), body);
}
document.getElementById("run").addEventListener("click", run);
run();
