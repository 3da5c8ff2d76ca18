#!/usr/bin/env python3
# A pipeline step's measured bubble from its ranks' traces (profiler=trace: every rank writes
# trace_stepN.json or trace_stepN_rankR.json, each with its clock's origin on the host's monotonic clock).
# The step's span is from the first compute op's start to the last one's end over every rank, inside the
# gradients phase (the schedule's forwards and backwards; update is not part of the pipeline); a rank's busy
# time is its compute ops' (ops and recomputes: kernels' work, not waits for transfers); its bubble is
# (span - busy) / span, as the plan's simulator defines it (plan/pipeline_schedule.h).
# Usage: bubble.py RUN_DIR STEP RANKS   prints one JSON line: span_ms, per-rank busy_ms and bubble, max bubble
import glob, json, sys

run, step, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spans, busy = [], []
for rank in range(ranks):
    path = f"{run}/trace_step{step}.json" if rank == 0 else f"{run}/trace_step{step}_rank{rank}.json"
    trace = json.load(open(path))
    origin = trace["otherData"]["steady_clock_origin_us"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    phase = [e for e in events if e["cat"] == "phase" and e["name"] == "gradients"]
    assert len(phase) == 1, (path, len(phase))
    begin, end = phase[0]["ts"], phase[0]["ts"] + phase[0]["dur"]
    compute = [e for e in events if e["cat"] in ("op", "recompute") and begin <= e["ts"] <= end]
    assert compute, path
    spans.append((origin + min(e["ts"] for e in compute), origin + max(e["ts"] + e["dur"] for e in compute)))
    busy.append(sum(e["dur"] for e in compute))
span = max(s[1] for s in spans) - min(s[0] for s in spans)
bubbles = [(span - b) / span for b in busy]
print(json.dumps({"span_ms": span / 1e3, "busy_ms": [b / 1e3 for b in busy], "bubble": bubbles,
                  "max_bubble": max(bubbles)}))
