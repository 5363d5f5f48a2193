"""fnserve's peers, serving the demo's models for tests/bench/bench_peers.py: a BentoML service and MLServer's
custom runtimes, each run from a virtualenv of its own (make bench-peers)."""
