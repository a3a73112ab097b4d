#!/usr/bin/env python3
"""MaskBench input for bench/maskbench.c: guidance-ai/jsonschemabench's maskbench/data/*.json
(checked out outside this repository) -> one JSON line per schema file:
{"id": FILE, "schema": SCHEMA_TEXT, "tests": [{"valid": bool, "text": INSTANCE}]}
where INSTANCE is json.dumps(data, indent=None, ensure_ascii=False), exactly as the
benchmark's runner.py serializes it.  usage: maskbench_prep.py DATA_DIR OUT.jsonl"""
import glob, json, os, sys

def main():
    data, out = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(data, "*.json")))
    with open(out, "w") as f:
        for p in files:
            with open(p) as g:
                d = json.load(g)
            tests = [{"valid": bool(t["valid"]), "text": json.dumps(t["data"], indent=None, ensure_ascii=False)}
                     for t in d.get("tests", [])]
            f.write(json.dumps({"id": os.path.basename(p), "schema": json.dumps(d["schema"]), "tests": tests},
                               ensure_ascii=False) + "\n")
    print(f"{len(files)} schemas -> {out}", file=sys.stderr)

if __name__ == "__main__":
    main()
