// The echo path's own check, no agent needed (tests/browser/test_demo_page.py): a stand-in agent
// sends a burst of noise over a loopback RTCPeerConnection in the same page; the page plays it, as
// ours does; we then time and measure its onset on the received track and in the microphone stream
// that getUserMedia (wrapped by echo_path.js) handed over, and what a meter made from that stream
// hears. Called with execute_async_script; the last argument is the callback.
"use strict";
const done = arguments[arguments.length - 1];
(async () => {
  const mic = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: false } });
  const agent = new AudioContext({ sampleRate: 48000 });
  const burst = agent.createBuffer(1, 48000 * 1.5, 48000);
  const x = burst.getChannelData(0);
  for (let i = 0; i < x.length; i++) x[i] = (Math.random() * 2 - 1) * 0.1 * Math.sqrt(3); // -20 dBFS
  const out = agent.createMediaStreamDestination();
  const a = new RTCPeerConnection({ iceServers: [] });
  const b = new RTCPeerConnection({ iceServers: [] });
  a.onicecandidate = (e) => e.candidate && b.addIceCandidate(e.candidate);
  b.onicecandidate = (e) => e.candidate && a.addIceCandidate(e.candidate);
  const remote = new Promise((resolve) => {
    b.ontrack = (e) => {
      const el = new Audio();
      el.srcObject = e.streams[0];
      el.play();
      resolve(e.streams[0]);
    };
  });
  a.addTrack(out.stream.getAudioTracks()[0], out.stream);
  await a.setLocalDescription(await a.createOffer());
  await b.setRemoteDescription(a.localDescription);
  await b.setLocalDescription(await b.createAnswer());
  await a.setRemoteDescription(b.localDescription);

  const ctx = new AudioContext({ sampleRate: 48000 });
  const tap = (stream) => {
    const an = ctx.createAnalyser();
    an.fftSize = 256; // 5 ms
    ctx.createMediaStreamSource(stream).connect(an);
    return an;
  };
  const frame = new Float32Array(256);
  const level = (an) => {
    an.getFloatTimeDomainData(frame);
    let e = 0;
    for (const v of frame) e += v * v;
    return 10 * Math.log10(e / frame.length + 1e-14);
  };
  const heard = tap(await remote);
  const sent = tap(new MediaStream(mic.getAudioTracks())); // the mix itself, not the page's stream object
  const meter = tap(mic); // what the page's meters read
  await new Promise((r) => setTimeout(r, 500));
  const player = agent.createBufferSource();
  player.buffer = burst;
  player.connect(out);
  player.start();
  const t0 = performance.now();
  const on = { heard: null, sent: null };
  const steady = { heard: [], sent: [] };
  let meterMax = -140;
  while (performance.now() - t0 < 1800) {
    const now = performance.now() - t0;
    const lv = { heard: level(heard), sent: level(sent) };
    for (const k of ["heard", "sent"]) {
      if (on[k] === null && lv[k] > -40) on[k] = now;
      if (on[k] !== null && now - on[k] > 300 && now - on[k] < 1200) steady[k].push(Math.pow(10, lv[k] / 10));
    }
    meterMax = Math.max(meterMax, level(meter));
    await new Promise((r) => setTimeout(r, 2));
  }
  const mean = (v) => 10 * Math.log10(v.reduce((s, e) => s + e, 0) / Math.max(1, v.length) + 1e-14);
  done({
    onsetHeardMs: on.heard,
    onsetSentMs: on.sent,
    heardDb: mean(steady.heard),
    sentDb: mean(steady.sent),
    meterMaxDb: meterMax,
    echo: JSON.parse(JSON.stringify(window.streamvoxEcho)),
  });
})().catch((e) => done({ error: String(e) }));
