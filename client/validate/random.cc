#include "client/validate/random.h"

#include <cmath>
#include <string>

#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void Store(Tensor& t, std::int64_t i, float v) {
  if (t.dtype() == DType::kBf16) {
    t.data<Bf16Bits>()[i] = FloatToBf16(v);
  } else {
    t.data<float>()[i] = v;
  }
}

}  // namespace

Rng::Rng(std::uint64_t seed) {
  std::uint64_t state = seed;
  for (std::uint64_t& s : s_) s = SplitMix64(state);
}

Rng Rng::Stream(std::uint64_t seed, absl::string_view name, std::int64_t index) {
  std::uint64_t state = seed ^ Xxh3(name.data(), name.size());
  std::uint64_t mixed = SplitMix64(state);
  state = mixed ^ static_cast<std::uint64_t>(index);
  return Rng(SplitMix64(state));
}

std::uint64_t Rng::Next() {
  const std::uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

std::int64_t Rng::UniformInt(std::int64_t lo, std::int64_t hi) {
  const std::uint64_t range = static_cast<std::uint64_t>(hi - lo) + 1;
  if (range == 0) return lo + static_cast<std::int64_t>(Next());  // the full 64-bit range
  // Lemire's multiply-and-reject: unbiased, and a division only on the rare
  // draws that land in the biased sliver.
  unsigned __int128 product = static_cast<unsigned __int128>(Next()) * range;
  std::uint64_t low = static_cast<std::uint64_t>(product);
  if (low < range) {
    const std::uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      product = static_cast<unsigned __int128>(Next()) * range;
      low = static_cast<std::uint64_t>(product);
    }
  }
  return lo + static_cast<std::int64_t>(product >> 64);
}

double Rng::Uniform01() {
  return static_cast<double>(static_cast<std::int64_t>(Next() >> 11)) * 0x1p-53;
}

namespace {

// Ziggurat of 256 layers of equal area under f(x) = exp(-x²/2) (Marsaglia &
// Tsang, "The Ziggurat Method for Generating Random Variables", 2000).
constexpr int kLayers = 256;
constexpr double kTailStart = 3.6541528853610088;  // R
constexpr double kLayerArea = 0.00492867323399;    // V

struct Ziggurat {
  // x[i]: width of layer i (x[0] is the base layer's virtual width V/f(R),
  // x[1] = R, x[kLayers] = 0); f[i] = exp(-x[i]²/2).
  double x[kLayers + 1];
  double f[kLayers + 1];
  Ziggurat() {
    auto density = [](double v) { return std::exp(-0.5 * v * v); };
    x[0] = kLayerArea / density(kTailStart);
    x[1] = kTailStart;
    for (int i = 2; i < kLayers; ++i) {
      x[i] = std::sqrt(-2.0 * std::log(density(x[i - 1]) + kLayerArea / x[i - 1]));
    }
    x[kLayers] = 0.0;
    for (int i = 0; i <= kLayers; ++i) f[i] = density(x[i]);
  }
};

const Ziggurat& Tables() {
  static const Ziggurat* const kTables = new Ziggurat();
  return *kTables;
}

}  // namespace

double Rng::Normal() {
  const Ziggurat& z = Tables();
  while (true) {
    const std::uint64_t u = Next();
    const int i = static_cast<int>(u & 0xff);
    const double sign = (u & 0x100) != 0 ? -1.0 : 1.0;
    // Through int64: converting a uint64 to double is a slow path on x86-64.
    const double x = static_cast<double>(static_cast<std::int64_t>(u >> 11)) * 0x1p-53 * z.x[i];
    if (x < z.x[i + 1]) return sign * x;  // inside the part wholly under the curve
    if (i == 0) {
      // The tail beyond R, by Marsaglia's exponential rejection.
      double a, b;
      do {
        a = -std::log(1.0 - Uniform01()) / kTailStart;
        b = -std::log(1.0 - Uniform01());
      } while (b + b < a * a);
      return sign * (kTailStart + a);
    }
    // The wedge between the layer's rectangle and the curve.
    const double y = z.f[i] + Uniform01() * (z.f[i + 1] - z.f[i]);
    if (y < std::exp(-0.5 * x * x)) return sign * x;
  }
}

Tensor RandomIntegers(DType dtype, std::vector<std::int64_t> shape, std::int64_t lo,
                      std::int64_t hi, Rng& rng) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    Store(t, i, static_cast<float>(rng.UniformInt(lo, hi)));
  }
  return t;
}

Tensor RandomNormal(DType dtype, std::vector<std::int64_t> shape, double stddev, Rng& rng) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    Store(t, i, static_cast<float>(stddev * rng.Normal()));
  }
  return t;
}

Tensor PortableBell(DType dtype, std::vector<std::int64_t> shape, Rng& rng) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const std::uint64_t r = rng.Next();
    const std::int64_t sum = static_cast<std::int64_t>(r & 0xffff) +
                             static_cast<std::int64_t>((r >> 16) & 0xffff) +
                             static_cast<std::int64_t>((r >> 32) & 0xffff) +
                             static_cast<std::int64_t>(r >> 48) - 2 * 0xffff;
    // |sum| < 2^18, so the float and the power-of-two scaling are exact.
    Store(t, i, std::ldexp(static_cast<float>(sum), -15));
  }
  return t;
}

std::vector<std::int64_t> RandomTargets(Rng& rng, std::int64_t m, std::int64_t v,
                                        std::int64_t ignore_index, int ignore_one_in) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) {
    const bool ignore = i > 0 && rng.UniformInt(0, ignore_one_in - 1) == 0;
    const std::int64_t id = rng.UniformInt(0, v - 1);
    t[static_cast<std::size_t>(i)] = ignore ? ignore_index : id;
  }
  return t;
}

}  // namespace logitd::validate
