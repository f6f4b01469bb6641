// The official E2B JS SDK (e2b@2.51.0) against `berth up`, configured only by
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY as `berth up` prints them: the areas the
// Python suites cover (commands with stdin, connect and timeouts; files with symlinks,
// procfs and watch; pause/connect, fork, snapshots; list paging; network; getHost;
// signed URLs; a kill mid-command). envd's own JS suite (tests/sdk/js) adds the PTY.
//
// Starts `berth up` on a free loopback port with a temp state dir (its templates/ a symlink
// to the shared store, $BERTH_TEMPLATES_DIR or /var/lib/berth/templates), and stops it by
// PID at the end. Binary: $BERTH_BIN, else ${CARGO_TARGET_DIR:-<repo>/target}/debug/berth.
// The SDK comes from tests/sdk/js/node_modules (installed by scripts/install-deps.sh).
// BERTH_KEEP_LOGS=1 keeps berth up's log (its path is printed).
//
//   node --test tests/sdk/control_plane/js/
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawn } from 'node:child_process'
import { createServer } from 'node:net'
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'

for (const name of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_ACCESS_TOKEN', 'E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  delete process.env[name]
}

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..')
const sdkEntry = createRequire(join(repoRoot, 'tests', 'sdk', 'js', 'package.json')).resolve('e2b')
const { Sandbox, CommandExitError } = await import(pathToFileURL(sdkEntry).href)

let berth
let stateDir
// The fake internet of scripts/fake-internet.sh: HTTP hosts 198.18.201.1 and .2 in a
// network namespace of their own; berth up's egress ceiling admits only them.
const internet = { name: `cpjs${process.pid % 100000}`, block: 201 }
let logPath
const created = []

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

