"""What a kvtier tier does whatever the engine: its jobs and their threads, the store's opener
and housekeeping, the server's existence probes, health and back-off, counters, the row
layout, the scheduler's step clock, the start-up line, the decision's evidence file, the
start-up guards. Nothing here imports vLLM; ``kvtier.vllm`` translates vLLM's calls onto it."""
