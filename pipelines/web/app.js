// The streamvox demo page: plain JS over the browser's own RTCPeerConnection, nothing loaded from
// any other host (it must work offline). Signalling is Pipecat's SmallWebRTC one, served by
// pipelines/pipecat_room.py: POST /start -> sessionId, then the SDP offer to
// /sessions/{id}/api/offer. RTVI messages (transcripts, the words as they are played, the
// agent's stage times) arrive on the data channel.
//
// The page is also the caller's ear: from the audio energy of its own mic and of the agent's
// track it measures voice-to-voice (end of your speech -> first agent audio) and barge-in (your
// speech onset -> agent quieter by 20 dB ("yield") -> agent silent). window.streamvox exposes
// all of it to tests and to scripts/browser_scenario.py.
"use strict";

// ---------------------------------------------------------------- measurement settings
// Thresholds on 10 ms RMS frames (dBFS). The agent's track is digital silence between words,
// so a low threshold is safe there; the mic has a noise floor, hence hold times.
const MIC_ON_DB = -42; // caller speaking
const MIC_ON_FRAMES = 3; // 30 ms above the threshold start a caller burst (a click does not)
const MIC_END_S = 0.5; // a caller burst ends after this much quiet
const BOT_ON_DB = -50; // agent audible
const BOT_END_S = 0.6; // longer than the voice's pauses between sentences
const YIELD_DB = 20; // "yield": the agent this much quieter than just before the onset, from
// then until its audio is gone (so a pause between words that it talks on after is no yield)
const KEPT_TALKING_S = 2.5; // still loud this long after the onset: it did not yield at all
const PAIR_WINDOW_S = 3; // a server figure and a page figure this close in time are one turn
const CHART_S = 10;
const RTVI_VERSION = "2.2.0";

const $ = (id) => document.getElementById(id);
const ui = {
  connect: $("connect"),
  disconnect: $("disconnect"),
  headphones: $("headphones"),
  loudspeakers: $("loudspeakers"),
  echoMode: $("echo-mode"),
  state: $("state"),
  message: $("message"),
  micBar: $("mic-bar"),
  botBar: $("bot-bar"),
  micDb: $("mic-db"),
  botDb: $("bot-db"),
  chart: $("chart"),
  transcript: $("transcript"),
  turns: document.querySelector("#turns tbody"),
  botAudio: $("bot-audio"),
  jitter: $("jitter"),
};

// What tests read. Times are on the page's audio clock (seconds, AudioContext.currentTime).
const svx = {
  state: "idle",
  error: null,
  micStartedAt: null, // getUserMedia resolved (a fake-file microphone starts playing here)
  records: [], // page-measured turns and barge-ins, each with the server's figures when paired
  serverFigures: [], // every streamvox-figures message as it arrived
  transcript: [], // {who: "you"|"agent", text, interrupted, t}
  botWords: [], // {t, text}: each bot-tts-text word when it arrived
  rtvi: [], // {t, type}: every RTVI message type, in order
  jitterBufferMs: null, // the browser's jitter buffer delay for the agent's audio, last second (getStats)
  // per second of the call: {t, ms, targetMs, stretchMs}: that delay, the jitter buffer's target, and the
  // audio it time-stretched (ms inserted - removed): each stretch moves the echo's delay by as much
  jitterSeries: [],
  agentErrors: [], // {t, text}: RTVI error messages (a service of the agent failed)
  botSegments: [], // {start, end}: the agent audible (end null while it still is)
  micSegments: [], // {start, end}: the caller audible
  headphones: false,
  echoMode: null, // "browser-aec" | "agent-aec" | "raw-mic": what the last Connect asked for (also sent in /start)
  clock: () => (audio.ctx ? audio.ctx.currentTime : null),
  botAudio, // (from, to) -> base64 of 16 kHz s16le mono: what the agent's track carried
  // everything above as plain JSON (records hold their table row, which is not data)
  snapshot: () => JSON.parse(JSON.stringify(svx, (k, v) => (k === "row" ? undefined : v))),
};
window.streamvox = svx;

