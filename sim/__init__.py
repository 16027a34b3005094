"""kvsim: a discrete-event simulator of tiered KV-cache memory in LLM inference.

Layers, lowest first: config, cost | workload, memory, kv, instance, cluster, observe, run
(docs/architecture.md).
"""
