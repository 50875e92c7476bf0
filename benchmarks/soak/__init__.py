"""The soak: real kvtier servers under a seeded fault schedule for an hour, then a verdict.

Command (root, for the tmpfs folders; needs redis-server or valkey-server)::

    python -m benchmarks soak --duration 3600 --seed 1 --out soak-out [--smollm/--no-smollm]
    python -m benchmarks soak --short --duration 100 --no-smollm --out /tmp/soak   # the CI soak

What it drives (``runner.layout``), every server a real ``kvtier serve`` on loopback with a
small host pool, a capped disk folder (``--disk-capacity``, ``--allow-small-tiers``) and few
engine KV blocks, so eviction and the cascade to disk and Redis happen all the time:

* two replicas sharing one Redis (``kvtier.bench.redis_servers``), each its own disk folder;
* two engines sharing one disk folder, no shared tier; with ``--smollm`` (default for runs of
  10 minutes or more) one of them serves SmolLM2, the others the tiny random Llama;
* ``--short``: two servers sharing Redis *and* one folder (both kinds of sharing, fewer
  start-ups on a 2-core machine; no engine kills: a restart outlasts the short run there);
* per model, vLLM's own API server without kvtier, same settings: the oracle's reference.

Each disk folder is the ``cache`` subfolder of its own small tmpfs. The load
(``load.Load``): multi-turn chat sessions over shared system prompts and documents, as token
ids, greedy, 4 output tokens, through the ``openai`` client from a few threads at a bounded
rate. Every answer is compared with the *resume oracle*: the reference's output for the same
prompt when as many prompt tokens were a prefix-cache hit as the server reported; a mismatch
is ``wrong``. A request's bound is the tier load-deadline ceiling
(``kvtier.policy.deadline.DeadlineRule``) plus one cold prefill of its length (the
reference's cold runs, or the running median of the servers' cold TTFTs, whichever is larger).
A request that meets a killed or restarting server is retried once the server is ready.

Fault kinds (``faults.Faults``; the schedule is drawn from ``random.Random(seed)`` up front):
``engine_sigkill`` (the server's session; the supervisor restarts it on the same port),
``redis_kill`` (down 1-5 s, back empty), ``redis_restart_empty``, ``redis_sigstop`` (1-3 s),
``disk_full`` (a balloon file fills the tmpfs for 2-6 s), ``disk_read_only`` (remount ro, or
a read-only bind over the folder when the remount is refused as busy, for 2-6 s),
``records_damaged`` (1-3 live records: bit flips, truncation, extension, zeroes, a foreign
version, another key's record copied or hard-linked, symlink, FIFO, directory, another owner,
0666), ``gc_to`` (``kvtier gc --to`` 10-40% of the cap) and ``verify_fix`` (``kvtier verify
--fix``) on the live folder, ``cpu_burst`` (a busy process per core for 2-5 s) and
``client_disconnect`` (a stream closed after its first token), ``disk_throttled`` (the
folder reads of one server, ``pair-a`` or ``srv-a``, slowed to 1 MiB/s or 256 KiB/s or stalled
at 4 KiB/s for 3-8 s through ``throttle.SoakThrottledDiskTier``: that server runs what
``kvtier serve`` runs, vLLM's server with kvtier's config, its disk tier swapped for the
throttled one; no root, loop device or cgroup needed). Kinds the host cannot do (no mounts) are
left out, with the reason in the ``run`` line.

Output: ``OUT/events.jsonl`` as EVENTS.md specifies (a ``sample`` every 5 s from
``sample.take``), server logs in ``OUT/logs/``, and ``report.write_report``'s report.md,
report.json and soak.png; the exit code is 1 when the verdict fails. Every server, Redis,
burner, mount and temporary folder is stopped or removed on every way out, Ctrl-C included;
the ``end`` line says what was left.
"""
