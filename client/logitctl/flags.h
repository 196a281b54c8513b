// logitctl's flags. They are defined in one place (flags.cc) because most
// are shared by several commands, as their help strings say; bench.cc and
// stress.cc define the ones only they read.
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// Connection (every subcommand).
ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(std::uint64_t, chunk_bytes);
ABSL_DECLARE_FLAG(std::uint64_t, digest_after_bytes);
ABSL_DECLARE_FLAG(std::string, token);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, ca);
ABSL_DECLARE_FLAG(std::string, cert);
ABSL_DECLARE_FLAG(std::string, key);
ABSL_DECLARE_FLAG(std::string, lb);

// Subcommand options.
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, tensor);
ABSL_DECLARE_FLAG(std::string, name);
ABSL_DECLARE_FLAG(std::string, x);
ABSL_DECLARE_FLAG(std::string, dy);
ABSL_DECLARE_FLAG(std::string, weight);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(bool, force);
ABSL_DECLARE_FLAG(std::string, out_dtype);
ABSL_DECLARE_FLAG(double, alpha);
ABSL_DECLARE_FLAG(bool, pipeline);
ABSL_DECLARE_FLAG(std::int32_t, connections);
ABSL_DECLARE_FLAG(bool, shm);
ABSL_DECLARE_FLAG(std::string, dx_dtype);
ABSL_DECLARE_FLAG(std::string, dw_dtype);
ABSL_DECLARE_FLAG(bool, no_dx);
ABSL_DECLARE_FLAG(bool, no_dw);
ABSL_DECLARE_FLAG(bool, accumulate);
ABSL_DECLARE_FLAG(bool, zero);
ABSL_DECLARE_FLAG(std::string, in);
ABSL_DECLARE_FLAG(std::string, targets);
ABSL_DECLARE_FLAG(std::string, reduction);
ABSL_DECLARE_FLAG(std::int64_t, ignore_index);
ABSL_DECLARE_FLAG(double, z_loss);
ABSL_DECLARE_FLAG(double, logit_softcap);
ABSL_DECLARE_FLAG(double, grad_scale);
ABSL_DECLARE_FLAG(bool, lse);
ABSL_DECLARE_FLAG(std::int64_t, top_k);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(bool, entropy);
ABSL_DECLARE_FLAG(bool, rank);
ABSL_DECLARE_FLAG(std::int64_t, vocab_size);
ABSL_DECLARE_FLAG(bool, dx);
ABSL_DECLARE_FLAG(bool, dw);