const conn = { pc: null, dc: null, stream: null, ping: null, timeout: null };
const audio = { ctx: null, node: null, botSource: null, pcm: [] };
const det = {
  mic: { on: false, run: 0, runStart: 0, onset: 0, last: -1e9 },
  bot: { on: false, run: 0, runStart: 0, onset: 0, last: -1e9, stoppedAt: -1e9 },
  barge: null,
  pauseBarge: null, // a caller onset in the agent's pause, until the agent says whether it was cut
  recent: [], // {t, botDb} of the last second, for the level before a barge-in
  interruptedAt: -1e9,
  botStoppedMsgAt: -1e9, // when the agent last said it stopped speaking
};
const chart = { t: [], mic: [], bot: [] };
const pending = { page: [], server: [] }; // unpaired records, both kinds
let botLine = null;

// ---------------------------------------------------------------- headphones toggle
// Default: off (loudspeakers), so the echo is cancelled (below: by the agent, by default). Measured
// (docs/BENCHMARKS.md, "Echo"): on loudspeakers with nobody cancelling, the agent hears itself and
// interrupts itself.
const params = new URLSearchParams(location.search);
const stored = localStorage.getItem("streamvox.headphones");
ui.headphones.checked = params.has("headphones") ? params.get("headphones") === "1" : stored === "1";
ui.headphones.addEventListener("change", () => {
  localStorage.setItem("streamvox.headphones", ui.headphones.checked ? "1" : "0");
  showEchoMode();
  if (conn.pc) info("The headphones setting applies from the next Connect.");
});
// On loudspeakers, who cancels the echo ("browser" or "agent"; ?loudspeakers= overrides what was stored).
// The agent, by default: the browser's canceller ducks a caller who talks over the agent, often for
// their whole first words ("Wait, stop." lost, the agent silent ~0.9 s after the caller began), while
// the agent, cancelling alone with the exact audio it played, hears them and falls silent in ~0.3 s
// (median); self-interruptions are rare either way and open either way (docs/BENCHMARKS.md, "Echo":
// the page's default on loudspeakers).
const LOUDSPEAKERS = ["browser", "agent"];
const DEFAULT_LOUDSPEAKERS = "agent";
const storedLs = localStorage.getItem("streamvox.loudspeakers");
const askedLs = params.get("loudspeakers");
ui.loudspeakers.value = LOUDSPEAKERS.includes(askedLs) ? askedLs : LOUDSPEAKERS.includes(storedLs) ? storedLs : DEFAULT_LOUDSPEAKERS;
ui.loudspeakers.addEventListener("change", () => {
  localStorage.setItem("streamvox.loudspeakers", ui.loudspeakers.value);
  showEchoMode();
  if (conn.pc) info("The loudspeakers setting applies from the next Connect.");
});

// Which echo mode the page is in (sent in /start, STREAMVOX_ECHO_CANCEL=auto acts on it): with
// headphones the page sends the raw microphone and nobody cancels (there is no echo); on loudspeakers
// either the page sends the raw microphone and the agent alone cancels, with the exact audio it played
// as the reference ("agent-aec", the default), or the browser cancels echo before sending and the agent
// cancels what it lets through ("browser-aec"): the browser's canceller also ducks a caller who talks
// over the agent (docs/BENCHMARKS.md, "Echo").
const echoModeOf = (headphones, loudspeakers) => (headphones ? "raw-mic" : loudspeakers === "agent" ? "agent-aec" : "browser-aec");
const ECHO_MODE_TEXT = {
  "raw-mic": "echo: raw microphone (headphones: none to cancel)",
  "browser-aec": "echo: cancelled by the browser, and what it lets through by the agent",
  "agent-aec": "echo: raw microphone, cancelled by the agent",
};
function showEchoMode() {
  const mode = conn.pc && svx.echoMode ? svx.echoMode : echoModeOf(ui.headphones.checked, ui.loudspeakers.value);
  ui.echoMode.textContent = ECHO_MODE_TEXT[mode];
  ui.echoMode.dataset.mode = mode;
  ui.loudspeakers.disabled = ui.headphones.checked;
}
showEchoMode();

