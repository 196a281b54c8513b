"""gRPC stubs of the wire contract logitd.v1 (proto/logitd/v1/logitd.proto).

logitd_pb2 and logitd_pb2_grpc are generated here by grpcio-tools when the
package is built or installed; they are not part of the source tree.
"""
