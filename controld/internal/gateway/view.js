// forkfleet live view: draws a sandbox's screencast into the canvas, as
// controld's gateway relays it (hub.go), and in control mode sends mouse
// and keyboard input. No framework: the browser's DecompressionStream
// inflates the zlib records.
//
// Messages (binary, little-endian):
//   hello  3, control u8
//   cursor 2, 0, 0, 0, x i32, y i32
//   frame  1, flags u8 (1 keyframe), format u8 (1 PNG, 5 ZLIB_RECORDS), 0,
//          width u16, height u16, tiles u16, per tile x, y, w, h u16 +
//          length u32 + PNG data, then the frame's zlib chunk (records of
//          the stream's raw DEFLATE stream that restarts at each keyframe,
//          without the sync flush's 00 00 ff ff tail).
'use strict';
(() => {
  const canvas = document.getElementById('screen');
  const ctx = canvas.getContext('2d');
  const cursorEl = document.getElementById('cursor');
  const statusEl = document.getElementById('status');
  const modeEl = document.getElementById('mode');
  const TAIL = new Uint8Array([0, 0, 0xff, 0xff]);
  // State the page shows, for people and tests.
  const view = window.forkfleetView = {
    connected: false, control: false, frames: 0, keyframes: 0, errors: 0,
    closeCode: 0, closeReason: '', bytes: 0, cursor: null,
    // Wall-clock times (ms since the epoch) at which the last frames were
    // on the canvas, newest last (benchd pairs them with key presses).
    drawn: [],
  };
  let fb = null; // ImageData: the framebuffer
  let inflater = null;
  let ws = null;
  let queue = Promise.resolve();
  let retry = 500;
  const url = location.origin.replace(/^http/, 'ws') + location.pathname.replace(/\/$/, '') + '/stream';

  function status(s) { statusEl.textContent = s; }

  function connect() {
    fb = null;
    resetInflater();
    ws = view.socket = new WebSocket(url);
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => { view.connected = true; retry = 500; status('live'); };
    ws.onmessage = (e) => {
      const m = new Uint8Array(e.data);
      view.bytes += m.length;
      queue = queue.then(() => handle(m)).catch((err) => {
        // A frame the page cannot apply: start over from the gateway's
        // keyframe.
        view.errors++;
        console.error('forkfleet view:', err);
        ws.close();
      });
    };
    ws.onclose = (e) => {
      view.connected = false;
      view.closeCode = e.code;
      view.closeReason = e.reason;
      if (e.code === 1008 || e.code === 4404) { status('closed: ' + e.reason); return; }
      // The sandbox is being checkpointed or restored, or the gateway
      // restarted: come back.
      status('reconnecting');
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  function resetInflater() {
    if (inflater) inflater.writer.abort().catch(() => {});
    const ds = new DecompressionStream('deflate-raw');
    inflater = { writer: ds.writable.getWriter(), reader: ds.readable.getReader(), chunks: [], have: 0, buf: new Uint8Array(0), pos: 0 };
  }

  async function handle(m) {
    const dv = new DataView(m.buffer, m.byteOffset, m.byteLength);
    switch (m[0]) {
      case 1: return frame(m, dv);
      case 2: return moveCursor(dv.getInt32(4, true), dv.getInt32(8, true));
      case 3:
        view.control = m[1] === 1;
        modeEl.textContent = view.control ? 'control' : 'view only';
        return;
    }
  }

  let cursorX = -1, cursorY = -1;
  function moveCursor(x, y) {
    cursorX = x; cursorY = y;
    view.cursor = [x, y];
    placeCursor();
  }
  function placeCursor() {
    if (cursorX < 0 || !canvas.width) return;
    const s = canvas.clientWidth / canvas.width;
    cursorEl.style.display = 'block';
    cursorEl.style.transform = `translate(${cursorX * s}px, ${cursorY * s}px) rotate(-30deg)`;
  }
  window.addEventListener('resize', placeCursor);

  let dirty = null;
  function mark(x, y, w, h) {
    if (!dirty) { dirty = [x, y, x + w, y + h]; return; }
    dirty[0] = Math.min(dirty[0], x); dirty[1] = Math.min(dirty[1], y);
    dirty[2] = Math.max(dirty[2], x + w); dirty[3] = Math.max(dirty[3], y + h);
  }

  async function frame(m, dv) {
    const key = (m[1] & 1) === 1, format = m[2];
    const w = dv.getUint16(4, true), h = dv.getUint16(6, true), n = dv.getUint16(8, true);
    if (key) {
      if (!fb || fb.width !== w || fb.height !== h) {
        canvas.width = w; canvas.height = h;
        fb = new ImageData(w, h);
      }
      resetInflater();
    }
    if (!fb) throw new Error('delta frame before a keyframe');
    let off = 10;
    for (let i = 0; i < n; i++) {
      const x = dv.getUint16(off, true), y = dv.getUint16(off + 2, true);
      const tw = dv.getUint16(off + 4, true), th = dv.getUint16(off + 6, true);
      const len = dv.getUint32(off + 8, true);
      off += 12;
      await pngTile(x, y, tw, th, m.subarray(off, off + len));
      off += len;
    }
    if (format === 5) await records(m.subarray(off));
    if (dirty) {
      ctx.putImageData(fb, 0, 0, dirty[0], dirty[1], dirty[2] - dirty[0], dirty[3] - dirty[1]);
      dirty = null;
    }
    view.frames++;
    if (key) { view.keyframes++; placeCursor(); }
    view.drawn.push(performance.timeOrigin + performance.now());
    if (view.drawn.length > 1024) view.drawn.shift();
  }

  const scratch = document.createElement('canvas');
  const sctx = scratch.getContext('2d', { willReadFrequently: true });
  async function pngTile(x, y, w, h, data) {
    checkRect(x, y, w, h);
    const bmp = await createImageBitmap(new Blob([data], { type: 'image/png' }),
      { premultiplyAlpha: 'none', colorSpaceConversion: 'none' });
    if (bmp.width !== w || bmp.height !== h) throw new Error('tile size');
    scratch.width = w; scratch.height = h;
    sctx.drawImage(bmp, 0, 0);
    bmp.close();
    const src = sctx.getImageData(0, 0, w, h).data, dst = fb.data, W = fb.width;
    for (let r = 0; r < h; r++) {
      dst.set(src.subarray(r * w * 4, (r + 1) * w * 4), ((y + r) * W + x) * 4);
    }
    mark(x, y, w, h);
  }

  function checkRect(x, y, w, h) {
    if (w === 0 || h === 0 || x + w > fb.width || y + h > fb.height) throw new Error('rect outside the frame');
  }

  // need makes n inflated bytes available at inflater.pos.
  async function need(n) {
    const z = inflater;
    while (z.buf.length - z.pos + z.have < n) {
      const { value, done } = await z.reader.read();
      if (done) throw new Error('inflate ended');
      z.chunks.push(value);
      z.have += value.length;
    }
    if (z.buf.length - z.pos < n) {
      const rest = z.buf.subarray(z.pos);
      const b = new Uint8Array(rest.length + z.have);
      b.set(rest);
      let o = rest.length;
      for (const c of z.chunks) { b.set(c, o); o += c.length; }
      z.buf = b; z.pos = 0; z.chunks = []; z.have = 0;
    }
  }

  async function records(chunk) {
    const z = inflater;
    const input = new Uint8Array(chunk.length + 4);
    input.set(chunk); input.set(TAIL, chunk.length);
    z.writer.write(input).catch(() => {});
    const px = fb.data, W = fb.width;
    for (;;) {
      await need(1);
      const op = z.buf[z.pos++];
      if (op === 3) return;
      await need(8);
      const b = z.buf, p = z.pos;
      const x = b[p] | b[p + 1] << 8, y = b[p + 2] | b[p + 3] << 8;
      const w = b[p + 4] | b[p + 5] << 8, h = b[p + 6] | b[p + 7] << 8;
      z.pos += 8;
      checkRect(x, y, w, h);
      if (op === 0) {
        await need(w * h * 3);
        const s = z.buf;
        let i = z.pos;
        for (let r = 0; r < h; r++) {
          let d = ((y + r) * W + x) * 4;
          for (let c = 0; c < w; c++, i += 3, d += 4) {
            px[d] = s[i + 2]; px[d + 1] = s[i + 1]; px[d + 2] = s[i]; px[d + 3] = 255;
          }
        }
        z.pos = i;
      } else if (op === 1) {
        await need(4);
        const s = z.buf, q = z.pos;
        const sx = s[q] | s[q + 1] << 8, sy = s[q + 2] | s[q + 3] << 8;
        z.pos += 4;
        checkRect(sx, sy, w, h);
        // Rows in the order that never reads a row already overwritten;
        // copyWithin handles the overlap within a row.
        const down = sy < y;
        for (let k = 0; k < h; k++) {
          const r = down ? h - 1 - k : k;
          const from = ((sy + r) * W + sx) * 4;
          px.copyWithin(((y + r) * W + x) * 4, from, from + w * 4);
        }
      } else if (op === 2) {
        await need(3);
        const s = z.buf, q = z.pos;
        const B = s[q], G = s[q + 1], R = s[q + 2];
        z.pos += 3;
        for (let r = 0; r < h; r++) {
          let d = ((y + r) * W + x) * 4;
          for (let c = 0; c < w; c++, d += 4) { px[d] = R; px[d + 1] = G; px[d + 2] = B; px[d + 3] = 255; }
        }
      } else {
        throw new Error('unknown record ' + op);
      }
      mark(x, y, w, h);
    }
  }

  // Input (control mode): pointer positions in frame pixels.
  function send(m) {
    if (view.control && ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m));
  }
  view.send = send;
  function at(e) {
    const r = canvas.getBoundingClientRect();
    return {
      x: Math.max(0, Math.min(canvas.width - 1, Math.floor((e.clientX - r.left) * canvas.width / r.width))),
      y: Math.max(0, Math.min(canvas.height - 1, Math.floor((e.clientY - r.top) * canvas.height / r.height))),
    };
  }
  let moveTo = null;
  canvas.addEventListener('mousemove', (e) => {
    if (!view.control) return;
    if (!moveTo) requestAnimationFrame(() => { send(Object.assign({ t: 'move' }, moveTo)); moveTo = null; });
    moveTo = at(e);
  });
  canvas.addEventListener('mousedown', (e) => { canvas.focus(); send(Object.assign({ t: 'down', b: e.button + 1 }, at(e))); e.preventDefault(); });
  canvas.addEventListener('mouseup', (e) => { send(Object.assign({ t: 'up', b: e.button + 1 }, at(e))); e.preventDefault(); });
  canvas.addEventListener('contextmenu', (e) => e.preventDefault());
  canvas.addEventListener('wheel', (e) => {
    if (!view.control) return;
    send(Object.assign({ t: 'wheel', dx: Math.sign(e.deltaX), dy: Math.sign(e.deltaY) }, at(e)));
    e.preventDefault();
  }, { passive: false });
  const keyNames = {
    Enter: 'Return', Backspace: 'BackSpace', Tab: 'Tab', Escape: 'Escape', Delete: 'Delete', Insert: 'Insert',
    ArrowLeft: 'Left', ArrowRight: 'Right', ArrowUp: 'Up', ArrowDown: 'Down', Home: 'Home', End: 'End',
    PageUp: 'Prior', PageDown: 'Next',
  };
  for (let i = 1; i <= 12; i++) keyNames['F' + i] = 'F' + i;
  document.addEventListener('keydown', (e) => {
    const mods = [];
    if (e.ctrlKey) mods.push('ctrl');
    if (e.altKey) mods.push('alt');
    if (e.metaKey) mods.push('super');
    let key = keyNames[e.key];
    if (!key && e.key.length === 1) {
      if (!mods.length) { send({ t: 'text', text: e.key }); e.preventDefault(); return; }
      key = e.key.toLowerCase();
    }
    if (!key) return; // a lone modifier
    if (e.shiftKey && keyNames[e.key]) mods.push('shift');
    send({ t: 'key', keys: mods.concat([key]) });
    e.preventDefault();
  });

  connect();
})();
