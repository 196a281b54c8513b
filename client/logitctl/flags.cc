#include "client/logitctl/flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "logitd/protocol.h"

// Connection (every subcommand).
ABSL_FLAG(std::string, server, "127.0.0.1:50051", "logitd server address (a gRPC target)");
ABSL_FLAG(double, timeout, 600, "per-call deadline in seconds; 0 for none");
ABSL_FLAG(std::uint64_t, chunk_bytes, logitd::kDefaultChunkBytes,
          "chunk size for tensors sent to the server, bytes");
ABSL_FLAG(std::uint64_t, digest_after_bytes, std::uint64_t{64} << 20,
          "tensors of this many bytes or more are sent with their digest after their chunks, "
          "hashed while they travel (servers whose info says request_digest_last); 0 hashes "
          "every tensor before the call's header, as older servers need");
ABSL_FLAG(std::string, token, "",
          "bearer token sent with every call (default: $LOGITD_TOKEN); visible to other users "
          "in the process list, so prefer $LOGITD_TOKEN or --token_file on shared machines");
ABSL_FLAG(std::string, token_file, "", "file holding a bearer token sent with every call");
ABSL_FLAG(std::string, ca, "",
          "PEM file of the CA that signed the server's certificate; enables TLS");
ABSL_FLAG(std::string, cert, "", "PEM client certificate for mutual TLS (needs --ca and --key)");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert");
ABSL_FLAG(std::string, lb, "pick_first",
          "gRPC load-balancing policy: pick_first (one server) or round_robin (calls spread over "
          "every address of --server, e.g. dns:///HOST:PORT or ipv4:IP:PORT,IP:PORT); not used "
          "by validate, which stays on one server");

// Subcommand options.
ABSL_FLAG(bool, json, false, "info, bench: print JSON instead of a table");
ABSL_FLAG(std::string, tensor, "", "weights register/load: tensor to read from the file");
ABSL_FLAG(std::string, name, "", "weights register/load: weight name (default: the tensor's name)");
ABSL_FLAG(std::string, x, "", "activations X as FILE[:TENSOR], bf16 [M, K]");
ABSL_FLAG(std::string, dy, "", "backward: logit gradient dY as FILE[:TENSOR], fp32 or bf16 [M, V]");
ABSL_FLAG(std::string, weight, "", "weight handle from `weights register`");
ABSL_FLAG(std::string, out, "", "output safetensors file");
ABSL_FLAG(bool, force, false,
          "weights release: drop the weight even if other registrations of it remain");
ABSL_FLAG(std::string, out_dtype, "fp32",
          "logits, bench: fp32 (the accumulator) or bf16 (legacy); bench: also dY's dtype");
ABSL_FLAG(double, alpha, 1.0, "logits: scale applied to X.W^T (non-zero)");
ABSL_FLAG(std::int32_t, connections, 1,
          "logits, logprobs, bench --rpc=logits|logprobs: spread each call over this many "
          "connections (1 to 64), X's rows cut where the weight says the bits stay the same");
ABSL_FLAG(bool, pipeline, true,
          "logits, logprobs, cross-entropy, bench: ask the server to run the call in "
          "row blocks, starting on X's first rows while the rest arrive and streaming the "
          "outputs' rows as they are done (the same bits; --nopipeline runs it whole)");
ABSL_FLAG(bool, shm, false,
          "logits, cast, cross-entropy, bench: move the call's tensors through a shared-memory "
          "region instead of gRPC (same host and user as a server started with --allow_shm)");
ABSL_FLAG(std::string, dx_dtype, "bf16", "backward, cross-entropy: dX dtype, bf16 or fp32");
ABSL_FLAG(std::string, dw_dtype, "fp32", "backward: dW dtype, fp32 or bf16");
ABSL_FLAG(bool, no_dx, false, "backward: do not compute dX");
ABSL_FLAG(bool, no_dw, false, "backward: do not compute dW");
ABSL_FLAG(bool, accumulate, false,
          "backward, cross-entropy: add dW into the server-held fp32 buffer instead of returning "
          "it");
ABSL_FLAG(bool, zero, false, "grad fetch: zero the server-held buffer after reading it");
ABSL_FLAG(std::string, in, "", "cast: fp32 input as FILE[:TENSOR]");
ABSL_FLAG(std::string, targets, "",
          "cross-entropy: target ids as FILE[:TENSOR], int32 or int64 [M]");
ABSL_FLAG(std::string, reduction, "mean", "cross-entropy: mean, sum or none (per-token losses)");
ABSL_FLAG(std::int64_t, ignore_index, -100,
          "cross-entropy, logprobs: targets equal to this are ignored");
ABSL_FLAG(double, z_loss, 0, "cross-entropy: coefficient of the z-loss term z_loss * lse^2");
ABSL_FLAG(double, logit_softcap, 0,
          "cross-entropy, logprobs: tanh soft-capping of the logits; 0 = off");
ABSL_FLAG(double, grad_scale, 1.0,
          "cross-entropy: incoming gradient of the reduced loss (non-zero)");
ABSL_FLAG(bool, lse, false, "cross-entropy, logprobs: also return the log-sum-exp per token");
ABSL_FLAG(std::int64_t, top_k, 0, "logprobs: the 0 to 64 most likely tokens per position");
ABSL_FLAG(double, temperature, 1.0, "logprobs: logits divided by it before the softmax (> 0)");
ABSL_FLAG(bool, entropy, false, "logprobs: also return the entropy per token");
ABSL_FLAG(bool, rank, false, "logprobs: also return each target's rank (needs --targets)");
ABSL_FLAG(std::int64_t, vocab_size, 0,
          "logprobs: vocabulary entries that count (padded vocabularies); 0 = all");
ABSL_FLAG(bool, dx, false, "cross-entropy: also return dX");
ABSL_FLAG(bool, dw, false,
          "cross-entropy: also compute dW (returned, or with --accumulate added "
          "into the server-held buffer)");