// ---------------------------------------------------------------- state and messages
function setState(state, text) {
  svx.state = state;
  ui.state.textContent = text;
  ui.state.className = "state " + (state === "connected" ? "connected" : state === "failed" ? "failed" : state === "idle" ? "idle" : "working");
}

function fail(text) {
  svx.error = text;
  setState("failed", "failed");
  ui.message.textContent = text;
  ui.message.className = "message";
  ui.message.hidden = false;
  teardown();
}

function info(text) {
  ui.message.textContent = text;
  ui.message.className = "message info";
  ui.message.hidden = false;
}

// ---------------------------------------------------------------- connect
ui.connect.addEventListener("click", () => {
  connect().catch((e) => fail(`Unexpected error while connecting: ${e && e.message ? e.message : e}`));
});
ui.disconnect.addEventListener("click", () => {
  teardown();
  setState("idle", "not connected");
});

async function connect() {
  ui.message.hidden = true;
  svx.error = null;
  ui.connect.disabled = true;
  ui.disconnect.disabled = false;
  svx.headphones = ui.headphones.checked;
  svx.echoMode = echoModeOf(svx.headphones, ui.loudspeakers.value);
  setState("working", "asking for the microphone…");
  // the browser's echo cancellation and its companions (noise suppression and gain control change
  // the echo's path too, which the agent's canceller would have to follow: off when it cancels)
  const processing = svx.echoMode === "browser-aec";
  if (!window.isSecureContext || !navigator.mediaDevices) {
    return fail(`Browsers give the microphone only to secure pages: open http://localhost:${location.port || 80}/ on the machine that runs the agent (or serve this page over HTTPS).`);
  }
  if (!window.RTCPeerConnection) return fail("This browser has no WebRTC (RTCPeerConnection).");
  await startAudio();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing },
    });
  } catch (e) {
    if (e.name === "NotAllowedError" || e.name === "SecurityError") {
      return fail("Microphone access was denied. Allow the microphone for this page (the icon at the left of the address bar), then press Connect again.");
    }
    if (e.name === "NotFoundError") return fail("No microphone was found. Plug one in, then press Connect again.");
    return fail(`The microphone could not be opened: ${e.name}: ${e.message}`);
  }
  svx.micStartedAt = audio.ctx.currentTime; // a fake-file microphone starts playing now
  conn.stream = stream;
  audio.ctx.createMediaStreamSource(stream).connect(audio.node, 0, 0);

  setState("working", "reaching the agent…");
  let sessionId;
  try {
    const r = await fetch("/start", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ createDailyRoom: false, transport: "webrtc", body: { echo_mode: svx.echoMode } }),
    });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    sessionId = (await r.json()).sessionId;
  } catch (e) {
    return fail(`The agent is not answering at ${location.origin} (${e.message}). Is \`make demo\` still running? Start it and press Connect again.`);
  }

  const pc = new RTCPeerConnection({ iceServers: [] }); // same host or LAN: no STUN server to ask
  conn.pc = pc;
  showEchoMode();
  pc.addTransceiver(stream.getAudioTracks()[0], { direction: "sendrecv" });
  // SmallWebRTC's layout: camera video second, screen video third (both stay empty here)
  pc.addTransceiver("video", { direction: "sendrecv" });
  pc.addTransceiver("video", { direction: "sendonly" });
  const dc = pc.createDataChannel("rtvi", { ordered: true });
  conn.dc = dc;
  dc.onopen = () => {
    dc.send(JSON.stringify({
      label: "rtvi-ai", type: "client-ready", id: crypto.randomUUID(),
      data: { version: RTVI_VERSION, about: { library: "streamvox-page", library_version: "1" } },
    }));
    // SmallWebRTC treats a client that stops pinging for 3 s as gone
    conn.ping = setInterval(() => {
      if (dc.readyState === "open") dc.send("ping");
      pollJitterBuffer(pc);
    }, 1000);
  };
  dc.onmessage = (ev) => {
    if (typeof ev.data !== "string" || !ev.data.startsWith("{")) return;
    try {
      onRtvi(JSON.parse(ev.data));
    } catch (e) {
      console.warn("unreadable message from the agent", e);
    }
  };
  pc.ontrack = (ev) => {
    if (ev.track.kind !== "audio") return;
    // The jitter buffer holds the agent's audio after the agent has stopped it (a barge-in is
    // heard that much later). On a LAN or loopback it needs no safety margin: ask for none
    // (jitterBufferTarget, ms; playoutDelayHint, s, in older Chromes). Browsers without it ignore it.
    try {
      if ("jitterBufferTarget" in ev.receiver) ev.receiver.jitterBufferTarget = 0;
      else ev.receiver.playoutDelayHint = 0;
    } catch (e) {
      console.warn("cannot set the jitter buffer target", e);
    }
    attachBot(ev.streams[0] || new MediaStream([ev.track]));
  };
  pc.oniceconnectionstatechange = () => {
    if (pc.iceConnectionState === "failed") {
      fail("ICE failed: no network path between this browser and the agent. Open the page on the machine that runs the agent (or on its LAN); across the internet WebRTC needs a TURN server, which this demo does not set up.");
    }
  };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "connected") {
      clearTimeout(conn.timeout);
      setState("connected", "connected — talk");
    } else if (pc.connectionState === "disconnected" && svx.state === "connected") {
      setState("working", "connection interrupted, waiting…");
    } else if (pc.connectionState === "closed" && svx.state !== "idle" && svx.state !== "failed") {
      fail("The agent closed the connection.");
    }
  };

  setState("working", "connecting…");
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc, 2000); // loopback/LAN candidates are there at once; send them in the offer
  let answer;
  try {
    const r = await fetch(`/sessions/${sessionId}/api/offer`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type, pc_id: null, restart_pc: false }),
    });
    if (!r.ok) throw new Error(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
    answer = await r.json();
  } catch (e) {
    return fail(`The agent refused the call (${e.message}).`);
  }
  await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
  conn.timeout = setTimeout(() => {
    if (svx.state !== "connected") fail("No connection to the agent within 15 s (ICE did not complete).");
  }, 15000);
}

