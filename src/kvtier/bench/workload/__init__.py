"""``kvtier bench workload``: serving workloads (multi-round chat, document questions, no reuse,
a restart between rounds) driven against any OpenAI-compatible server.

One module per job: ``text`` (the tokenizer-free word generator), ``plan`` (the requests of a
workload and their arrival times), ``client`` (one streamed request), ``metrics`` (the server's
prompt-token counters), ``runner`` (sending the plan), ``results`` (the figures of a run),
``output`` (table, plot, JSON), ``drive`` (the command: size, send, summarize).
"""
