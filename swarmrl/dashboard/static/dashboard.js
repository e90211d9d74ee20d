// swarmrl dashboard: polls the stats API (paths relative to this page) and draws tiles, SVG line charts,
// the policy-version spread and the node table. No library, nothing loaded from elsewhere.
"use strict";
(function () {
  const POLL_MS = 2000;
  const COLORS = { loss: "#d9480f", reward: "#4c6ef5", task_reward: "#12b886", heldout_acc: "#7048e8" };
  const SVGNS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const fmt = (v, d) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));
  const short = (id) => (id.length > 12 ? id.slice(0, 12) + "\u2026" : id);
  function ago(t, now) {
    if (!t) return "-";
    const s = Math.max(0, now - t);
    return s < 90 ? s.toFixed(0) + " s ago" : s < 5400 ? (s / 60).toFixed(0) + " min ago" : (s / 3600).toFixed(1) + " h ago";
  }

  function niceTicks(lo, hi, n) {
    if (hi === lo) { hi = lo + 1; lo = lo - 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toFixed(12));
    return ticks;
  }

  // series: [{name, points: [[x, y], ...]}]; draws axes, grid and one <path class="series"> per series
  function lineChart(svg, series) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = svg.clientWidth || 400, H = svg.clientHeight || 190, L = 44, R = 10, T = 8, B = 22;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      svg.appendChild(el("svg:text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no points yet"));
      return;
    }
    let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
    let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const yt = niceTicks(y0, y1, 4);
    y0 = Math.min(y0, yt[0]); y1 = Math.max(y1, yt[yt.length - 1]);
    if (y0 === y1) { y0 -= 1; y1 += 1; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (const t of yt) {
      svg.appendChild(el("svg:line", { class: "grid", x1: L, x2: W - R, y1: sy(t), y2: sy(t) }));
      svg.appendChild(el("svg:text", { x: L - 4, y: sy(t) + 3, "text-anchor": "end" }, +t.toPrecision(4)));
    }
    for (const t of niceTicks(x0, x1, 5).filter((t) => t >= x0 && t <= x1)) {
      svg.appendChild(el("svg:text", { x: sx(t), y: H - 6, "text-anchor": "middle" }, t));
    }
    for (const s of series) {
      if (!s.points.length) continue;
      const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
      svg.appendChild(el("svg:path", { class: "series", d: d, stroke: COLORS[s.name] || "#333",
                                       "data-series": s.name, "data-points": s.points.length }));
      if (s.points.length < 40) {
        for (const p of s.points) {
          svg.appendChild(el("svg:circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: COLORS[s.name] || "#333" }));
        }
      }
    }
  }

  function drawCharts(curves) {
    for (const svg of document.querySelectorAll("svg.chart")) {
      const names = svg.dataset.series.split(",");
      lineChart(svg, names.map((n) => ({
        name: n, points: curves.points.filter((p) => p[n] !== null && p[n] !== undefined).map((p) => [p.version, p[n]]),
      })));
    }
    const leg = $("legend-reward");
    leg.textContent = "";
    for (const n of ["reward", "task_reward"]) {
      const s = el("span"); const i = el("i"); i.style.background = COLORS[n];
      s.appendChild(i); s.appendChild(document.createTextNode(n.replace("_", " "))); leg.appendChild(s);
    }
  }

  function tile(k, v) {
    const t = el("div", { class: "tile" });
    t.appendChild(el("div", { class: "k" }, k)); t.appendChild(el("div", { class: "v" }, v));
    return t;
  }

  function drawOverview(o, curves) {
    $("mode").textContent = o.mode === "swarm" ? "swarm run (orchestrator)" : "local run";
    const last = curves.points.length ? curves.points[curves.points.length - 1] : null;
    const acc = curves.points.filter((p) => p.heldout_acc !== null && p.heldout_acc !== undefined);
    const tiles = $("tiles"); tiles.textContent = "";
    tiles.appendChild(tile("step", o.step));
    tiles.appendChild(tile("policy version", o.policy_version));
    tiles.appendChild(tile("nodes active", o.nodes.active || 0));
    for (const st of Object.keys(o.nodes).sort()) if (st !== "active") tiles.appendChild(tile("nodes " + st, o.nodes[st]));
    if (o.validation) {
      tiles.appendChild(tile("validation queue", o.validation.pending));
      tiles.appendChild(tile("accepted / rejected", o.validation.accepted + " / " + o.validation.rejected));
    }
    tiles.appendChild(tile("loss", last ? fmt(last.loss, 4) : "-"));
    tiles.appendChild(tile("reward", last ? fmt(last.reward, 3) : "-"));
    tiles.appendChild(tile("held-out acc", acc.length ? (100 * acc[acc.length - 1].heldout_acc).toFixed(1) + "%" : "-"));
  }

  function drawPolicy(p) {
    const b = $("policy-body"); b.textContent = ""; b.className = "";
    b.appendChild(el("div", {}, "current version " + p.policy_version + " (trainer step " + p.step + ")"));
    b.appendChild(el("div", { class: "note" }, "SHARDCAST servers" + (p.servers.length ? "" : ": none announced")));
    const ul = el("ul", { class: "servers" });
    for (const s of p.servers) ul.appendChild(el("li", {}, s));
    if (p.origin && !p.servers.includes(p.origin)) ul.appendChild(el("li", {}, p.origin + " (origin)"));
    b.appendChild(ul);
    b.appendChild(el("div", { class: "note" }, p.spread_basis));
    const max = Math.max(1, ...p.spread.map((s) => s.nodes));
    const t = el("table", { id: "spread" });
    for (const s of p.spread) {
      const tr = el("tr", { "data-version": s.version });
      tr.appendChild(el("td", {}, "v" + s.version));
      const td = el("td"); const bar = el("span", { class: "bar" }); bar.style.width = (120 * s.nodes / max) + "px";
      td.appendChild(bar); td.appendChild(document.createTextNode(" " + s.nodes)); tr.appendChild(td);
      t.appendChild(tr);
    }
    b.appendChild(t);
  }

  function drawNodes(list, now) {
    const tb = document.querySelector("#nodes tbody"); tb.textContent = "";
    $("nodes-note").textContent = list.total > list.items.length ? `(${list.items.length} of ${list.total})` : `(${list.total})`;
    for (const n of list.items) {
      const tr = el("tr", { "data-node": n.node_id });
      const cells = [[n.node_id, "id"], [n.status, "st-" + n.status], [fmt(n.throughput, 0)], [fmt(n.stake, 1)],
        [fmt(n.credits, 1)], [n.accepted ?? "-"], [n.rejected ?? "-"], [n.pending ?? "-"],
        [n.slashes ? n.slashes + " (" + fmt(n.slashed, 1) + ")" : "0"], [n.policy_version ?? "-"], [ago(n.last_seen, now)]];
      cells.forEach(([v, cls], i) => {
        const td = el("td", cls ? { class: cls } : {}, i === 0 ? short(String(v)) : String(v));
        if (i === 0) td.title = v;
        if (i === 1 && n.status_reason) td.title = n.status_reason;
        tr.appendChild(td);
      });
      tb.appendChild(tr);
    }
  }

  async function get(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function poll() {
    try {
      const [o, nodes, curves, policy] = await Promise.all([get("v1/stats/overview"), get("v1/stats/nodes?limit=200"),
        get("v1/stats/trainer?limit=500"), get("v1/stats/policy")]);
      drawOverview(o, curves); drawCharts(curves); drawPolicy(policy); drawNodes(nodes, o.time);
      document.body.dataset.updated = String(o.time);
      $("conn").textContent = "updated " + new Date(o.time * 1000).toLocaleTimeString();
    } catch (e) {
      $("conn").textContent = "not updated: " + e.message;
    }
    setTimeout(poll, POLL_MS);
  }
  poll();
})();
