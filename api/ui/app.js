// The frenzy-opt dashboard: plain browser JavaScript against the service's /v1 API, refreshed every few
// seconds. The token (if the service has tenants) is kept in this browser's localStorage and sent as a
// bearer token, so a tenant sees its own jobs and an admin everyone's.
"use strict";

const REFRESH_MS = 2000;
const HISTORY_S = 6 * 3600;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
let timer = null;

function token() { return localStorage.getItem("frenzy-token") || ""; }

async function api(path, asText = false) {
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  const response = await fetch(path, { headers });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${response.status} ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return asText ? response.text() : response.json();
}

function cell(row, text) {
  const td = document.createElement("td");
  if (text instanceof Node) td.appendChild(text); else td.textContent = text ?? "";
  row.appendChild(td);
  return td;
}

function fill(tableId, rows) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const values of rows) {
    const tr = document.createElement("tr");
    for (const v of values) cell(tr, v);
    body.appendChild(tr);
  }
  return body;
}

function jobLink(job) {
  const a = document.createElement("a");
  a.href = `#job/${encodeURIComponent(job.id)}`;
  a.textContent = job.name || job.id;
  a.dataset.job = job.id;
  return a;
}

function duration(s) {
  if (s === null || s === undefined) return "unknown";
  if (s < 120) return `${Math.max(0, Math.round(s))} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// The service's one clock is cluster time; at a time scale other than 1 the wall time is shown beside it.
function clusterDuration(s, scale) {
  if (!scale || scale === 1) return duration(s);
  return `${duration(s)} cluster time (~${duration(s / scale)} wall at ${scale}x)`;
}

function gpus(job) {
  const p = job.placement || {}, plan = job.plan || {};
  const type = plan.gpu_type, n = plan.num_gpus;
  return type && n ? `${n} × ${type}` : (p.nodes ? p.nodes.join(", ") : "");
}

function colourOf(keys) {
  const sorted = [...new Set(keys)].sort();
  return Object.fromEntries(sorted.map((k, i) => [k, PALETTE[i % PALETTE.length]]));
}

function svgEl(name, attrs, parent) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

// The charts' window: the last HISTORY_S seconds, or from shortly before the first stretch if that is later
// (a young service's history then fills the width).
function windowOf(timeline) {
  const first = Math.min(...timeline.intervals.map((i) => i.start), timeline.now);
  const t0 = Math.max(timeline.now - HISTORY_S, first - 0.05 * (timeline.now - first) - 1);
  return [t0, timeline.now];
}

function drawOccupancy(timeline, colours) {
  const svg = $("occupancy");
  svg.replaceChildren();
  const [t0, t1] = windowOf(timeline);
  const x = (t) => ((t - t0) / (t1 - t0)) * 800;
  for (const [type, total] of Object.entries(timeline.gpus_per_type)) {
    // The used GPUs of the type as a step function: +n at each start, -n at each end.
    const changes = [];
    for (const iv of timeline.intervals.filter((i) => i.gpu_type === type)) {
      changes.push([Math.max(iv.start, t0), iv.num_gpus]);
      changes.push([iv.end === null ? t1 : iv.end, -iv.num_gpus]);
    }
    changes.sort((a, b) => a[0] - b[0]);
    let used = 0;
    const points = [[0, 200]];
    for (const [t, delta] of changes) {
      const px = x(Math.max(t, t0));
      points.push([px, 200 - (used / total) * 190]);
      used += delta;
      points.push([px, 200 - (used / total) * 190]);
    }
    points.push([800, 200 - (used / total) * 190]);
    svgEl("polyline", {
      points: points.map((p) => p.join(",")).join(" "), fill: "none", stroke: colours[type],
      "stroke-width": 2, "data-gpu-type": type, "vector-effect": "non-scaling-stroke",
    }, svg);
  }
  const legend = $("occupancy-legend");
  legend.replaceChildren();
  for (const [type, colour] of Object.entries(colours)) {
    const span = document.createElement("span");
    span.innerHTML = `<i style="background:${colour}"></i>`;
    span.appendChild(document.createTextNode(type));
    legend.appendChild(span);
  }
}

function drawGantt(timeline, colours) {
  const svg = $("gantt");
  svg.replaceChildren();
  const jobs = [...new Set(timeline.intervals.map((i) => i.job))];
  const [t0, t1] = windowOf(timeline);
  const row = 200 / Math.max(jobs.length, 1);
  for (const iv of timeline.intervals) {
    const start = Math.max(iv.start, t0), end = iv.end === null ? t1 : iv.end;
    const rect = svgEl("rect", {
      x: ((start - t0) / (t1 - t0)) * 800, width: Math.max(((end - start) / (t1 - t0)) * 800, 1),
      y: jobs.indexOf(iv.job) * row, height: Math.max(row - 1, 1), fill: colours[iv.gpu_type],
      "data-job": iv.job,
    }, svg);
    svgEl("title", {}, rect).textContent = `${iv.name} (${iv.tenant}): ${iv.num_gpus} × ${iv.gpu_type}`;
  }
}

async function overview() {
  const [cluster, list, timeline] = await Promise.all([
    api("/v1/cluster"), api("/v1/jobs?limit=500"), api(`/v1/timeline?since=${Date.now() / 1000 - HISTORY_S}`),
  ]);
  $("cluster-name").textContent = `cluster ${cluster.name}`;
  const colours = colourOf(Object.keys(cluster.gpu_types));
  const cards = $("gpu-types");
  cards.replaceChildren();
  for (const [type, c] of Object.entries(cluster.gpu_types)) {
    const div = document.createElement("div");
    div.className = "card";
    div.dataset.gpuType = type;
    div.innerHTML = `<div>${type}</div><b>${c.used}</b> / ${c.gpus} GPUs in use`
      + `<div class="bar"><span style="width:${(100 * c.used) / c.gpus}%;background:${colours[type]}"></span></div>`;
    cards.appendChild(div);
  }
  const jobs = list.items;
  const queued = jobs.filter((j) => j.state === "queued")
    .sort((a, b) => (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9));
  fill("queue", queued.map((j) => [
    j.queue_position ?? "", jobLink(j), j.tenant, j.reason || j.waiting_for,
    j.estimated_start_in_s === null || j.estimated_start_in_s === undefined ? "unknown"
      : `in ${clusterDuration(j.estimated_start_in_s, j.time_scale)}`,
  ]));
  const running = jobs.filter((j) => j.state === "running" || j.state === "scheduled");
  fill("running", running.map((j) => {
    const p = j.progress || {};
    const steps = j.plan && j.plan.train_steps;
    const progress = p.step !== undefined ? `step ${p.step}${steps ? ` / ${steps}` : ""}` : j.state;
    return [jobLink(j), j.tenant, gpus(j), progress, p.step_time_s ? `${p.step_time_s.toFixed(3)} s` : ""];
  }));
  const finished = jobs.filter((j) => ["succeeded", "failed", "cancelled"].includes(j.state))
    .sort((a, b) => b.updated_at - a.updated_at).slice(0, 20);
  fill("finished", finished.map((j) => [jobLink(j), j.tenant, j.state, gpus(j),
    new Date(j.updated_at * 1000).toLocaleTimeString()]));
  drawOccupancy(timeline, colours);
  drawGantt(timeline, colours);
}

async function jobPage(id) {
  const job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  $("job-title").textContent = `${job.name} (${job.id})`;
  $("job-summary").textContent = `${job.state}; tenant ${job.tenant}; ${job.attempts} attempts `
    + `(failures ${job.failures} of ${job.max_retries} retries, moves ${job.moves}); ${job.reason || ""}`
    + (job.deadline_missed_by_s != null
      ? `; deadline missed by ${clusterDuration(job.deadline_missed_by_s, job.time_scale)}`
      : job.deadline_risk ? "; deadline at risk" : "");
  $("job-summary").dataset.state = job.state;
  const plan = job.plan || {};
  fill("job-plan", Object.entries({ gpu_type: plan.gpu_type, num_gpus: plan.num_gpus, ...(plan.parallel || {}) })
    .filter(([, v]) => v !== undefined).map(([k, v]) => [k, String(v)]));
  const predicted = job.predicted || {}, measured = job.measured || {};
  const gib = (b) => (b ? `${(b / 2 ** 30).toFixed(2)} GiB` : "");
  const peak = measured.peak_memory_bytes;
  fill("job-compare", [
    ["peak memory", gib(predicted.peak_allocated_bytes), gib(Array.isArray(peak) ? Math.max(...peak) : peak)],
    ["step time", predicted.step_time_s ? `${predicted.step_time_s.toFixed(3)} s` : "",
      measured.step_time_s ? `${measured.step_time_s.toFixed(3)} s` : ""],
  ]);
  fill("job-history", (job.history || []).map((e) => [new Date(e.at * 1000).toLocaleString(), e.state, e.detail]));
  try {
    $("job-logs").textContent = await api(`/v1/jobs/${encodeURIComponent(id)}/logs`, true);
  } catch (err) {
    $("job-logs").textContent = `no logs: ${err.message}`;
  }
}

async function refresh() {
  const route = location.hash.match(/^#job\/(.+)$/);
  $("overview").hidden = Boolean(route);
  $("job").hidden = !route;
  try {
    if (route) await jobPage(decodeURIComponent(route[1])); else await overview();
    $("error").hidden = true;
    $("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    $("error").textContent = String(err.message || err);
    $("error").hidden = false;
  }
}

function start() {
  $("token").value = token();
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem("frenzy-token", $("token").value.trim());
    refresh();
  });
  window.addEventListener("hashchange", refresh);
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

start();
