// The live page: plays an operator stream over /ws (the bundled sample or a sim task's scripted operator)
// and shows what comes back. Messages: docs/LIVE.md. No build step, no external scripts.
// URL parameters: ?task=dual_pick&seed=3&replay=1&autostart=1 (task "sample" or a sim task), token=….
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const token = params.get("token");
const FORMATS = { 0: "raw", 1: "image/jpeg", 2: "image/webp" };
const HEADER_BYTES = 20; // "<BBHHHId": kind, format, height, width, 0, index, input time

let ws = null, stream = null, timer = null;
const streams = {};          // fetched operator streams by URL
let sent = [];              // [input time, wall ms] of recent frames, for the latency readout
let queues = { G: [], S: [] };
let shown = 0, replayShown = 0, shownWindow = [], jointsWindow = [];

function log(text) { $("log").textContent = (text + "\n" + $("log").textContent).slice(0, 4000); }

function withToken(url) {
  return token ? url + (url.includes("?") ? "&" : "?") + `token=${encodeURIComponent(token)}` : url;
}

async function loadStream(task, seed) {
  // The bundled sample, or the sim task's scripted operator (built by the server on first use).
  const url = task === "sample" ? "/sample.json" : `/sim/${encodeURIComponent(task)}.json?seed=${seed}`;
  if (!streams[url]) {
    const r = await fetch(withToken(url));
    if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
    streams[url] = await r.json();
  }
  return streams[url];
}

async function loadTasks() {
  // The task picker: the sample, then every sim task; URL parameters preselect.
  try {
    const { tasks } = await (await fetch("/sim.json")).json();
    for (const t of tasks) {
      const o = document.createElement("option");
      o.value = t.task; o.textContent = `sim: ${t.task}`; o.title = t.prompt;
      $("task").appendChild(o);
    }
  } catch (e) { log(`no sim tasks: ${e}`); }
  const want = params.get("task");
  if (want && [...$("task").options].some((o) => o.value === want)) $("task").value = want;
  else if (want) log(`no task ${want}: playing the sample`);
  if (params.get("seed")) $("seed").value = params.get("seed");
  $("replay").checked = params.get("replay") === "1";
  onTask();
}

function onTask() {
  const sim = $("task").value !== "sample";
  $("seed").disabled = !sim; $("replay").disabled = !sim;
}

