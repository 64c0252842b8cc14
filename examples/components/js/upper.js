// A WASI 0.2 command in JavaScript (world ../upper.wit: exports wasi:cli/run): stdin
// upper-cased to stdout through wasi:io streams. "boom" on stdin throws; "spin" never ends.
import { getStdin } from "wasi:cli/stdin@0.2.10";
import { getStdout } from "wasi:cli/stdout@0.2.10";

function readAll(stream) {
  const chunks = [];
  for (;;) {
    try {
      chunks.push(stream.blockingRead(65536n));
    } catch (e) {
      if (e.payload?.tag === "closed") break;
      throw e;
    }
  }
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}

export const run = {
  run() {
    const data = readAll(getStdin());
    const text = new TextDecoder().decode(data);
    if (text.startsWith("boom")) throw new Error("boom, on purpose");
    if (text.startsWith("spin")) for (;;) {}
    const out = new TextEncoder().encode(text.toUpperCase());
    const stdout = getStdout();
    // wasi:io takes at most 4096 bytes per blocking-write-and-flush.
    for (let at = 0; at < out.length; at += 4096) {
      stdout.blockingWriteAndFlush(out.subarray(at, at + 4096));
    }
  },
};
