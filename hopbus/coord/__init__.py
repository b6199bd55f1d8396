"""The control plane: Redis keys, iteration counters, token queues, streams, the embedded broker."""
