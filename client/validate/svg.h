// A small SVG writer for the HTML report: scales (linear or log10), tick
// positions, and a canvas that emits lines, polylines, markers, bars, text
// and plot axes as well-formed XML with presentation attributes only, so a
// drawing needs no stylesheet and no script.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace logitd::validate::svg {

// Maps data values in [lo, hi] onto pixels in [from, to], linearly or by
// log10 (then lo and hi must be positive).
struct Scale {
  double lo = 0;
  double hi = 1;
  double from = 0;
  double to = 1;
  bool log = false;
  double operator()(double value) const;
  // Whether `value` can be drawn: finite, and positive on a log scale.
  bool Drawable(double value) const;
};

struct Tick {
  double value;
  std::string label;
};

// About `count` ticks at round values (1, 2 or 5 times a power of ten).
std::vector<Tick> LinearTicks(double lo, double hi, int count);
// A tick at each power of ten in [lo, hi], labelled "1e-6".
std::vector<Tick> DecadeTicks(double lo, double hi);
// [lo, hi] widened outward to whole powers of ten; lo and hi positive.
std::pair<double, double> DecadeRange(double lo, double hi);

struct Point {
  double x;
  double y;
};

// Pixel coordinates; colours are CSS colour strings.
class Canvas {
 public:
  // `title` is the drawing's accessible name (its <title>).
  Canvas(int width, int height, absl::string_view title);

  void Line(double x1, double y1, double x2, double y2, absl::string_view colour, double width = 1,
            bool dashed = false);
  void Polyline(const std::vector<Point>& points, absl::string_view colour, double width = 1.5,
                bool dashed = false);
  // A marker; `tooltip` shows on hover (an SVG <title>), none when empty.
  void Circle(double x, double y, double r, absl::string_view colour,
              absl::string_view tooltip = "");
  void Rect(double x, double y, double w, double h, absl::string_view fill,
            absl::string_view tooltip = "");
  enum class Anchor { kStart, kMiddle, kEnd };
  // `rotate` turns the text by -90 degrees about (x, y): a vertical label.
  void Text(double x, double y, absl::string_view text, Anchor anchor = Anchor::kStart,
            int size = 11, bool rotate = false);

  // The frame of a plot area, tick marks and labels on both axes, light
  // grid lines at the y ticks, and the axis titles.
  void Axes(const Scale& x, const Scale& y, const std::vector<Tick>& x_ticks,
            const std::vector<Tick>& y_ticks, absl::string_view x_title, absl::string_view y_title);

  int width() const { return width_; }
  int height() const { return height_; }
  // The <svg> element with everything drawn so far.
  std::string Str() const;

 private:
  int width_;
  int height_;
  std::string title_;
  std::string body_;
};

// A coordinate as written into the drawing ("%.1f").
std::string Coord(double v);

}  // namespace logitd::validate::svg
