// The JS SDK's side of the MCP gateway (run by test_gateway.py against its berth up, with
// E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and BERTH_SERVING_CA set): e2b@2.51.0's
// `Sandbox.create({ mcp })` starts the echo server from the fake internet's git host,
// then the official TypeScript MCP client (@modelcontextprotocol/sdk, as pinned by
// tests/mcp/conformance's lockfile) lists and calls its tools at `getMcpUrl()` with
// `getMcpToken()`, over TLS trusting berth's serving CA. Prints one JSON line of what it
// saw; exits non-zero on any failure. The sandbox is killed at the end either way.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
const load = async (packageDir, name) =>
  import(pathToFileURL(createRequire(join(repoRoot, packageDir, 'package.json')).resolve(name)).href)
const { Sandbox } = await load('tests/sdk/js', 'e2b')
const { Agent, fetch: undiciFetch } = await load('tests/sdk/js', 'undici')
const { Client } = await load('tests/mcp/conformance', '@modelcontextprotocol/sdk/client/index.js')
const { StreamableHTTPClientTransport } = await load(
  'tests/mcp/conformance',
  '@modelcontextprotocol/sdk/client/streamableHttp.js',
)

const trusting = new Agent({ connect: { ca: readFileSync(process.env.BERTH_SERVING_CA, 'utf8') } })
const fetchTrusting = (url, init) => undiciFetch(url, { ...init, dispatcher: trusting })

const sandbox = await Sandbox.create({
  mcp: { 'github/acme/echo': { runCmd: 'python3 server.py', installCmd: 'true' } },
  timeoutMs: 600_000,
})
const report = { sandboxId: sandbox.sandboxId }
try {
  report.url = sandbox.getMcpUrl()
  const token = await sandbox.getMcpToken()
  const client = new Client({ name: 'berth-js-test', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(report.url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
    fetch: fetchTrusting,
  })
  await client.connect(transport)
  report.tools = (await client.listTools()).tools.map((tool) => tool.name).sort()
  const called = await client.callTool({ name: 'echo', arguments: { text: 'from js' } })
  report.echo = called.content[0].text
  await client.close()
} finally {
  await sandbox.kill()
  report.killed = !(await sandbox.isRunning())
}
console.log(JSON.stringify(report))
