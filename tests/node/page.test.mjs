// The chat page at GET / in a headless Chromium (Debian's chromium, driven by playwright-core):
// send a message, wait for the streamed answer and its tokens/s line, check that user text
// is shown as text (an HTML tag in it creates no element), that the conversation survives a
// reload (localStorage), and save a screenshot (SCREENSHOT, default build/serve-page.png).
import { chromium } from 'playwright-core';
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';

const BIN = process.env.GERBIL || 'build/gerbil';
const MODEL = '../shared/data/models/stories260K/hf';
const EXE = process.env.CHROMIUM || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));
const SHOT = process.env.SCREENSHOT || 'build/serve-page.png';
if (!EXE) { console.log('SKIPPED: no chromium (apt-get install chromium)'); process.exit(77); }

const srv = await new Promise((resolve, reject) => {
  const p = spawn(BIN, ['serve', '--model', MODEL, '--port', '0', '--alias', 'stories260K'],
                  { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, GERBIL_SERVE_STEP_DELAY_US: '3000' } });
  let out = '', err = '';
  p.stdout.on('data', (d) => { out += d; const m = out.match(/listening on (\S+)/); if (m) resolve({ p, url: m[1] }); });
  p.stderr.on('data', (d) => { err += d; });
  p.on('exit', (c) => reject(new Error(`gerbil serve exited ${c}: ${err}`)));
});

let failed = 0;
const browser = await chromium.launch({ executablePath: EXE, args: ['--no-sandbox', '--disable-gpu'] });
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(srv.url + '/');
  assert.equal(await page.title(), 'gerbil chat');
  await page.fill('#system', 'You tell short stories.');
  await page.fill('#temperature', '0');
  await page.fill('#max_tokens', '60');
  await page.fill('#input', 'Once upon a time <img src=x onerror="window.pwned=1"> there was');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.assistant .stats', { timeout: 30000 });
  const answer = await page.textContent('.msg.assistant');
  const stats = await page.textContent('.msg.assistant .stats');
  console.log('answer:', JSON.stringify(answer));
  console.log('stats:', stats);
  assert.ok(answer.replace(/^Assistant/, '').replace(stats, '').trim().length > 10, 'a streamed answer');
  assert.match(stats, /60 tokens, [0-9.]+ tokens\/s/);
  assert.equal(await page.locator('.msg.user img').count(), 0, 'user text is not parsed as HTML');
  assert.match(await page.textContent('.msg.user'), /<img src=x/);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  await page.screenshot({ path: SHOT });
  await page.reload();
  await page.waitForSelector('.msg.assistant');
  assert.equal(await page.locator('#convs li').count(), 1, 'the conversation is kept in localStorage');
  assert.deepEqual(errors, []);
  console.log(`ok: page streamed an answer; screenshot ${SHOT}`);
} catch (e) {
  failed = 1;
  console.log('FAIL', e);
} finally {
  await browser.close();
  srv.p.removeAllListeners('exit');
  srv.p.kill('SIGTERM');
}
process.exit(failed);
