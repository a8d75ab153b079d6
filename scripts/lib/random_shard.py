#!/usr/bin/env python3
"""Writes llm.c token shards of random GPT-2 tokens (V = 50257) for the GPU benchmarks, whose
speed does not depend on the content: 256 int32 header (magic 20240520, version 1, token count),
then the uint16 tokens. One random stream, seeded 1, runs through the files in order.

    random_shard.py PATH=TOKENS [PATH=TOKENS ...]
"""
import array
import random
import sys

random.seed(1)
for arg in sys.argv[1:]:
    path, n = arg.rsplit("=", 1)
    n = int(n)
    with open(path, "wb") as f:
        array.array("i", [20240520, 1, n] + [0] * 253).tofile(f)
        array.array("H", (random.randrange(50257) for _ in range(n))).tofile(f)
