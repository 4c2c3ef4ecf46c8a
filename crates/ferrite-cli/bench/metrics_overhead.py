#!/usr/bin/env python3
"""Overhead of watching a run: the digits epoch with and without --metrics-addr/--metrics-file.

Runs `ferrite train` (the default demo, digits MLP) alternately without outputs ("off") and with
`--metrics-addr 127.0.0.1:0 --metrics-file FILE` while a scraper thread GETs /metrics every
SCRAPE_MS ms ("on", ten times Prometheus's usual rate of one scrape a second). Rounds are
interleaved so machine load hits both alike. Reports, per round, the median and the fastest epoch
time (training + evaluation, as `ferrite train` prints per epoch; the fastest is the least
disturbed by other programs on a shared machine) and the process's CPU time (user + system, all
threads: the server and writer threads included), then the median overhead of "on" over "off"
for each figure.

    cargo build --release -p ferrite-cli
    python3 crates/ferrite-cli/bench/metrics_overhead.py [ROUNDS] [EPOCHS]
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")
SCRAPE_MS = 100
EPOCH_RE = re.compile(r"^epoch\s+\d+/\d+ .*\|\s+([0-9.]+) (ms|s)$")


def epoch_times(lines):
    out = []
    for line in lines:
        m = EPOCH_RE.match(line.strip())
        if m:
            v = float(m.group(1))
            out.append(v if m.group(2) == "ms" else v * 1e3)
    return out


def run(epochs, watched, tmp):
    cmd = [FERRITE, "train", "--no-progress", "--epochs", str(epochs), "--out", os.path.join(tmp, "w.safetensors")]
    if watched:
        cmd += ["--metrics-addr", "127.0.0.1:0", "--metrics-file", os.path.join(tmp, "run.jsonl")]
    env = dict(os.environ, NO_PROXY="*")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    rusage = None
    lines, scrapes, stop = [], [0], threading.Event()

    def scraper(url):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not stop.is_set():
            try:
                opener.open(url, timeout=2).read()
                scrapes[0] += 1
            except OSError:
                pass
            stop.wait(SCRAPE_MS / 1e3)

    thread = None
    for line in p.stdout:
        lines.append(line)
        if watched and thread is None and "metrics: serving " in line:
            url = line.split("metrics: serving ", 1)[1].strip()
            thread = threading.Thread(target=scraper, args=(url,), daemon=True)
            thread.start()
    _, status, rusage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    if thread:
        thread.join()
    if p.returncode != 0:
        sys.exit(f"ferrite train failed ({p.returncode}): {' '.join(cmd)}")
    times = epoch_times(lines)
    cpu = rusage.ru_utime + rusage.ru_stime
    return {"median": statistics.median(times), "min": min(times), "cpu": cpu, "scrapes": scrapes[0]}


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    print(f"digits epoch, {epochs} epochs per run, {rounds} interleaved rounds, scrape every {SCRAPE_MS} ms when on")
    print("| round | median epoch off / on | fastest epoch off / on | CPU time off / on | scrapes |")
    print("|---|---:|---:|---:|---:|")
    over = {"median": [], "min": [], "cpu": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, rounds + 1):
            order = [False, True] if r % 2 else [True, False]
            res = {w: run(epochs, w, tmp) for w in order}
            off, on = res[False], res[True]
            for k in over:
                over[k].append((on[k] - off[k]) / off[k] * 100)
            print(
                f"| {r} | {off['median']:.2f} / {on['median']:.2f} ms | {off['min']:.2f} / {on['min']:.2f} ms "
                f"| {off['cpu']:.2f} / {on['cpu']:.2f} s | {on['scrapes']} |"
            )
    for k, name in [("median", "median epoch"), ("min", "fastest epoch"), ("cpu", "CPU time")]:
        print(f"overhead, {name}: median {statistics.median(over[k]):+.2f} % over {rounds} rounds")


if __name__ == "__main__":
    main()
