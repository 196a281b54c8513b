// logitctl's subcommands that call the server themselves (bench, stress and
// validate have entry points of their own). Each takes the command line's
// positional words, the command's name first, reads its options from the
// flags (flags.h) and returns logitctl's exit code (common.h).
#pragma once

#include <string>
#include <vector>

namespace logitd::logitctl {

// info.cc
int CmdInfo(const std::vector<std::string>& words);

// weights.cc
int CmdWeightsRegister(const std::vector<std::string>& words);
int CmdWeightsLoad(const std::vector<std::string>& words);
int CmdWeightsList(const std::vector<std::string>& words);
int CmdWeightsRelease(const std::vector<std::string>& words);

// logits.cc
int CmdLogits(const std::vector<std::string>& words);

// backward.cc
int CmdBackward(const std::vector<std::string>& words);

// grad.cc
int CmdGrad(const std::vector<std::string>& words);

// cast.cc
int CmdCast(const std::vector<std::string>& words);

// cross_entropy.cc
int CmdCrossEntropy(const std::vector<std::string>& words);

// logprobs.cc
int CmdLogProbs(const std::vector<std::string>& words);

// runs.cc
int CmdRuns(const std::vector<std::string>& words);
int CmdRules(const std::vector<std::string>& words);

}  // namespace logitd::logitctl
