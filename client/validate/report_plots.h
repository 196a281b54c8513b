// The drawings of the HTML report, as inline SVG: the rounding_error suite's
// error against K, and histograms of error as a fraction of its bound. Every
// number a drawing shows (tooltips, labels) is the --json report's number,
// written the way the JSON document writes it.
#pragma once

#include <string>
#include <vector>

#include "client/validate/report.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {

// A figure as a double: JSON numbers as they are, the strings "inf", "-inf"
// and "nan" (JsonNumber's spelling of non-finite values) as those values;
// NaN for anything else.
double FigureValue(const nlohmann::ordered_json& figure);
// A figure exactly as the --json document writes it (numbers unquoted,
// strings without their quotes).
std::string FigureText(const nlohmann::ordered_json& figure);

// One output's worst element error as a fraction of its bound, as a case
// recorded it (a figure whose key ends in "worst_bound_fraction").
struct BoundFraction {
  std::string label;  // "suite/case output"
  double value;
  std::string text;  // FigureText of the figure
};

// The fractions of one kind of output: logits, dX, dW or cross-entropy.
struct FractionGroup {
  std::string title;
  std::string outputs;  // which figures it holds, for the caption
  std::vector<BoundFraction> items;
};

// Every worst_bound_fraction figure of the run, grouped; groups without any
// are left out. Aggregates (a case's "table" figures) are not counted twice.
std::vector<FractionGroup> BoundFractions(const Report& report);

// "<figure>" with the rounding_error plot and its caption; empty when no
// rounding_error case recorded errors.
std::string RoundingErrorFigure(const Report& report);

// "<figure>" elements, one histogram per group, on one shared set of bins.
std::string FractionHistograms(const std::vector<FractionGroup>& groups);

// "<figure>" elements, one per case with an error_histogram figure (a
// verify candidate's every element, binned by |error| ÷ bound); empty when
// none has one.
std::string ElementHistograms(const Report& report);

}  // namespace logitd::validate
