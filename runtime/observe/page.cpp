#include "runtime/observe/page.hpp"

namespace starling::runtime::observe {

const std::string& status_page() {
  static const std::string page = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>starling run</title>
<style>
  :root { --bg:#f6f7f9; --card:#fff; --ink:#1d2330; --muted:#6b7385; --line:#e3e6ec;
          --accent:#2f6fdb; --ok:#1f9d55; --bad:#d64545; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
         background:var(--bg); color:var(--ink); }
  header { padding:14px 22px; background:var(--ink); color:#fff; display:flex;
           align-items:baseline; gap:18px; flex-wrap:wrap; }
  header h1 { font-size:18px; margin:0; }
  header .meta { color:#c4cad6; font-size:13px; }
  #state { margin-left:auto; font-size:13px; }
  main { padding:18px 22px; display:grid; gap:16px;
         grid-template-columns:repeat(auto-fit, minmax(320px, 1fr)); }
  .card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px; }
  .card h2 { font-size:13px; text-transform:uppercase; letter-spacing:.05em; color:var(--muted);
             margin:0 0 10px; }
  .tiles { display:grid; grid-template-columns:repeat(auto-fit, minmax(130px, 1fr)); gap:10px;
           grid-column:1 / -1; }
  .tile { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
  .tile .v { font-size:24px; font-weight:600; }
  .tile .k { color:var(--muted); font-size:12px; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:4px 6px; border-bottom:1px solid var(--line); font-size:13px; }
  th { color:var(--muted); font-weight:500; }
  td.n { text-align:right; font-variant-numeric:tabular-nums; }
  .dot { display:inline-block; width:8px; height:8px; border-radius:50%; margin-right:6px; }
  .live { background:var(--ok); } .down { background:var(--bad); }
  .wide { grid-column:1 / -1; }
  svg text { font-size:11px; fill:var(--muted); }
  .muted { color:var(--muted); }
  .pictures { display:grid; gap:12px; grid-template-columns:repeat(auto-fit, minmax(360px, 1fr)); }
  .pictures img { width:100%; border:1px solid var(--line); border-radius:6px; background:#fff; }
</style>
</head>
<body>
<header>
  <h1 id="title">starling run</h1>
  <span class="meta" id="meta">waiting for the node…</span>
  <span id="state" class="meta"></span>
</header>
<main>
  <section class="tiles" id="tiles"></section>
  <section class="card wide"><h2>Loss</h2><div id="loss"><span class="muted">no loss reported yet</span></div></section>
  <section class="card"><h2>Live instances by role</h2><table id="roles"></table></section>
  <section class="card"><h2>Averaging rounds, faults, restarts</h2><table id="events"></table></section>
  <section class="card"><h2 id="through-title">Throughput</h2><table id="through"></table><p class="muted" id="through-none">no throughput reported yet</p></section>
  <section class="card wide" id="pictures-card" style="display:none"><h2>Pictures</h2><div id="pictures" class="pictures"></div></section>
  <section class="card wide"><h2>Instances</h2><table id="members"></table></section>
  <section class="card wide"><h2>Contribution ledger <a class="muted" href="/ledger.csv">ledger.csv</a></h2><table id="ledger"></table>
    <p class="muted" id="legend"><b>accepted</b>: samples the peer's partners credit it with, never its own word.
    DeDLOC and DiLoCo: the weight the partners of each completed averaging round received from it.
    SWARM: the samples of a trainer's microbatches whose forward and backward went through every stage and that a
    stage-0 peer applied to its gradient (stage 0 is the backward's last hop), credited by that stage-0 peer.
    <b>computed</b>, <b>dropped</b>, <b>rounds</b>: the peer's own word (a stage peer's computed: the backward samples it
    applied or lost; its rounds: its global steps).</p></section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
// A simulated run's clock is virtual: its times and rates say so.
let virtualTime = false;
function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + " M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + " k";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 2 : digits);
}
function duration(s) {
  if (s === null || s === undefined) return "–";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = Math.floor(s % 60);
  return (h ? h + " h " : "") + (h || m ? m + " min " : "") + r + " s";
}
function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (i ? v.toFixed(1) : String(Math.round(v))) + " " + units[i];
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function rows(table, head, data) {
  table.replaceChildren();
  const tr = el("tr");
  head.forEach((h, i) => { const th = el("th", h); if (i > 0) th.style.textAlign = "right"; tr.appendChild(th); });
  table.appendChild(tr);
  data.forEach((r) => {
    const row = el("tr");
    r.forEach((c, i) => {
      const td = el("td", undefined, i > 0 ? "n" : "");
      if (c instanceof Node) td.appendChild(c); else td.textContent = c;
      row.appendChild(td);
    });
    table.appendChild(row);
  });
}
function sum(o) { let s = 0; for (const k in (o || {})) s += o[k] || 0; return s; }
function tiles(st) {
  const m = st.metrics, t = $("tiles");
  const items = [
    [virtualTime ? "samples / virtual s" : "samples / s", fmt(m.starling_samples_per_second, 1)],
    ["samples", fmt(m.starling_samples_total, 0)],
    ["loss", fmt(m.starling_loss, 4)],
    ["global step", m.starling_global_step >= 0 ? fmt(m.starling_global_step, 0) : "–"],
    ["live instances", fmt(sum(m.starling_live_instances), 0)],
    ["rounds averaged", fmt((m.starling_averaging_rounds_total || {}).averaged || 0, 0)],
    ["restarts", fmt(m.starling_restarts_total, 0)],
    [virtualTime ? "virtual time" : "run time", duration(st.run_time_s)],
  ];
  t.replaceChildren();
  items.forEach(([k, v]) => {
    const d = el("div", undefined, "tile");
    d.appendChild(el("div", v, "v"));
    d.appendChild(el("div", k, "k"));
    t.appendChild(d);
  });
}
function lossCurve(points) {
  const box = $("loss");
  const pts = (points || []).filter((p) => p[0] !== null && p[1] !== null);
  if (pts.length < 2) return;
  const W = 900, H = 240, L = 48, R = 12, T = 10, B = 26;
  let x0 = pts[0][0], x1 = pts[pts.length - 1][0], y0 = Infinity, y1 = -Infinity;
  pts.forEach((p) => { y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); });
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) { y1 = y0 + 1; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    add("line", { x1: L, x2: W - R, y1: py(y), y2: py(y), stroke: "#e3e6ec" });
    add("text", { x: L - 6, y: py(y) + 4, "text-anchor": "end" }, y.toFixed(3));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + (x1 - x0) * i / 4;
    add("text", { x: px(x), y: H - 8, "text-anchor": "middle" }, x.toFixed(0) + " s" + (virtualTime ? " (virtual)" : ""));
  }
  // Every peer reports its own loss: the raw points (faint) scatter around the run's loss, and
  // their mean over 60 slices of the time axis (bold) shows the trend.
  const line = (ps) => ps.map((p) => px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1)).join(" ");
  add("polyline", { points: line(pts), fill: "none", stroke: "#2f6fdb", "stroke-opacity": 0.25,
                    "stroke-width": 1 });
  const slices = new Map();
  pts.forEach((p) => {
    const k = Math.min(59, Math.floor((p[0] - x0) / (x1 - x0) * 60));
    const a = slices.get(k) || [0, 0, 0];
    a[0] += p[0]; a[1] += p[1]; a[2] += 1;
    slices.set(k, a);
  });
  const mean = [...slices.keys()].sort((a, b) => a - b).map((k) => {
    const a = slices.get(k);
    return [a[0] / a[2], a[1] / a[2]];
  });
  add("polyline", { points: line(mean), fill: "none", stroke: "#2f6fdb", "stroke-width": 2.5,
                    id: "loss-mean" });
  box.replaceChildren(svg);
}
function render(st) {
  const r = st.run, m = st.metrics;
  virtualTime = r.mode === "sim";
  $("title").textContent = r.experiment || "starling run";
  document.title = (r.experiment || "starling") + " — starling";
  const start = r.start_unix_s ? new Date(r.start_unix_s * 1000).toLocaleString() : "–";
  $("meta").textContent = `${r.kind || "graph"} · ${r.mode} mode · ${r.nodes} node${r.nodes === 1 ? "" : "s"} · seed ${r.seed} · started ${start}`;
  $("state").textContent = (st.finished ? "finished" : "running") + ` · snapshot ${st.version} · updated ${new Date().toLocaleTimeString()}`;
  tiles(st);
  lossCurve(st.loss_curve);
  const live = m.starling_live_instances || {};
  rows($("roles"), ["role", "live"], Object.keys(live).map((k) => [k, fmt(live[k], 0)]));
  const ev = [];
  const rounds = m.starling_averaging_rounds_total || {};
  for (const k in rounds) ev.push(["rounds " + k, fmt(rounds[k], 0)]);
  const faults = m.starling_faults_total || {};
  for (const k in faults) ev.push(["faults: " + k, fmt(faults[k], 0)]);
  ev.push(["restarts", fmt(m.starling_restarts_total, 0)]);
  ev.push(["peers joined / left", fmt(m.starling_joins_total, 0) + " / " + fmt(m.starling_leaves_total, 0)]);
  ev.push(["microbatch retries", fmt(m.starling_retries_total, 0)]);
  ev.push(["samples dropped", fmt(m.starling_dropped_samples_total, 0)]);
  const refused = m.starling_refusals_total || {};
  for (const k in refused) ev.push(["refused here: " + k, fmt(refused[k], 0)]);
  if (m.starling_bans_total) ev.push(["peers banned", fmt(m.starling_bans_total, 0)]);
  const modes = m.starling_live_peers_by_mode || {};
  if (Object.keys(modes).length) ev.push(["live peers: full / client mode", fmt(modes.full, 0) + " / " + fmt(modes.client, 0)]);
  rows($("events"), ["what", "count"], ev);
  const stageRate = m.starling_stage_samples_per_second || {}, stageTotal = m.starling_stage_samples_total || {};
  const peerRate = m.starling_peer_samples_per_second || {}, peerTotal = m.starling_peer_samples_total || {};
  const per = virtualTime ? "samples / virtual s" : "samples / s";
  let through = [];
  if (Object.keys(stageTotal).length) {
    $("through-title").textContent = "Throughput per stage";
    through = Object.keys(stageTotal).sort((a, b) => a - b).map((k) => ["stage " + k, fmt(stageRate[k], 1), fmt(stageTotal[k], 0)]);
    rows($("through"), ["stage", per, "samples applied"], through);
  } else {
    $("through-title").textContent = "Throughput per peer";
    through = Object.keys(peerTotal).map((k) => [k, fmt(peerRate[k], 1), fmt(peerTotal[k], 0)]);
    rows($("through"), ["peer", per, "samples"], through);
  }
  $("through").style.display = through.length ? "" : "none";
  $("through-none").style.display = through.length ? "none" : "";
  rows($("members"), ["instance", "role", "node", "samples", "restarts", "last seen"],
    (st.members || []).map((x) => {
      const name = el("span");
      name.appendChild(el("span", undefined, "dot " + (x.live ? "live" : "down")));
      name.appendChild(document.createTextNode(x.name));
      return [name, x.detail ? x.role + " · " + x.detail : x.role, String(x.node), fmt(x.samples, 0), fmt(x.restarts, 0),
              x.last_seen_s === null || x.last_seen_s < 0 ? "–" : fmt(x.last_seen_s, 1) + " s"];
    }));
  // Accepted: what the peer's round partners credit it with; computed and dropped: its own word.
  // A closed run names each peer's token by its id (public, as in issued.log and deny lists).
  const tokens = (st.ledger || []).some((x) => x.token_id);
  rows($("ledger"), ["peer", "accepted", "computed", "dropped", "rounds", "uptime", "sent", "received", "refused", "status"]
      .concat(tokens ? ["token id"] : []),
    (st.ledger || []).map((x) => {
      const name = el("span");
      name.appendChild(el("span", undefined, "dot " + (x.banned || x.left || x.record === "expired" ? "down" : "live")));
      name.appendChild(document.createTextNode(x.peer + (x.stage >= 0 ? " · stage " + x.stage : "")));
      const status = x.banned ? "banned: " + (x.ban_reason || "?") : x.left ? "left"
                   : x.record === "expired" ? "record expired" : x.record === "live" ? "publishing" : "–";
      return [name, fmt(x.accepted, 0), fmt(x.computed, 0), fmt(x.dropped, 0), fmt(x.rounds, 0),
              duration(x.uptime_s), bytes(x.bytes_sent), bytes(x.bytes_received),
              fmt(x.refusals, 0) + (x.refused_by > 1 ? " by " + x.refused_by + " nodes" : ""), status].concat(tokens ? [x.token_id ? x.token_id.slice(0, 16) : "–"] : []);
    }));
}
async function refresh() {
  try {
    const res = await fetch("/status", { cache: "no-store" });
    if (!res.ok) throw new Error("HTTP " + res.status);
    render(await res.json());
  } catch (e) {
    $("state").textContent = "node unreachable (" + e.message + "), retrying";
  }
}
// The run's pictures (its SVG plots, PNG images such as the demo's grid.png, and the loss drawn
// live), every 10 s: each reloads itself.
let pictureRound = 0;
async function pictures() {
  try {
    const res = await fetch("/pictures", { cache: "no-store" });
    if (!res.ok) return;
    const names = await res.json();
    const box = $("pictures");
    $("pictures-card").style.display = names.length ? "" : "none";
    pictureRound++;
    box.replaceChildren(...names.map((n) => {
      const img = el("img");
      img.alt = n;
      img.src = "/pictures/" + encodeURIComponent(n) + "?r=" + pictureRound;
      return img;
    }));
  } catch (e) { /* the state line says when the node is unreachable */ }
}
refresh();
pictures();
setInterval(refresh, 2000);
setInterval(pictures, 10000);
</script>
</body>
</html>
)html";
  return page;
}

} // namespace starling::runtime::observe