// How much of the agent's audio waits in the browser before it is played: part of what a barge-in
// cannot flush from the server side (WebRTC stats: jitterBufferDelay / jitterBufferEmittedCount).
const jb = { delay: 0, count: 0, target: 0, stretch: 0 };
async function pollJitterBuffer(pc) {
  try {
    const stats = await pc.getStats();
    stats.forEach((r) => {
      if (r.type !== "inbound-rtp" || r.kind !== "audio" || !r.jitterBufferEmittedCount) return;
      const dCount = r.jitterBufferEmittedCount - jb.count;
      const stretch = (r.insertedSamplesForDeceleration || 0) - (r.removedSamplesForAcceleration || 0);
      if (dCount > 0) {
        svx.jitterBufferMs = Math.round((1000 * (r.jitterBufferDelay - jb.delay)) / dCount);
        const targetMs = r.jitterBufferTargetDelay === undefined ? null : Math.round((1000 * (r.jitterBufferTargetDelay - jb.target)) / dCount);
        const rate = r.totalSamplesDuration > 0 ? r.totalSamplesReceived / r.totalSamplesDuration : 48000;
        const stretchMs = Math.round((1000 * (stretch - jb.stretch)) / rate);
        svx.jitterSeries.push({ t: svx.clock(), ms: svx.jitterBufferMs, targetMs, stretchMs });
        if (svx.jitterSeries.length > 3600) svx.jitterSeries.shift();
      }
      jb.delay = r.jitterBufferDelay;
      jb.count = r.jitterBufferEmittedCount;
      jb.target = r.jitterBufferTargetDelay || 0;
      jb.stretch = stretch;
    });
    ui.jitter.textContent = svx.jitterBufferMs === null ? "" : `browser jitter buffer ${svx.jitterBufferMs} ms`;
  } catch (e) {
    // stats are a nicety: a closed connection has none
  }
}

