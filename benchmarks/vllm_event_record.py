"""What one CUDA event record costs the step timer's host thread: torch's ``Event.record`` (releases the GIL on every
call) against the driver's ``cuEventRecord`` called with the GIL held (``step_timer.driver_record``), each alone
and beside a second Python thread that keeps asking for the GIL (as vLLM's engine-core threads do between steps).

    python benchmarks/vllm_event_record.py [--n 20000]      # on a CUDA GPU; prints microseconds per record and ratios

The timer records five events a no-SD step and seven an EAGLE step on the runner's stream. On a lent H100
(data/gpu/raw/v2hybrid-h100-driver/bench) a record took 1.54 us through torch and 1.30 us through the driver alone,
1.98 and 1.30 us beside the thread; in the engine both cost the same, +0.2-0.6% a step (data/gpu/live/overhead.csv).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time


def per_record_us(record, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        record()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="records per arm (default 20000)")
    a = ap.parse_args(argv)
    import torch

    from spec_repro.engines.vllm.step_timer import driver_record

    if not torch.cuda.is_available():
        print("vllm_event_record: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    drv = driver_record()
    if drv is None:
        print("vllm_event_record: libcuda.so.1 could not be loaded", file=sys.stderr)
        return 2
    stream, ev = torch.cuda.Stream(), torch.cuda.Event(enable_timing=True)
    ev.record(stream)                                    # torch creates the event at its first record
    h, s = ev.cuda_event, stream.cuda_stream
    arms = {"torch": lambda: ev.record(stream), "driver": lambda: drv(h, s)}
    stop = threading.Event()

    def contender():                                     # pure-Python work that wants the GIL back at once
        x = 0
        while not stop.is_set():
            x += 1
            if x % 100 == 0:
                time.sleep(0)

    res = {}
    for label, busy in (("alone", False), ("beside a GIL-hungry thread", True)):
        th = threading.Thread(target=contender, daemon=True) if busy else None
        if th:
            th.start()
        for name, rec in arms.items():
            per_record_us(rec, min(a.n, 1000))           # warm
            res[(label, name)] = per_record_us(rec, a.n)
            torch.cuda.synchronize()
        stop.set()
        if th:
            th.join()
        stop.clear()
        print(f"{label}: torch {res[(label, 'torch')]:.2f} us/record, driver {res[(label, 'driver')]:.2f} us/record, "
              f"torch / driver {res[(label, 'torch')] / res[(label, 'driver')]:.2f}x")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.n} records an arm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
