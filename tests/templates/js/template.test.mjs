// The official E2B JS SDK's Template builder (e2b@2.51.0, from tests/sdk/js) against
// `berth up`: one build with a COPY and a start command, and a sandbox from it.
//
// Starts `berth up` on a free loopback port with a temp state dir whose template store
// holds only `base`, imported from $BERTH_TEMPLATES_DIR (default /var/lib/berth/templates)
// as a symlink to its layers; stops it by PID at the end. Binary: $BERTH_BIN, else
// ${CARGO_TARGET_DIR:-<repo>/target}/debug/berth.
//
//   node --test tests/templates/js/
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { createServer } from 'node:net'
import {
  copyFileSync, createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync,
} from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'

for (const name of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_ACCESS_TOKEN', 'E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  delete process.env[name]
}

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
const sdkEntry = createRequire(join(repoRoot, 'tests', 'sdk', 'js', 'package.json')).resolve('e2b')
const { Sandbox, Template, waitForPort } = await import(pathToFileURL(sdkEntry).href)

let berth
let stateDir
let logPath

function berthBinary() {
  if (process.env.BERTH_BIN) return process.env.BERTH_BIN
  const target = process.env.CARGO_TARGET_DIR ? resolve(repoRoot, process.env.CARGO_TARGET_DIR) : join(repoRoot, 'target')
  return join(target, 'debug', 'berth')
}

function freePort() {
  return new Promise((resolvePort, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address()
      probe.close(() => resolvePort(port))
    })
  })
}

async function until(predicate, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

// `base` of the shared template store: manifest copied, layers symlinked.
function importBase(state) {
  const shared = process.env.BERTH_TEMPLATES_DIR ?? '/var/lib/berth/templates'
  const manifest = join(shared, 'manifests', 'base.json')
  if (!existsSync(manifest)) return
  const { layers } = JSON.parse(readFileSync(manifest, 'utf8'))
  mkdirSync(join(state, 'templates', 'layers'), { recursive: true })
  mkdirSync(join(state, 'templates', 'manifests'))
  for (const layer of layers) symlinkSync(join(shared, 'layers', layer), join(state, 'templates', 'layers', layer))
  copyFileSync(manifest, join(state, 'templates', 'manifests', 'base.json'))
}

before(async () => {
  const binary = berthBinary()
  assert.ok(existsSync(binary), `berth binary not found at ${binary}`)
  stateDir = mkdtempSync(join(tmpdir(), 'berth-tpl-js-'))
  importBase(stateDir)
  logPath = join(mkdtempSync(join(tmpdir(), 'berth-tpl-js-log-')), 'berth-up.log')
  const log = createWriteStream(logPath)
  const listen = `127.0.0.1:${await freePort()}`
  berth = spawn(binary, ['up', '--listen', listen, '--state-dir', stateDir], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      RUST_LOG: process.env.RUST_LOG ?? 'info',
      BERTH_CRIU_STATE_DIR: process.env.BERTH_CRIU_STATE_DIR ?? '/var/lib/berth',
    },
  })
  berth.stderr.pipe(log)
  let exited = null
  berth.on('exit', (code, signal) => (exited = { code, signal }))
  const printed = {}
  createInterface({ input: berth.stdout }).on('line', (line) => {
    log.write(`${line}\n`)
    const match = /^\s*(?:export\s+)?(E2B_API_URL|E2B_SANDBOX_URL|E2B_API_KEY)=(\S+)\s*$/.exec(line)
    if (match) printed[match[1]] = match[2]
  })
  await until(
    () => {
      if (exited) throw new Error(`berth up exited during startup: ${JSON.stringify(exited)}; log ${logPath}`)
      return Object.keys(printed).length === 3
    },
    'berth up to print its E2B_* lines',
    Number(process.env.BERTH_STARTUP_TIMEOUT ?? 900) * 1000,
  )
  Object.assign(process.env, printed)
})

after(async () => {
  if (berth && berth.exitCode === null && berth.signalCode === null) {
    const exited = new Promise((r) => berth.once('exit', r))
    process.kill(berth.pid, 'SIGTERM')
    const timer = setTimeout(() => process.kill(berth.pid, 'SIGKILL'), 60_000)
    await exited
    clearTimeout(timer)
  }
  const mounted = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((point) => point && (point === stateDir || point.startsWith(`${stateDir}/`)))
  if (stateDir && mounted.length === 0) rmSync(stateDir, { recursive: true, force: true })
  if (logPath && !process.env.BERTH_KEEP_LOGS) rmSync(dirname(logPath), { recursive: true, force: true })
  else if (logPath) console.error(`berth up log kept at ${logPath}`)
})

test('a Template built with the JS SDK, and a sandbox from it', async () => {
  const context = mkdtempSync(join(tmpdir(), 'berth-tpl-js-ctx-'))
  writeFileSync(join(context, 'page.html'), 'from the js builder\n')
  const name = `js-builder-${process.pid}`
  const template = Template({ fileContextPath: context })
    .fromTemplate('base')
    .runCmd('echo js-root > /etc/js-marker', { user: 'root' })
    .copy('page.html', '/home/user/site/index.html')
    .setEnvs({ JS_BUILT: 'yes' })
    .setStartCmd('cd /home/user/site && python3 -m http.server 8090', waitForPort(8090))
  const logs = []
  const info = await Template.build(template, name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (entry) => logs.push(entry) })
  assert.equal(info.name, name)
  assert.ok(logs.some((entry) => String(entry.message).includes('checkpointing')))

  const sandbox = await Sandbox.create(name, { timeoutMs: 120_000 })
  try {
    assert.equal((await sandbox.commands.run('cat /etc/js-marker')).stdout, 'js-root\n')
    assert.equal((await sandbox.commands.run('echo $JS_BUILT')).stdout, 'yes\n')
    const page = await sandbox.commands.run('curl -s --max-time 5 http://127.0.0.1:8090/index.html')
    assert.equal(page.stdout, 'from the js builder\n')
    const detail = await sandbox.getInfo()
    assert.equal(detail.templateId, info.templateId)
  } finally {
    await sandbox.kill()
  }
  assert.equal(await Template.exists(name), true)
  rmSync(context, { recursive: true, force: true })
})