function iceGathered(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, timeoutMs);
  });
}

function teardown() {
  clearInterval(conn.ping);
  clearTimeout(conn.timeout);
  if (conn.dc) conn.dc.onmessage = null;
  if (conn.pc) {
    conn.pc.onconnectionstatechange = null;
    conn.pc.close();
  }
  if (conn.stream) conn.stream.getTracks().forEach((t) => t.stop());
  conn.pc = conn.dc = conn.stream = null;
  showEchoMode();
  ui.connect.disabled = false;
  ui.disconnect.disabled = true;
}

// ---------------------------------------------------------------- audio: levels and recording
async function startAudio() {
  if (!audio.ctx) {
    audio.ctx = new AudioContext({ sampleRate: 48000 });
    await audio.ctx.audioWorklet.addModule("assets/levels-worklet.js");
    audio.node = new AudioWorkletNode(audio.ctx, "levels", { numberOfInputs: 2, numberOfOutputs: 1, outputChannelCount: [1] });
    const mute = audio.ctx.createGain(); // keeps the node pulled by the graph, adds no sound
    mute.gain.value = 0;
    audio.node.connect(mute).connect(audio.ctx.destination);
    audio.node.port.onmessage = (ev) => {
      const m = ev.data;
      if (m.pcm) audio.pcm.push({ start: m.start, pcm: m.pcm });
      else onLevels(m.t, m.mic, m.bot);
    };
  }
  await audio.ctx.resume();
}

function attachBot(stream) {
  // Chrome hands a remote WebRTC track to WebAudio only while a media element plays it.
  ui.botAudio.srcObject = stream;
  ui.botAudio.play().catch((e) => info(`Press anywhere on the page to hear the agent (${e.name}).`));
  if (audio.botSource) audio.botSource.disconnect();
  audio.botSource = audio.ctx.createMediaStreamSource(stream);
  audio.botSource.connect(audio.node, 0, 1);
}

function botAudio(from, to) {
  const rate = 16000;
  const chunks = audio.pcm.filter((c) => c.start + c.pcm.length / rate > from && c.start < to);
  let n = 0;
  for (const c of chunks) n += c.pcm.length;
  const out = new Int16Array(n);
  let i = 0;
  for (const c of chunks) {
    for (const x of c.pcm) out[i++] = Math.max(-32768, Math.min(32767, Math.round(x * 32767)));
  }
  let s = "";
  const bytes = new Uint8Array(out.buffer);
  for (let k = 0; k < bytes.length; k += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(k, k + 0x8000));
  return { start: chunks.length ? chunks[0].start : from, rate, pcm: btoa(s) };
}

const db = (rms) => (rms > 1e-7 ? 20 * Math.log10(rms) : -140);

function onLevels(t, micRms, botRms) {
  const micDb = db(micRms);
  const botDb = db(botRms);
  chart.t.push(t);
  chart.mic.push(micDb);
  chart.bot.push(botDb);
  while (chart.t.length && chart.t[0] < t - CHART_S) {
    chart.t.shift();
    chart.mic.shift();
    chart.bot.shift();
  }
  det.recent.push({ t, botDb });
  while (det.recent.length && det.recent[0].t < t - 1) det.recent.shift();
  trackBot(t, botDb);
  trackMic(t, micDb);
  trackYield(t, botDb);
}

function trackBot(t, botDb) {
  const b = det.bot;
  if (botDb > BOT_ON_DB) {
    if (b.run++ === 0) b.runStart = t - 0.01;
    if (!b.on && b.run >= 2) {
      b.on = true;
      b.onset = b.runStart;
      svx.botSegments.push({ start: b.onset, end: null });
      onBotStart(b.onset);
    }
    b.last = t;
  } else {
    b.run = 0;
    if (b.on && t - b.last >= BOT_END_S) {
      b.on = false;
      b.stoppedAt = b.last;
      svx.botSegments[svx.botSegments.length - 1].end = b.last + 0.01;
      onBotStop(b.last);
    }
  }
}

