"""The OIP's ``open_inference_grpc.proto`` and its generated stubs (``make grpc-stubs``; do not edit them).

The messages live in a descriptor pool of their own (``open_inference_grpc_pb2.POOL``), not
protobuf's default pool, where ``tritonclient.grpc`` registers the same message names.
"""
