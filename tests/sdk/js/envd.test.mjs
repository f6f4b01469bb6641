// Smoke tests: the official E2B JS SDK (e2b@2.51.0) in debug mode against berth-envd.
//
// Debug mode (E2B_DEBUG=true) skips the REST API and talks to envd at localhost:49983, so
// this file starts one berth-envd on 127.0.0.1:49983 and kills it by PID at the end.
// Binary: $BERTH_ENVD_BIN, else ${CARGO_TARGET_DIR:-<repo>/target}/debug/berth-envd.
//
//   node --test tests/sdk/js/
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

process.env.E2B_DEBUG = 'true'
for (const name of ['E2B_SANDBOX_URL', 'E2B_API_URL', 'E2B_DOMAIN']) delete process.env[name]

const { Sandbox, CommandExitError } = await import('e2b')

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
const envdUrl = 'http://127.0.0.1:49983'

let envd
let workdir
let sandbox

function envdBinary() {
  if (process.env.BERTH_ENVD_BIN) return process.env.BERTH_ENVD_BIN
  const target = process.env.CARGO_TARGET_DIR
    ? resolve(repoRoot, process.env.CARGO_TARGET_DIR)
    : join(repoRoot, 'target')
  return join(target, 'debug', 'berth-envd')
}

async function healthy() {
  try {
    return (await fetch(`${envdUrl}/health`)).status === 204
  } catch {
    return false
  }
}

// Polls `predicate` every 20 ms; throws after a generous bound (a bound, not a measurement).
async function until(predicate, what, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

// True once `pid` (or a child of it) runs a program whose command line starts with
// `prefix`, or once `pid` is gone. The login shell reads the user's profile first; a
// test kills a command only after that, never halfway through someone's profile.
function runs(pid, prefix) {
  const cmdline = (dir) => readFileSync(`/proc/${dir}/cmdline`).toString().replaceAll('\0', ' ').trim()
  try {
    if (cmdline(pid).startsWith(prefix)) return true
  } catch {
    return true
  }
  for (const dir of readdirSync('/proc')) {
    if (!/^\d+$/.test(dir)) continue
    try {
      const stat = readFileSync(`/proc/${dir}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      if (ppid === pid && cmdline(dir).startsWith(prefix)) return true
    } catch {
      // the process ended while we looked
    }
  }
  return false
}

before(async () => {
  const binary = envdBinary()
  assert.ok(existsSync(binary), `berth-envd binary not found at ${binary}`)
  assert.equal(await healthy(), false, `something already answers on ${envdUrl}`)
  workdir = mkdtempSync(join(tmpdir(), 'berth-envd-js-'))
  envd = spawn(binary, ['--listen', '127.0.0.1:49983'], {
    cwd: workdir,
    env: { ...process.env, HOME: workdir },
    stdio: ['ignore', 'ignore', 'inherit'],
  })
  let exited = null
  envd.on('exit', (code, signal) => (exited = { code, signal }))
  await until(async () => {
    if (exited) throw new Error(`berth-envd exited during startup: ${JSON.stringify(exited)}`)
    return healthy()
  }, 'berth-envd /health', 60_000)
  sandbox = await Sandbox.create()
})

after(async () => {
  if (envd && envd.exitCode === null && envd.signalCode === null) {
    const exited = new Promise((r) => envd.once('exit', r))
    process.kill(envd.pid, 'SIGTERM')
    const timer = setTimeout(() => process.kill(envd.pid, 'SIGKILL'), 10_000)
    await exited
    clearTimeout(timer)
  }
  if (workdir) rmSync(workdir, { recursive: true, force: true })
})

test('commands.run returns output and exit code', async () => {
  const result = await sandbox.commands.run('echo hello; echo oops >&2')
  assert.equal(result.stdout, 'hello\n')
  assert.equal(result.stderr, 'oops\n')
  assert.equal(result.exitCode, 0)
})

test('commands.run rejects a non-zero exit with CommandExitError', async () => {
  await assert.rejects(sandbox.commands.run('exit 7'), (error) => {
    assert.ok(error instanceof CommandExitError)
    assert.equal(error.exitCode, 7)
    return true
  })
})

test('commands.run streams output and honours envs and cwd', async () => {
  const chunks = []
  const result = await sandbox.commands.run('echo "$GREETING from $(pwd)"', {
    envs: { GREETING: 'hi' },
    cwd: workdir,
    onStdout: (data) => chunks.push(data),
  })
  assert.equal(result.stdout, `hi from ${workdir}\n`)
  assert.equal(chunks.join(''), result.stdout)
})

test('background command is listed, killed and reports a failed exit', async () => {
  const handle = await sandbox.commands.run('sleep 300', { background: true })
  try {
    const listed = await sandbox.commands.list()
    assert.ok(listed.some((p) => p.pid === handle.pid), 'background command must be listed')
    await until(() => runs(handle.pid, 'sleep'), 'the command to run sleep')
    assert.equal(await sandbox.commands.kill(handle.pid), true)
    await assert.rejects(handle.wait(), CommandExitError)
    await until(
      async () => !(await sandbox.commands.list()).some((p) => p.pid === handle.pid),
      'the killed command to leave the list',
    )
  } finally {
    await until(() => runs(handle.pid, 'sleep'), 'the command to run sleep')
    await sandbox.commands.kill(handle.pid)
  }
})

test('files write, read and list', async () => {
  const dir = join(workdir, 'files-smoke')
  const info = await sandbox.files.write(join(dir, 'note.txt'), 'written by the JS SDK')
  assert.equal(info.path, join(dir, 'note.txt'))
  assert.equal(readFileSync(join(dir, 'note.txt'), 'utf8'), 'written by the JS SDK')
  writeFileSync(join(dir, 'other.bin'), Buffer.from([0, 1, 2, 255]))
  assert.equal(await sandbox.files.read(join(dir, 'note.txt')), 'written by the JS SDK')
  const bytes = await sandbox.files.read(join(dir, 'other.bin'), { format: 'bytes' })
  assert.deepEqual([...bytes], [0, 1, 2, 255])
  const entries = (await sandbox.files.list(dir)).map((e) => [e.name, e.type]).sort()
  assert.deepEqual(entries, [
    ['note.txt', 'file'],
    ['other.bin', 'file'],
  ])
})

test('pty runs input, resizes and is killed', async () => {
  let output = ''
  const decoder = new TextDecoder()
  const terminal = await sandbox.pty.create({
    cols: 80,
    rows: 24,
    timeoutMs: 0,
    onData: (data) => {
      output += decoder.decode(data, { stream: true })
    },
  })
  try {
    await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('echo js-$((6*7)) $(stty size)\n'))
    await until(() => output.includes('js-42 24 80'), 'PTY output')
    await sandbox.pty.resize(terminal.pid, { cols: 100, rows: 30 })
    await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('echo resized $(stty size)\n'))
    await until(() => output.includes('resized 30 100'), 'PTY output after resize')
    assert.equal(await sandbox.pty.kill(terminal.pid), true)
    const ended = await terminal.wait().then(
      (result) => result.exitCode,
      (error) => error.exitCode,
    )
    assert.notEqual(ended, 0)
  } finally {
    await sandbox.pty.kill(terminal.pid)
  }
})
