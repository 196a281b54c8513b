// logitd_gemm_sweep: runs every cuBLASLt configuration a GEMM engine could
// pick for small and odd LM-head shapes, each alone, on integer operands, and
// says which ones finish with the exact result, which give wrong results,
// which fail, which fault the device and which hang. A diagnostic for the
// tuner's candidate rules, run on the GPU machine (scripts/gpu-check.sh,
// step "sweep").
//
// Three candidate sets per product:
//   offered  every configuration the heuristic offers (up to 32), split-K any
//   forced   the heuristic's first three with SPLITK_NUM and a compute-type
//            reduction set to 1..16 regardless of the kernel's capabilities
//            (the tuner's rule before it checked them)
//   tuner    what GemmEngine::TuningCandidates lists under --split_k=fp32
//
// A hung or faulting configuration leaves the CUDA context unusable, so the
// sweep runs in child processes: a child stops at the first hang or fault
// (after printing it) and the parent starts another from the next one.
//
//   usage: logitd_gemm_sweep [--sets=offered,forced,tuner] [--timeout_ms=3000]
//                            [--max_seconds=150] [--tokens=1,4,5,8,300,1729]
//
// --tokens: the token counts M of every product (dW's reduction length);
// 1,729 is where a split-in-three variant of algorithm 66 summed dW wrongly
// on an H100 (docs/notes/cuda.md, "Split-K").
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "logitd/bf16.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace kc = logitd::kernels::cuda;
using logitd::Bf16Bits;

