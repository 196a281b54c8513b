#include "client/validate/svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/report.h"

namespace logitd::validate::svg {
namespace {

constexpr char kAxisColour[] = "#444";
constexpr char kGridColour[] = "#e3e3e3";

std::string Stroke(absl::string_view colour, double width, bool dashed) {
  std::string s = absl::StrCat(" stroke=\"", XmlEscape(colour), "\" stroke-width=\"",
                               absl::StrFormat("%g", width), "\"");
  if (dashed) absl::StrAppend(&s, " stroke-dasharray=\"6 4\"");
  return s;
}

// "<title>tooltip</title>" when there is one.
std::string TitleElement(absl::string_view tooltip) {
  return tooltip.empty() ? std::string() : absl::StrCat("<title>", XmlEscape(tooltip), "</title>");
}

// A closed element when there is a tooltip, else a self-closing one.
std::string Element(absl::string_view open, absl::string_view name, absl::string_view tooltip) {
  if (tooltip.empty()) return absl::StrCat(open, "/>\n");
  return absl::StrCat(open, ">", TitleElement(tooltip), "</", name, ">\n");
}

}  // namespace

std::string Coord(double v) { return absl::StrFormat("%.1f", v); }

double Scale::operator()(double value) const {
  double t;
  if (log) {
    t = (std::log10(value) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  } else {
    t = (value - lo) / (hi - lo);
  }
  return from + t * (to - from);
}

bool Scale::Drawable(double value) const { return std::isfinite(value) && (!log || value > 0); }

std::vector<Tick> LinearTicks(double lo, double hi, int count) {
  std::vector<Tick> ticks;
  if (!(hi > lo) || count < 1) {
    ticks.push_back({lo, absl::StrFormat("%g", lo)});
    return ticks;
  }
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    const double clean = std::fabs(v) < step * 1e-9 ? 0.0 : v;
    ticks.push_back({clean, absl::StrFormat("%g", clean)});
  }
  return ticks;
}

std::vector<Tick> DecadeTicks(double lo, double hi) {
  std::vector<Tick> ticks;
  const int first = static_cast<int>(std::ceil(std::log10(lo) - 1e-9));
  const int last = static_cast<int>(std::floor(std::log10(hi) + 1e-9));
  for (int e = first; e <= last; ++e) ticks.push_back({std::pow(10.0, e), absl::StrCat("1e", e)});
  return ticks;
}

std::pair<double, double> DecadeRange(double lo, double hi) {
  double a = std::pow(10.0, std::floor(std::log10(lo) + 1e-9));
  double b = std::pow(10.0, std::ceil(std::log10(hi) - 1e-9));
  if (b <= a) b = a * 10;
  return {a, b};
}

Canvas::Canvas(int width, int height, absl::string_view title)
    : width_(width), height_(height), title_(title) {}

void Canvas::Line(double x1, double y1, double x2, double y2, absl::string_view colour,
                  double width, bool dashed) {
  absl::StrAppend(&body_, "<line x1=\"", Coord(x1), "\" y1=\"", Coord(y1), "\" x2=\"", Coord(x2),
                  "\" y2=\"", Coord(y2), "\"", Stroke(colour, width, dashed), "/>\n");
}

void Canvas::Polyline(const std::vector<Point>& points, absl::string_view colour, double width,
                      bool dashed) {
  if (points.size() < 2) return;
  std::string coords;
  for (const Point& p : points) {
    absl::StrAppend(&coords, coords.empty() ? "" : " ", Coord(p.x), ",", Coord(p.y));
  }
  absl::StrAppend(&body_, "<polyline points=\"", coords, "\" fill=\"none\"",
                  Stroke(colour, width, dashed), "/>\n");
}

void Canvas::Circle(double x, double y, double r, absl::string_view colour,
                    absl::string_view tooltip) {
  const std::string open = absl::StrCat("<circle cx=\"", Coord(x), "\" cy=\"", Coord(y), "\" r=\"",
                                        Coord(r), "\" fill=\"", XmlEscape(colour), "\"");
  absl::StrAppend(&body_, Element(open, "circle", tooltip));
}

void Canvas::Rect(double x, double y, double w, double h, absl::string_view fill,
                  absl::string_view tooltip) {
  const std::string open =
      absl::StrCat("<rect x=\"", Coord(x), "\" y=\"", Coord(y), "\" width=\"", Coord(w),
                   "\" height=\"", Coord(h), "\" fill=\"", XmlEscape(fill), "\"");
  absl::StrAppend(&body_, Element(open, "rect", tooltip));
}

void Canvas::Text(double x, double y, absl::string_view text, Anchor anchor, int size,
                  bool rotate) {
  const char* a = anchor == Anchor::kStart ? "start" : anchor == Anchor::kMiddle ? "middle" : "end";
  absl::StrAppend(&body_, "<text x=\"", Coord(x), "\" y=\"", Coord(y), "\" font-size=\"", size,
                  "\" text-anchor=\"", a, "\"");
  if (rotate) absl::StrAppend(&body_, " transform=\"rotate(-90 ", Coord(x), " ", Coord(y), ")\"");
  absl::StrAppend(&body_, ">", XmlEscape(text), "</text>\n");
}

void Canvas::Axes(const Scale& x, const Scale& y, const std::vector<Tick>& x_ticks,
                  const std::vector<Tick>& y_ticks, absl::string_view x_title,
                  absl::string_view y_title) {
  const double left = std::min(x.from, x.to), right = std::max(x.from, x.to);
  const double top = std::min(y.from, y.to), bottom = std::max(y.from, y.to);
  for (const Tick& t : y_ticks) {
    const double py = y(t.value);
    Line(left, py, right, py, kGridColour);
    Line(left - 4, py, left, py, kAxisColour);
    Text(left - 6, py + 4, t.label, Anchor::kEnd, 10);
  }
  for (const Tick& t : x_ticks) {
    const double px = x(t.value);
    Line(px, bottom, px, bottom + 4, kAxisColour);
    Text(px, bottom + 16, t.label, Anchor::kMiddle, 10);
  }
  absl::StrAppend(&body_, "<rect x=\"", Coord(left), "\" y=\"", Coord(top), "\" width=\"",
                  Coord(right - left), "\" height=\"", Coord(bottom - top), "\" fill=\"none\"",
                  Stroke(kAxisColour, 1, false), "/>\n");
  Text((left + right) / 2, bottom + 34, x_title, Anchor::kMiddle, 11);
  Text(14, (top + bottom) / 2, y_title, Anchor::kMiddle, 11, /*rotate=*/true);
}

std::string Canvas::Str() const {
  return absl::StrCat("<svg width=\"", width_, "\" height=\"", height_, "\" viewBox=\"0 0 ", width_,
                      " ", height_, "\" role=\"img\" font-family=\"sans-serif\">\n", "<title>",
                      XmlEscape(title_), "</title>\n", body_, "</svg>\n");
}

}  // namespace logitd::validate::svg
