"""Generated protobuf code for libtpu's runtime metric service. DO NOT EDIT the ``*_pb2`` files.

``tpu_metric_service.proto`` (beside this file) is a subset of tpu-info's
``tpu_info/proto/tpu_metric_service.proto`` under otel-gpu's own proto package; see its header.

The code is generated with grpcio-tools 1.62.3 (protoc of protobuf 4.25), so that it imports
on every protobuf runtime from 4.25 up (newer gencode refuses older runtimes). From the
repository root::

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install 'grpcio-tools==1.62.3'
    /tmp/protoc/bin/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \\
        otel_gpu/backends/tpu/_proto/tpu_metric_service.proto

No ``_pb2_grpc`` module is generated: the client calls the method path directly
(:mod:`otel_gpu.backends.tpu._grpc`), which also keeps grpcio's own version check out.
"""
