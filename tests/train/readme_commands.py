#!/usr/bin/env python3
"""The README's commands, as written: every shell line of its ```sh blocks is checked against what
the build has. A line that runs a dpml program (by its build path or its bare name, under mpiexec
or scripts/launch.sh or not) runs that program with the line's flags and --check-flags — each flag
must exist and its value be accepted; a script or file the line names must exist; a CMake or
CTest preset it names must be in CMakePresets.json. The long runs themselves are CI's (scripts/
test.sh) and the GPU machine's (scripts/gpu-check.sh).

    tests/train/readme_commands.py README.md train_gpt=build/cpu/examples/train_gpt/train_gpt ...
"""
import json
import os
import re
import shlex
import subprocess
import sys


def sh_lines(readme):
    """The README's shell lines, continuations joined, comments dropped."""
    lines, inside, pending = [], False, ""
    for raw in open(readme, encoding="utf-8"):
        if raw.startswith("```"):
            inside = raw.strip() == "```sh"
            continue
        if not inside:
            continue
        line = pending + raw.rstrip("\n")
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines


def main():
    readme, programs = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
    root = os.path.dirname(os.path.abspath(readme))
    presets = json.load(open(os.path.join(root, "CMakePresets.json")))
    preset_names = {p["name"] for kind in ("configurePresets", "buildPresets", "testPresets") for p in presets.get(kind, [])}
    problems, checked = [], 0
    for line in sh_lines(readme):
        for part in re.split(r"\s*&&\s*", line):
            words = shlex.split(part)
            checked += 1
            # The program: the first word whose file name is a dpml program.
            at = next((i for i, w in enumerate(words) if os.path.basename(w) in programs), None)
            if at is not None:
                name = os.path.basename(words[at])
                argv = [programs[name]] + words[at + 1:] + ["--check-flags"]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                if out.returncode != 0 or "flags accepted" not in out.stdout:
                    problems.append(f"README: `{part}`: {name} refused its flags: {(out.stdout + out.stderr).strip()[-400:]}")
                continue
            for i, w in enumerate(words):
                if w.startswith("--preset") and i + 1 < len(words) and words[i + 1] not in preset_names:
                    problems.append(f"README: `{part}`: no preset '{words[i + 1]}' in CMakePresets.json")
                if re.match(r"^(scripts|examples|bench|tests)/", w) and not os.path.exists(os.path.join(root, w)):
                    problems.append(f"README: `{part}`: '{w}' does not exist")
    print(f"{checked} README commands checked")
    for p in problems:
        print("FAIL", p)
    sys.exit(1 if problems or checked == 0 else 0)


if __name__ == "__main__":
    main()
