"""The kernel families' table the GPU bench scripts print (gpu-bench.sh, resnet-bench.sh): one row
per family, one column per implementation, milliseconds of one profiled step."""


def print_family_table(fams):
    """fams: {impl: {family: ms}}; prints nothing when no run reported families."""
    names = sorted({f for v in fams.values() for f in v})
    if not names:
        return
    impls = list(fams)
    print()
    print("| family (ms, one profiled step) | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{fams[i].get(n, 0):.2f}" for i in impls) + " |")