function trackMic(t, micDb) {
  const m = det.mic;
  if (micDb > MIC_ON_DB) {
    if (m.run++ === 0) m.runStart = t - 0.01;
    if (!m.on && m.run >= MIC_ON_FRAMES) {
      m.on = true;
      m.onset = m.runStart;
      svx.micSegments.push({ start: m.onset, end: null });
      onMicStart(m.onset);
    }
    if (m.on) m.last = t;
  } else {
    m.run = 0;
    if (m.on && t - m.last >= MIC_END_S) {
      m.on = false;
      svx.micSegments[svx.micSegments.length - 1].end = m.last + 0.01;
    }
  }
}

function onBotStart(t) {
  const m = det.mic;
  // a reply: the caller spoke since the agent last stopped and has been quiet for a moment
  if (m.last > det.bot.stoppedAt && m.last > -1e8 && t - m.last > 0.15) {
    addPageRecord({ kind: "turn", t, speechEnd: m.last, v2v_ms: ms(t - m.last) });
  }
}

function onMicStart(t) {
  if (det.bot.on && !det.barge) {
    const before = det.recent.filter((r) => r.t < t && r.botDb > BOT_ON_DB);
    const pre = before.length ? before.reduce((a, r) => a + r.botDb, 0) / before.length : BOT_ON_DB;
    det.barge = { onset: t, pre, quietSince: null, jitterBufferMs: svx.jitterBufferMs };
  }
}

function trackYield(t, botDb) {
  const g = det.barge;
  if (!g || t < g.onset) return;
  if (botDb <= g.pre - YIELD_DB) {
    if (g.quietSince === null) g.quietSince = t - 0.01;
  } else {
    g.quietSince = null;
    if (t - g.onset > KEPT_TALKING_S) {
      det.barge = null;
      addPageRecord({ kind: "barge-in", t, onset: g.onset, silence_ms: null, yield_ms: null, kept_talking: true });
    }
  }
}

function onBotStop(last) {
  const g = det.barge;
  if (!g) return;
  det.barge = null;
  const gone = last + 0.01;
  if (gone <= g.onset) {
    // The agent was quiet at the onset: finished, or between two words it never got to say
    // because the caller cut it there. Only the agent knows which: it says "stopped speaking"
    // after the onset if it was cut (onBotStoppedSpeaking), before it if it had finished.
    det.pauseBarge = { onset: g.onset, quietSince: gone, jitterBufferMs: g.jitterBufferMs };
    if (det.botStoppedMsgAt >= g.onset) onBotStoppedSpeaking(det.botStoppedMsgAt); // it said so already
    return;
  }
  addPageRecord({
    kind: "barge-in",
    t: gone,
    onset: g.onset,
    silence_ms: ms(gone - g.onset),
    yield_ms: ms(Math.min(g.quietSince === null ? gone : g.quietSince, gone) - g.onset),
    interrupted: saysInterrupted(det.interruptedAt, g.onset),
    jitter_buffer_ms: g.jitterBufferMs,
  });
}

const ms = (s) => Math.round(1000 * s);

// Did the agent's "interrupted" (at t) answer the caller's onset? It may come a little before the
// page's onset: the server's VAD can hear the speech first.
function saysInterrupted(t, onset) {
  return t >= onset - 0.5;
}

