// An echo path for the headless browser: what a loudspeaker and a room would add to the microphone.
//
// Why here and not in the page: the fake microphone has no echo, so without this the browser test
// cannot see what happens to a caller on loudspeakers. support/browser/harness.py installs this file
// before the page's own scripts (CDP Page.addScriptToEvaluateOnNewDocument), after a line that sets
// window.__streamvoxEchoOptions = {delayMs, db, driftMsPerS, roomSeed, rt60S}.
//
// What it does: navigator.mediaDevices.getUserMedia still opens the real (fake-file) microphone
// with the page's constraints - so the browser's own processing (echoCancellation and its
// companions) applies to the caller's voice alone, as on a device - and hands the page a WebAudio
// mix instead: that processed microphone plus the agent's remote track through a DelayNode (the
// delay, drifting linearly if asked), a ConvolverNode (a synthetic small room, seeded) and a
// GainNode (the echo level in dB). The echo therefore enters *after* the browser's processing,
// where no browser canceller can take it out: what reaches the agent is what a loudspeaker whose
// echo nobody cancelled would give it.
//
// The agent's track is taken from every RTCPeerConnection the page makes ("track" events). Chrome
// hands a remote WebRTC track to WebAudio only while a media element plays it: the page plays it.
//
// The page's meters keep hearing the caller alone: a MediaStreamAudioSourceNode the page makes from
// the mixed stream reads the processed microphone instead, so the page still times the caller's own
// speech (onsets, ends) and the echo is only in what the agent receives.
//
// window.streamvoxEcho exposes the options, the number of agent tracks fed into the echo, the echo's
// loudest 50 ms level seen (dBFS), and impulse(seed, rt60S, rate) for tests of the room.
"use strict";
(() => {
  const opt = window.__streamvoxEchoOptions;
  if (!opt || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) return;
  const RATE = 48000;
  const PRE_DELAY_S = 0.003; // direct sound -> first reflections
  const state = { options: opt, remoteTracks: 0, echoPeakDb: -140, micStreams: 0, impulse, error: null };
  window.streamvoxEcho = state;
  let graph = null;

  // A small PRNG with a seed (mulberry32): the same room every run.
  function rng(seed) {
    let a = seed >>> 0;
    return () => {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  // The room: a direct path (1 at t=0) and a tail of exponentially decaying noise that falls 60 dB
  // in rt60S, as much energy as the direct path; scaled to unit energy so that the GainNode's dB is
  // the echo's level against the agent's track.
  function impulse(seed, rt60S, rate) {
    const n = Math.ceil((rt60S * 1.2 + PRE_DELAY_S) * rate);
    const h = new Float32Array(n);
    const rand = rng(seed);
    const pre = Math.round(PRE_DELAY_S * rate);
    let tail = 0;
    for (let i = pre; i < n; i++) {
      const noise = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand()); // normal
      h[i] = noise * Math.exp((-6.9078 * (i - pre)) / (rt60S * rate)); // 10^(-3) amplitude at rt60S
      tail += h[i] * h[i];
    }
    const k = 1 / Math.sqrt(tail);
    for (let i = pre; i < n; i++) h[i] *= k;
    h[0] = 1;
    const norm = 1 / Math.sqrt(2);
    for (let i = 0; i < n; i++) h[i] *= norm;
    return h;
  }

  function build() {
    if (graph) return graph;
    const ctx = new AudioContext({ sampleRate: RATE });
    const d0 = opt.delayMs / 1000;
    const drift = opt.driftMsPerS / 1000; // seconds of delay per second
    const horizon = 600; // the drift runs this long, then the delay stays
    const maxDelay = Math.min(179, d0 + Math.abs(drift) * horizon + 0.1);
    const delay = ctx.createDelay(maxDelay);
    const room = ctx.createConvolver();
    room.normalize = false;
    const h = impulse(opt.roomSeed, opt.rt60S, RATE);
    const ir = ctx.createBuffer(1, h.length, RATE);
    ir.copyToChannel(h, 0);
    room.buffer = ir;
    const gain = ctx.createGain();
    gain.gain.value = Math.pow(10, opt.db / 20);
    delay.connect(room).connect(gain);
    const tap = ctx.createAnalyser(); // how loud the echo got: proof that it was there
    tap.fftSize = 2048;
    gain.connect(tap);
    const frame = new Float32Array(tap.fftSize);
    setInterval(() => {
      tap.getFloatTimeDomainData(frame);
      let e = 0;
      for (const x of frame) e += x * x;
      const level = e > 0 ? 10 * Math.log10(e / frame.length) : -140;
      if (level > state.echoPeakDb) state.echoPeakDb = level;
    }, 40);
    const t0 = ctx.currentTime;
    let end = d0 + drift * horizon;
    let tEnd = horizon;
    if (end < 0) { // a negative drift stops at no delay
      tEnd = d0 / -drift;
      end = 0;
    }
    delay.delayTime.setValueAtTime(d0, t0);
    if (drift !== 0) delay.delayTime.linearRampToValueAtTime(end, t0 + tEnd);
    ctx.resume();
    graph = { ctx, delay, gain };
    return graph;
  }

  function feed(stream) {
    const g = build();
    // after the page's own handler has put the track on its media element
    setTimeout(() => {
      try {
        nativeSource.call(g.ctx, stream).connect(g.delay);
        state.remoteTracks += 1;
      } catch (e) {
        state.error = `the agent's track could not feed the echo: ${e}`;
      }
    }, 0);
  }

  // the agent's track, from every peer connection the page makes
  const NativePC = window.RTCPeerConnection;
  if (NativePC) {
    class EchoedPC extends NativePC {
      constructor(...args) {
        super(...args);
        this.addEventListener("track", (ev) => {
          if (ev.track.kind === "audio") feed(ev.streams[0] || new MediaStream([ev.track]));
        });
      }
    }
    window.RTCPeerConnection = EchoedPC;
  }

  // the page's meters read the processed microphone, not the mix
  const dryOf = new WeakMap();
  const nativeSource = AudioContext.prototype.createMediaStreamSource;
  AudioContext.prototype.createMediaStreamSource = function (stream) {
    return nativeSource.call(this, dryOf.get(stream) || stream);
  };

  const nativeGUM = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  navigator.mediaDevices.getUserMedia = async (constraints) => {
    const g = build(); // before the microphone opens: its file starts playing when it does
    const dry = await nativeGUM(constraints);
    if (!constraints || !constraints.audio) return dry;
    const out = g.ctx.createMediaStreamDestination(); // the processed microphone plus the echo
    out.channelCount = 1;
    out.channelCountMode = "explicit";
    nativeSource.call(g.ctx, dry).connect(out);
    g.gain.connect(out);
    const mixed = new MediaStream([...out.stream.getAudioTracks(), ...dry.getVideoTracks()]);
    const track = mixed.getAudioTracks()[0];
    const stop = track.stop.bind(track);
    track.stop = () => { // the page's Disconnect closes the real microphone too
      dry.getTracks().forEach((t) => t.stop());
      g.gain.disconnect(out);
      stop();
    };
    dryOf.set(mixed, dry);
    state.micStreams += 1;
    return mixed;
  };
})();
