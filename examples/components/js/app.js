// A TensorWasm function in JavaScript: typed exports of a WASI 0.2 component (../calc.wit),
// built with componentize-js:
//   componentize-js examples/components/js/app.js --wit examples/components/calc.wit \
//       --world-name calc --disable http fetch-event -o calc.wasm
// (without `--disable http fetch-event` the component imports wasi:http, which TensorWasm
// does not offer to guests, and its deploy is refused with invalid_module naming the import)

export function add(a, b) {
  return a + b;
}

export function norm(p) {
  return Math.hypot(p.x, p.y);
}

export function greet(name) {
  return `hello, ${name}`;
}

export function words(text) {
  const found = text.split(/\s+/).filter((word) => word.length > 0);
  return [new Set(found).size, found.length];
}

export function boom() {
  throw new Error("boom, on purpose");
}

export function spin() {
  for (;;) {}
}

export function hog(mib) {
  const held = new Uint8Array(mib << 20);
  return held.length >> 20;
}
