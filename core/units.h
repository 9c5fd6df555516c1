// Quantities with units: "1ms", "2.5us", "25GBps", "100Gbps", "16GiB", "8MiB", "125TFLOPS".
// Decimal prefixes are decimal (1 GB = 1e9 bytes, 100 Gbps = 12.5e9 bytes/s), binary ones binary
// (1 GiB = 2^30 bytes). Values are returned in SI base units: seconds, bytes, bytes/s, FLOP/s, FLOP.
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"

namespace pipegrid {

enum class Dimension { Time, Bytes, Bandwidth, FlopRate, Flops, Frequency };

// "a time like \"1ms\"" - used in error messages.
std::string describe(Dimension d);

// Parses a quantity of the given dimension. The unit is required ("0s", not "0"). Negative values
// are errors unless allow_negative. After the unit is applied the magnitude must be at most, per
// dimension: 1e9 s, 1e18 B, 1e21 B/s, 1e21 FLOP/s, 1e24 FLOP, 1e12 Hz ("1e300TB" is an error, not
// infinity), and a bandwidth other than 0 at least 1 B/s (slower links make times beside which
// compute is lost to rounding). The error message says what was expected and what was found,
// without location (callers add it): expected a time like "1ms", got "5GB" ("GB" is the unit of a byte size).
Result<double> parse_quantity(std::string_view text, Dimension d, bool allow_negative = false);

// The largest magnitude parse_quantity accepts for a dimension (1e9 for Time, ...), for inputs that
// carry quantities without units (profiles, SimGrid speeds) and must keep the same bounds.
double max_magnitude(Dimension d);

// describe() with a qualifier: qualified(Dimension::Time, "positive") = "a positive time like \"1ms\"".
std::string describe(Dimension d, std::string_view qualifier);

// Human-readable forms with a unit, e.g. "1.5 ms", "8 MiB", "25 GB/s", "125 TFLOP/s".
std::string format_time(double seconds);
std::string format_bytes(double bytes);
std::string format_bandwidth(double bytes_per_s);
std::string format_flop_rate(double flop_per_s);
std::string format_flops(double flop);
std::string format_frequency(double hz);

}  // namespace pipegrid
