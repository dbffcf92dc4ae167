#!/bin/sh
# docs/guide.md as a user meets it: every shell command of the guide runs as written, in
# order, in a fresh clone of the source tree after the README's first command, and the
# output lines the guide quotes match real output.
#
# The clone: `git clone` of SOURCE_DIR (its committed tree: leftover runs/ or files that are
# not committed cannot hide a collision or a missing input), with the program under test
# linked in as build/turbozero; README.md and docs/guide.md are read from SOURCE_DIR itself.
#
# Every fenced block of the guide names what it holds after its opening fence; a block
# without a name, or with a name not listed here, fails the test:
#   sh                 commands, run in order as written (one line each, or continued by a
#                      trailing backslash, or a here-document); each must exit with status 0
#   sh skip: REASON    commands that are not run here (printed with REASON)
#   console            `$ ` lines are commands, run as above; the other lines are their output
#   text cfg json python   output, configuration and code samples: not run
# Attributes after `sh`: `keep-steps` (below), `stop-at=S1,S2,...`: the block's first,
# second, ... `train` command stops after step S1, S2, ...: the program's test hook
# TZ_CKPT_FAULT kills it there, so that a run the block stops with a signal stops at a known
# step whatever the timing (the signal then finds it running or already gone: the same end).
#
# Shortened: every `build/turbozero train` (not --dry-run) gets, appended after its own
# options (later --set win), `--set data.seq_len=16 --set train.eval_windows=4` and, outside
# blocks marked `keep-steps`, `--set train.steps=4`. Nothing else in a command changes.
# MPI runs take the test environment (tests/CMakeLists.txt).
set -u
TZ=${1:?usage: guide_examples.sh TURBOZERO SOURCE_DIR}
SRC=${2:?usage: guide_examples.sh TURBOZERO SOURCE_DIR}
command -v git > /dev/null || { echo "git not installed: skipping the guide test"; exit 77; }
git -c safe.directory="$SRC" -C "$SRC" rev-parse --git-dir > /dev/null 2>&1 ||
  { echo "$SRC is not a git checkout: no clone to run the guide in, skipping"; exit 77; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tzguide.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
if [ "$(id -u)" -eq 0 ]; then # as the guide says for mpirun as root
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
git -c safe.directory="$SRC" clone -q "$SRC" "$TMP/clone" || { echo "FAIL git clone $SRC"; exit 1; }
mkdir -p "$TMP/clone/build" "$TMP/logs" && ln -s "$(realpath "$TZ")" "$TMP/clone/build/turbozero" || exit 1

# ---- 1. the README's first command, then the guide's commands, as one bash script
python3 - "$SRC/README.md" "$SRC/docs/guide.md" "$TMP/run.sh" "$TMP/logs" <<'PY' || exit 1
import re, shlex, sys
readme, guide, out, logs = sys.argv[1:5]
SHORT = "--set data.seq_len=16 --set train.eval_windows=4"
STEPS = "--set train.steps=4"
NOT_RUN = {"text", "cfg", "json", "python"}
errors = []

def blocks(path):
    """(line, info, body lines) of every ``` fenced block"""
    res, cur = [], None
    for n, line in enumerate(open(path).read().split("\n"), 1):
        if line.startswith("```"):
            if cur is None:
                cur = (n, line[3:].strip(), [])
            else:
                res.append(cur); cur = None
        elif cur is not None:
            cur[2].append(line)
    if cur is not None:
        errors.append("%s:%d: fenced block never closed" % (path, cur[0]))
    return res

def split_top(code):
    """code split at the top-level operators ; & && || | (outside quotes): [(segment, op)]"""
    parts, i, start, q = [], 0, 0, None
    while i < len(code):
        c = code[i]
        if q == "'":
            if c == "'": q = None
        elif q == "$'":
            if c == "\\": i += 1
            elif c == "'": q = None
        elif q == '"':
            if c == "\\": i += 1
            elif c == '"': q = None
        elif c == "\\": i += 1
        elif c == "'": q = "'"
        elif c == "$" and code[i + 1:i + 2] == "'": q = "$'"; i += 1
        elif c == '"': q = '"'
        elif c == "#" and (i == 0 or code[i - 1] in " \t"):
            parts.append((code[start:i], "")); return parts, code[i:]
        elif c in ";|&":
            op = code[i:i + 2] if code[i:i + 2] in ("&&", "||") else c
            redirect = c == "&" and ((i and code[i - 1] in "<>") or code[i + 1:i + 2] == ">")
            if not redirect:
                parts.append((code[start:i], op)); i += len(op); start = i; continue
        i += 1
    parts.append((code[start:], ""))
    return parts, ""

def commands(body):
    """a block's commands: logical lines (backslash continuations, here-documents joined)"""
    cmds, i = [], 0
    while i < len(body):
        line = body[i]; i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(body):
            line += "\n" + body[i]; i += 1
        m = re.search(r"<<-?\s*'?(\w+)'?", line)
        if m:
            while i < len(body):
                line += "\n" + body[i]; i += 1
                if body[i - 1].strip() == m.group(1): break
        cmds.append(line)
    return cmds

def runnable(cmd, keep_steps, stops, trains):
    """the command as run (its comments dropped): train commands shortened (and stopped
    where asked); a here-document's text stays as it is"""
    if "<<" in cmd.partition("\n")[0]:
        first, _, rest = cmd.partition("\n")
    else:
        first, rest = re.sub(r"\\\n\s*", " ", cmd), ""
    parts, comment = split_top(first)
    outp = []
    for seg, op in parts:
        try:
            words = shlex.split(seg)
        except ValueError:
            words = []
        k = next((j for j, w in enumerate(words) if w.endswith("build/turbozero")), None)
        if k is not None and words[k + 1:k + 2] == ["train"] and "--dry-run" not in words:
            add = SHORT + ("" if keep_steps else " " + STEPS)
            seg = seg.rstrip() + " " + add + (" " if op else "")
            if trains[0] < len(stops):
                lead = len(seg) - len(seg.lstrip())
                seg = (seg[:lead] + "TZ_CKPT_FAULT=rank=0,at=step,step=%d,do=kill " % stops[trains[0]]
                       + seg[lead:])
            trains[0] += 1
            changed[0] = True
        outp.append(seg + op)
    code = "".join(outp).rstrip()
    return code + ("\n" + rest if rest else "")
changed = [False]

steps = []   # (where, command as written, command as run)
rb = [b for b in blocks(readme) if b[1] == "sh"]
if not rb:
    errors.append("README.md: no sh block")
else:   # the README's first command: its set-up is the test's build; its run is run here
    for seg, _ in split_top(" ".join(rb[0][2]))[0]:
        seg = seg.strip()
        if seg.startswith("build/turbozero"):
            steps.append(("README.md:%d" % rb[0][0], seg, runnable(seg, False, [], [0]), changed[0]))
            changed[0] = False
        else:
            print("skip README.md:%d: %s (the set-up: the clone runs the build under test)" % (rb[0][0], seg))
for n, info, body in blocks(guide):
    where = "docs/guide.md:%d" % n
    lang, _, attrs = info.partition(" ")
    if lang == "sh" and attrs.startswith("skip:") and attrs[5:].strip():
        print("skip %s (%d lines): %s" % (where, len(commands(body)), attrs[5:].strip()))
        continue
    if lang in NOT_RUN and not attrs:
        continue
    if lang == "console" and not attrs:
        cmds = [l[2:] for l in body if l.startswith("$ ")]
        keep, stops = False, []
    elif lang == "sh":
        keep, stops = False, []
        for a in attrs.split():
            if a == "keep-steps": keep = True
            elif re.fullmatch(r"stop-at=\d+(,\d+)*", a): stops = [int(x) for x in a[8:].split(",")]
            elif a == "skip:": errors.append("%s: ```sh skip: without a reason" % where)
            else: errors.append("%s: unknown attribute %r after ```sh" % (where, a))
        cmds = commands(body)
    else:
        errors.append("%s: a fenced block must say what it holds: ```sh, ```sh skip: REASON, "
                      "```console or one of %s, not %r" % (where, ", ".join(sorted(NOT_RUN)), "```" + info))
        continue
    if not cmds:
        errors.append("%s: a %s block without a command" % (where, lang))
    trains = [0]
    for c in cmds:
        steps.append((where, c, runnable(c, keep, stops, trains), changed[0]))
        changed[0] = False
    if trains[0] < len(stops):
        errors.append("%s: stop-at names %d train commands, the block has %d" % (where, len(stops), trains[0]))
if errors:
    print("\n".join("FAIL " + e for e in errors)); sys.exit(1)

q = shlex.quote
with open(out, "w") as f:
    f.write("exec 3>&1\n")
    for i, (where, asis, run, short) in enumerate(steps, 1):
        log = "%s/%02d.log" % (logs, i)
        f.write("echo; echo %s\n" % q("[%d/%d] %s" % (i, len(steps), where)))
        f.write("printf '%%s\\n' %s | sed -e '1s/^/$ /' -e '1!s/^/  /'\n" % q(asis))
        if short:
            f.write("printf '  run as: %%s\\n' %s\n" % q(run.split("\n")[0]))
        f.write("t0=$SECONDS\nexec > %s 2>&1\n%s\nrc=$?\nexec >&3 2>&3\n" % (q(log), run))
        f.write("tail -n 3 %s | sed 's/^/  | /'\n" % q(log))
        f.write("echo \"  exit status $rc, $((SECONDS - t0)) s\"\n")
        f.write("[ $rc -eq 0 ] || { echo \"FAIL %s: exit status $rc\"; tail -n 40 %s; exit 1; }\n"
                % (where, q(log)))
    f.write("wait\necho \"guide: %d commands ran\"\n" % len(steps))
print("%d commands to run, in %s" % (len(steps), out))
PY
cd "$TMP/clone" || exit 1
timeout -k 5 240 bash "$TMP/run.sh"
rc=$?
[ $rc -eq 124 ] && echo "FAIL the guide's commands did not end within 240 s"
[ $rc -eq 0 ] || exit 1

# ---- 2. the output lines the guide quotes (the step line, the metrics.jsonl records, eval's
# summary and last line), with their numbers and times as wildcards, against real output
"$TZ" train inputs/llama/finetune.cfg --set train.steps=4 --set data.seq_len=64 \
    --set train.micro_batch=4 --set train.eval_every=2 --set train.eval_windows=8 \
    --set train.log_every=1 --set run.dir="$TMP/run" > "$TMP/train.log" 2>&1 ||
    { echo "FAIL train"; tail -5 "$TMP/train.log"; exit 1; }
"$TZ" eval inputs/llama/finetune.cfg > "$TMP/eval.log" 2>&1 ||
    { echo "FAIL eval"; tail -5 "$TMP/eval.log"; exit 1; }
cat "$TMP/train.log" "$TMP/run/metrics.jsonl" "$TMP/eval.log" > "$TMP/all"
python3 - "$SRC/docs/guide.md" "$TMP/all" <<'PY'
import re, sys
guide = open(sys.argv[1]).read().splitlines()
out = open(sys.argv[2]).read().splitlines()
starts = ("step ", '{"step": ', '{"summary": ', "eval_loss=", "model inputs/")
quoted = [l for l in guide if l.startswith(starts)]
fail = 0
def pattern(q):
    q = re.sub(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "\x01", q)       # ISO times
    q = re.sub(r"\b(\d+h\d+m|\d+m\d+s|\d+s)\b", "\x02", q)      # durations (ETA)
    q = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "\x03", q)          # numbers
    p = re.escape(q)
    return (p.replace("\x01", "[0-9T:.Z-]+").replace("\x02", "[0-9hms]+")
             .replace("\x03", "-?[0-9.]+(e[-+]?[0-9]+)?"))
for q in quoted:
    pat = pattern(q)
    if any(re.fullmatch(pat, o) for o in out):
        print("ok   " + q[:90])
    else:
        print("FAIL no output line of the form: " + q)
        fail += 1
if len(quoted) < 5:
    print("FAIL only %d quoted lines found in the guide" % len(quoted)); fail += 1
print("guide_examples: %d checked, %d failed" % (len(quoted), fail))
sys.exit(1 if fail else 0)
PY
