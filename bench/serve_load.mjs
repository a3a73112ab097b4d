// Load test for an OpenAI-compatible server (gerbil serve, or llama-server for comparison).
//
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 [--streams 64] [--duration 600]
//        [--max-tokens 64] [--prompts 16] [--ids] [--check] [--pid PID] [--model NAME] [--json]
//        [--json-schema FILE]
//
// N clients each stream completions back to back for --duration seconds (greedy, ignore_eos,
// max_tokens each). Reports aggregate generated tokens/s, p50/p99 time to first token and
// inter-token latency, errors. --check first runs every prompt alone and then requires each
// stream's text to equal its solo run (batch invariance under load). --pid reads that
// process's resident memory after the warm-up (a fifth of the run, at most 30 s) and at the end. --ids sends token-id prompts
// (models without a tokenizer). At the end (gerbil) /metrics must show no running request and
// every KV block free or kept by the prefix cache. --json-schema constrains every stream with
// response_format json_schema (the schema in FILE): a stream then ends where its JSON does, so
// tokens are counted from usage, and gerbil's /metrics gives the mean grammar-mask time per
// token. Uses only Node's built-in fetch.
import fs from 'node:fs';

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf('--' + name);
  if (i < 0) return dflt;
  return typeof dflt === 'boolean' ? true : args[i + 1];
};
const URL_ = opt('url', 'http://127.0.0.1:8080');
const STREAMS = +opt('streams', 64), DURATION = +opt('duration', 600), MAXTOK = +opt('max-tokens', 64);
const NPROMPTS = +opt('prompts', 16), CHECK = opt('check', false), IDS = opt('ids', false), JSON_OUT = opt('json', false);
const PID = opt('pid', null), MODEL = opt('model', undefined), KEY = process.env.GERBIL_API_KEY;
const SCHEMA_FILE = opt('json-schema', null);
const SCHEMA = SCHEMA_FILE ? JSON.parse(fs.readFileSync(SCHEMA_FILE, 'utf8')) : null;
const headers = { 'Content-Type': 'application/json', ...(KEY ? { Authorization: `Bearer ${KEY}` } : {}) };

const names = ['Tom', 'Lily', 'Ben', 'Sue', 'Max', 'Anna', 'Sam', 'Mia', 'Tim', 'Zoe', 'Bob', 'Amy', 'Jack', 'Lucy', 'Leo', 'Eve'];
const prompts = [];
for (let i = 0; i < NPROMPTS; i++) {
  if (IDS) prompts.push(Array.from({ length: 8 + (i * 7) % 40 }, (_, k) => 1 + ((i + 1) * 7919 * (k + 3)) % 1000));
  else prompts.push(`Once upon a time, ${names[i % names.length]} went to the ${['park', 'sea', 'shop', 'forest'][i % 4]}` +
                    (i >= names.length ? ` with ${names[(i * 5) % names.length]}` : ''));
}

function rss(pid) {
  try {
    const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
    return m ? +m[1] / 1024 : NaN;
  } catch (e) { return NaN; }
}

async function stream(prompt, onToken) {
  const t0 = performance.now();
  const body = { prompt, max_tokens: MAXTOK, temperature: 0, ignore_eos: true, stream: true, cache_prompt: true };
  if (MODEL) body.model = MODEL;
  if (SCHEMA) {
    body.response_format = { type: 'json_schema', json_schema: { name: 'bench', schema: SCHEMA } };
    body.stream_options = { include_usage: true };
  }
  const r = await fetch(URL_ + '/v1/completions', { method: 'POST', headers, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', text = '', first = 0, last = 0, n = 0, usage = null;
  const gaps = [];
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ')) continue;
      const d = ev.slice(6);
      if (d === '[DONE]') continue;
      const j = JSON.parse(d);
      if (j.error) throw new Error(j.error.message);
      if (j.usage) usage = j.usage;
      const c = (j.choices || [])[0];
      if (!c) continue;
      const piece = c.text || '';
      if (piece.length || c.finish_reason == null) {
        const now = performance.now();
        if (!first) first = now; else gaps.push(now - last);
        last = now;
        n++;
      }
      text += piece;
    }
  }
  return { text, ttft: first - t0, gaps, chunks: n, tokens: usage ? usage.completion_tokens : MAXTOK };
}

function pct(a, p) {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
}

const solo = [];
if (CHECK) for (const p of prompts) solo.push((await stream(p)).text);
let rssStart = NaN; /* after the warm-up: a fifth of the run, at most 30 s */
if (PID) setTimeout(() => { rssStart = rss(PID); }, Math.min(30, DURATION / 5) * 1000);
const tEnd = performance.now() + DURATION * 1000;
let done = 0, errors = 0, mismatches = 0, genTokens = 0;
const ttfts = [], itls = [], errSamples = [];
const t0 = performance.now();
await Promise.all(Array.from({ length: STREAMS }, async (_, c) => {
  for (let it = 0; performance.now() < tEnd; it++) {
    const i = (c + it * STREAMS) % prompts.length;
    try {
      const r = await stream(prompts[i]);
      done++;
      genTokens += r.tokens;
      ttfts.push(r.ttft);
      itls.push(...r.gaps);
      if (CHECK && r.text !== solo[i]) {
        mismatches++;
        if (errSamples.length < 3) errSamples.push(`prompt ${i}: ${JSON.stringify(r.text)} != ${JSON.stringify(solo[i])}`);
      }
    } catch (e) {
      errors++;
      if (errSamples.length < 3) errSamples.push(String(e.message || e));
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
const rssEnd = PID ? rss(PID) : NaN;
let kv = null;
try {
  const m = await (await fetch(URL_ + '/metrics', { headers })).text();
  const g = (n) => { const x = m.match(new RegExp(`^${n} ([0-9.e+-]+)$`, 'm')); return x ? +x[1] : NaN; };
  if (!Number.isNaN(g('gerbil_kv_blocks_total')))
    kv = { running: g('gerbil_requests_running'), free: g('gerbil_kv_blocks_free'), cached: g('gerbil_prefix_cache_blocks'),
           total: g('gerbil_kv_blocks_total'), prefix_hit_rate: g('gerbil_prefix_cache_hit_rate') };
  if (kv && g('gerbil_grammar_masks_total') > 0)
    kv.mask_us_per_token = +(g('gerbil_grammar_mask_seconds_total') / g('gerbil_grammar_masks_total') * 1e6).toFixed(1);
} catch (e) {}
const res = {
  streams: STREAMS, seconds: +wall.toFixed(1), requests: done, errors, mismatches: CHECK ? mismatches : null,
  gen_tokens_per_s: +(genTokens / wall).toFixed(1),
  ttft_ms: { p50: +pct(ttfts, 50).toFixed(1), p99: +pct(ttfts, 99).toFixed(1) },
  itl_ms: { p50: +pct(itls, 50).toFixed(2), p99: +pct(itls, 99).toFixed(2) },
  rss_mib: PID ? { start: +rssStart.toFixed(1), end: +rssEnd.toFixed(1) } : null,
  kv, samples: errSamples,
};
const kvOk = !kv || (kv.running === 0 && kv.free + kv.cached === kv.total);
if (JSON_OUT) console.log(JSON.stringify(res));
else console.log(JSON.stringify(res, null, 1));
process.exit(errors || (CHECK && mismatches) || !kvOk ? 1 : 0);
