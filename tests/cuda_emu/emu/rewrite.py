#!/usr/bin/env python3
"""Rewrites one CUDA source of cuda/ into C++ for the CPU emulation (tests/cuda_emu/emu/).

    rewrite.py IN OUT

Four textual changes, each keeping the line count (so #line points errors at IN):
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> tz_emu_launch(TZ_EMU_STR(kernel), tz_emu_config(grid, block[, smem[, stream]]),
                       [](auto... tz_a) { kernel(tz_a...); }, args)
     (template kernels `k<4><<<...>>>` and launches inside macros included); the arguments
     are evaluated once, at the launch, and every thread gets its own copy, as in CUDA;
  extern __shared__ T name[];  ->  T *name = (T *)tz_emu_dyn_smem();
  __shared__ T name[N];        ->  the same, then tz_emu_shared_fresh(&name, sizeof name);
  #pragma unroll [n]           ->  an empty line (GCC has its own unroll pragma).
Comments and string literals are left alone. Fails (exit 1, naming IN:line) on a launch it
cannot parse, rather than writing something wrong."""
import re
import sys


def code_mask(text):
    """mask[i] is True where text[i] is code (not in a comment or a string/char literal)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            mask[k] = False
        i = j
    return mask


def fail(path, text, pos, why):
    line = text.count("\n", 0, pos) + 1
    sys.exit(f"{path}:{line}: cannot rewrite this kernel launch for the CUDA emulation: {why}")


def skip_space_back(text, i):
    """Index of the last non-space character at or before i (backslash-newlines are space)."""
    while i >= 0 and (text[i].isspace() or (text[i] == "\\" and text[i + 1] == "\n")):
        i -= 1
    return i


def skip_space(text, i):
    while i < len(text) and (text[i].isspace() or text.startswith("\\\n", i)):
        i += 1
    return i


def matching(text, mask, i, open_c, close_c):
    """Index of the bracket closing the one at i (same kind), over code only."""
    depth = 0
    for j in range(i, len(text)):
        if not mask[j]:
            continue
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return -1


def rewrite_launches(text, path):
    mask = code_mask(text)
    out, last = [], 0
    pos = 0
    while True:
        j = text.find("<<<", pos)
        if j < 0:
            break
        if not mask[j]:
            pos = j + 3
            continue
        # the kernel's name, backwards: identifier, optionally followed by <template args>
        e = skip_space_back(text, j - 1)
        if e >= 0 and text[e] == ">":
            depth, k = 0, e
            while k >= 0:
                if mask[k] and text[k] == ">":
                    depth += 1
                elif mask[k] and text[k] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            if k < 0:
                fail(path, text, j, "unbalanced template arguments before <<<")
            k = skip_space_back(text, k - 1)
        else:
            k = e
        s = k
        while s >= 0 and (text[s].isalnum() or text[s] in "_:"):
            s -= 1
        s += 1
        if s > k:
            fail(path, text, j, "no kernel name before <<<")
        name = text[s:e + 1]
        # the configuration, up to >>> at bracket depth 0
        depth, m = 0, j + 3
        while m < len(text):
            if mask[m]:
                if text[m] in "([{":
                    depth += 1
                elif text[m] in ")]}":
                    depth -= 1
                elif depth == 0 and text.startswith(">>>", m):
                    break
            m += 1
        if m >= len(text):
            fail(path, text, j, "no >>> closing the launch configuration")
        cfg = text[j + 3:m]
        p = skip_space(text, m + 3)
        if p >= len(text) or text[p] != "(":
            fail(path, text, j, "no argument list after >>>")
        q = matching(text, mask, p, "(", ")")
        if q < 0:
            fail(path, text, j, "unbalanced argument list")
        args = text[p + 1:q]
        out.append(text[last:s])
        sep = ", " if args.strip() else ""
        out.append(f"tz_emu_launch(TZ_EMU_STR({name}), tz_emu_config({cfg}), "
                   f"[](auto... tz_a) {{ {name}(tz_a...); }}{sep}{args})")
        last = pos = q + 1
    out.append(text[last:])
    return "".join(out)


SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                  r"([A-Za-z_][\w ]*?)\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                  r"([A-Za-z_]\w*)\s*\[\s*\]\s*;")
SHARED = re.compile(r"(?<![\w])__shared__\s+(?!extern)[A-Za-z_][\w \t]*?\s(\w+)\s*((?:\[[^\];]*\]\s*)*);")
UNROLL = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+unroll\b[^\n]*$", re.M)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: rewrite.py IN OUT")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    text = rewrite_launches(text, src)
    text = SMEM.sub(lambda m: f"{m.group(1)} *{m.group(2)} = ({m.group(1)} *)tz_emu_dyn_smem();",
                    text)
    # a block's static shared variables read as NaN bytes until the block writes them
    # (not the previous block's values): the call after the declaration, on its line
    text = SHARED.sub(lambda m: f"{m.group(0)} tz_emu_shared_fresh(&{m.group(1)}, sizeof {m.group(1)});",
                      text)
    text = UNROLL.sub("", text)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#line 1 "{src}"\n{text}')


if __name__ == "__main__":
    main()