// Polls `predicate` every 100 ms; throws after a generous bound (a bound, not a measurement).
async function until(predicate, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

function fakeInternet(verb, ...args) {
  return new Promise((resolveRun, reject) => {
    const child = spawn('bash', [join(repoRoot, 'scripts', 'fake-internet.sh'), verb, internet.name, ...args], {
      stdio: ['ignore', 'ignore', 'inherit'],
    })
    child.on('exit', (code) => (code === 0 ? resolveRun() : reject(new Error(`fake-internet.sh ${verb}: ${code}`))))
  })
}

before(async () => {
  await fakeInternet('up', String(internet.block), '2')
  const binary = berthBinary()
  assert.ok(existsSync(binary), `berth binary not found at ${binary}`)
  stateDir = mkdtempSync(join(tmpdir(), 'berth-cp-js-'))
  const templates = process.env.BERTH_TEMPLATES_DIR ?? '/var/lib/berth/templates'
  if (existsSync(templates)) symlinkSync(templates, join(stateDir, 'templates'))
  logPath = join(mkdtempSync(join(tmpdir(), 'berth-cp-js-log-')), 'berth-up.log')
  const log = createWriteStream(logPath)
  const listen = `127.0.0.1:${await freePort()}`
  berth = spawn(binary, ['up', '--listen', listen, '--state-dir', stateDir], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      RUST_LOG: process.env.RUST_LOG ?? 'info',
      // A sandbox pool of its own (daemons on one host need distinct pools) and an
      // egress ceiling admitting only the range tests put their fake internet in.
      BERTH_SANDBOX_CIDR: `10.${128 + Math.floor(Math.random() * 120)}.${16 * Math.floor(Math.random() * 16)}.0/20`,
      BERTH_EGRESS_ALLOW: `198.18.${internet.block}.0/24`,
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
      return 'E2B_API_URL' in printed && 'E2B_SANDBOX_URL' in printed
    },
    'berth up to print E2B_API_URL and E2B_SANDBOX_URL',
    Number(process.env.BERTH_STARTUP_TIMEOUT ?? 900) * 1000,
  )
  // stdout is a pipe, so berth up prints no key (keys never go to logs): make one.
  assert.ok(!('E2B_API_KEY' in printed), 'berth up printed an API key into a pipe')
  const keyOutput = execFileSync(binary, ['keys', 'create', '--team', 'default', '--state-dir', stateDir], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  printed.E2B_API_KEY = keyOutput.toString().trim().split('\n').pop().split('=').pop()
  Object.assign(process.env, printed)
})

after(async () => {
  await fakeInternet('down').catch(() => {})
  for (const sandbox of created) {
    await sandbox.kill().catch(() => {})
  }
  if (berth && berth.exitCode === null && berth.signalCode === null) {
    const exited = new Promise((r) => berth.once('exit', r))
    process.kill(berth.pid, 'SIGTERM')
    const timer = setTimeout(() => process.kill(berth.pid, 'SIGKILL'), 60_000)
    await exited
    clearTimeout(timer)
  }
  // A sandbox that outlived berth up could leave mounts inside; never delete through them.
  const mounted = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((point) => point && (point === stateDir || point.startsWith(`${stateDir}/`)))
  if (stateDir && mounted.length === 0) rmSync(stateDir, { recursive: true, force: true })
  else if (stateDir) console.error(`leaving ${stateDir}: still mounted inside: ${mounted.slice(0, 5)}`)
  if (logPath && !process.env.BERTH_KEEP_LOGS) rmSync(dirname(logPath), { recursive: true, force: true })
  else if (logPath) console.error(`berth up log kept at ${logPath}`)
})

async function createSandbox(opts) {
  const sandbox = await Sandbox.create(opts)
  created.push(sandbox)
  return sandbox
}

test('create with metadata and envs, then commands and files inside', async () => {
  const sandbox = await createSandbox({
    timeoutMs: 120_000,
    metadata: { suite: 'js-smoke' },
    envs: { JS_SMOKE: 'yes' },
  })
  assert.match(sandbox.sandboxId, /^[a-z0-9]+$/)

  const result = await sandbox.commands.run('echo "$JS_SMOKE as $(whoami)"')
  assert.equal(result.stdout, 'yes as user\n')
  await assert.rejects(sandbox.commands.run('exit 4'), (error) => {
    assert.ok(error instanceof CommandExitError)
    assert.equal(error.exitCode, 4)
    return true
  })

  await sandbox.files.write('/home/user/js.txt', 'written by the JS SDK')
  assert.equal(await sandbox.files.read('/home/user/js.txt'), 'written by the JS SDK')
  assert.ok((await sandbox.files.list('/home/user')).some((entry) => entry.name === 'js.txt'))
})

test('getInfo, setTimeout, list by metadata, connect and kill', async () => {
  const tag = `js-${process.pid}-${Date.now()}`
  const sandbox = await createSandbox({ timeoutMs: 60_000, metadata: { tag } })

  const info = await sandbox.getInfo()
  assert.equal(info.sandboxId, sandbox.sandboxId)
  assert.deepEqual(info.metadata, { tag })
  assert.equal(info.state, 'running')

  await sandbox.setTimeout(600_000)
  const extended = await sandbox.getInfo()
  assert.ok(extended.endAt.getTime() > info.endAt.getTime() + 400_000)

  const paginator = Sandbox.list({ query: { metadata: { tag } } })
  const listed = await paginator.nextItems()
  assert.deepEqual(
    listed.map((item) => item.sandboxId),
    [sandbox.sandboxId],
  )

  const connected = await Sandbox.connect(sandbox.sandboxId)
  assert.equal((await connected.commands.run('echo via-connect')).stdout, 'via-connect\n')

  await sandbox.kill()
  assert.equal(await sandbox.isRunning(), false)
  assert.deepEqual(await Sandbox.list({ query: { metadata: { tag } } }).nextItems(), [])
})

test('getMetrics reports a sample', async () => {
  const sandbox = await createSandbox({ timeoutMs: 300_000 })
  await until(async () => (await sandbox.getMetrics()).length > 0, 'a metrics sample', 120_000)
  const [latest] = (await sandbox.getMetrics()).slice(-1)
  assert.ok(latest.cpuCount >= 1)
  assert.ok(latest.memUsed > 0 && latest.memUsed <= latest.memTotal)
  assert.ok(latest.diskUsed > 0 && latest.diskUsed <= latest.diskTotal)
})

test('pause, connect resumes with memory, fork and snapshot', async () => {
  const sandbox = await createSandbox({ timeoutMs: 300_000 })
  // A value only in a shell's memory, printed on demand through a fifo.
  await sandbox.commands.run(
    'mkfifo /tmp/ask && (secret=$RANDOM$RANDOM; while true; do read _ < /tmp/ask; echo "$secret" > /tmp/answer; done) >/dev/null 2>&1 &',
  )
  const ask = async (box) => (await box.commands.run('echo > /tmp/ask; sleep 0.2; cat /tmp/answer')).stdout.trim()
  const secret = await ask(sandbox)
  assert.match(secret, /^\d+$/)

  assert.equal(await sandbox.pause(), true)
  assert.equal((await Sandbox.getInfo(sandbox.sandboxId)).state, 'paused')
  const resumed = await Sandbox.connect(sandbox.sandboxId, { timeoutMs: 300_000 })
  assert.equal(await ask(resumed), secret)

  const [fork] = await resumed.fork({ count: 1 })
  created.push(fork)
  assert.notEqual(fork.sandboxId, sandbox.sandboxId)
  assert.equal(await ask(fork), secret)

  const name = `js-snap-${process.pid}`
  const snapshot = await resumed.createSnapshot({ name })
  const child = await createSandbox({ template: snapshot.snapshotId, timeoutMs: 120_000 })
  assert.equal(await ask(child), secret)
  assert.equal((await child.commands.run('echo $E2B_SANDBOX_ID')).stdout.trim(), child.sandboxId)
})

test('network policy at create and updated live', async () => {
  const [allowed, other] = [1, 2].map((i) => `198.18.${internet.block}.${i}`)
  const sbx = await Sandbox.create({ network: { denyOut: ['0.0.0.0/0'], allowOut: [allowed] } })
  created.push(sbx)
  const reach = async (ip) => {
    try {
      await sbx.commands.run(`curl -fsS -m 5 -o /dev/null http://${ip}/`, { user: 'root' })
      return true
    } catch (error) {
      if (error instanceof CommandExitError) return false
      throw error
    }
  }
  assert.equal(await reach(allowed), true)
  assert.equal(await reach(other), false)
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.deepEqual(info.network?.denyOut, ['0.0.0.0/0'])
  await sbx.updateNetwork({})
  assert.equal(await reach(other), true, 'an update without rules clears them')
  await sbx.updateNetwork({ denyOut: [`${allowed}/32`] })
  assert.equal(await reach(allowed), false)
  assert.equal(await reach(other), true)
})

test('getHost URLs resolve and reach the sandbox; signed file URLs need no sandbox id', async () => {
  const sandbox = await createSandbox({ timeoutMs: 300_000, secure: true })
  const port = new URL(process.env.E2B_API_URL).port
  const host = sandbox.getHost(8000)
  assert.equal(host, `8000-${sandbox.sandboxId}.localhost:${port}`)

  await sandbox.files.write('/home/user/site/index.html', 'reached from node')
  await sandbox.commands.run('cd /home/user/site && python3 -m http.server 8000', { background: true })
  await until(async () => {
    try {
      return (await fetch(`http://${host}/index.html`)).ok
    } catch {
      return false
    }
  }, 'the sandbox web server through getHost')
  assert.equal(await (await fetch(`http://${host}/index.html`)).text(), 'reached from node')

  const url = await sandbox.downloadUrl('/home/user/site/index.html', { useSignatureExpiration: 60 })
  assert.ok(url.startsWith(`${process.env.E2B_SANDBOX_URL}/files?`), url)
  assert.ok(!url.includes(sandbox.sandboxId))
  const answer = await fetch(url)
  assert.equal(answer.status, 200)
  assert.equal(await answer.text(), 'reached from node')
  const forged = await fetch(url.replace(/signature=[^&]+/, 'signature=v1_forged'))
  assert.equal(forged.status, 401)
})

test('a sandbox killed while a command streams raises "killed or reached its end of life"', async () => {
  const sandbox = await createSandbox({ timeoutMs: 120_000 })
  let streaming
  const started = new Promise((resolveStarted) => (streaming = resolveStarted))
  const began = Date.now()
  const running = sandbox.commands.run('echo streaming; sleep 100', { onStdout: () => streaming(), timeoutMs: 0 })
  // Handled from the start: the stream may fail before the kill call returns.
  const outcome = running.then(
    () => null,
    (error) => error,
  )
  await started
  await Sandbox.kill(sandbox.sandboxId)
  const error = await outcome
  assert.ok(error instanceof Error, 'the command must fail when its sandbox is killed')
  assert.match(error.message, /killed or reached its end of life/)
  assert.ok(Date.now() - began < 30_000, 'the stream ends when the sandbox does, not at a read timeout')
})

test('files: makeDir, exists, getInfo (symlinks too), rename, remove, procfs reads', async () => {
  const sandbox = await createSandbox({ timeoutMs: 120_000 })
  const dir = '/home/user/js-files/sub'
  assert.equal(await sandbox.files.makeDir(dir), true)
  assert.equal(await sandbox.files.makeDir(dir), false, 'an existing directory is not made again')
  assert.equal(await sandbox.files.exists(dir), true)
  await sandbox.files.write(`${dir}/a.txt`, 'twelve bytes')
  const info = await sandbox.files.getInfo(`${dir}/a.txt`)
  assert.equal(info.type, 'file')
  assert.equal(info.size, 12)
  assert.equal(info.owner, 'user')

  await sandbox.commands.run(`ln -s ${dir}/a.txt ${dir}/link`)
  const link = await sandbox.files.getInfo(`${dir}/link`)
  assert.equal(link.type, 'file', 'a symlink reports its target type')
  assert.equal(link.symlinkTarget, `${dir}/a.txt`)

  const moved = await sandbox.files.rename(`${dir}/a.txt`, `${dir}/b.txt`)
  assert.equal(moved.path, `${dir}/b.txt`)
  assert.equal(await sandbox.files.exists(`${dir}/a.txt`), false)
  assert.equal(await sandbox.files.read(`${dir}/b.txt`), 'twelve bytes')
  await sandbox.files.remove('/home/user/js-files')
  assert.equal(await sandbox.files.exists('/home/user/js-files'), false)

  const status = await sandbox.files.read('/proc/self/status')
  assert.match(status, /^Name:/m, 'procfs files (size 0 in stat) are read to their end')
})

test('watchDir reports create, write, rename and remove, and stops', async () => {
  const sandbox = await createSandbox({ timeoutMs: 120_000 })
  const dir = '/home/user/watched'
  await sandbox.files.makeDir(dir)
  const events = []
  const handle = await sandbox.files.watchDir(dir, (event) => events.push(`${event.type} ${event.name}`), { timeoutMs: 0 })
  try {
    await sandbox.files.write(`${dir}/w.txt`, 'one')
    await sandbox.files.rename(`${dir}/w.txt`, `${dir}/r.txt`)
    await sandbox.files.remove(`${dir}/r.txt`)
    await until(() => events.includes('remove r.txt'), `the remove event (seen: ${events})`)
    for (const expected of ['create w.txt', 'write w.txt', 'rename w.txt', 'create r.txt']) {
      assert.ok(events.includes(expected), `${expected} in ${events}`)
    }
  } finally {
    await handle.stop()
  }
  const seen = events.length
  await sandbox.files.write(`${dir}/after.txt`, 'unwatched')
  await new Promise((r) => setTimeout(r, 500))
  assert.equal(events.length, seen, 'no events after stop')
})

test('stdin reaches a running command, connect follows it, and a timeout kills it', async () => {
  const sandbox = await createSandbox({ timeoutMs: 120_000 })
  const handle = await sandbox.commands.run('read line; echo got-$line', { background: true, stdin: true })
  // A second stream on the running command sees what it prints from then on.
  const followed = await sandbox.commands.connect(handle.pid)
  await sandbox.commands.sendStdin(handle.pid, 'js-stdin\n')
  assert.equal((await followed.wait()).stdout, 'got-js-stdin\n')
  assert.equal((await handle.wait()).stdout, 'got-js-stdin\n')

  await assert.rejects(sandbox.commands.run('sleep 300', { timeoutMs: 1_000 }), (error) => {
    assert.match(error.message, /timed out|deadline/i)
    return true
  })
  await until(
    async () => (await sandbox.commands.run('pgrep -x sleep || true')).stdout === '',
    'the timed-out command to be killed',
  )
})

test('Sandbox.list and listSnapshots page with limit and nextToken; snapshots delete', async () => {
  const tag = `js-page-${process.pid}-${Date.now()}`
  const boxes = []
  for (let i = 0; i < 3; i++) boxes.push(await createSandbox({ timeoutMs: 120_000, metadata: { tag } }))
  const paginator = Sandbox.list({ limit: 2, query: { metadata: { tag } } })
  const first = await paginator.nextItems()
  assert.equal(first.length, 2)
  assert.equal(paginator.hasNext, true)
  const second = await paginator.nextItems()
  assert.equal(second.length, 1)
  assert.equal(paginator.hasNext, false)
  assert.deepEqual(
    [...first, ...second].map((s) => s.sandboxId).sort(),
    boxes.map((s) => s.sandboxId).sort(),
  )

  const snapshots = []
  for (const [i, box] of boxes.slice(0, 2).entries()) {
    snapshots.push(await box.createSnapshot({ name: `js-page-${process.pid}-${i}` }))
  }
  const mine = boxes[0].listSnapshots({ limit: 1 })
  const page = await mine.nextItems()
  assert.deepEqual(page.map((s) => s.snapshotId), [snapshots[0].snapshotId])
  assert.equal(mine.hasNext, false, 'one snapshot of that sandbox')
  const all = Sandbox.listSnapshots({ limit: 1 })
  const ids = []
  while (all.hasNext) ids.push(...(await all.nextItems()).map((s) => s.snapshotId))
  for (const snapshot of snapshots) assert.ok(ids.includes(snapshot.snapshotId), `${snapshot.snapshotId} listed`)
  for (const snapshot of snapshots) assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snapshots[0].snapshotId), false, 'a deleted snapshot is gone')
})
