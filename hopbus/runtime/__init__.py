"""The real cluster: worker processes that drive ``worker_loop`` with ZeroMQ, Redis and a model,
and the local launcher behind ``hopbus train``."""
