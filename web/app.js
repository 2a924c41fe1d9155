// vramscope web page: knobs -> the command line of `vramscope estimate` ->
// the engine (WebAssembly, web/engine/engine.cc) -> the views. The page
// computes nothing itself: every number shown is a field of the engine's JSON,
// which is the CLI's `estimate --json` for the same command line.
"use strict";

// The knobs of `estimate` the page shows: element id, flag, and the value
// that means "flag not given" (the CLI's default, DESIGN.md's knob table).
// "auto" (shown "library default") gives no flag: the engine picks what the
// user's libraries do (the checkpoint's dtype under transformers 5, the HF
// Trainer's fused AdamW), as the CLI does without --precision / --optimizer;
// the report's Assumed section says which.
const SELECTS = {
  precision: ["auto", "fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16"],
  optimizer: ["auto", "none", "sgd", "sgd-momentum", "adamw", "adamw-foreach", "adamw-fused", "adamw-forloop",
              "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "adafactor", "lion"],
  finetune: ["full", "lora", "qlora"],
  "grad-ckpt": ["none", "full", "reentrant"],
  attn: ["eager", "sdpa", "flash"],
  loss: ["hf", "chunked", "fused-linear"],
  zero: ["", "1", "2", "3"],
  fsdp: ["", "full", "grad-op", "hybrid"],
  offload: ["none", "optimizer", "params"],
};
const DEFAULTS = {
  gpu: "h100-80g", batch: "1", seq: "2048", "grad-accum": "1", precision: "auto",
  optimizer: "auto", finetune: "full", "lora-rank": "16", "lora-targets": "q,v", "grad-ckpt": "none",
  attn: "sdpa", loss: "hf", "alloc-conf": "", gpus: "", ddp: false, zero: "", fsdp: "",
  offload: "none", tp: "1", pp: "1", sp: false, cp: "1", microbatches: "", explain: false,
  "extra-flags": "",
};
const KNOB_IDS = Object.keys(DEFAULTS);
const CONFIG_PATH = "/page/config.json";  // where the engine sees a pasted config
const $ = (id) => document.getElementById(id);

const state = { engine: null, runs: 0, result: null, zoom: null, timing: {}, sweepTimer: 0 };
window.vramscope = state;  // for tests/web_test.py and the curious

function gib(bytes) {
  return `${(bytes / vsCharts.GIB).toFixed(2)} GiB`;
}

function knobValue(id) {
  const node = $(id);
  return node.type === "checkbox" ? node.checked : node.value.trim();
}

function setKnob(id, value) {
  const node = $(id);
  if (node.type === "checkbox") node.checked = value === true || value === "true" || value === "1";
  else node.value = value;
}

// --- the command line -------------------------------------------------------

function modelArg() {
  return $("source-config").checked ? CONFIG_PATH : $("model").value;
}

// The flags of every knob that differs from its default, in the page's order;
// "other flags" (any flag of `estimate`, the page's way to the knobs it has no
// field for) last, split at white space as a shell would split them unquoted.
function knobFlags() {
  const flags = [];
  for (const id of KNOB_IDS) {
    const value = knobValue(id), flag = $(id).dataset.flag;
    if (value === DEFAULTS[id] || value === "") continue;
    if (id === "extra-flags") flags.push(...value.split(/\s+/));
    else if (value === true) flags.push(flag);
    else if (value !== false) flags.push(flag, value);
  }
  return flags;
}

function estimateArgv() {
  return ["estimate", modelArg(), ...knobFlags()];
}

function files() {
  return $("source-config").checked ? { [CONFIG_PATH]: $("config").value } : {};
}

function shellQuote(s) {
  return /^[\w.,:=\/+-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
}

function cliCommand(argv) {
  const shown = argv.map((a) => (a === CONFIG_PATH ? "config.json" : a));
  return ["vramscope", ...shown, "--json"].map(shellQuote).join(" ");
}

// --- the URL hash: every knob that is not its default ---------------------

function hashOfKnobs() {
  const p = new URLSearchParams();
  if ($("source-config").checked) p.set("config", $("config").value);
  else p.set("model", $("model").value);
  for (const id of KNOB_IDS) {
    const value = knobValue(id);
    if (value !== DEFAULTS[id] && value !== "") p.set(id, String(value));
  }
  if ($("sweep-knob").value !== "seq") p.set("sweep", $("sweep-knob").value);
  return "#" + p.toString();
}

function knobsFromHash(hash) {
  const p = new URLSearchParams(hash.replace(/^#/, ""));
  for (const id of KNOB_IDS) setKnob(id, p.has(id) ? p.get(id) : DEFAULTS[id]);
  if (p.has("config")) {
    $("source-config").checked = true;
    $("config").value = p.get("config");
  } else {
    $("source-catalog").checked = true;
    if (p.has("model")) $("model").value = p.get("model");
  }
  $("sweep-knob").value = p.has("sweep") ? p.get("sweep") : "seq";
  showSource();
}

// --- the engine ----------------------------------------------------------------

function callEngine(argv, fileMap) {
  const request = JSON.stringify({ argv, files: fileMap });
  return JSON.parse(state.engine.ccall("vs_run", "string", ["string"], [request]));
}

// Runs the estimate of the knobs now shown, renders it, and schedules the sweep.
function estimate() {
  const argv = estimateArgv();
  history.replaceState(null, "", hashOfKnobs());
  $("cli").textContent = cliCommand(argv);
  const t0 = performance.now();
  const answer = callEngine(argv, files());
  const ms = performance.now() - t0;
  state.timing.last_estimate_ms = ms;
  if (state.timing.first_result_ms === undefined) state.timing.first_result_ms = performance.now();
  state.runs += 1;
  state.result = answer;
  state.argv = argv;
  render(answer);
  $("timing").textContent = `engine: ${ms.toFixed(1)} ms for this estimate` +
    ` (page ready to first result: ${state.timing.first_result_ms.toFixed(0)} ms)`;
  document.body.dataset.runs = String(state.runs);
  scheduleSweep(answer.ok);
}

// --- the views -----------------------------------------------------------------

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

function render(answer) {
  showError(answer.ok ? "" : answer.error);
  document.body.dataset.ok = String(answer.ok);
  if (!answer.ok) return;
  const r = answer.json;
  for (const [id, key] of [["peak-allocated", "peak_allocated_bytes"], ["peak-reserved", "peak_reserved_bytes"],
                           ["device-total", "device_total_bytes"]]) {
    $(id).textContent = gib(r[key]);
    $(id).dataset.bytes = String(r[key]);
  }
  renderVerdict(r);
  renderList($("warnings"), answer.warnings, (w) => w);
  state.zoom = null;
  drawTimeline();
  renderBreakdown(r);
  renderList($("assumed"), r.assumptions || [], (a) => `${a.what}: ${a.assumed}${a.flag ? ` (${a.flag})` : ""}`);
  $("explain-box").hidden = !(r.explanation && r.explanation.length);
  renderList($("explanation"), r.explanation || [], (e) => (typeof e === "string" ? e : JSON.stringify(e)));
  renderLive(r);
  renderRanks(r);
}

// Parallel layouts: every class of ranks with the same memory, as the CLI lists them.
function renderRanks(r) {
  const ranks = r.ranks || [];
  $("ranks-box").hidden = ranks.length < 2;
  const tbody = $("ranks").querySelector("tbody");
  tbody.textContent = "";
  for (const k of ranks) {
    const needed = k.full_requirement ? k.full_requirement.device_total_bytes : k.device_total_bytes;
    const cells = [[k.rank_class], [String(k.ranks.length)], [gib(k.peak_allocated_bytes), "bytes"],
                   [gib(k.peak_reserved_bytes), "bytes"], [gib(k.device_total_bytes), "bytes"],
                   [gib(needed), "bytes"], [k.fits ? "yes" : "no"]];
    const tr = document.createElement("tr");
    for (const [value, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
}

function renderVerdict(r) {
  const v = $("verdict");
  const head = r.headroom_bytes;
  v.className = r.fits ? "fits" : "oom";
  v.textContent = (r.fits ? `Fits on ${r.gpu.name}: ${gib(head)} headroom` :
    `Does not fit on ${r.gpu.name}: needs ${gib(r.needed_bytes)}, ${gib(-head)} over`) +
    ` · ${r.model.name}, ${(r.model.parameters / 1e9).toFixed(2)} B parameters` +
    (r.ranks && r.ranks.length > 1 ? ` · worst rank class: ${r.worst_rank_class}` : "");
}

function renderList(ul, items, toText) {
  ul.textContent = "";
  for (const item of items) {
    const li = document.createElement("li");
    li.textContent = toText(item);
    ul.appendChild(li);
  }
}

function drawTimeline() {
  const answer = state.result;
  if (!answer || !answer.ok || !answer.timeline) return;
  vsCharts.timeline($("timeline"), answer.timeline, answer.json.gpu.usable_bytes, state.zoom, (range) => {
    state.zoom = range;
    drawTimeline();
  });
}

const CATEGORY_COLORS = ["#2f6fd6", "#8e44ad", "#e08a1e", "#1e8e4a", "#c0392b", "#16a2b8", "#7f8c8d",
                         "#d35400", "#95a5a6"];

function renderBreakdown(r) {
  const entries = Object.entries(r.breakdown_at_peak || {});
  const total = entries.reduce((s, [, b]) => s + b, 0) || 1;
  const rows = entries.map(([name, bytes], i) =>
    `<tr><td><span class="swatch" style="background:${CATEGORY_COLORS[i % 9]}"></span>${name}</td>` +
    `<td class="bytes">${gib(bytes)}</td><td class="bytes">${((100 * bytes) / total).toFixed(1)}%</td></tr>`);
  const bar = entries.map(([, bytes], i) =>
    `<span style="display:inline-block;height:14px;width:${(100 * bytes) / total}%;background:${CATEGORY_COLORS[i % 9]}"></span>`);
  $("breakdown").innerHTML = `<div style="display:flex;margin-bottom:6px">${bar.join("")}</div>` +
    `<table><tbody>${rows.join("")}</tbody></table>`;
}

function renderLive(r) {
  const tbody = $("live").querySelector("tbody");
  tbody.textContent = "";
  for (const a of r.top_allocations || []) {
    const tr = document.createElement("tr");
    for (const [value, cls] of [[gib(a.block_bytes), "bytes"], [a.category], [a.op], [a.module],
                                [`${a.phase} ${a.step}`]]) {
      const td = document.createElement("td");
      td.textContent = value === undefined ? "" : value;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  $("live-count").textContent = r.live_at_peak_count !== undefined ?
    `(largest ${(r.top_allocations || []).length} of ${r.live_at_peak_count})` : "";
}

// --- the sweep: after the estimate is shown, so it never delays it -------------

const SWEEP_GRIDS = { seq: [512, 1024, 2048, 4096, 8192, 16384], batch: [1, 2, 4, 8, 16, 32] };

function sweepArgv(knob) {
  const flags = knobFlags();
  const own = `--${knob}`;
  const i = flags.indexOf(own);
  if (i >= 0) flags.splice(i, 2);
  return ["sweep", modelArg(), ...flags, own, SWEEP_GRIDS[knob].join(",")];
}

function scheduleSweep(ok) {
  clearTimeout(state.sweepTimer);
  const knob = $("sweep-knob").value;
  $("sweep-box").hidden = !knob || !ok;
  if (!knob || !ok) return;
  $("sweep-note").textContent = "(computing…)";
  state.sweepTimer = setTimeout(() => {
    const t0 = performance.now();
    const answer = callEngine(sweepArgv(knob), files());
    const ms = performance.now() - t0;
    if (!answer.ok) {
      $("sweep-note").textContent = `(${answer.error})`;
      return;
    }
    state.sweepPoints = answer.json.points;
    // (A browser with a frozen clock, as a headless screenshot's, reports 0 ms.)
    const took = ms >= 1 ? ` in ${ms.toFixed(0)} ms` : "";
    $("sweep-note").textContent = `(${knob}; ${answer.json.points.length} estimates${took})`;
    vsCharts.sweep($("sweep"), answer.json.points, knob, state.result.json.gpu.usable_bytes);
  }, 30);
}

// --- the model source ----------------------------------------------------------

function showSource() {
  const config = $("source-config").checked;
  $("config-box").hidden = !config;
  $("model").hidden = config;
}

// The Hub, fetched by the browser itself (the engine has no network). Offline,
// or blocked, it says so; the catalog and pasted configs keep working.
async function fetchHub() {
  const id = $("hub-id").value.trim();
  const status = $("hub-status");
  if (!id) return;
  status.textContent = `Fetching ${id}/config.json from huggingface.co…`;
  try {
    const response = await fetch(`https://huggingface.co/${id}/resolve/main/config.json`);
    if (!response.ok) throw new Error(`HTTP ${response.status} (a gated or private model needs its config.json pasted)`);
    $("config").value = await response.text();
    status.textContent = `Fetched ${id}/config.json.`;
    estimate();
  } catch (e) {
    status.textContent = `Could not fetch from the Hub (${navigator.onLine ? e.message : "offline"}). ` +
      "Everything else works offline: paste or drop the model's config.json here, or pick a catalog model.";
  }
}

// --- start -----------------------------------------------------------------------

function fillSelect(select, values, labels) {
  select.textContent = "";
  values.forEach((v, i) => {
    const o = document.createElement("option");
    o.value = v;
    o.textContent = labels ? labels[i] : v === "" ? "off" : v === "auto" ? "library default" : v;
    select.appendChild(o);
  });
}

function fillPickers() {
  const catalog = JSON.parse(state.engine.ccall("vs_catalog", "string", [], []));
  fillSelect($("model"), catalog.models.map((m) => m.alias),
             catalog.models.map((m) => `${m.alias} (${m.family}, ${(m.reference_parameters / 1e9).toFixed(1)} B)`));
  fillSelect($("gpu"), catalog.gpus.map((g) => g.name),
             catalog.gpus.map((g) => `${g.name} (${(g.total_bytes / vsCharts.GIB).toFixed(0)} GiB)`));
  for (const [id, values] of Object.entries(SELECTS)) fillSelect($(id), values);
  $("model").value = "llama-3-8b";
}

function wire() {
  const rerun = () => estimate();
  $("knobs").addEventListener("submit", (e) => e.preventDefault());  // Enter in a field re-estimates only
  for (const node of document.querySelectorAll("#knobs select, #knobs input")) {
    if (node.id === "hub-id") continue;
    node.addEventListener("change", rerun);
  }
  $("config").addEventListener("change", rerun);
  $("source-catalog").addEventListener("change", showSource);
  $("source-config").addEventListener("change", showSource);
  $("hub-fetch").addEventListener("click", fetchHub);
  $("copy-cli").addEventListener("click", () => {
    // Where the clipboard is refused, the command is selected for Ctrl+C.
    const select = () => window.getSelection().selectAllChildren($("cli"));
    if (navigator.clipboard) navigator.clipboard.writeText($("cli").textContent).catch(select);
    else select();
  });
  $("config").addEventListener("dragover", (e) => e.preventDefault());  // or the drop never comes
  $("config").addEventListener("drop", (e) => {
    e.preventDefault();
    e.dataTransfer.files[0].text().then((t) => { $("config").value = t; estimate(); });
  });
  window.addEventListener("hashchange", () => { knobsFromHash(location.hash); estimate(); });
}

createVramscopeEngine().then((engine) => {
  state.engine = engine;
  state.timing.engine_ready_ms = performance.now();
  fillPickers();
  knobsFromHash(location.hash);
  wire();
  $("status").textContent = "";
  estimate();
}).catch((e) => {
  $("status").textContent = "";
  showError(`The engine did not load: ${e}`);
});