namespace {

struct Product {
  std::string op;  // logits, dx, dw
  std::int64_t m;  // tokens
  std::int64_t v;  // vocabulary rows
  std::int64_t k;  // hidden size
  cudaDataType_t out;
};

// The LM head's products for the weights and token counts of issue-style
// workloads: small, odd, not multiples of 8.
std::vector<Product> Products(const std::vector<std::int64_t>& tokens) {
  std::vector<Product> out;
  const std::vector<std::pair<std::int64_t, std::int64_t>> weights = {
      {256, 128}, {384, 200}, {512, 64}, {130, 257}, {1000, 96}, {77, 333}, {2048, 40}};
  for (const auto& [v, k] : weights) {
    for (std::int64_t m : tokens) {
      for (const char* op : {"logits", "dx", "dw"}) {
        for (cudaDataType_t t : {CUDA_R_32F, CUDA_R_16BF}) out.push_back({op, m, v, k, t});
      }
    }
  }
  return out;
}

kc::GemmShape ShapeOf(const Product& p) {
  if (p.op == "logits") return kc::LogitsShape(p.m, p.v, p.k, p.out);
  if (p.op == "dx") return kc::GradInputShape(p.m, p.v, p.k, p.out);
  return kc::GradWeightShape(p.m, p.v, p.k, p.out);
}

std::vector<Bf16Bits> Integers(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (auto& b : out) b = logitd::FloatToBf16(static_cast<float>(dist(rng)));
  return out;
}

struct Candidate {
  std::string set;
  kc::AlgoChoice choice;
};

[[noreturn]] void Die(const std::string& what) {
  std::printf("ERROR %s\n", what.c_str());
  std::fflush(stdout);
  std::_Exit(2);
}

// The child: enumerates every (product, candidate) pair in a fixed order and
// runs those from `start` on. Exit 0 when done, 3 after a hang, 4 after a
// fault, printing one RESULT line per pair.
int Child(std::size_t start, const std::vector<std::string>& sets,
          const std::vector<std::int64_t>& tokens, int timeout_ms, int max_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(max_seconds);
  if (cudaSetDevice(0) != cudaSuccess) Die("cudaSetDevice(0)");
  auto memory = kc::DeviceMemory::Create(0, 0);
  auto stream = kc::CreateStream();
  auto handle = kc::CreateLtHandle();
  auto workspace = memory->Allocate(32u << 20, "workspace");
  auto done = kc::CreateEvent(false);
  if (!stream.ok() || !handle.ok() || !workspace.ok() || !done.ok()) Die("setup");
  const kc::GemmStream gs{handle->get(), stream->get(), workspace->get(), workspace->size()};

  kc::GemmEngineOptions any;
  any.split_k = logitd::kernels::SplitK::kAny;
  any.heuristic_candidates = 32;
  kc::GemmEngine lister(any, memory);
  kc::GemmEngine tuner(kc::GemmEngineOptions{}, memory);

  std::size_t index = 0;
  for (const Product& p : Products(tokens)) {
    const kc::GemmShape shape = ShapeOf(p);
    const auto x = Integers(p.m * p.k, 1);
    const auto w = Integers(p.v * p.k, 2);
    const auto g = Integers(p.m * p.v, 3);
    // Exact sums, as the product's row-major C[shape.m, shape.n].
    std::vector<double> exact(static_cast<std::size_t>(shape.m * shape.n), 0.0);
    for (std::int64_t i = 0; i < shape.m; ++i) {
      for (std::int64_t j = 0; j < shape.n; ++j) {
        double sum = 0;
        for (std::int64_t l = 0; l < shape.k; ++l) {
          float a = 0, b = 0;
          if (p.op == "logits") {  // Y[m, v] = X[m, k] W[v, k]^T
            a = logitd::Bf16ToFloat(x[static_cast<std::size_t>(i * p.k + l)]);
            b = logitd::Bf16ToFloat(w[static_cast<std::size_t>(j * p.k + l)]);
          } else if (p.op == "dx") {  // dX[m, k] = G[m, v] W[v, k]
            a = logitd::Bf16ToFloat(g[static_cast<std::size_t>(i * p.v + l)]);
            b = logitd::Bf16ToFloat(w[static_cast<std::size_t>(l * p.k + j)]);
          } else {  // dW[v, k] = G[m, v]^T X[m, k]
            a = logitd::Bf16ToFloat(g[static_cast<std::size_t>(l * p.v + i)]);
            b = logitd::Bf16ToFloat(x[static_cast<std::size_t>(l * p.k + j)]);
          }
          sum += static_cast<double>(a) * b;
        }
        exact[static_cast<std::size_t>(i * shape.n + j)] = sum;
      }
    }
    auto upload = [&](const std::vector<Bf16Bits>& h) {
      auto b = memory->Allocate(h.size() * 2, "operand");
      if (!b.ok() ||
          cudaMemcpy(b->get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
        Die("upload");
      }
      return *std::move(b);
    };
    auto dx = upload(x);
    auto dw = upload(w);
    auto dg = upload(g);
    const std::size_t elt = p.out == CUDA_R_32F ? 4 : 2;
    auto dc = memory->Allocate(exact.size() * elt, "c");
    if (!dc.ok()) Die("alloc c");
    kc::GemmOperands ops;
    if (p.op == "logits") ops = {dx.get(), dw.get(), dc->get()};
    if (p.op == "dx") ops = {dg.get(), dw.get(), dc->get()};
    if (p.op == "dw") ops = {dg.get(), dx.get(), dc->get()};

    std::vector<Candidate> candidates;
    auto offered = lister.Candidates(shape, ops, gs);
    for (const std::string& set : sets) {
      if (set == "offered" && offered.ok()) {
        for (const auto& c : *offered) candidates.push_back({set, c});
      } else if (set == "forced" && offered.ok()) {
        for (std::size_t i = 0; i < std::min<std::size_t>(3, offered->size()); ++i) {
          for (std::int32_t split : {1, 2, 3, 4, 6, 8, 12, 16}) {
            cublasLtMatmulAlgo_t algo = (*offered)[i].algo;
            const std::uint32_t scheme =
                split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
            if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                     sizeof split) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                     &scheme,
                                                     sizeof scheme) != CUBLAS_STATUS_SUCCESS) {
              continue;
            }
            auto checked = lister.Check(shape, gs, algo);
            if (checked.ok()) candidates.push_back({set, *checked});
          }
        }
      } else if (set == "tuner") {
        auto listed = tuner.TuningCandidates(shape, ops, gs);
        if (listed.ok()) {
          for (const auto& c : *listed) candidates.push_back({set, c});
        }
      }
    }

