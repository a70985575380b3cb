// Audio-thread half of the page's ear: RMS of the caller's mic (input 0) and of the bot's track
// (input 1) every 10 ms, stamped with the audio clock, plus the bot's audio at 16 kHz so that a
// test can transcribe what was actually heard. Main-thread timers are too coarse and too late
// for onset/offset times; the audio clock is what the samples themselves carry.
class Levels extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frame = Math.round(sampleRate / 100); // 10 ms
    this.n = 0;
    this.mic = 0;
    this.bot = 0;
    this.ratio = sampleRate / 16000; // 3 at 48 kHz, the rate the page asks for
    this.acc = 0;
    this.accN = 0;
    this.phase = 0;
    this.pcm = new Float32Array(1600); // 100 ms at 16 kHz
    this.pcmN = 0;
    this.pcmStart = null;
  }

  process(inputs) {
    const mic = inputs[0] && inputs[0][0];
    const bot = inputs[1] && inputs[1][0];
    const len = (mic || bot || { length: 128 }).length;
    for (let i = 0; i < len; i++) {
      const m = mic ? mic[i] : 0;
      const b = bot ? bot[i] : 0;
      this.mic += m * m;
      this.bot += b * b;
      this.n++;
      if (this.n >= this.frame) {
        const t = currentTime + (i + 1) / sampleRate;
        this.port.postMessage({ t, mic: Math.sqrt(this.mic / this.n), bot: Math.sqrt(this.bot / this.n) });
        this.n = 0;
        this.mic = 0;
        this.bot = 0;
      }
      // 16 kHz by averaging (a box filter: rough, but Whisper hears speech through it fine)
      this.acc += b;
      this.accN++;
      this.phase += 1;
      if (this.phase >= this.ratio) {
        this.phase -= this.ratio;
        if (this.pcmStart === null) this.pcmStart = currentTime + (i + 1) / sampleRate;
        this.pcm[this.pcmN++] = this.acc / this.accN;
        this.acc = 0;
        this.accN = 0;
        if (this.pcmN === this.pcm.length) {
          this.port.postMessage({ pcm: this.pcm, start: this.pcmStart }, [this.pcm.buffer]);
          this.pcm = new Float32Array(1600);
          this.pcmN = 0;
          this.pcmStart = null;
        }
      }
    }
    return true;
  }
}

registerProcessor("levels", Levels);
