#!/usr/bin/env bash
# What gerbil does on a terminal, driven through a pseudo-terminal (python3's pty):
# `chat` edits lines and keeps a history through libedit (Backspace, Up, Ctrl-A/Ctrl-E),
# Ctrl-C at the prompt does not quit, Ctrl-D does; prompt-processing progress
# ("prompt: done/total tokens, tok/s") shows on a terminal only, and not with -q.
set -u
G=${GERBIL:?set GERBIL to the gerbil binary}
D=../shared/data/models/stories260K
if [ ! -f $D/hf/tokenizer.json ]; then echo "SKIPPED: $D absent (shared test data)"; exit 77; fi
command -v python3 >/dev/null || { echo "SKIPPED: python3 needed for the pseudo-terminal"; exit 77; }
python3 -c "import pty" 2>/dev/null || { echo "SKIPPED: python3 has no pty module"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }

# drive.py OUT KEYS... -- CMD...: run CMD on a pseudo-terminal, send each KEYS (Python
# escapes) after the ">>> " prompt shows (or at once for a command without one), save
# all it printed to OUT, exit with its exit code
cat > "$T/drive.py" <<'EOF'
import os, pty, select, sys, time
out_path = sys.argv[1]
sep = sys.argv.index("--")
keys = [k.encode().decode("unicode_escape").encode("latin-1") for k in sys.argv[2:sep]]
argv = sys.argv[sep + 1:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
out = b""
def pump(until, limit=60):
    global out
    end = time.time() + limit
    while time.time() < end and not until():
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                return
            if not d:
                return
            out += d
last = 0
for k in keys:
    # send once a new ">>> " prompt ends the output and nothing more comes for 0.3 s
    while True:
        pump(lambda: out.count(b">>> ") > last and out.endswith(b">>> "))
        n = len(out)
        pump(lambda: len(out) > n, 0.3)
        if len(out) == n:
            break
    last = out.count(b">>> ")
    os.write(fd, k)
pump(lambda: False, 30)
_, st = os.waitpid(pid, 0)
open(out_path, "wb").write(out)
sys.exit(os.waitstatus_to_exitcode(st))
EOF
# the answers in a chat's terminal output: after the progress line is erased, up to the stats
answers() { python3 -c "
import re, sys
for a in re.findall(rb'\r\x1b\[K([^\r\x1b]*)\r\n\[\d+ tokens', open(sys.argv[1], 'rb').read()): print(a.decode())" "$1"; }

mkdir -p "$T/m" && cp $D/hf/* "$T/m/" && chmod u+w "$T/m"/*
printf '%s' '{% for m in messages %}{% if m.role == "user" %}{{ m.content }} {% endif %}{% endfor %}' > "$T/m/chat_template.jinja"
C=("$G" chat "$T/m" -n 10 --temperature 0)

# 1. line editing and history: "hellx", Backspace, "o" -> hello; Up recalls it; "bcd" with
# Ctrl-A "a" Ctrl-E "e" -> abcde. The answers equal those of the same messages piped in.
python3 "$T/drive.py" "$T/tty.out" 'hellx\x7fo\r' '\x1b[A\r' 'bcd\x01a\x05e\r' '\x04' -- "${C[@]}"
ok $? "chat on a terminal exits 0 at Ctrl-D"
printf 'hello\nhello\nabcde\n' | "${C[@]}" > "$T/ref.out" 2>/dev/null
printf 'hellxo\nhellxo\nbcdae\n' | "${C[@]}" > "$T/wrong.out" 2>/dev/null
answers "$T/tty.out" > "$T/tty.ans"
[ "$(grep -c . "$T/tty.ans")" = 3 ] && cmp -s "$T/tty.ans" "$T/ref.out" && ! cmp -s "$T/ref.out" "$T/wrong.out"
ok $? "edited and recalled lines are what is sent: $(cat "$T/tty.ans" | head -3 | tr '\n' '|') vs $(tr '\n' '|' < "$T/ref.out")"
grep -q ">>> " "$T/tty.out"; ok $? "the >>> prompt"
grep -qa "prompt: [0-9]*/[0-9]* tokens, [0-9.]* tok/s" "$T/tty.out"; ok $? "chat: prompt-processing progress on a terminal"

# 2. Ctrl-C at the prompt does not quit; the chat goes on; /bye quits
python3 "$T/drive.py" "$T/int.out" '\x03' 'hello\r' '/bye\r' -- "${C[@]}"
rc=$?
[ $rc = 0 ] && grep -qa "(Ctrl-D or /bye quits)" "$T/int.out" && [ "$(answers "$T/int.out" | grep -c .)" = 1 ]
ok $? "Ctrl-C at the prompt: a note, the chat goes on ($rc)"

# 3. run: progress on a terminal only, not with -q, and not when stderr is no terminal
python3 "$T/drive.py" "$T/run.out" -- "$G" run --model $D/hf --raw "Once upon a time" -n 5 --temperature 0
grep -qa "prompt: 5/5 tokens, [0-9.]* tok/s" "$T/run.out"; ok $? "run: progress on a terminal: $(head -c 300 "$T/run.out" | od -c | head -3)"
python3 "$T/drive.py" "$T/runq.out" -- "$G" run --model $D/hf --raw "Once upon a time" -n 5 --temperature 0 -q
! grep -qa "prompt:" "$T/runq.out" && grep -qa "there was" "$T/runq.out"; ok $? "run -q: no progress"
"$G" run --model $D/hf --raw "Once upon a time" -n 5 --temperature 0 >/dev/null 2>"$T/err"
! grep -q "prompt: [0-9]*/" "$T/err"; ok $? "run, stderr no terminal: no progress ($(cat "$T/err"))"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
