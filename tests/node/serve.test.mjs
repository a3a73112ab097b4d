// gerbil serve against the official openai SDK, on stories260K. Starts the server itself
// on a free port (GERBIL: the binary; run from the repository root) and stops it with
// SIGTERM, which must exit 0. Every check names what it expected.
import OpenAI from 'openai';
import { spawn, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';

const BIN = process.env.GERBIL || 'build/gerbil';
const MODEL = '../shared/data/models/stories260K/hf';
const KEY = 'test-key-123';
let failures = 0, passes = 0;

async function check(name, fn) {
  try {
    await fn();
    passes++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

function startServer(args, env = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '--model', MODEL, '--port', '0', '--alias', 'stories260K', ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    const timer = setTimeout(() => reject(new Error(`no "listening on" line in 60 s; stderr: ${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, url: m[1], stderr: () => err }); }
    });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => { clearTimeout(timer); reject(new Error(`gerbil serve exited ${code}: ${err}`)); });
  });
}

function stopServer(s) {
  return new Promise((resolve) => {
    s.proc.removeAllListeners('exit');
    s.proc.on('exit', (code, sig) => resolve({ code, sig }));
    s.proc.kill('SIGTERM');
  });
}

async function metrics(url) {
  const r = await fetch(url + '/metrics', { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200);
  const text = await r.text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, get };
}

const srv = await startServer(['--api-key', KEY, '--parallel', '2', '--queue', '1', '--max-body', '4096'],
                              { GERBIL_SERVE_STEP_DELAY_US: '5000' });
const base = srv.url + '/v1';
const client = new OpenAI({ baseURL: base, apiKey: KEY, maxRetries: 0 });

await check('GET /v1/models lists the alias', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['stories260K']);
});

await check('GET /health is ok without a key', async () => {
  const r = await fetch(srv.url + '/health');
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { status: 'ok' });
});

await check('completions continue the prompt exactly as `gerbil run --raw` (leading space kept)', async () => {
  const ref = JSON.parse(execFileSync(BIN, ['run', '--raw', '--json', '--model', MODEL, '--temperature', '0', '-n', '20',
                                            'The little dog'], { encoding: 'utf8' }));
  const r = await client.completions.create({ model: 'stories260K', prompt: 'The little dog', max_tokens: 20,
                                             temperature: 0 });
  assert.equal(r.choices[0].text, ref.text);
  assert.ok(r.choices[0].text.startsWith(' '), `text starts with a space: ${JSON.stringify(r.choices[0].text)}`);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, ref.n_prompt);
  assert.equal(r.usage.completion_tokens, 20);
});

await check('completions from token ids, with echo, and a list of prompts', async () => {
  const r = await client.completions.create({ model: 'stories260K', prompt: [1, 291, 376, 400, 428], max_tokens: 5,
                                             temperature: 0, echo: true });
  assert.ok(r.choices[0].text.startsWith('The little dog was'), JSON.stringify(r.choices[0].text));
  const two = await client.completions.create({ model: 'stories260K', prompt: ['Once upon', 'The cat'], max_tokens: 4,
                                               temperature: 0 });
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
});

const messages = [{ role: 'user', content: 'Once upon a time' }];
let nonStream;
await check('chat completion (not streamed): content, finish_reason, usage', async () => {
  nonStream = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 0 });
  const c = nonStream.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0);
  assert.equal(c.finish_reason, 'length');
  assert.equal(nonStream.usage.completion_tokens, 12);
  assert.equal(nonStream.usage.total_tokens, nonStream.usage.prompt_tokens + 12);
});

await check('chat completion streamed: the deltas join to the same text; usage chunk', async () => {
  const stream = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 0,
                                                        stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text += c.delta.content || '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, nonStream.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.ok(usage && usage.completion_tokens === 12, `usage ${JSON.stringify(usage)}`);
  assert.ok(chunks >= 3, `${chunks} chunks`);
});

await check('logprobs: one entry per token, top_logprobs sorted, greedy picks the best', async () => {
  const r = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 6, temperature: 0,
                                                   logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 6);
  for (const e of lp) {
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.logprob <= 0);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6, 'greedy token is the top one');
  }
  const p = lp.reduce((s, e) => s + Math.exp(e.top_logprobs.reduce((a, t) => Math.max(a, t.logprob), -1e9)), 0);
  assert.ok(p > 0);
});

await check('seeded sampling repeats; n choices', async () => {
  const req = { model: 'stories260K', messages, max_tokens: 10, temperature: 1.0, seed: 42, n: 2 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices.length, 2);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
});

async function expectError(fn, cls, status) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e}`);
    assert.equal(e.status, status);
    assert.ok(e.error && typeof e.error.message === 'string', 'an OpenAI-shaped error body');
    return e;
  }
  assert.fail(`expected ${cls.name} (${status}), the call succeeded`);
}

await check('400 BadRequestError: wrong type, over the context (message has the numbers)', async () => {
  await expectError(() => client.chat.completions.create({ model: 'stories260K', messages, temperature: 'hot' }),
                    OpenAI.BadRequestError, 400);
  const e = await expectError(() => client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 100000 }),
                              OpenAI.BadRequestError, 400);
  assert.match(e.error.message, /512/);
  assert.match(e.error.message, /100000/);
});

await check('401 AuthenticationError: bad key', async () => {
  const bad = new OpenAI({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
  await expectError(() => bad.models.list(), OpenAI.AuthenticationError, 401);
});

await check('404 NotFoundError: unknown model and unknown route', async () => {
  await expectError(() => client.chat.completions.create({ model: 'gpt-17', messages }), OpenAI.NotFoundError, 404);
  const r = await fetch(srv.url + '/v2/nothing', { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 404);
});

await check('413: a body over --max-body', async () => {
  const e = await expectError(() => client.completions.create({ model: 'stories260K', prompt: 'x'.repeat(8000) }),
                              OpenAI.APIError, 413);
  assert.match(e.error.message, /4096/);
});

await check('429 RateLimitError with Retry-After when sequences + queue are full', async () => {
  const long = () => client.completions.create({ model: 'stories260K', prompt: 'Once', max_tokens: 60, temperature: 0,
                                                  ignore_eos: true });
  const results = await Promise.allSettled([long(), long(), long(), long(), long()]);
  const rejected = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
  assert.ok(rejected.length >= 1, 'at least one refused');
  for (const e of rejected) {
    assert.ok(e instanceof OpenAI.RateLimitError, `${e}`);
    assert.equal(e.headers['retry-after'], '1');
  }
  assert.ok(results.filter((r) => r.status === 'fulfilled').length >= 3, '2 running + 1 queued finished');
});

await check('AbortController cancels mid-stream; /metrics shows the slot and its blocks freed', async () => {
  const before = await metrics(srv.url);
  const ac = new AbortController();
  const stream = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 400,
                                                        temperature: 0, ignore_eos: true, stream: true },
                                                      { signal: ac.signal });
  let got = 0, aborted = false;
  try {
    for await (const ch of stream) {
      if (ch.choices.length && ch.choices[0].delta.content) got++;
      if (got === 3) ac.abort();
    }
  } catch (e) {
    aborted = e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError';
  }
  assert.ok(aborted || got === 3, 'the stream ended by the abort');
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(srv.url);
    if (m.get('gerbil_requests_running') === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(m.get('gerbil_requests_running'), 0, 'no request running');
  assert.equal(m.get('gerbil_sequences_running'), 0, 'no sequence holds blocks');
  assert.equal(m.get('gerbil_kv_blocks_free') + m.get('gerbil_prefix_cache_blocks'), m.get('gerbil_kv_blocks_total'),
               'every block is free or kept by the prefix cache');
  const generated = m.get('gerbil_generation_tokens_total') - before.get('gerbil_generation_tokens_total');
  assert.ok(generated < 400, `the cancelled request stopped early (${generated} of 400 tokens)`);
});

await check('/metrics: Prometheus text with requests by status, histograms, prefix cache', async () => {
  const m = await metrics(srv.url);
  assert.match(m.text, /^gerbil_http_requests_total\{status="200"\} [1-9]/m);
  assert.match(m.text, /^gerbil_http_requests_total\{status="429"\} [1-9]/m);
  assert.match(m.text, /^# TYPE gerbil_time_to_first_token_seconds histogram$/m);
  assert.match(m.text, /^gerbil_inter_token_latency_seconds_count [1-9]/m);
  assert.ok(m.get('gerbil_prefix_cache_hit_rate') >= 0);
});

await check('/tokenize and /detokenize (llama.cpp shapes)', async () => {
  const h = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };
  const t = await (await fetch(srv.url + '/tokenize', { method: 'POST', headers: h,
                                                         body: JSON.stringify({ content: 'The little dog' }) })).json();
  assert.deepEqual(t.tokens, [291, 376, 400, 428]);
  const d = await (await fetch(srv.url + '/detokenize', { method: 'POST', headers: h,
                                                           body: JSON.stringify({ tokens: t.tokens }) })).json();
  assert.equal(d.content, 'The little dog');
});

let exit;
await check('SIGTERM mid-stream: the stream ends with a last chunk and [DONE], the server exits 0', async () => {
  const stream = await client.completions.create({ model: 'stories260K', prompt: 'Once', max_tokens: 400,
                                                   temperature: 0, ignore_eos: true, stream: true });
  let got = 0, finish = null, stopping = null;
  for await (const ch of stream) {
    got++;
    if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    if (got === 2) stopping = stopServer(srv);
  }
  exit = await stopping;
  assert.equal(finish, 'abort', 'the stream was ended by the shutdown, with a finish_reason');
  assert.ok(got < 400);
  assert.equal(exit.sig, null);
  assert.equal(exit.code, 0, srv.stderr());
});
if (!exit) exit = await stopServer(srv);

console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
