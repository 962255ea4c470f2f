"""controld's generated gRPC API: forkfleet.controld.v1 (controld_pb2, controld_pb2_grpc).
The client is forkfleet.client."""
