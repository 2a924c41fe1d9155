// Hand-built reports for the renderer tests: the numbers are chosen, not
// simulated, so the tests do not depend on the simulator or the catalog.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "vramscope/report.h"

namespace vramscope::testing {

// Bytes per category in kAllCategories order: parameters, gradients,
// optimizer_state, activations, loss, temporaries, communication, workspace,
// other.
TimelinePoint Point(uint64_t event_index, uint32_t step, Phase phase, CategoryBytes bytes,
                    uint64_t reserved_bytes);

// Fills what the simulator derives from the timeline: allocated per point (the
// category sum), the first allocated peak and the breakdown there, the
// reserved peak, per-phase peaks and the event count.
void DerivePeaks(SimResult* sim);

// A rank class with its device total computed from sim and extras.
RankReport MakeRank(std::string rank_class, std::vector<int> ranks, SimResult sim,
                    DeviceExtras extras, uint64_t host_peak_bytes = 0);

// The three golden fixtures.
Report SmallFitReport();  // one rank class, two training steps, fits
Report OomReport();       // one rank class, out of memory in the first forward
Report TwoRankReport();   // pipeline stages: two rank classes, both fit

// All three with their golden file stems.
std::vector<std::pair<std::string, Report>> GoldenFixtures();

// A report with `n` timeline points (a sawtooth), for size and shape tests.
Report ManyPointsReport(size_t n);

}  // namespace vramscope::testing
