"""The host pool's own rules, whatever runs it: how much each tier holds (``sizing``), how much
RAM a pool may take (``ram_guard``), and the region files a dead engine leaves (``regions``).
Nothing here imports vLLM."""
