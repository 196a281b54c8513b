#include "client/validate/report_plots.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/validate/svg.h"

namespace logitd::validate {
namespace {

constexpr char kFp32Colour[] = "#1f6feb";
constexpr char kBf16Colour[] = "#d4700a";
constexpr char kBoundColour[] = "#cf222e";
constexpr char kWithinColour[] = "#4878a8";
constexpr char kOutsideColour[] = "#cf222e";
constexpr char kFractionKey[] = "worst_bound_fraction";

struct KPoint {
  double k;
  std::string k_text;
  // Per series: the value and its JSON text.
  double fp32, bf16, gamma, worst;
  std::string fp32_text, bf16_text, gamma_text, worst_text;
};

std::vector<KPoint> RoundingPoints(const Report& report) {
  std::vector<KPoint> points;
  for (const CaseResult& r : report.results) {
    const nlohmann::ordered_json& f = r.figures;
    if (r.suite != "rounding_error" || !f.contains("k") || !f.contains("fp32_rel_frobenius_err") ||
        !f.contains("bf16_rel_frobenius_err") || !f.contains("gamma_k")) {
      continue;
    }
    KPoint p;
    p.k = FigureValue(f["k"]);
    p.k_text = FigureText(f["k"]);
    p.fp32 = FigureValue(f["fp32_rel_frobenius_err"]);
    p.bf16 = FigureValue(f["bf16_rel_frobenius_err"]);
    p.gamma = FigureValue(f["gamma_k"]);
    p.fp32_text = FigureText(f["fp32_rel_frobenius_err"]);
    p.bf16_text = FigureText(f["bf16_rel_frobenius_err"]);
    p.gamma_text = FigureText(f["gamma_k"]);
    // The element-wise quantity the bound governs: worst |err| / Σ|x·w|.
    p.worst = f.contains(kFractionKey) ? FigureValue(f[kFractionKey]) * p.gamma
                                       : std::numeric_limits<double>::quiet_NaN();
    p.worst_text = f.contains(kFractionKey) ? FigureText(f[kFractionKey]) : "";
    if (std::isfinite(p.k) && p.k > 0) points.push_back(std::move(p));
  }
  std::sort(points.begin(), points.end(),
            [](const KPoint& a, const KPoint& b) { return a.k < b.k; });
  return points;
}

struct Series {
  const char* name;
  const char* colour;
  bool dashed;
  double KPoint::*value;
  std::string KPoint::*text;
  const char* tooltip;  // what the value is, for hover text
};

const Series kSeries[] = {
    {"fp32-out relative error", kFp32Colour, false, &KPoint::fp32, &KPoint::fp32_text,
     "fp32_rel_frobenius_err"},
    {"bf16-out relative error", kBf16Colour, false, &KPoint::bf16, &KPoint::bf16_text,
     "bf16_rel_frobenius_err"},
    {"fp32 worst element |err| / Σ|x·w|", kFp32Colour, true, &KPoint::worst, &KPoint::worst_text,
     "worst_bound_fraction (times γ_K)"},
    {"γ_K bound", kBoundColour, true, &KPoint::gamma, &KPoint::gamma_text, "gamma_k"},
};

void DrawSeries(svg::Canvas& c, const svg::Scale& x, const svg::Scale& y,
                const std::vector<KPoint>& points, const Series& s, bool markers) {
  std::vector<svg::Point> line;
  for (const KPoint& p : points) {
    const double v = p.*(s.value);
    if (!y.Drawable(v)) continue;
    line.push_back({x(p.k), y(v)});
    if (markers) {
      c.Circle(x(p.k), y(v), 3.5, s.colour,
               absl::StrCat("K=", p.k_text, ": ", s.tooltip, " ", p.*(s.text)));
    }
  }
  c.Polyline(line, s.colour, 1.5, s.dashed);
}

// Puts a value into one of the histogram's bins: 0 is bin 0; (0, 10^lo) is
// bin 1 too (there is none when lo is the smallest decade seen); decade
// [10^d, 10^(d+1)) is bin 1 + d - lo, with 1 itself in the last decade; a
// value above 1 (outside the bound) or non-finite is the last bin.
std::size_t BinOf(double v, int lo) {
  const std::size_t decades = static_cast<std::size_t>(-lo);
  if (!(v <= 1)) return decades + 1;
  if (v <= 0) return 0;
  const int d = std::clamp(static_cast<int>(std::floor(std::log10(v))), lo, -1);
  return static_cast<std::size_t>(1 + d - lo);
}

int LowestDecade(const std::vector<FractionGroup>& groups) {
  double smallest = 1;
  for (const FractionGroup& g : groups) {
    for (const BoundFraction& b : g.items) {
      if (b.value > 0 && b.value < smallest) smallest = b.value;
    }
  }
  return std::clamp(static_cast<int>(std::floor(std::log10(smallest))), -12, -1);
}

std::string Histogram(const FractionGroup& g, int lo) {
  const std::size_t bins = static_cast<std::size_t>(-lo) + 2;
  std::vector<std::vector<const BoundFraction*>> in(bins);
  for (const BoundFraction& b : g.items) in[BinOf(b.value, lo)].push_back(&b);
  std::size_t most = 1;
  for (const auto& bin : in) most = std::max(most, bin.size());

  svg::Canvas c(480, 250, absl::StrCat(g.title, ": worst error as a fraction of its bound"));
  const double left = 56, right = 466, top = 14, bottom = 190;
  const double w = (right - left) / static_cast<double>(bins);
  svg::Scale x{0, static_cast<double>(bins), left, right};
  svg::Scale y{0, static_cast<double>(std::max<std::size_t>(most, 4)), bottom, top};
  std::vector<svg::Tick> x_ticks;
  for (int d = lo; d <= 0; ++d) {
    x_ticks.push_back({static_cast<double>(1 + d - lo), d == 0 ? "1" : absl::StrCat("1e", d)});
  }
  c.Axes(x, y, x_ticks, svg::LinearTicks(0, y.hi, 4), "worst |error| ÷ bound (log bins)",
         "outputs");
  c.Text(left + w / 2, bottom + 16, "0", svg::Canvas::Anchor::kMiddle, 10);
  c.Text(right - w / 2, bottom + 16, "> 1", svg::Canvas::Anchor::kMiddle, 10);
  for (std::size_t i = 0; i < bins; ++i) {
    if (in[i].empty()) continue;
    std::vector<std::string> lines;
    for (const BoundFraction* b : in[i]) lines.push_back(absl::StrCat(b->label, ": ", b->text));
    const double top_px = y(static_cast<double>(in[i].size()));
    c.Rect(left + w * static_cast<double>(i) + 2, top_px, w - 4, bottom - top_px,
           i + 1 == bins ? kOutsideColour : kWithinColour, absl::StrJoin(lines, "\n"));
  }
  return absl::StrCat("<figure>\n", c.Str(), "<figcaption><b>", XmlEscape(g.title), "</b> (",
                      g.items.size(), " outputs: ", XmlEscape(g.outputs),
                      "). The last bin, in red, is outside the bound.</figcaption>\n</figure>\n");
}

// Records every worst_bound_fraction figure under `node`, with the keys on
// the way to it naming the output.
void Collect(const CaseResult& r, const nlohmann::ordered_json& node, const std::string& path,
             std::vector<BoundFraction>* out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string& key = it.key();
    if (path.empty() && (key == "table" || key == "seconds")) continue;
    if (it->is_object()) {
      Collect(r, *it, path.empty() ? key : absl::StrCat(path, ".", key), out);
      continue;
    }
    if (!absl::EndsWith(key, kFractionKey)) continue;
    std::string output = key.substr(0, key.size() - sizeof(kFractionKey) + 1);
    if (!output.empty() && output.back() == '_') output.pop_back();
    if (!path.empty()) output = output.empty() ? path : absl::StrCat(path, ".", output);
    if (output.empty()) output = r.suite == "rounding_error" ? "fp32 logits" : "output";
    out->push_back({absl::StrCat(r.FullName(), " ", output), FigureValue(*it), FigureText(*it)});
  }
}

}  // namespace

