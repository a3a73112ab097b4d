// POST /v1/embeddings through the official openai SDK's embeddings call, against `gerbil serve` of an
// embedding model folder (argv[2]) and of a text generator (argv[3], answered 400). GERBIL: the binary.
// The numbers must be what `gerbil embed` prints for the same inputs (argv[4]: its JSON for
// ["Hello world", "a"]); tests/test_embed.c checks those against sentence-transformers.
import OpenAI from 'openai';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import assert from 'node:assert/strict';

const BIN = process.env.GERBIL || 'build/gerbil';
const [EMBED_MODEL, TEXT_MODEL, CLI_JSON] = process.argv.slice(2);
let failures = 0, passes = 0;

async function check(name, fn) {
  try { await fn(); passes++; console.log(`ok   ${name}`); }
  catch (e) { failures++; console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`); }
}

function startServer(model) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '--model', model, '--port', '0', '--alias', 'm'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    const timer = setTimeout(() => reject(new Error(`no "listening on" line in 60 s; stderr: ${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, url: m[1] }); }
    });
    p.stderr.on('data', (d) => { err += d; });
  });
}

function stop(s) { return new Promise((res) => { s.proc.on('exit', (code) => res(code)); s.proc.kill('SIGTERM'); }); }

const cli = JSON.parse(readFileSync(CLI_JSON, 'utf8'));
const close = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) <= 1e-6);

const s = await startServer(EMBED_MODEL);
const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none' });
await check('array of strings, floats, usage', async () => {
  const r = await client.embeddings.create({ model: 'm', input: ['Hello world', 'a'], encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, 2);
  assert.deepEqual(r.data.map((d) => d.index), [0, 1]);
  assert.equal(r.data[0].object, 'embedding');
  assert.ok(close(r.data[0].embedding, cli.embeddings[0]), 'input 0 differs from gerbil embed');
  assert.ok(close(r.data[1].embedding, cli.embeddings[1]), 'input 1 differs from gerbil embed');
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens);
});
await check('the SDK default (base64) decodes to the same floats', async () => {
  const r = await client.embeddings.create({ model: 'm', input: 'Hello world' });
  assert.ok(close(r.data[0].embedding, cli.embeddings[0]));
});
await check('dimensions: truncated and renormalised', async () => {
  const r = await client.embeddings.create({ model: 'm', input: 'Hello world', dimensions: 8, encoding_format: 'float' });
  const e = r.data[0].embedding, f = cli.embeddings[0].slice(0, 8), n = Math.hypot(...f);
  assert.equal(e.length, 8);
  assert.ok(close(e, f.map((x) => x / n)));
});
await check('token ids and arrays of them', async () => {
  const a = await client.embeddings.create({ model: 'm', input: [[9707, 1879, 151643], [64, 151643]], encoding_format: 'float' });
  const b = await client.embeddings.create({ model: 'm', input: [9707, 1879, 151643], encoding_format: 'float' });
  assert.equal(a.data.length, 2);
  assert.ok(close(a.data[0].embedding, b.data[0].embedding));
  assert.ok(close(a.data[0].embedding, cli.embeddings[0]), 'the ids of "Hello world<|endoftext|>" give its embedding');
});
await check('bad requests are 400 naming the problem', async () => {
  for (const [body, pat] of [[{ input: [] }, /non-empty/], [{ input: 'x', dimensions: 99 }, /out of range/],
                             [{ input: 'x', encoding_format: 'hex' }, /encoding_format/], [{ input: [[9707, 1e9]] }, /vocabulary/]]) {
    await assert.rejects(client.embeddings.create({ model: 'm', ...body }), (e) => e.status === 400 && pat.test(e.message));
  }
});
await check('chat on an embedding model: 400', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && /embedding model/.test(e.message));
});
assert.equal(await stop(s), 0);

const t = await startServer(TEXT_MODEL);
await check('a text generator: 400, not an embedding model', async () => {
  const c = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'none' });
  await assert.rejects(c.embeddings.create({ model: 'm', input: 'hi' }),
    (e) => e.status === 400 && /not an embedding model/.test(e.message));
});
assert.equal(await stop(t), 0);

console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
