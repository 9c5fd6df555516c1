// Relative floating-point comparison for the tests.
//
// doctest::Approx(x) accepts a when |a - x| < epsilon x (scale + max(|a|, |x|)), with scale 1 by
// default: an absolute floor of epsilon (1.2e-5 by default) that swamps small quantities. A latency
// of 2 us then "equals" anything from -10 us to 14 us, and a layer time of 127 us one of 123 us (a
// stale expectation passed that way). approx() sets the scale to the smallest normal double, so the
// tolerance is relative, epsilon x max(|a|, |x|) (doctest's default epsilon, about 1.2e-5, unless
// .epsilon() says otherwise), and 0 still equals 0 (doctest's comparison is strict). An expected zero
// matches only zero.
#pragma once

#include <doctest/doctest.h>

#include <limits>

namespace pipegrid::testing {

inline doctest::Approx approx(double value) {
  return doctest::Approx(value).scale(std::numeric_limits<double>::min());
}

}  // namespace pipegrid::testing
