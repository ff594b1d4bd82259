"""Side-by-side benchmarks of kiln against its peers.

Run ``python -m benchmarks`` (or ``python benchmarks/run.py``); see
``benchmarks/README.md`` and ``docs/benchmarks.md``.

Layout:

* ``harness``   -- the model (Contender, Op, Workload), the workload registry
                   and the one timing helper with its interleaved scheduler;
* ``workloads`` -- the ratio workloads (records, floats, many-tensors,
                   big-tensor, sample), each with its floor and peers;
* ``hostile``   -- time and traced allocation to reject hostile counts;
* ``report``    -- machine description, the table, targets, JSON and plot;
* ``run``       -- the command line.
"""
