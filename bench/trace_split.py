#!/usr/bin/env python3
"""Per-op time split of a traced step: sums the trace's op events over the layers and prints each op's time
and share of the step, largest first, for one or several traces side by side.

  python3 bench/trace_split.py RUN_DIR/trace_stepN.json [LABEL=]OTHER_TRACE ...
  python3 bench/trace_split.py before=A1.json,A2.json,A3.json after=B1.json,B2.json,B3.json

A column given as several traces joined by commas (runs of the same step) shows each op's minimum over them:
on a shared machine other processes only ever add time, so the minimum of interleaved runs is the figure
least disturbed by them; the step is then the sum of those minima.

A trace comes from `meshtrain train ... profiler=trace profiler_steps=N` (metrics/trace.h). Layer indices are
dropped from the names (decoder/layers_3/mlp/wi/forward -> mlp/wi/forward), so each row is one op of every
layer together, and the optimizer's per-tensor ops are summed per kind (optimizer/adamw, optimizer/grad_norm);
rows under 0.2% of the step in every trace are summed into one. The step is the sum of all op events (the
time the step spent in ops). Standard library only.
"""
import json
import re
import sys

LAYER = re.compile(r"^decoder/layers_\d+/")
PER_TENSOR = re.compile(r"^(optimizer/(?:adamw|grad_norm))/.*")
SMALL = 0.002  # of the step


def op_times(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    times = {}
    for event in events:
        # Op events only: a trace also holds the data wait ("data") and the gradients phase ("phase"), which
        # spans the step's ops; traces older than those categories have none.
        if event.get("ph") != "X" or "dur" not in event or event.get("cat", "op") != "op":
            continue
        name = PER_TENSOR.sub(r"\1 (every tensor)", LAYER.sub("", event["name"]))
        times[name] = times.get(name, 0.0) + event["dur"] / 1e3  # ms
    return times


def main(arguments):
    if not arguments:
        print(__doc__.strip())
        return 2
    columns = []
    for argument in arguments:
        label, _, path = argument.rpartition("=") if "=" in argument else (argument, "", argument)
        runs = [op_times(one) for one in path.split(",")]
        names = {name for times in runs for name in times}
        columns.append((label or path, {name: min(times.get(name, float("inf")) for times in runs)
                                        for name in names}))
    totals = [sum(times.values()) for _, times in columns]
    names = sorted({name for _, times in columns for name in times},
                   key=lambda name: -max(times.get(name, 0.0) for _, times in columns))
    small = [name for name in names
             if all(times.get(name, 0.0) < SMALL * total for (_, times), total in zip(columns, totals))]
    if small:
        other = f"{len(small)} ops each under {100 * SMALL:.1f}%"
        for _, times in columns:
            times[other] = sum(times.pop(name, 0.0) for name in small)
        names = [name for name in names if name not in small] + [other]
    width = max(len(name) for name in names)
    header = f"{'op (all layers)':<{width}}" + "".join(f" | {label[-24:]:>24}" for label, _ in columns)
    print(header)
    print("-" * len(header))
    for name in names:
        cells = ""
        for (_, times), total in zip(columns, totals):
            ms = times.get(name)
            cells += f" | {'-':>24}" if ms is None else f" | {ms:>10.1f} ms {100.0 * ms / total:>8.1f}%"
        print(f"{name:<{width}}{cells}")
    print(f"{'all ops':<{width}}" + "".join(f" | {total:>10.1f} ms {100.0:>8.1f}%" for total in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