function wsUrl() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}/ws` + (token ? `?token=${encodeURIComponent(token)}` : "");
}

async function start() {
  const task = $("task").value, seed = Number($("seed").value);
  $("start").disabled = true;
  $("status").textContent = task === "sample" ? "loading the sample" : `building ${task} (seed ${seed}) ...`;
  try {
    stream = await loadStream(task, seed);
  } catch (e) {
    log(String(e)); $("status").textContent = "idle"; $("start").disabled = false;
    return;
  }
  $("stop").disabled = false;
  const msg = { type: "start", schema: stream.schema, prompt: "", frames: "jpeg", skeleton: true,
                record: $("record").checked };
  if (task === "sample") msg.T_world_camera = stream.T_world_camera;
  else Object.assign(msg, { sim: { task, seed }, replay: $("replay").checked });
  ws = new WebSocket(wsUrl());
  ws.binaryType = "arraybuffer";
  ws.onopen = () => ws.send(JSON.stringify(msg));
  ws.onmessage = (ev) => (typeof ev.data === "string" ? onText(JSON.parse(ev.data)) : onBinary(ev.data));
  ws.onclose = (ev) => { $("status").textContent = `closed (${ev.code} ${ev.reason})`; stopPlaying(); };
}

function play() {
  // Real time: frame i goes out when the wall clock passes its time; the stream loops.
  const frames = stream.frames, span = 2 * frames[frames.length - 1].t - frames[frames.length - 2].t;
  const t0 = performance.now();
  let i = 0, loop = 0;
  timer = setInterval(() => {
    const now = (performance.now() - t0) / 1000;
    while (ws && ws.readyState === WebSocket.OPEN && loop * span + frames[i].t <= now) {
      const f = frames[i], t = loop * span + f.t;
      ws.send(JSON.stringify({ type: "frame", t, tracker_pose: f.tracker_pose, tracker_valid: f.tracker_valid,
                               hand_keypoints: f.hand_keypoints, hand_valid: f.hand_valid }));
      sent.push([t, performance.now()]);
      if (sent.length > 4096) sent = sent.slice(-2048);
      if (++i === frames.length) { i = 0; loop++; }
    }
  }, 5);
}

function stopPlaying() {
  clearInterval(timer); timer = null;
  $("start").disabled = false; $("stop").disabled = true;
}

function sentAt(t) {
  for (let k = sent.length - 1; k >= 0; k--) if (sent[k][0] <= t + 1e-6) return sent[k][1];
  return null;
}

function onText(m) {
  if (m.type === "ready") {
    $("session").textContent = m.session;
    $("prompt").textContent = m.prompt || "(none)";
    $("status").textContent = `session ${m.session}: waiting for a slot`;
    for (const id of ["skeleton", "generated", "replay_view"]) { $(id).width = m.width; $(id).height = m.height; }
    play();
  } else if (m.type === "joints") {
    jointsWindow.push(performance.now());
    $("ik_ms").textContent = m.ik_ms.toFixed(2);
    drawJoints(m.action);
  } else if (m.type === "block") {
    $("status").textContent = `streaming (block ${m.index})`;
    const at = sentAt(m.t[m.t.length - 1]);
    if (at !== null) $("latency").textContent = (performance.now() - at).toFixed(0);
  } else if (m.type === "stats") {
    $("server_latency").textContent = `${m.latency_ms.p50} / ${m.latency_ms.p95}`;
    $("dropped").textContent = `${m.dropped} / ${m.held}`;
    if (m.replay_skipped !== null) $("replay_skipped").textContent = m.replay_skipped;
  } else if (m.type === "saved") {
    log(`recording saved: ${m.path} (${m.frames} frames)`);
  } else if (m.type === "error") {
    log(`error ${m.code}: ${m.message}`);
  }
}

async function onBinary(buf) {
  const v = new DataView(buf);
  const kind = String.fromCharCode(v.getUint8(0)), fmt = v.getUint8(1);
  const h = v.getUint16(2, true), w = v.getUint16(4, true);
  const payload = new Uint8Array(buf, HEADER_BYTES);
  let image;
  if (fmt === 0) {
    const rgba = new Uint8ClampedArray(w * h * 4);
    for (let p = 0; p < w * h; p++) {
      rgba[4 * p] = payload[3 * p]; rgba[4 * p + 1] = payload[3 * p + 1]; rgba[4 * p + 2] = payload[3 * p + 2];
      rgba[4 * p + 3] = 255;
    }
    image = new ImageData(rgba, w, h);
  } else {
    image = await createImageBitmap(new Blob([payload], { type: FORMATS[fmt] }));
  }
  if (kind === "M") { // paced by the server: shown as it comes
    draw("replay_view", image);
    $("replay_shown").textContent = ++replayShown;
    return;
  }
  const q = queues[kind];
  q.push(image);
  if (q.length > 48) q.splice(0, q.length - 48); // behind: skip to the newest frames
}

function drawJoints(action) {
  const c = $("joints"), g = c.getContext("2d"), bw = c.width / action.length, mid = c.height / 2;
  g.clearRect(0, 0, c.width, c.height);
  action.forEach((a, k) => {
    g.fillStyle = k < 14 ? "#6af" : "#fa6";
    const y = Math.max(-1, Math.min(1, a / 3.2)) * mid;
    g.fillRect(k * bw, mid - Math.max(y, 0), bw - 1, Math.abs(y));
  });
}

function draw(id, image) {
  const g = $(id).getContext("2d");
  if (image instanceof ImageData) g.putImageData(image, 0, 0); else g.drawImage(image, 0, 0);
}

// Frames are shown at the video's 16 fps, both panels in step.
let lastDraw = 0;
function frameLoop(now) {
  if (now - lastDraw >= 1000 / 16 - 2 && queues.G.length) {
    lastDraw = now;
    draw("generated", queues.G.shift());
    if (queues.S.length) draw("skeleton", queues.S.shift());
    shown++; shownWindow.push(now);
    $("shown").textContent = shown;
  }
  shownWindow = shownWindow.filter((t) => now - t < 1000);
  jointsWindow = jointsWindow.filter((t) => now - t < 1000);
  $("fps").textContent = shownWindow.length;
  $("joints_rate").textContent = jointsWindow.length;
  requestAnimationFrame(frameLoop);
}
requestAnimationFrame(frameLoop);

$("start").onclick = start;
$("stop").onclick = () => { if (ws) ws.send(JSON.stringify({ type: "stop" })); stopPlaying(); };
$("task").onchange = onTask;
loadTasks().then(() => { if (params.get("autostart")) start(); });
