// Structured output and tool calling in gerbil serve, through the official openai SDK, on
// stories260K (../shared/data): response_format json_schema / json_object outputs validate with
// ajv (tests/grammar-node's), a bad schema is a 400 naming the keyword, a constrained request
// inside a busy batch gets the tokens it gets alone, forced tool calls (tool_choice named and
// required) come back as tool_calls whose arguments validate against the function's schema,
// streamed and not, under every chat template in ../shared/data that defines tools (the model
// folder is stories260K with that template beside it), and a tool result round-trips through
// Qwen3's template exactly as `gerbil template` renders it. GERBIL: the binary; run from the
// repository root.
import OpenAI from 'openai';
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const requireAjv = createRequire(new URL('../grammar-node/package.json', import.meta.url));
const Ajv = requireAjv('ajv').default || requireAjv('ajv');
const ajv = new Ajv({ strict: false, allErrors: true });

const BIN = process.env.GERBIL || 'build/gerbil';
const STORIES = '../shared/data/models/stories260K/hf';
const TEMPLATES = '../shared/data/tokenizers/chat_templates';
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

function startServer(model, args = []) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '--model', model, '--port', '0', '--alias', 'm', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    const timer = setTimeout(() => reject(new Error(`no "listening on" line in 60 s; stderr: ${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, url: m[1] }); }
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

// stories260K with another chat template beside it
function withTemplate(file) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gerbil-tools-'));
  for (const f of fs.readdirSync(STORIES)) fs.symlinkSync(path.resolve(STORIES, f), path.join(dir, f));
  fs.copyFileSync(path.join(TEMPLATES, file), path.join(dir, 'chat_template.jinja'));
  return dir;
}

const personSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    pets: { type: 'array', items: { enum: ['cat', 'dog'] }, maxItems: 2 },
  },
  required: ['name', 'age'],
  additionalProperties: false,
};
const weatherParams = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
  required: ['city', 'days'],
  additionalProperties: false,
};
const timeParams = {
  type: 'object',
  properties: { zone: { enum: ['UTC', 'CET', 'PST'] } },
  required: ['zone'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather forecast', parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', description: 'The time in a zone', parameters: timeParams } },
];
const validators = { get_weather: ajv.compile(weatherParams), get_time: ajv.compile(timeParams) };
const messages = [{ role: 'user', content: 'Once upon a time' }];

function checkCalls(calls, names, where) {
  assert.ok(Array.isArray(calls) && calls.length >= 1, `${where}: tool_calls ${JSON.stringify(calls)}`);
  for (const c of calls) {
    assert.equal(c.type, 'function', where);
    assert.match(c.id, /^call_/, where);
    assert.ok(names.includes(c.function.name), `${where}: called ${c.function.name}, want one of ${names}`);
    const args = JSON.parse(c.function.arguments);
    const v = validators[c.function.name];
    assert.ok(v(args), `${where}: arguments ${c.function.arguments} do not validate: ${ajv.errorsText(v.errors)}`);
  }
}

// a streamed chat completion, accumulated as an OpenAI client does
async function streamed(client, body) {
  const s = await client.chat.completions.create({ ...body, stream: true });
  let content = '', finish = null;
  const calls = [];
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.content) content += c.delta.content;
    for (const tc of c.delta.tool_calls || []) {
      const k = tc.index;
      calls[k] = calls[k] || { id: '', type: 'function', function: { name: '', arguments: '' } };
      if (tc.id) calls[k].id = tc.id;
      if (tc.function?.name) calls[k].function.name += tc.function.name;
      if (tc.function?.arguments) calls[k].function.arguments += tc.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, calls, finish };
}

async function forcedCalls(client, where) {
  for (const seed of [1, 2]) {
    const body = { model: 'm', messages, tools, max_tokens: 300, temperature: 1, seed,
                   tool_choice: { type: 'function', function: { name: 'get_weather' } } };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `${where} seed ${seed}: ${JSON.stringify(c)}`);
    checkCalls(c.message.tool_calls, ['get_weather'], `${where} named seed ${seed}`);
    assert.equal(c.message.tool_calls.length, 1);
    const s = await streamed(client, body);
    assert.equal(s.finish, 'tool_calls', `${where} streamed`);
    checkCalls(s.calls, ['get_weather'], `${where} streamed`);
    assert.equal(s.calls[0].function.arguments, c.message.tool_calls[0].function.arguments, `${where}: streamed = not streamed`);
    assert.equal(s.content, '', `${where}: no content beside a forced call`);
  }
  const r = await client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 300, temperature: 1, seed: 5,
                                                   tool_choice: 'required', parallel_tool_calls: false });
  assert.equal(r.choices[0].finish_reason, 'tool_calls', `${where} required`);
  checkCalls(r.choices[0].message.tool_calls, ['get_weather', 'get_time'], `${where} required`);
  assert.equal(r.choices[0].message.tool_calls.length, 1, `${where}: parallel_tool_calls false gives one call`);
}

const srv = await startServer(STORIES, ['--parallel', '16']);
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0 });

await check('response_format json_schema: every finished output validates (stream and not)', async () => {
  const validate = ajv.compile(personSchema);
  let finished = 0;
  for (let seed = 1; seed <= 6; seed++) {
    const body = { model: 'm', messages, max_tokens: 200, temperature: 1, seed,
                   response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema, strict: true } } };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    const s = await streamed(client, body);
    assert.equal(s.content, c.message.content, 'streamed text = non-streamed text');
    if (c.finish_reason !== 'stop') continue;
    finished++;
    const doc = JSON.parse(c.message.content);
    assert.ok(validate(doc), `${c.message.content}: ${ajv.errorsText(validate.errors)}`);
  }
  assert.ok(finished >= 3, `only ${finished} of 6 finished within 200 tokens`);
});

await check('response_format json_object, and llama.cpp json_schema / grammar fields', async () => {
  const r = await client.chat.completions.create({ model: 'm', messages, max_tokens: 200, temperature: 0.8, seed: 4,
                                                   response_format: { type: 'json_object' } });
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v && !Array.isArray(v));
  } else {
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.match(r.choices[0].message.content, /^\s?\{/);
  }
  const g = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 40, temperature: 1, seed: 2, grammar: 'root ::= "yes" | "no"' }) });
  const gj = await g.json();
  assert.ok(['yes', 'no'].includes(gj.choices[0].text), JSON.stringify(gj));
  assert.equal(gj.choices[0].finish_reason, 'stop');
  const js = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Tom', max_tokens: 40, temperature: 1, seed: 2, json_schema: { enum: [1, 2, 3] } }) });
  const jj = await js.json();
  assert.ok([1, 2, 3].includes(JSON.parse(jj.choices[0].text)), JSON.stringify(jj));
});

await check('a schema that cannot be enforced is a 400 naming the keyword', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: { required: ['a'] } } } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /"not"/.test(e.message) && e.param === 'response_format');
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { enum: [] } } } }),
    (e) => e instanceof OpenAI.BadRequestError && /allows no output/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, grammar: 'root ::= undefined_rule' }),
    (e) => e instanceof OpenAI.BadRequestError && /undefined_rule/.test(e.message) && e.param === 'grammar');
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, response_format: { type: 'xml' } }),
    (e) => e instanceof OpenAI.BadRequestError && /response_format/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, tools,
      tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e instanceof OpenAI.BadRequestError && /'nope'/.test(e.message) && e.param === 'tool_choice');
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, tool_choice: 'required' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice');
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, tools: [{ type: 'function', function: {} }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools');
  await assert.rejects(client.chat.completions.create({ model: 'm', messages, max_tokens: 8, tools,
      tool_choice: 'required', response_format: { type: 'json_object' } }),
    (e) => e instanceof OpenAI.BadRequestError && /one constraint/.test(e.message));
  const bad = [{ role: 'user', content: 'x' }, { role: 'assistant', content: null,
    tool_calls: [{ id: 'c', type: 'function', function: { name: 'get_time', arguments: '{not json' } }] }];
  await assert.rejects(client.chat.completions.create({ model: 'm', messages: bad, max_tokens: 8 }),
    (e) => e instanceof OpenAI.BadRequestError && /get_time/.test(e.message));
});

await check('a constrained request inside a busy batch gets the tokens it gets alone', async () => {
  const body = (seed) => ({ model: 'm', messages: [{ role: 'user', content: `Lily had ${seed} cats` }], max_tokens: 120,
    temperature: 0.9, seed, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: personSchema } } });
  const alone = [];
  for (let i = 0; i < 4; i++) alone.push((await client.chat.completions.create(body(i))).choices[0].message.content);
  const busy = [];
  for (let i = 0; i < 4; i++) busy.push(client.chat.completions.create(body(i)));
  for (let i = 0; i < 8; i++) busy.push(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `Tom ${i}` }],
                                                                        max_tokens: 60, temperature: 0 }));
  for (let i = 0; i < 8; i++) busy.push(client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 100, seed: i,
                                                                        tool_choice: 'required', temperature: 1 }));
  const got = await Promise.all(busy);
  for (let i = 0; i < 4; i++) assert.equal(got[i].choices[0].message.content, alone[i], `request ${i} alone vs in the batch`);
  const m = await (await fetch(srv.url + '/metrics')).text();
  assert.ok(+m.match(/^gerbil_grammar_masks_total (\d+)/m)[1] > 0, 'masks counted in /metrics');
});

await check('stories260K (no template: Hermes): forced tool calls, named and required, streamed and not', async () => {
  await forcedCalls(client, 'no template');
});

await check('tool_choice auto/none: text that is no call stays content', async () => {
  for (const tool_choice of ['auto', 'none', undefined]) {
    const r = await client.chat.completions.create({ model: 'm', messages, tools, tool_choice, max_tokens: 30, temperature: 0 });
    assert.ok(!r.choices[0].message.tool_calls, JSON.stringify(r.choices[0]));
    assert.ok(r.choices[0].message.content.length > 0);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  }
});
const st = await stopServer(srv);
await check('the server stops cleanly', async () => assert.equal(st.code, 0, JSON.stringify(st)));

// every template family that defines tools
for (const [file, name] of [['Qwen-Qwen3-0.6B.jinja', 'Qwen3 (Hermes)'], ['Qwen3.5-4B.jinja', 'Qwen3.5 (XML)'],
                            ['meta-llama-Llama-3.1-8B-Instruct.jinja', 'Llama 3.1 (JSON)'],
                            ['meta-llama-Llama-3.2-3B-Instruct.jinja', 'Llama 3.2 (JSON)'],
                            ['google-gemma-4-31B-it.jinja', 'Gemma 4 (unparsed: forced calls as Hermes)']]) {
  const dir = withTemplate(file);
  let s;
  try {
    s = await startServer(dir, ['--ctx-size', '2048', '--parallel', '2']);
    const c = new OpenAI({ baseURL: s.url + '/v1', apiKey: 'none', maxRetries: 0 });
    await check(`${name}: forced tool calls parse and validate`, async () => forcedCalls(c, name));
    await check(`${name}: a tool result round-trips through the template`, async () => {
      const hist = [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
          function: { name: 'get_weather', arguments: '{"city":"Paris","days":1}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
      ];
      const r = await c.chat.completions.create({ model: 'm', messages: hist, tools, max_tokens: 4, temperature: 0 });
      // the prompt is the template rendered with the history (arguments as an object, as transformers passes them)
      const mf = path.join(dir, 'm.json'), tf = path.join(dir, 't.json');
      const asTemplate = hist.map((m) => m.tool_calls ? { ...m, content: '', tool_calls: m.tool_calls.map((t) =>
        ({ ...t, function: { ...t.function, arguments: JSON.parse(t.function.arguments) } })) } : m);
      fs.writeFileSync(mf, JSON.stringify(asTemplate));
      fs.writeFileSync(tf, JSON.stringify(tools));
      const rendered = execFileSync(BIN, ['template', '--model', dir, '--messages', mf, '--tools', tf, '--add-generation-prompt'],
                                    { encoding: 'utf8' });
      assert.match(rendered, /temp\\?": 21/, 'the tool result is in the prompt'); // Llama's template writes it as a JSON string
      assert.ok(rendered.includes('get_weather') && rendered.includes('Paris'), 'the call is in the prompt');
      const tok = await (await fetch(s.url + '/tokenize', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                           body: JSON.stringify({ content: rendered }) })).json();
      assert.equal(r.usage.prompt_tokens, tok.tokens.length, 'prompt tokens = the rendered template tokenized');
    });
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  } finally {
    if (s) await stopServer(s);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
