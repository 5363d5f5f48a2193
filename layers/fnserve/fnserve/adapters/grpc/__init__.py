"""The Open Inference Protocol's gRPC service (``fnserve serve --grpc-port``); needs ``fnserve[grpc]``."""
