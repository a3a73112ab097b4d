// node validate.js SCHEMA.json OUT1.json [OUT2.json ...]
// Each OUT file holds one generated text: it must parse as JSON and validate against the
// schema (ajv in draft 2020-12 mode, with ajv-formats). Prints one line per file; exit 1 if any fails.
"use strict";
const fs = require("fs");
// the schemas in tests/grammar are draft 2020-12 (prefixItems, $defs)
const Ajv = require("ajv/dist/2020");
const addFormats = require("ajv-formats");
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const schema = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const validate = ajv.compile(schema);
let bad = 0;
for (const f of process.argv.slice(3)) {
  const text = fs.readFileSync(f, "utf8");
  let v;
  try {
    v = JSON.parse(text);
  } catch (e) {
    console.log(`FAIL ${f}: does not parse: ${e.message}: ${JSON.stringify(text)}`);
    bad++;
    continue;
  }
  if (!validate(v)) {
    console.log(`FAIL ${f}: ${ajv.errorsText(validate.errors)}: ${text}`);
    bad++;
  } else {
    console.log(`ok ${f}`);
  }
}
process.exit(bad ? 1 : 0);