// A caller onset in the agent's pause (det.pauseBarge), and the agent now says it stopped
// speaking: it had not finished, the caller cut it in that pause, and the caller heard nothing of
// it from the onset on - a barge-in whose yield and silence are 0, marked "in_pause" (the
// benchmark counts these apart: their 0 ms is the pause's luck, not the agent's speed).
function onBotStoppedSpeaking(t) {
  det.botStoppedMsgAt = t;
  const p = det.pauseBarge;
  det.pauseBarge = null;
  if (!p || t < p.onset || t - p.onset > KEPT_TALKING_S + BOT_END_S) return;
  addPageRecord({
    kind: "barge-in",
    t: p.onset,
    onset: p.onset,
    silence_ms: 0,
    yield_ms: 0,
    in_pause: true,
    quiet_before_ms: ms(p.onset - p.quietSince),
    interrupted: saysInterrupted(det.interruptedAt, p.onset),
    jitter_buffer_ms: p.jitterBufferMs,
  });
}

// The agent's word that it was interrupted comes over the data channel, which can run behind the
// audio: it may arrive after the page has already seen the agent's audio stop and recorded the
// barge-in. Then it marks that barge-in, the latest one whose onset it follows.
function markInterrupted(t) {
  const rec = svx.records.findLast((r) => r.kind === "barge-in" && r.onset !== undefined);
  if (rec && !rec.interrupted && saysInterrupted(t, rec.onset) && t - rec.onset < KEPT_TALKING_S + BOT_END_S) {
    rec.interrupted = true;
    render(rec);
  }
}

// ---------------------------------------------------------------- RTVI messages
function onRtvi(msg) {
  const t = svx.clock();
  svx.rtvi.push({ t, type: msg.type });
  const data = msg.data || {};
  switch (msg.type) {
    case "bot-ready":
      info("Connected. Say something — or talk over the agent to interrupt it.");
      break;
    case "user-transcription":
      if (data.final && data.text && data.text.trim()) {
        closeBotLine();
        addLine("you", data.text.trim(), t);
      }
      break;
    case "bot-started-speaking":
      closeBotLine();
      break;
    case "bot-tts-text":
      if (data.text) {
        svx.botWords.push({ t, text: data.text });
        if (!botLine) botLine = addLine("agent", "", t);
        botLine.entry.text = (botLine.entry.text + " " + data.text).trim();
        botLine.li.querySelector(".text").textContent = botLine.entry.text;
      }
      break;
    case "bot-interrupted":
      det.interruptedAt = t;
      markInterrupted(t);
      if (botLine) {
        botLine.entry.interrupted = true;
        botLine.li.classList.add("interrupted");
      }
      closeBotLine();
      break;
    case "bot-stopped-speaking":
      onBotStoppedSpeaking(t);
      closeBotLine();
      break;
    case "server-message":
      if (data.type === "streamvox-figures") {
        svx.serverFigures.push({ ...data, t });
        pairServer({ ...data, t });
      }
      break;
    case "error": {
      const text = data.message || data.error || JSON.stringify(data);
      svx.agentErrors.push({ t, text });
      info(`The agent reported an error: ${text}`);
      break;
    }
    default:
      break;
  }
}

function addLine(who, text, t) {
  const entry = { who, text, interrupted: false, t };
  svx.transcript.push(entry);
  const li = document.createElement("li");
  li.className = who;
  li.innerHTML = `<span class="who">${who === "you" ? "you" : "agent"}</span><span class="text"></span>`;
  li.querySelector(".text").textContent = text;
  ui.transcript.appendChild(li);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return { entry, li };
}

function closeBotLine() {
  if (botLine && !botLine.entry.text) {
    botLine.li.remove();
    svx.transcript.splice(svx.transcript.indexOf(botLine.entry), 1);
  }
  botLine = null;
}

// ---------------------------------------------------------------- per-turn table
// The server's message for a turn leaves when its transport starts sending (the page hears it a
// little later); for a barge-in, once the cancel is acknowledged. Pair each with the nearest
// page record of the same kind.
function addPageRecord(rec) {
  const i = pending.server.findIndex((s) => s.kind === rec.kind && Math.abs(s.t - rec.t) < PAIR_WINDOW_S);
  if (i >= 0) rec.server = pending.server.splice(i, 1)[0];
  else pending.page.push(rec);
  svx.records.push(rec);
  render(rec);
}

