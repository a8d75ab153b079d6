#!/usr/bin/env python3
"""Every flag of every program, with the values a user mistypes.

For each program given, its --help (generated from its train::Args table) names each flag, its
kind (<int>, <number>, <text>, or a switch) and its range. Each numeric flag then gets: no value,
a word, a value of the wrong kind, non-finite and overflowing values, and the values just outside
and at the ends of its range; a switch gets a bad =value. Each run goes through --check-flags
(the values checked, nothing done) and must either
  - be refused: a non-zero exit status, not a signal, within the time limit, with a message that
    names the flag, printed once; or
  - be accepted (exit 0, "flags accepted"), only for a value inside the flag's range.
A numeric flag without a declared range must be listed in UNBOUNDED with the reason any value is
valid: a flag that takes 0 or a negative number silently is the bug this test is for.

    tests/train/flag_corpus.py build/cpu/examples/train_gpt/train_gpt build/cpu/examples/...
"""
import concurrent.futures
import math
import re
import subprocess
import sys

# Numeric flags that take any value of their kind, and why.
UNBOUNDED = {
    "--seed": "any integer seeds the generator",
    "--forget-bias": "an LSTM's forget-gate bias may start at any finite value (train_lstm; 1 is usual)",
}

FLAG = re.compile(r"^\s+(--[\w-]+)(?: <(int|number|text)>| \| --no-[\w-]+)\s+(.*)$")
RANGE = re.compile(r"\(default: [^;]*; (.*)\)$")
TIMEOUT_S = 30


def flags_of(program):
    out = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=TIMEOUT_S)
    if out.returncode != 0 or "usage:" not in out.stdout:
        raise SystemExit(f"{program} --help failed (status {out.returncode}): {out.stdout}{out.stderr}")
    flags = []
    for line in out.stdout.splitlines():
        m = FLAG.match(line)
        if not m or m.group(1) in ("--help", "--check-flags"):
            continue
        r = RANGE.search(m.group(3))
        flags.append((m.group(1), m.group(2) or "switch", r.group(1) if r else ""))
    if not flags:
        raise SystemExit(f"{program} --help lists no flags")
    return flags


def bounds(rng):
    """(low, low_excluded, high, high_excluded) of a range text: '>= 1', '> 0', '[0, 1]', '[0, 1)',
    '<= 5', '< 5'."""
    m = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", rng)
    if m:
        return float(m.group(2)), m.group(1) == "(", float(m.group(3)), m.group(4) == ")"
    m = re.fullmatch(r"(>=|>) (\S+)", rng)
    if m:
        return float(m.group(2)), m.group(1) == ">", None, False
    m = re.fullmatch(r"(<=|<) (\S+)", rng)
    if m:
        return None, False, float(m.group(2)), m.group(1) == "<"
    raise ValueError(f"unknown range text '{rng}'")


def text(x, kind):
    return str(int(x)) if kind == "int" else repr(float(x))


def cases(flag, kind, rng):
    """(argv words, must_refuse) for one flag."""
    if kind == "switch":
        return [([f"{flag}=maybe"], True), ([flag], False)]
    out = [([flag], True)]  # no value (the last word)
    if kind == "text":
        return out  # any text parses; what it names is the program's to check
    out.append(([flag, "abc"], True))
    if kind == "int":
        out += [([flag, "1.5"], True), ([flag, "99999999999999999999999"], True), ([flag, "nan"], True)]
    else:
        out += [([flag, v], True) for v in ("nan", "inf", "-inf", "1e999")]
    if not rng:
        return out
    lo, lo_excluded, hi, hi_excluded = bounds(rng)
    step = 1 if kind == "int" else max(1.0, abs(lo or hi or 1.0)) * 0.5
    if kind == "number" and lo is not None and hi is not None:
        step = min(step, (hi - lo) / 4)  # an inside value between the ends of a short range
    if lo is not None:
        out.append(([flag, text(lo, kind)], lo_excluded))
        out.append(([flag, text(lo - step, kind)], True))
        if lo_excluded:
            out.append(([flag, text(lo + step, kind)], False))
    if hi is not None:
        out.append(([flag, text(hi, kind)], hi_excluded))
        out.append(([flag, text(hi + step, kind)], True))
        if hi_excluded:
            out.append(([flag, text(hi - step, kind)], False))
    return out


def run(program, flag, words, must_refuse):
    """An error text for a case that went wrong, or None."""
    argv = [program, "--check-flags"] + words
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv)}: no answer within {TIMEOUT_S} s (a hang)"
    said = out.stdout + out.stderr
    if out.returncode < 0 or out.returncode >= 128:
        return f"{' '.join(argv)}: killed by a signal (status {out.returncode}): {said.strip()[-300:]}"
    if must_refuse:
        if out.returncode == 0:
            return f"{' '.join(argv)}: accepted, but the value is invalid"
        named = [l for l in said.splitlines() if flag in l]
        if not named:
            return f"{' '.join(argv)}: refused without naming {flag}: {said.strip()[-300:]}"
        if len(named) > 1:
            return f"{' '.join(argv)}: the refusal was printed {len(named)} times"
        return None
    if out.returncode != 0 or "flags accepted" not in said:
        return f"{' '.join(argv)}: refused a valid value (status {out.returncode}): {said.strip()[-300:]}"
    return None


def main():
    programs = sys.argv[1:]
    if not programs:
        raise SystemExit(__doc__)
    jobs, problems, counted = [], [], 0
    for program in programs:
        for flag, kind, rng in flags_of(program):
            if kind in ("int", "number") and not rng and flag not in UNBOUNDED:
                problems.append(f"{program}: {flag} <{kind}> declares no range (add one, or list it in UNBOUNDED with why)")
            for words, must_refuse in cases(flag, kind, rng):
                jobs.append((program, flag, words, must_refuse))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for err in pool.map(lambda j: run(*j), jobs):
            counted += 1
            if err:
                problems.append(err)
    print(f"{counted} cases over {len(programs)} programs")
    for p in problems:
        print("FAIL", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
