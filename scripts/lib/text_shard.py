#!/usr/bin/env python3
"""Writes a text (a file, or the plain files of a directory in name order, such as the fortunes
package's) as one llm.c token shard with one token per byte: 256 int32 header (magic 20240520,
version 1, token count), then the bytes as uint16 tokens. train_gpt reads it as token shards
(--data-path 'DIR/*.bin', any --vocab-size above 255), so a large model's shape trains on real text.

    text_shard.py TEXT OUT.bin
"""
import array
import os
import sys

src, out = sys.argv[1], sys.argv[2]
if os.path.isdir(src):  # the plain files: the fortunes package keeps binary indices beside them (*.dat)
    files = sorted(os.path.join(src, f) for f in os.listdir(src) if "." not in f)
    files = [f for f in files if os.path.isfile(f)]
else:
    files = [src]
data = b"".join(open(f, "rb").read() for f in files)
with open(out, "wb") as f:
    array.array("i", [20240520, 1, len(data)] + [0] * 253).tofile(f)
    array.array("H", list(data)).tofile(f)  # one uint16 per byte
print(f"{out}: {len(data)} tokens from {len(files)} file(s)")
