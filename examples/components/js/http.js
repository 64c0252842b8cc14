// A TensorWasm HTTP handler in JavaScript: a small JSON API as a wasi:http/incoming-handler
// component, built by componentize-js (its fetch-event API). docs/writing-functions.md shows
// how to build it.
//
//   GET  /hello            text greeting
//   GET  /items/{n}        {"id": n, "method": ..., "query": {...}}
//   POST /sum              {"numbers": [...]} -> {"sum": ...}; 400 on bad JSON
//   ANY  /echo             the request body back, same content-type
//   GET  /headers          the request's x-* headers as JSON
//   GET  /boom, /spin      hostile: an exception, an endless loop
//   anything else          404 {"error": "not found"}

const json = (value, status = 200) =>
  new Response(JSON.stringify(value), {
    status,
    headers: { "content-type": "application/json" },
  });

async function handle(request) {
  const url = new URL(request.url);
  const path = url.pathname;
  if (path === "/hello") {
    return new Response("hello from JavaScript\n", { headers: { "content-type": "text/plain" } });
  }
  const item = path.match(/^\/items\/(.*)$/);
  if (item) {
    if (!/^[0-9]+$/.test(item[1])) return json({ error: "an item id is a number" }, 400);
    return json({ id: Number(item[1]), method: request.method, query: Object.fromEntries(url.searchParams) });
  }
  if (path === "/sum" && request.method === "POST") {
    try {
      const { numbers } = JSON.parse(await request.text());
      return json({ sum: numbers.reduce((a, b) => a + b, 0) });
    } catch (e) {
      return json({ error: `bad request: ${e.message}` }, 400);
    }
  }
  if (path === "/echo") {
    const type = request.headers.get("content-type") ?? "application/octet-stream";
    return new Response(await request.arrayBuffer(), { headers: { "content-type": type } });
  }
  if (path === "/headers") {
    const seen = {};
    for (const [name, value] of request.headers) if (name.startsWith("x-")) seen[name] = value;
    return json(seen);
  }
  if (path === "/boom") throw new Error("boom, on purpose");
  if (path === "/spin") for (;;) {}
  return json({ error: "not found", path }, 404);
}

addEventListener("fetch", (event) => event.respondWith(handle(event.request)));
