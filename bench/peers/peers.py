#!/usr/bin/env python3
"""Helpers for run_peers.sh: run one measurement, parse its per-step times, print the comparison table.

  peers.py busy                      % of all CPUs busy over one second (whole system)
  peers.py run --results FILE --pass P --peer NAME --batch B --seq T --log LOG [--metrics JSONL]
               [--timeout S] [--quiet-wait S] [--retries R] [--clean DIR] -- CMD...
        Waits up to --quiet-wait s for the machine to be < 15% busy, runs CMD (output to LOG), then
        appends one JSON record to FILE: status, per-step times, the wall time, the CPU time of CMD and
        its children, and `others_pct`, the share of all CPUs that OTHER processes used meanwhile
        (/proc/stat busy time minus CMD's own rusage). While others_pct > 10 it runs again, up to
        --retries more times (LOG.try2, ...), and records the least disturbed try. Never fails.
  peers.py table --results FILE [--peak-gflops G] [--bf16-peak-gflops G]
        Prints medians, spreads, MFU and the meshtrain / peer ratios.

Per-step times come from:
  meshtrain  run_dir/metrics.jsonl, field step_time_s (--metrics)
  llm.c      "step N: train loss X (took Y ms)"
  pytorch    "step N: loss X time_ms Y" (torch_gpt2.py)
The first step printed is warm-up and is not counted.

Standard library only; runs under any python3.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

# GPT-2 124M, counted as llm.c and nanoGPT do (specs/performance.md): 6 N per token with N = matmul weights
# including the unembedding (vocab 50257), plus 12 L D T per token for attention (non-causal count).
N_MATMUL = 123_532_032
L_LAYERS, D_MODEL = 12, 768
DEFAULT_PEAK_GFLOPS = 460.0
DISTURBED_PCT = 10.0  # others' share of all CPUs above which a run counts as disturbed
# Debian's PyTorch 1.13 ("pytorch") and PyTorch 2.x from PyPI in a virtual environment, one peer per mode.
TORCH_PEERS = ["pytorch", "torch2-eager", "torch2-compile", "torch2-bf16"]
# The bf16 runs: their MFU is against the bf16 GEMM peak, and they are compared with each other.
BF16_PEERS = ["meshtrain-bf16", "torch2-bf16"]

LLMC_RE = re.compile(r"^step (\d+): train loss ([-+0-9.eEnaif]+) \(took ([0-9.eE+-]+) ms\)")
TORCH_RE = re.compile(r"^step (\d+): loss ([-+0-9.eEnaif]+) time_ms ([0-9.eE+-]+)")


def flops_per_step(b, t):
    tokens = b * t
    return 6.0 * N_MATMUL * tokens + 12.0 * L_LAYERS * D_MODEL * t * tokens


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    total = sum(v[:8])
    idle = v[3] + v[4]
    return total - idle, total


def busy_pct(seconds=1.0):
    b0, t0 = cpu_times()
    time.sleep(seconds)
    b1, t1 = cpu_times()
    return 100.0 * (b1 - b0) / max(1, t1 - t0)


def parse_steps(peer, log_path, metrics_path):
    """Returns a list of (step, seconds, loss) in the order printed."""
    steps = []
    if peer.startswith("meshtrain"):
        if metrics_path and os.path.exists(metrics_path):
            with open(metrics_path) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if "step_time_s" in r:
                        steps.append((int(r.get("step", len(steps))), float(r["step_time_s"]),
                                      float(r.get("loss", float("nan")))))
        return steps
    rx = LLMC_RE if peer == "llm.c" else TORCH_RE
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as f:
            for line in f:
                m = rx.match(line.strip())
                if m:
                    steps.append((int(m.group(1)), float(m.group(3)) / 1000.0, float(m.group(2))))
    return steps


def cmd_busy(_args):
    print(f"{busy_pct():.0f}")
    return 0


def wait_for_quiet(limit_s, threshold=15.0):
    waited = 0.0
    while True:
        busy = busy_pct()
        if busy < threshold:
            return busy
        if waited >= limit_s:
            print(f"   (machine still {busy:.0f}% busy after {waited:.0f} s; measuring anyway)", flush=True)
            return busy
        time.sleep(4)
        waited += 5


def run_once(cmd, log, timeout):
    """Runs cmd with output to log. Returns (status, rc, wall_s, cpu_s of cmd and children, others_pct,
    peak resident set in GiB of cmd or the largest of its waited-for children)."""
    b0, _ = cpu_times()
    w0 = time.monotonic()
    status, rc, ru_cpu, peak_rss = "ok", None, 0.0, None
    try:
        with open(log, "wb") as logf:
            p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = w0 + timeout if timeout > 0 else None
            while True:
                pid, st, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == p.pid:
                    break
                if deadline and time.monotonic() > deadline:
                    status = "timeout"
                    os.killpg(p.pid, signal.SIGTERM)
                    time.sleep(2)
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    pid, st, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.2)
            rc = os.waitstatus_to_exitcode(st)
            ru_cpu = ru.ru_utime + ru.ru_stime
            peak_rss = ru.ru_maxrss / 2**20  # KiB on Linux
    except OSError as e:
        status = f"failed to start: {e}"
    wall = time.monotonic() - w0
    b1, _ = cpu_times()
    busy_s = (b1 - b0) / os.sysconf("SC_CLK_TCK")
    others = max(0.0, busy_s - ru_cpu) / max(1e-9, wall * (os.cpu_count() or 1)) * 100.0
    return status, rc, wall, ru_cpu, others, peak_rss


def cmd_run(args):
    cmd = args.cmd
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    rec = {"pass": args.pass_name, "peer": args.peer, "batch": args.batch, "seq": args.seq,
           "log": args.log, "cmd": " ".join(cmd)}
    if args.status:  # the caller already knows it can't run (missing binary, failed build)
        rec.update(status=args.status, steps=[], note=args.note or "")
        with open(args.results, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return 0
    best = None
    tries = []
    for attempt in range(1 + max(0, args.retries)):
        if args.clean and os.path.isdir(args.clean):
            shutil.rmtree(args.clean, ignore_errors=True)
        if args.quiet_wait > 0:
            wait_for_quiet(args.quiet_wait)
        log = args.log if attempt == 0 else f"{args.log}.try{attempt + 1}"
        load = os.getloadavg()[0]
        print(f"-- {args.peer} {args.batch}x{args.seq}" + (f" (try {attempt + 1})" if attempt else "")
              + f", load average {load:.2f}", flush=True)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        status, rc, wall, cpu, others, peak_rss = run_once(cmd, log, args.timeout)
        steps = parse_steps(args.peer, log, args.metrics)
        if status == "ok" and rc != 0:
            status = f"exit {rc}"
        if status == "ok" and len(steps) < 2:
            status = "no timed steps"
        r = dict(rec, log=log, started=started, load_avg=round(load, 2), status=status, rc=rc,
                 wall_s=round(wall, 2), cpu_s=round(cpu, 2), others_pct=round(others, 1),
                 peak_rss_gib=None if peak_rss is None else round(peak_rss, 3),
                 steps=[[s, round(dt, 6), l] for s, dt, l in steps])
        shown = ", ".join(f"{dt:.2f}" for _, dt, _ in steps)
        print(f"   {status}; wall {wall:.0f} s, others {others:.0f}% of CPUs; step s: [{shown}]", flush=True)
        tries.append(round(others, 1))
        if best is None or (r["status"] == "ok" and (best["status"] != "ok" or others < best["others_pct"])):
            best = r
        if status != "ok" or others <= DISTURBED_PCT:
            break  # a failure does not get better by retrying; a quiet run is final
    best["others_pct_tries"] = tries
    with open(args.results, "a") as f:
        f.write(json.dumps(best) + "\n")
    return 0


def summarize(rec, peak, step_flops=flops_per_step):
    """Median tokens/s over the timed steps (the first is skipped), their min and max, GFLOP/s and MFU from
    step_flops(batch, seq) (GPT-2 124M's count unless another model's is given)."""
    b, t = rec["batch"], rec["seq"]
    timed = [dt for _, dt, _ in rec.get("steps", [])[1:] if dt > 0]
    if not timed:
        return None
    tps = sorted(b * t / dt for dt in timed)
    med = statistics.median(tps)
    f = step_flops(b, t)
    return {"n": len(timed), "tps": med, "lo": tps[0], "hi": tps[-1],
            "gflops": f * med / (b * t) / 1e9, "mfu": f * med / (b * t) / 1e9 / peak,
            "loss0": rec["steps"][0][2], "lossN": rec["steps"][-1][2]}


def cmd_table(args):
    recs = []
    with open(args.results) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    peak = args.peak_gflops
    bf16_peak = args.bf16_peak_gflops or 2.0 * peak
    print(f"FLOPs per step = 6 x {N_MATMUL:,} x tokens + 12 x {L_LAYERS} x {D_MODEL} x T x tokens "
          f"(llm.c / nanoGPT count): " + ", ".join(
              f"{b}x{t}: {flops_per_step(b, t) / 1e9:.1f} GFLOP" for b, t in
              sorted({(r['batch'], r['seq']) for r in recs})))
    print(f"MFU = those FLOPs / step time / {peak:.0f} GFLOP/s (--peak-gflops: this machine's measured 2-thread "
          f"fp32 GEMM peak; bf16 rows: / {bf16_peak:.0f}, --bf16-peak-gflops). Medians over the timed steps (first "
          f"step skipped). RSS: peak resident set.")
    print("* = other processes used > 10% of the CPUs during that run (figures disturbed).")
    print()
    hdr = (f"{'pass':<14} {'B x T':<7} {'system':<14} {'status':<8} {'n':>2} {'tokens/s':>9} "
           f"{'min..max':>15} {'GFLOP/s':>8} {'MFU':>6} {'RSS GiB':>7} {'others':>7} {'loss first->last':>18}")
    print(hdr)
    print("-" * len(hdr))
    summ = {}
    for r in recs:
        s = summarize(r, bf16_peak if r["peer"] in BF16_PEERS else peak) if r["status"] in ("ok", "timeout", "no timed steps") or r.get("steps") else None
        key = (r["pass"], r["batch"], r["seq"], r["peer"])
        summ[key] = s
        shape = f"{r['batch']}x{r['seq']}"
        oth = r.get("others_pct")
        oth_s = "" if oth is None else f"{oth:.0f}%" + ("*" if oth > DISTURBED_PCT else " ")
        st = r["status"] if len(r["status"]) <= 8 else r["status"][:8]
        rss = r.get("peak_rss_gib")
        rss_s = "-" if rss is None else f"{rss:.2f}"
        if s is None:
            print(f"{r['pass']:<14} {shape:<7} {r['peer']:<14} {st:<8} {'-':>2} {'-':>9} {'-':>15} {'-':>8} "
                  f"{'-':>6} {rss_s:>7} {oth_s:>7}  {r.get('note', '')}")
            continue
        print(f"{r['pass']:<14} {shape:<7} {r['peer']:<14} {st:<8} {s['n']:>2} {s['tps']:>9.1f} "
              f"{s['lo']:>7.1f}..{s['hi']:<7.1f} {s['gflops']:>8.1f} {s['mfu'] * 100:>5.1f}% {rss_s:>7} {oth_s:>7} "
              f"{s['loss0']:>8.3f}->{s['lossN']:<8.3f}")
    print()
    print("ratios of median tokens/s (meshtrain / peer):")
    seen = []
    for r in recs:
        k = (r["pass"], r["batch"], r["seq"])
        if k not in seen:
            seen.append(k)
    for p, b, t in seen:
        m = summ.get((p, b, t, "meshtrain"))
        parts = []
        mb = summ.get((p, b, t, "meshtrain-bf16"))
        pairs = [("meshtrain", m, peer) for peer in ["llm.c"] + TORCH_PEERS if peer != "torch2-bf16"]
        pairs += [("meshtrain-bf16", mb, peer) for peer in ["torch2-bf16", "meshtrain"]]
        if (p, b, t, "meshtrain-bf16") not in summ:
            pairs.append(("meshtrain", m, "torch2-bf16"))
        for name, mine, peer in pairs:
            if (p, b, t, peer) not in summ or (p, b, t, name) not in summ:
                continue
            o = summ.get((p, b, t, peer))
            if mine and o and o["tps"] > 0:
                parts.append(f"{name}/{peer} = {mine['tps'] / o['tps']:.2f}x")
            else:
                parts.append(f"{name}/{peer} = n/a")
        print(f"  {p:<14} {b}x{t:<5} " + "   ".join(parts))
    return 0


def main():
    ap = argparse.ArgumentParser(description="run_peers.sh helpers")
    sub = ap.add_subparsers(dest="sub", required=True)
    sub.add_parser("busy")
    r = sub.add_parser("run")
    r.add_argument("--results", required=True)
    r.add_argument("--pass", dest="pass_name", required=True)
    r.add_argument("--peer", required=True, choices=["meshtrain", "meshtrain-bf16", "llm.c"] + TORCH_PEERS)
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--seq", type=int, required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--metrics")
    r.add_argument("--timeout", type=float, default=0)
    r.add_argument("--quiet-wait", type=float, default=0,
                   help="before each try, wait up to this many s for the machine to be < 15%% busy")
    r.add_argument("--retries", type=int, default=0,
                   help="run again (up to this many times) while others took > 10%% of the CPUs; keep the "
                        "least disturbed try")
    r.add_argument("--clean", help="directory to delete before each try (meshtrain's run_dir)")
    r.add_argument("--status", help="record this status without running anything")
    r.add_argument("--note")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    t = sub.add_parser("table")
    t.add_argument("--results", required=True)
    t.add_argument("--peak-gflops", type=float, default=DEFAULT_PEAK_GFLOPS)
    t.add_argument("--bf16-peak-gflops", type=float, default=0.0, help="bf16 rows' MFU peak (default 2x)")
    args = ap.parse_args()
    try:
        return {"busy": cmd_busy, "run": cmd_run, "table": cmd_table}[args.sub](args)
    except Exception as e:  # the benchmark never fails a caller
        print(f"peers.py {args.sub}: error: {e}", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
