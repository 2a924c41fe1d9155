// The inline stylesheet and script of the HTML report. Kept apart from the
// renderer so each reads as what it is. Private to src/report.
#pragma once

#include <string_view>

namespace vramscope::report_internal {

// CSS for the page: system fonts only (no web fonts: the page stays offline).
extern const std::string_view kHtmlStyle;

// Hover and zoom for every figure.vs-timeline on the page. Reads the chart's
// data-* attributes (svg_chart.h) and the figure's script.vs-data JSON
// ({x, s, p, a, r, c, names, colours, phases}); builds its tooltip with
// textContent only, so no input text is ever parsed as markup. Without
// JavaScript the static chart stays as it is. When every figure is set up it
// sets data-vs-script="done" on <html>: the headless-browser test
// (tests/html_test.py) reads it to know the script ran without an error.
// The script has no "//" comments: the offline test flags every "//" as a
// possible protocol-relative URL.
extern const std::string_view kHtmlScript;

}  // namespace vramscope::report_internal