    std::vector<std::byte> host(exact.size() * elt);
    for (const Candidate& cand : candidates) {
      const std::size_t my = index++;
      if (my < start) continue;
      if (std::chrono::steady_clock::now() > deadline) {
        std::printf("STOPPED %zu\n", my);
        std::fflush(stdout);
        return 5;
      }
      const std::string label =
          absl::StrCat(cand.set, " ", shape.ToString(), " ", cand.choice.Brief());
      std::printf("BEGIN %zu %s\n", my, label.c_str());
      std::fflush(stdout);
      if (cudaMemsetAsync(dc->get(), 0xff, dc->size(), stream->get()) != cudaSuccess) Die("memset");
      const absl::Status st = lister.RunWith(shape, ops, gs, cand.choice);
      if (!st.ok()) {
        const bool lost = kc::IsDeviceLost(st);
        std::printf("RESULT %zu %s %s | %s\n", my, lost ? "FAULT" : "ERROR", label.c_str(),
                    std::string(st.message()).c_str());
        std::fflush(stdout);
        if (lost) std::_Exit(4);
        continue;
      }
      if (cudaEventRecord(done->get(), stream->get()) != cudaSuccess) Die("event");
      const auto t0 = std::chrono::steady_clock::now();
      cudaError_t q = cudaErrorNotReady;
      while ((q = cudaEventQuery(done->get())) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(timeout_ms)) {
          std::printf("RESULT %zu HANG %s | not finished after %d ms\n", my, label.c_str(),
                      timeout_ms);
          std::fflush(stdout);
          std::_Exit(3);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (q != cudaSuccess) {
        const absl::Status fault = kc::CudaErrorToStatus(q, "after the GEMM");
        std::printf("RESULT %zu %s %s | %s\n", my, kc::IsDeviceLost(fault) ? "FAULT" : "ERROR",
                    label.c_str(), std::string(fault.message()).c_str());
        std::fflush(stdout);
        if (kc::IsDeviceLost(fault)) std::_Exit(4);
        continue;
      }
      if (cudaMemcpy(host.data(), dc->get(), host.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
        Die("copy back");
      }
      // bf16 partial sums (split_k=any, bf16 out, a reduction in the output
      // type) may round before the end: such results are held to 2 bf16 ulps.
      const bool loose = p.out == CUDA_R_16BF && cand.choice.split_k > 1 &&
                         cand.choice.reduction != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      std::int64_t wrong = 0;
      for (std::size_t i = 0; i < exact.size(); ++i) {
        const float want = static_cast<float>(exact[i]);
        if (p.out == CUDA_R_32F) {
          float got;
          std::memcpy(&got, host.data() + i * 4, 4);
          // A sum of one product (K = 1) of a negative and a zero is -0.
          wrong +=
              logitd::FloatBits(got) != logitd::FloatBits(want) && !(got == 0.0f && want == 0.0f);
        } else {
          Bf16Bits got;
          std::memcpy(&got, host.data() + i * 2, 2);
          if (loose) {
            const double tol = std::max(1.0, std::fabs(exact[i])) * (2.0 / 128.0);
            wrong += !(std::fabs(logitd::Bf16ToFloat(got) - exact[i]) <= tol);
          } else {
            wrong += got != logitd::FloatToBf16(want) &&
                     !(logitd::Bf16ToFloat(got) == 0.0f && want == 0.0f);
          }
        }
      }
      std::printf("RESULT %zu %s %s | %lld of %zu elements wrong\n", my, wrong ? "WRONG" : "OK",
                  label.c_str(), static_cast<long long>(wrong), exact.size());
      std::fflush(stdout);
    }
  }
  std::printf("END %zu\n", index);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sets = {"offered", "forced", "tuner"};
  int timeout_ms = 3000;
  int max_seconds = 150;
  long child_start = -1;
  std::vector<std::int64_t> tokens = {1, 4, 5, 8, 300, 1729};
  std::string tokens_text = "1,4,5,8,300,1729";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sets=", 0) == 0) {
      sets = absl::StrSplit(a.substr(7), ',');
    } else if (a.rfind("--timeout_ms=", 0) == 0) {
      timeout_ms = std::atoi(a.c_str() + 13);
    } else if (a.rfind("--max_seconds=", 0) == 0) {
      max_seconds = std::atoi(a.c_str() + 14);
    } else if (a.rfind("--tokens=", 0) == 0) {
      tokens_text = a.substr(9);
      tokens.clear();
      for (absl::string_view t : absl::StrSplit(tokens_text, ',')) {
        const long m = std::atol(std::string(t).c_str());
        if (m <= 0) {
          std::fprintf(stderr, "--tokens: %s is not a positive count\n", std::string(t).c_str());
          return 2;
        }
        tokens.push_back(m);
      }
    } else if (a.rfind("--child_start=", 0) == 0) {
      child_start = std::atol(a.c_str() + 14);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--sets=offered,forced,tuner] [--timeout_ms=N] [--max_seconds=N] "
                   "[--tokens=M,...]\n",
                   argv[0]);
      return 2;
    }
  }
  if (child_start >= 0) {
    return Child(static_cast<std::size_t>(child_start), sets, tokens, timeout_ms, max_seconds);
  }

  // The parent never touches CUDA: it runs children, reads their lines and
  // restarts after a hang or a fault.
  std::map<std::string, std::map<std::string, int>> counts;  // set -> outcome -> n
  std::size_t start = 0;
  int restarts = 0;
  bool complete = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(max_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      const std::string start_arg = absl::StrCat("--child_start=", start);
      const std::string sets_arg = absl::StrCat("--sets=", absl::StrJoin(sets, ","));
      const std::string timeout_arg = absl::StrCat("--timeout_ms=", timeout_ms);
      const std::string tokens_arg = absl::StrCat("--tokens=", tokens_text);
      // The child stops at the sweep's deadline too.
      const std::string seconds_arg = absl::StrCat(
          "--max_seconds=", std::max<long>(1, std::chrono::duration_cast<std::chrono::seconds>(
                                                  deadline - std::chrono::steady_clock::now())
                                                  .count()));
      execl("/proc/self/exe", argv[0], start_arg.c_str(), sets_arg.c_str(), timeout_arg.c_str(),
            tokens_arg.c_str(), seconds_arg.c_str(), static_cast<char*>(nullptr));
      std::_Exit(2);
    }
    close(fds[1]);
    // Lines as they come, with a watch on the child: one that stops
    // printing (a kernel that blocks even its exit) is killed, and so is one
    // still running past the sweep's deadline.
    long last_begun = -1;
    long last_result = -1;
    bool ended = false;
    bool killed = false;
    std::string pending;
    auto last_output = std::chrono::steady_clock::now();
    const auto quiet_limit = std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(15);
    for (;;) {
      pollfd pfd{fds[0], POLLIN, 0};
      const int ready = poll(&pfd, 1, 500);
      const auto now = std::chrono::steady_clock::now();
      if (ready > 0) {
        char buf[4096];
        const ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0) break;  // the child closed its end: it is exiting
        last_output = now;
        pending.append(buf, static_cast<std::size_t>(n));
        for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
          const std::string l = pending.substr(0, nl + 1);
          pending.erase(0, nl + 1);
          if (l.rfind("BEGIN ", 0) == 0) {
            last_begun = std::atol(l.c_str() + 6);
          } else if (l.rfind("RESULT ", 0) == 0) {
            std::vector<std::string> f = absl::StrSplit(l, absl::MaxSplits(' ', 3));
            if (f.size() >= 4) {
              last_result = std::atol(f[1].c_str());
              const std::string set = f[3].substr(0, f[3].find(' '));
              ++counts[set][f[2]];
              if (f[2] != "OK") {
                std::fputs(l.c_str(), stdout);  // as it happens: the run may be cut short
                std::fflush(stdout);
              }
            }
          } else if (l.rfind("END ", 0) == 0) {
            ended = true;
          } else {
            std::fputs(l.c_str(), stdout);
          }
        }
      } else if (now - last_output > quiet_limit || now > deadline + std::chrono::seconds(10)) {
        std::printf(
            "sweep: child silent for %lld s%s; killed\n",
            static_cast<long long>(
                std::chrono::duration_cast<std::chrono::seconds>(now - last_output).count()),
            now > deadline ? " past the deadline" : "");
        std::fflush(stdout);
        kill(pid, SIGKILL);
        killed = true;
        break;
      }
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (killed && std::chrono::steady_clock::now() > deadline) break;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (ended && code == 0) {
      complete = true;
      break;
    }
    if (code == 5) break;  // the deadline
    if (last_begun < 0 || ++restarts > 200) {
      std::printf("sweep: child exited %d before any progress; giving up\n", code);
      return 2;
    }
    if (killed && last_result != last_begun) {
      // Silent in the middle of a configuration: it hung without the
      // child's own watchdog noticing.
      std::printf("RESULT %ld HANG (the child stopped answering)\n", last_begun);
      ++counts["?"]["HANG"];
    } else if (!killed && code != 3 && code != 4) {
      // A crash without a RESULT line: count it against the one that began.
      std::printf("RESULT %ld CRASH (exit %d)\n", last_begun, code);
      ++counts["?"]["CRASH"];
    }
    start = static_cast<std::size_t>(last_begun) + 1;
  }
  std::printf("\nsweep summary (%d child restarts%s)\n%-8s %6s %6s %6s %6s %6s %6s\n", restarts,
              complete ? "" : absl::StrCat("; stopped after ", max_seconds, " s").c_str(), "set",
              "OK", "WRONG", "ERROR", "FAULT", "HANG", "CRASH");
  int bad_tuner = 0;
  for (const auto& [set, by] : counts) {
    auto n = [&](const char* k) {
      auto it = by.find(k);
      return it == by.end() ? 0 : it->second;
    };
    std::printf("%-8s %6d %6d %6d %6d %6d %6d\n", set.c_str(), n("OK"), n("WRONG"), n("ERROR"),
                n("FAULT"), n("HANG"), n("CRASH"));
    if (set == "tuner") bad_tuner = n("WRONG") + n("ERROR") + n("FAULT") + n("HANG") + n("CRASH");
  }
  // The exit status speaks for what the server may run: the tuner's set.
  return bad_tuner == 0 ? 0 : 1;
}
