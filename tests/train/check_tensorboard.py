#!/usr/bin/env python3
"""A program's TensorBoard events read by TensorBoard's own reader, against its JSON lines.

Runs the given launch command (e.g. `mpiexec -n 2 train_gpt` with small model flags) twice into
one --tensorboard directory, each launch with its own --metrics file, then checks with
tensorboard.backend.event_processing.event_accumulator.EventAccumulator that
  - each launch made its own run directory <YYYYmmdd-HHMMSS>-<host>-<pid> (named once on stdout)
    holding one events.out.tfevents.<seconds>.<host> file, and nothing else is in the directory;
  - every finite value of every JSON line is a scalar under the metric's name at the line's step
    (a line without "step", fashion_mnist's end of epoch, at the step of the line before it), in
    the order written, equal to the JSON's six significant digits (TensorBoard stores float32);
    every null is absent, and TensorBoard holds no other scalar.
--expect-null: the JSON lines must hold a null (train_gpt's val_loss before the first evaluation),
so that leaving non-finite values out is tested.
The `tensorboard` package comes from scripts/install-deps.sh (a venv at /opt/dpml-venv, or
$DPML_VENV); without it this check fails: there is no silent pass.

    check_tensorboard.py [--expect-null] WORKDIR LAUNCH...
"""
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys

VENV = os.environ.get("DPML_VENV", "/opt/dpml-venv")

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    venv_python = os.path.join(VENV, "bin", "python3")
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(venv_python, [venv_python, *sys.argv])
    raise SystemExit(f"check_tensorboard: the python package 'tensorboard' is not importable by {sys.executable} "
                     f"nor by {venv_python}: run scripts/install-deps.sh")

RUN_LINE = re.compile(r"^metrics: TensorBoard run '([^']*)' \(tensorboard --logdir ([^)]*)\)$", re.M)


def fail(message):
    raise SystemExit(f"check_tensorboard: {message}")


def launch(command, workdir, name):
    """Runs one launch; returns (its run directory, its JSON lines)."""
    jsonl = os.path.join(workdir, f"{name}.jsonl")
    tb = os.path.join(workdir, "tb")
    argv = [*command, "--metrics", jsonl, "--tensorboard", tb]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        fail(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    runs = RUN_LINE.findall(out.stdout)
    if len(runs) != 1 or runs[0][1] != tb:
        fail(f"expected one line naming the TensorBoard run in {tb} (rank 0 only), got {runs}:\n{out.stdout}")
    with open(jsonl) as f:
        lines = [json.loads(line) for line in f]
    if not lines or "step" not in lines[0]:
        fail(f"{jsonl}: no JSON line, or the first has no step")
    return runs[0][0], lines


def check_run(run, lines, expect_null):
    """The number of scalars checked."""
    host = socket.gethostname()
    if not re.fullmatch(rf"[0-9]{{8}}-[0-9]{{6}}-{re.escape(host)}-[0-9]+", os.path.basename(run)):
        fail(f"run directory '{run}' is not <YYYYmmdd-HHMMSS>-{host}-<pid>")
    files = os.listdir(run)
    if len(files) != 1 or not re.fullmatch(rf"events\.out\.tfevents\.[0-9]{{10}}\.{re.escape(host)}", files[0]):
        fail(f"run directory '{run}' holds {files}, not one events.out.tfevents.<seconds>.{host}")
    # (tag, step) -> values in the order written, from the JSON lines and from TensorBoard.
    expected, nulls, step = {}, 0, None
    for line in lines:
        step = line.get("step", step)
        for name, value in line.items():
            if name == "step":
                continue
            if value is None:
                nulls += 1
            else:
                expected.setdefault((name, step), []).append(value)
    acc = EventAccumulator(run, size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    found = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            found.setdefault((tag, e.step), []).append(e.value)
    if found.keys() != expected.keys():
        fail(f"{run}: (tag, step) in TensorBoard but not JSON {sorted(found.keys() - expected.keys())}, "
             f"in JSON but not TensorBoard {sorted(expected.keys() - found.keys())}")
    for key, values in expected.items():
        # JSON keeps 6 significant digits, TensorBoard a float32 (24 bits): they agree to 1e-5.
        if len(found[key]) != len(values) or not all(
                math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-37) for a, b in zip(found[key], values)):
            fail(f"{run}: '{key[0]}' at step {key[1]}: TensorBoard {found[key]}, JSON {values}")
    if expect_null and nulls == 0:
        fail(f"{run}: no null value in the JSON lines: leaving non-finite values out went untested")
    return sum(len(v) for v in expected.values())


def main():
    args = sys.argv[1:]
    expect_null = bool(args) and args[0] == "--expect-null"
    args = args[1:] if expect_null else args
    if len(args) < 2:
        fail("usage: check_tensorboard.py [--expect-null] WORKDIR LAUNCH...")
    workdir, command = os.path.abspath(args[0]), args[1:]
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    launches = [launch(command, workdir, "first"), launch(command, workdir, "second")]
    found = sorted(os.path.join(workdir, "tb", d) for d in os.listdir(os.path.join(workdir, "tb")))
    if found != sorted(run for run, _ in launches) or len(set(found)) != 2:
        fail(f"two launches made run directories {found}, named {[run for run, _ in launches]}")
    counts = [check_run(run, lines, expect_null) for run, lines in launches]
    print(f"check_tensorboard: {len(found)} runs, {counts} scalars equal to the JSON lines")


if __name__ == "__main__":
    main()