function pairServer(fig) {
  const i = pending.page.findIndex((p) => p.kind === fig.kind && Math.abs(p.t - fig.t) < PAIR_WINDOW_S);
  if (i >= 0) {
    const rec = pending.page.splice(i, 1)[0];
    rec.server = fig;
    render(rec);
  } else {
    pending.server.push(fig);
    setTimeout(() => {
      const k = pending.server.indexOf(fig);
      if (k >= 0) { // the page heard nothing it could pair: show the server's side alone
        pending.server.splice(k, 1);
        const rec = { kind: fig.kind, t: fig.t, server: fig, unpaired: true };
        svx.records.push(rec);
        render(rec);
      }
    }, PAIR_WINDOW_S * 1000);
  }
}

const STAGES = {
  turn: [["vad_stop", "VAD stop"], ["stt_final", "STT final"], ["end_of_turn", "end of turn"], ["llm_first_token", "LLM 1st token"], ["tts_first_audio", "TTS 1st audio"], ["transport_first_audio", "sent"]],
  "barge-in": [["vad_start", "VAD start"], ["interruption", "interruption"], ["bot_stopped", "bot stopped"]],
};

function render(rec) {
  if (!rec.row) {
    rec.row = document.createElement("tr");
    ui.turns.appendChild(rec.row);
  }
  const n = svx.records.indexOf(rec) + 1;
  let page;
  if (rec.unpaired) page = "—";
  else if (rec.kind === "turn") page = `voice-to-voice <b>${rec.v2v_ms} ms</b>`;
  else if (rec.kept_talking) page = "the agent kept talking";
  else page = `yield <b>${rec.yield_ms} ms</b>, silent <b>${rec.silence_ms} ms</b>`;
  let server = "";
  if (rec.server) {
    const s = rec.server;
    server = STAGES[rec.kind].filter(([k]) => s[k] !== null && s[k] !== undefined).map(([k, w]) => `<span class="stage">${w} ${s[k] >= 0 ? "+" : ""}${Math.round(s[k])}</span>`).join("");
    if (s.tts_ttfb !== null && s.tts_ttfb !== undefined) server += `<span class="stage">TTS first byte ${Math.round(s.tts_ttfb)} ms</span>`;
    if (rec.kind === "barge-in") server += `<span class="stage">cancel→ack ${s.cancel_ack !== null && s.cancel_ack !== undefined ? s.cancel_ack.toFixed(1) + " ms" : "none"}</span>`;
  }
  rec.row.innerHTML = `<td>${n}</td><td>${rec.kind === "turn" ? "reply" : "barge-in"}</td><td class="num">${page}</td><td>${server}</td>`;
}

// ---------------------------------------------------------------- meters and chart
function draw() {
  const c = ui.chart;
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  g.strokeStyle = "#e5e7eb";
  g.beginPath();
  for (const level of [-60, -40, -20]) {
    const y = c.height * (-level / 70);
    g.moveTo(0, y);
    g.lineTo(c.width, y);
  }
  g.stroke();
  if (!chart.t.length) return;
  const now = chart.t[chart.t.length - 1];
  for (const [series, color] of [[chart.mic, "#2563eb"], [chart.bot, "#ea580c"]]) {
    g.strokeStyle = color;
    g.beginPath();
    for (let i = 0; i < series.length; i++) {
      const x = c.width * (1 - (now - chart.t[i]) / CHART_S);
      const y = c.height * Math.min(1, Math.max(0, -series[i] / 70));
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    }
    g.stroke();
  }
  const last = (a) => a[a.length - 1];
  for (const [bar, label, level] of [[ui.micBar, ui.micDb, last(chart.mic)], [ui.botBar, ui.botDb, last(chart.bot)]]) {
    bar.style.width = `${Math.max(0, Math.min(100, (level + 70) * (100 / 70)))}%`;
    label.textContent = level > -139 ? `${level.toFixed(0)} dBFS` : "silent";
  }
}
setInterval(draw, 100);
