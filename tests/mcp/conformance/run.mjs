// Runs the server scenarios of @modelcontextprotocol/conformance against berth's /mcp.
//
//   BERTH_MCP_API_KEY=e2b_… node run.mjs http://127.0.0.1:3000/mcp [results-dir]
//
// The suite's client sends no custom headers, and berth's /mcp wants an X-API-Key (the
// identity is the key's team), so the suite talks to a loopback proxy that adds the key
// and forwards everything else unchanged: method, path, body, and every header including
// Host and Origin (the DNS-rebinding scenario depends on them reaching berth). Responses,
// SSE streams included, are piped back unbuffered. Exits with the suite's exit status:
// 0 when every failure is listed in expected-failures.yml and no listed one passes.
import { spawn } from "node:child_process";
import http from "node:http";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [target, resultsDir = join(here, "results")] = process.argv.slice(2);
const apiKey = process.env.BERTH_MCP_API_KEY;
if (!target || !apiKey) {
  console.error("usage: BERTH_MCP_API_KEY=… node run.mjs <berth /mcp URL> [results-dir]");
  process.exit(2);
}
const upstream = new URL(target);

const proxy = http.createServer((request, response) => {
  const forwarded = http.request(
    {
      host: upstream.hostname,
      port: upstream.port,
      method: request.method,
      path: request.url,
      headers: { ...request.headers, "x-api-key": apiKey },
    },
    (answer) => {
      response.writeHead(answer.statusCode, answer.headers);
      answer.pipe(response);
    },
  );
  forwarded.on("error", (error) => {
    if (!response.headersSent) response.writeHead(502, { "content-type": "text/plain" });
    response.end(`proxy: ${error.message}`);
  });
  request.pipe(forwarded);
});
await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
const proxied = `http://localhost:${proxy.address().port}${upstream.pathname}`;

const suite = spawn(
  process.execPath,
  [
    "--import",
    join(here, "node20-fs-shim.mjs"),
    join(here, "node_modules/@modelcontextprotocol/conformance/dist/index.js"),
    "server",
    "--url",
    proxied,
    "--expected-failures",
    join(here, "expected-failures.yml"),
    "--output-dir",
    resultsDir,
  ],
  { stdio: "inherit" },
);
const code = await new Promise((resolve) => suite.on("exit", (status, signal) => resolve(status ?? (signal ? 1 : 0))));
proxy.closeAllConnections();
proxy.close();
process.exit(code);