double FigureValue(const nlohmann::ordered_json& figure) {
  if (figure.is_number()) return figure.get<double>();
  if (figure.is_string()) {
    const std::string& s = figure.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::string FigureText(const nlohmann::ordered_json& figure) {
  if (figure.is_string()) return figure.get<std::string>();
  return figure.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::vector<FractionGroup> BoundFractions(const Report& report) {
  std::vector<FractionGroup> groups = {
      {"Logits", "rounding_error's fp32-out logits", {}},
      {"dX", "backward_contract's dX, fp32 and bf16", {}},
      {"dW", "backward_contract's dW", {}},
      {"Cross-entropy", "cross_entropy's loss, lse, dX and dW", {}},
      {"Other", "other outputs", {}},
  };
  for (const CaseResult& r : report.results) {
    // verify's candidates have every element's histogram (ElementHistograms).
    if (r.figures.contains("error_histogram")) continue;
    std::vector<BoundFraction> found;
    Collect(r, r.figures, "", &found);
    for (BoundFraction& b : found) {
      const std::string lower = absl::AsciiStrToLower(b.label.substr(r.FullName().size()));
      std::size_t g = 4;
      if (r.suite == "rounding_error") {
        g = 0;
      } else if (r.suite == "cross_entropy") {
        g = 3;
      } else if (absl::StrContains(lower, "dx")) {
        g = 1;
      } else if (absl::StrContains(lower, "dw")) {
        g = 2;
      }
      groups[g].items.push_back(std::move(b));
    }
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const FractionGroup& g) { return g.items.empty(); }),
               groups.end());
  return groups;
}

std::string RoundingErrorFigure(const Report& report) {
  const std::vector<KPoint> points = RoundingPoints(report);
  if (points.empty()) return "";
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const KPoint& p : points) {
    for (double v : {p.fp32, p.bf16, p.gamma, p.worst}) {
      if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  if (hi == 0) return "";
  const auto [y_lo, y_hi] = svg::DecadeRange(lo, hi);
  svg::Canvas c(660, 390, "rounding_error: relative error against K");
  const svg::Scale x{points.front().k / 1.5, points.back().k * 1.5, 70, 640, /*log=*/true};
  const svg::Scale y{y_lo, y_hi, 290, 16, /*log=*/true};
  std::vector<svg::Tick> x_ticks;
  for (const KPoint& p : points) x_ticks.push_back({p.k, p.k_text});
  c.Axes(x, y, x_ticks, svg::DecadeTicks(y_lo, y_hi), "K (reduction width, log scale)",
         "error (log scale)");
  for (const Series& s : kSeries) DrawSeries(c, x, y, points, s, &s != &kSeries[3]);
  for (std::size_t i = 0; i < std::size(kSeries); ++i) {
    const double lx = 70 + 280 * static_cast<double>(i % 2);
    const double ly = 346 + 20 * static_cast<double>(i / 2);
    c.Line(lx, ly, lx + 24, ly, kSeries[i].colour, 2, kSeries[i].dashed);
    c.Text(lx + 30, ly + 4, kSeries[i].name, svg::Canvas::Anchor::kStart, 11);
  }
  return absl::StrCat(
      "<figure>\n", c.Str(),
      "<figcaption>Relative Frobenius error ‖Y − Y<sub>fp64</sub>‖ / ‖Y<sub>fp64</sub>‖ of the "
      "fp32-out and bf16-out logits at each K (solid), the γ<sub>K</sub> coefficient of the "
      "fp32 accumulation bound |y − y<sub>fp64</sub>| ≤ γ<sub>K</sub>·Σ|x·w| (red, dashed), "
      "and the quantity that bound governs, the worst element's |error| / Σ|x·w| "
      "(worst_bound_fraction × γ<sub>K</sub>, blue, dashed). Hover a marker for the --json "
      "figure. A zero error cannot be drawn on a log scale and is left out.</figcaption>\n",
      "</figure>\n");
}

std::string FractionHistograms(const std::vector<FractionGroup>& groups) {
  if (groups.empty()) return "";
  const int lo = LowestDecade(groups);
  std::string out = "<div class=\"plots\">\n";
  for (const FractionGroup& g : groups) absl::StrAppend(&out, Histogram(g, lo));
  absl::StrAppend(&out, "</div>\n");
  return out;
}

namespace {

// The precision-class test of one verify candidate, as the server decided
// it: the whole tensor's RMS error over the conforming envelope's and its
// worst rows', each a bar against its own threshold (a tick), on a log
// scale; red where outside. Empty where the test was not made.
std::string ClassFigure(const CaseResult& r) {
  if (!r.figures.contains("precision_class")) return "";
  const nlohmann::ordered_json& p = r.figures["precision_class"];
  if (!p.value("tested", false)) return "";
  struct Bar {
    std::string label;
    double ratio, threshold;
  };
  std::vector<Bar> bars = {
      {"tensor", FigureValue(p.value("rms_ratio", 0.0)), FigureValue(p.value("threshold", 0.0))}};
  for (const auto& row : p.value("worst_rows", nlohmann::ordered_json::array())) {
    bars.push_back({absl::StrCat("row ", FigureText(row.value("row", 0))),
                    FigureValue(row.value("rms_ratio", 0.0)),
                    FigureValue(row.value("threshold", 0.0))});
  }
  double lo = 1, hi = 1;
  for (const Bar& b : bars) {
    for (double v : {b.ratio, b.threshold}) {
      if (v > 0 && std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  const auto [dlo, dhi] = svg::DecadeRange(lo, hi * 1.01);
  const double height = 40 + 22 * static_cast<double>(bars.size());
  svg::Canvas c(480, static_cast<int>(height + 40),
                absl::StrCat(r.FullName(), ": the precision-class test"));
  const double left = 70, right = 466, top = 14,
               bottom = 14 + 22 * static_cast<double>(bars.size());
  svg::Scale x{dlo, dhi, left, right, /*log=*/true};
  svg::Scale y{0, static_cast<double>(bars.size()), top, bottom};
  std::vector<svg::Tick> y_ticks;
  c.Axes(x, y, svg::DecadeTicks(dlo, dhi), y_ticks,
         "RMS |error| ÷ the conforming envelope's (tick: threshold)", "");
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double y0 = top + 22 * static_cast<double>(i) + 4;
    c.Text(left - 4, y0 + 11, b.label, svg::Canvas::Anchor::kEnd, 10);
    if (!(b.ratio > 0) || !std::isfinite(b.ratio)) continue;
    const bool outside = b.threshold > 0 && b.ratio > b.threshold;
    c.Rect(left, y0, std::max(1.0, x(std::max(b.ratio, dlo)) - left), 14,
           outside ? kOutsideColour : kWithinColour,
           absl::StrCat(b.label, ": RMS ", FigureText(b.ratio), " times the envelope's, threshold ",
                        FigureText(b.threshold)));
    if (b.threshold > 0 && std::isfinite(b.threshold)) {
      c.Line(x(b.threshold), y0 - 2, x(b.threshold), y0 + 16, "#222", 2);
    }
  }
  const bool outside = p.value("outside", false);
  return absl::StrCat(
      "<figure>\n", c.Str(), "<figcaption><b>", XmlEscape(r.FullName()),
      "</b>: the precision-class test", outside ? " (outside: it decided the verdict)" : "",
      ". Each bar is an RMS error over the envelope of conforming fp32 accumulations of the same "
      "inputs; the tick is what a conforming candidate stays below with probability 1 − ",
      FigureText(p.value("alpha", 0.0)), ". Effective precision ",
      FigureText(p.value("effective_bits", 0.0)), " bits (the envelope's ",
      FigureText(p.value("class_bits", 0.0)), ").</figcaption>\n</figure>\n");
}

}  // namespace

std::string ElementHistograms(const Report& report) {
  static constexpr const char* kBins[] = {"0",    "1e-6", "1e-5", "1e-4", "1e-3",
                                          "1e-2", "0.1",  "0.5",  "1",    "> 1"};
  constexpr std::size_t kBinCount = sizeof(kBins) / sizeof(kBins[0]);
  std::string out;
  for (const CaseResult& r : report.results) {
    if (!r.figures.contains("error_histogram") || !r.figures["error_histogram"].is_array() ||
        r.figures["error_histogram"].size() != kBinCount) {
      continue;
    }
    const nlohmann::ordered_json& h = r.figures["error_histogram"];
    double most = 1;
    for (const auto& n : h) most = std::max(most, FigureValue(n));
    svg::Canvas c(480, 250, absl::StrCat(r.FullName(), ": |error| as a fraction of its bound"));
    const double left = 56, right = 466, top = 14, bottom = 190;
    const double w = (right - left) / static_cast<double>(kBinCount);
    svg::Scale x{0, static_cast<double>(kBinCount), left, right};
    // Counts span decades (most elements in a few bins): a log scale of
    // count + 1, so that a single element outside still shows.
    const auto [lo, hi] = svg::DecadeRange(1, most + 1);
    svg::Scale y{lo, hi, bottom, top, /*log=*/true};
    std::vector<svg::Tick> x_ticks;
    for (std::size_t i = 0; i < kBinCount; ++i) {
      x_ticks.push_back({static_cast<double>(i) + 0.5, kBins[i]});
    }
    c.Axes(x, y, x_ticks, svg::DecadeTicks(lo, hi),
           "|error| ÷ bound, up to (bins; 0 exact, > 1 outside)", "elements + 1");
    for (std::size_t i = 0; i < kBinCount; ++i) {
      const double n = FigureValue(h[i]);
      if (!(n > 0)) continue;
      const double top_px = y(n + 1);
      c.Rect(left + w * static_cast<double>(i) + 2, top_px, w - 4, bottom - top_px,
             i + 1 == kBinCount ? kOutsideColour : kWithinColour,
             absl::StrCat(FigureText(h[i]), " elements, |error| ÷ bound ",
                          i == 0 ? "exactly 0" : absl::StrCat("up to ", kBins[i])));
    }
    absl::StrAppend(&out, "<figure>\n", c.Str(), "<figcaption><b>", XmlEscape(r.FullName()),
                    "</b>: every element checked (", FigureText(r.figures.value("elements", 0)),
                    "), binned by |candidate − fp64 reference| ÷ its proven bound. The last bin, "
                    "in red, is outside the bound.</figcaption>\n</figure>\n");
    absl::StrAppend(&out, ClassFigure(r));
  }
  if (out.empty()) return out;
  return absl::StrCat("<div class=\"plots\">\n", out, "</div>\n");
}

}  // namespace logitd::validate
