"""What the daemon tells operators: the log stream, gRPC's own lines, traces.

``logs`` configures the structured stdout stream and ``logsink`` writes it without ever
blocking; ``grpc_relay`` turns the gRPC C core's stderr lines into records; ``tracing``
exports allocation spans over OTLP, best effort.
"""
