// The GPU from JavaScript through tensor-wasm:gpu (world ../gpu-demo.wit): the same three
// exports as ../python/gpu_app.py, checked against the guest's own arithmetic. A misuse answers
// "Error_<Case>: <message>", as the Python one does.
import { Buffer } from "tensor-wasm:gpu/buffers@0.1.0";
import { Kernel, launch } from "tensor-wasm:gpu/kernels@0.1.0";

const buf = (b) => ({ tag: "buffer", val: b });
const u32 = (v) => ({ tag: "u32", val: v });
const f32 = (v) => ({ tag: "f32", val: v });
const dim = (x, y = 1) => ({ x, y, z: 1 });

function upload(values) {
  const data = new Uint8Array(new Float32Array(values).buffer);
  const b = Buffer.allocate(BigInt(data.length));
  b.write(0n, data);
  return b;
}

function download(b, count) {
  const bytes = b.read(0n, BigInt(4 * count));
  return new Float32Array(bytes.buffer, bytes.byteOffset, count);
}

// "Error_<Case>: <message>" of an error thrown by a tensor-wasm:gpu call.
function describe(e) {
  const p = e.payload ?? e;
  if (!p || typeof p.tag !== "string") throw e;
  const name = p.tag.split("-").map((w) => w[0].toUpperCase() + w.slice(1)).join("");
  return `Error_${name}: ${p.val}`;
}

function guarded(f) {
  try {
    return f();
  } catch (e) {
    throw describe(e);
  }
}

export function addThenScale(n, factor) {
  const a = Array.from({ length: n }, (_, i) => i * 0.5);
  const x = Array.from({ length: n }, (_, i) => (n - i) * 0.25);
  const out = guarded(() => {
    const [da, dx] = [upload(a), upload(x)];
    const sum = Buffer.allocate(BigInt(4 * n));
    const scaled = Buffer.allocate(BigInt(4 * n));
    const blocks = Math.ceil(n / 256);
    launch(Kernel.fromBlueprint("vector_add"), dim(blocks), dim(256), 0,
      [buf(da), buf(dx), buf(sum), u32(n)]);
    // The sum stays on the device: `scale` reads it where `vector_add` wrote it.
    launch(Kernel.fromBlueprint("scale"), dim(blocks), dim(256), 0,
      [buf(sum), buf(scaled), f32(factor), u32(n)]);
    return download(scaled, n);
  });
  const r = Math.fround;
  let mismatches = 0;
  for (let i = 0; i < n; i++) {
    if (out[i] !== r(r(r(a[i]) + r(x[i])) * r(factor))) mismatches++;
  }
  return { first: Array.from(out.slice(0, 4)), mismatches };
}

export function matmulCheck(m, k, n) {
  const a = Array.from({ length: m * k }, (_, i) => ((i * 7) % 13) - 6);
  const x = Array.from({ length: k * n }, (_, i) => ((i * 5) % 11) * 0.5);
  const c = guarded(() => {
    const [da, dx] = [upload(a), upload(x)];
    const dc = Buffer.allocate(BigInt(4 * m * n));
    launch(Kernel.fromBlueprint("matmul"), dim(Math.ceil(n / 16), Math.ceil(m / 16)),
      dim(16, 16), 0, [buf(da), buf(dx), buf(dc), u32(m), u32(n), u32(k)]);
    return download(dc, m * n);
  });
  let worst = 0;
  for (let row = 0; row < m; row++) {
    for (let col = 0; col < n; col++) {
      let want = 0;
      for (let i = 0; i < k; i++) want += a[row * k + i] * x[i * n + col];
      worst = Math.max(worst, Math.abs(c[row * n + col] - want));
    }
  }
  return worst;
}

const MISUSES = {
  oversized: () => Buffer.allocate(1n << 40n),
  "out-of-range": () => Buffer.allocate(16n).write(12n, new Uint8Array(8)),
  "unknown-blueprint": () => Kernel.fromBlueprint("no_such_kernel"),
  "raw-ptx": () => Kernel.fromPtx(".version 7.0", "k"),
  "bad-args": () =>
    launch(Kernel.fromBlueprint("vector_add"), dim(1), dim(1), 0, [buf(Buffer.allocate(16n)), u32(4)]),
  hog: () => {
    const held = [];
    for (let i = 0; i < 4096; i++) held.push(Buffer.allocate(1n << 20n));
  },
};

export function misuse(what) {
  const attempt = MISUSES[what];
  if (!attempt) throw `unknown misuse ${what}`;
  try {
    attempt();
  } catch (e) {
    return describe(e);
  }
  throw `${what}: the host accepted it`;
}
