// The official JS code-interpreter SDK (@e2b/code-interpreter@2.8.0), unmodified,
// against a `code-interpreter-v1` sandbox of a real `berth up`, configured only by the
// SDK's own variables (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). berth_env.py starts
// that berth (building the template once in the suite's state dir) and sets them:
//
//   python3 tests/interpreter/berth_env.py run -- node --test tests/interpreter/js/
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'

for (const name of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_ACCESS_TOKEN']) delete process.env[name]
for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) throw new Error(`${name} is not set: run through tests/interpreter/berth_env.py run`)
}

const { Sandbox, NotFoundError, SandboxError, TimeoutError } = await import('@e2b/code-interpreter')

let sandbox

before(async () => {
  sandbox = await Sandbox.create({ envs: { BERTH_SANDBOX_VAR: 'from-the-sandbox' }, timeoutMs: 1_800_000 })
})

after(async () => {
  await sandbox?.kill()
})

test('results, text and state across calls', async () => {
  const first = await sandbox.runCode('x = 1; x += 1; x')
  assert.equal(first.text, '2')
  assert.equal((await sandbox.runCode('x * 10')).text, '20')
})

test('callbacks arrive in order while the code runs', async () => {
  const seen = []
  const started = Date.now()
  const execution = await sandbox.runCode(
    "import sys, time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('warn', file=sys.stderr, flush=True)\ndisplay('shown')\nraise ValueError('late')",
    {
      onStdout: (m) => seen.push(['stdout', m.line, Date.now()]),
      onStderr: (m) => seen.push(['stderr', m.line, Date.now()]),
      onResult: (r) => seen.push(['result', r.text, Date.now()]),
      onError: (e) => seen.push(['error', e.name, Date.now()]),
    },
  )
  const finished = Date.now()
  assert.deepEqual(seen.map((s) => s[0]), ['stdout', 'stderr', 'result', 'error'])
  assert.equal(seen[0][1], 'first\n')
  assert.ok(seen[0][2] - started < finished - started - 1000, 'stdout was not streamed')
  assert.equal(execution.error.name, 'ValueError')
  assert.match(execution.error.traceback, /raise ValueError/)
})

test('execution count and display outputs', async () => {
  const a = await sandbox.runCode('1')
  const b = await sandbox.runCode("from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\ndisplay(HTML('<b>y</b>'))\n3")
  assert.equal(b.executionCount, a.executionCount + 1)
  assert.deepEqual(b.results.map((r) => [r.html, r.isMainResult]), [['<b>x</b>', false], ['<b>y</b>', false], [undefined, true]])
  assert.equal(b.text, '3')
})

test('matplotlib chart data and DataFrames', async () => {
  const plot = await sandbox.runCode(
    "import matplotlib.pyplot as plt\nplt.figure()\nplt.bar(['a', 'b'], [1, 2], label='g')\nplt.title('T')\nplt.show()",
  )
  const result = plot.results[0]
  assert.ok(result.png)
  assert.equal(result.chart.type, 'bar')
  assert.equal(result.chart.title, 'T')
  assert.deepEqual(result.chart.elements.map((e) => [e.label, e.value, e.group]), [['a', 1, 'g'], ['b', 2, 'g']])
  const frame = await sandbox.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  assert.match(frame.results[0].html, /<table/)
  assert.deepEqual(frame.results[0].data, { a: [1, 2] })
})

test('languages have their own state; env vars per call do not leak', async () => {
  for (const [language, setup, read, expected] of [
    ['js', 'var n = 41', 'n + 1', '42'],
    ['ts', 'const t: number = 41', 't + 1', '42'],
    ['r', 'n <- 41', 'n + 1', '[1] 42'],
  ]) {
    await sandbox.runCode(setup, { language })
    const execution = await sandbox.runCode(read, { language })
    assert.equal(execution.results[0].text.trim(), expected, language)
  }
  assert.deepEqual((await sandbox.runCode('N=5; echo $((N+1))', { language: 'bash' })).logs.stdout, ['6\n'])
  assert.equal((await sandbox.runCode('process.env.FOO', { language: 'js', envs: { FOO: 'bar' } })).text, 'bar')
  assert.equal((await sandbox.runCode("process.env.FOO || 'default'", { language: 'js' })).text, 'default')
  assert.equal((await sandbox.runCode("import os; os.getenv('FOO', 'default')", { envs: { FOO: 'py' } })).text, 'py')
  assert.equal((await sandbox.runCode("import os; os.getenv('FOO', 'default')")).text, 'default')
  assert.equal((await sandbox.runCode('process.env.BERTH_SANDBOX_VAR', { language: 'js' })).text, 'from-the-sandbox')
})

test('contexts: cwd, list, restart, remove', async () => {
  const cwd = (await sandbox.runCode('import tempfile; tempfile.mkdtemp()')).text
  const context = await sandbox.createCodeContext({ language: 'python', cwd })
  assert.equal(context.cwd, cwd)
  assert.equal((await sandbox.runCode('import os; os.getcwd()', { context })).text, cwd)
  const js = await sandbox.createCodeContext({ language: 'js', cwd })
  assert.equal((await sandbox.runCode('process.cwd()', { context: js })).text, cwd)
  const listed = await sandbox.listCodeContexts()
  assert.ok(listed.some((c) => c.id === context.id))
  assert.ok(['python', 'javascript'].every((l) => listed.some((c) => c.language === l)))
  await sandbox.runCode('kept = 1', { context })
  await sandbox.restartCodeContext(context)
  assert.equal((await sandbox.runCode('kept', { context })).error.name, 'NameError')
  await sandbox.removeCodeContext(context)
  await sandbox.removeCodeContext(js.id)
  assert.ok(!(await sandbox.listCodeContexts()).some((c) => c.id === context.id))
  await assert.rejects(sandbox.runCode('1', { context }), NotFoundError)
})

test('timeout interrupts a busy loop and the context stays usable', async () => {
  await sandbox.runCode('survivor = 7')
  await assert.rejects(sandbox.runCode('while True:\n    pass', { timeoutMs: 2000 }), TimeoutError)
  assert.equal((await sandbox.runCode('survivor * 6', { timeoutMs: 30_000 })).text, '42')
})

test('an unknown language is a 4xx error', async () => {
  await assert.rejects(sandbox.runCode('1', { language: 'cobol' }), (error) => error instanceof SandboxError && /400/.test(error.message))
})
