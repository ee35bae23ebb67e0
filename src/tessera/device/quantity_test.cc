#include "tessera/device/quantity.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::device {
namespace {

using ::testing::HasSubstr;

struct Accepted {
  std::string input;
  std::string canonical;           // ToString()
  std::optional<int64_t> integer;  // AsInt64(), nullopt when it must fail
};

void PrintTo(const Accepted& c, std::ostream* os) { *os << QuoteForError(c.input); }

class AcceptedTest : public ::testing::TestWithParam<Accepted> {};

TEST_P(AcceptedTest, ParsesToTheExactValue) {
  const Accepted& c = GetParam();
  absl::StatusOr<Quantity> q = ParseQuantity(c.input);
  ASSERT_TRUE(q.ok()) << c.input << ": " << q.status();
  EXPECT_EQ(q->ToString(), c.canonical) << c.input;
  absl::StatusOr<int64_t> v = q->AsInt64();
  if (c.integer.has_value()) {
    ASSERT_TRUE(v.ok()) << c.input << ": " << v.status();
    EXPECT_EQ(*v, *c.integer) << c.input;
  } else {
    EXPECT_FALSE(v.ok()) << c.input << " gave " << *v;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(v.status().message(), HasSubstr("not an integer"));
  }
  // The canonical form denotes the same value.
  absl::StatusOr<Quantity> again = ParseQuantity(q->ToString());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *q) << c.input;
}

INSTANTIATE_TEST_SUITE_P(
    Quantities, AcceptedTest,
    ::testing::Values(
        // Plain numbers and signs.
        Accepted{"0", "0", 0}, Accepted{"1", "1", 1}, Accepted{"+1", "1", 1},
        Accepted{"-1", "-1", -1}, Accepted{"-0", "0", 0}, Accepted{"+0.000", "0", 0},
        Accepted{"007", "7", 7}, Accepted{"1500", "1500", 1500}, Accepted{"15000", "15k", 15000},
        // Fractions, with either side of the point empty.
        Accepted{".5", "500m", std::nullopt}, Accepted{"5.", "5", 5},
        Accepted{"1.5", "1500m", std::nullopt}, Accepted{"2.0", "2", 2},
        Accepted{"1.G", "1G", 1000000000},
        // Decimal SI suffixes.
        Accepted{"500m", "500m", std::nullopt}, Accepted{"1000m", "1", 1},
        Accepted{"2k", "2k", 2000}, Accepted{"1.5k", "1500", 1500}, Accepted{"3M", "3M", 3000000},
        Accepted{"1G", "1G", 1000000000}, Accepted{"1T", "1T", 1000000000000},
        Accepted{"1P", "1P", 1000000000000000}, Accepted{"1E", "1E", 1000000000000000000},
        Accepted{"1n", "1n", std::nullopt}, Accepted{"1u", "1u", std::nullopt},
        Accepted{"1500u", "1500u", std::nullopt}, Accepted{"0Gi", "0", 0}, Accepted{"0m", "0", 0},
        // Binary SI suffixes.
        Accepted{"1Ki", "1Ki", 1024}, Accepted{"1Mi", "1Mi", 1048576},
        Accepted{"1Gi", "1Gi", 1073741824}, Accepted{"1.5Gi", "1536Mi", 1610612736},
        Accepted{"0.5Ki", "512", 512}, Accepted{"0.1Ki", "102400m", std::nullopt},
        Accepted{"1024Ki", "1Mi", 1048576}, Accepted{"2000Mi", "2000Mi", 2097152000},
        Accepted{"1Ti", "1Ti", int64_t{1} << 40}, Accepted{"1Pi", "1Pi", int64_t{1} << 50},
        Accepted{"1Ei", "1Ei", int64_t{1} << 60}, Accepted{"7Ei", "7Ei", int64_t{7} << 60},
        Accepted{"-2Gi", "-2Gi", -2147483648},
        // Decimal exponents.
        Accepted{"1e3", "1e3", 1000}, Accepted{"1E3", "1e3", 1000}, Accepted{"1e+3", "1e3", 1000},
        Accepted{"1.e3", "1e3", 1000}, Accepted{"1500e0", "1500", 1500},
        Accepted{"12e6", "12e6", 12000000}, Accepted{"1e-3", "1e-3", std::nullopt},
        Accepted{"25e-1", "2500e-3", std::nullopt}, Accepted{"1e0", "1", 1},
        Accepted{"0e99999999999", "0", 0},
        // Limits: the magnitude may reach 2^63-1 units.
        Accepted{"9223372036854775807", "9223372036854775807", 9223372036854775807},
        Accepted{"-9223372036854775807", "-9223372036854775807", -9223372036854775807},
        Accepted{"9223372036854775806.5", "9223372036854775806500m", std::nullopt},
        // Finer than 1n rounds up (away from zero) to the next nano-unit, as in Kubernetes.
        Accepted{"1e-12", "1e-9", std::nullopt}, Accepted{"-1e-12", "-1e-9", std::nullopt},
        Accepted{"0.000000000001", "1n", std::nullopt},
        Accepted{"1.0000000001", "1000000001n", std::nullopt},
        Accepted{"1e-9999999", "1e-9", std::nullopt},
        Accepted{"0.0000000001Ki", "103n", std::nullopt}));

struct Rejected {
  std::string input;
  std::string reason;  // a substring of the message
};

void PrintTo(const Rejected& c, std::ostream* os) { *os << QuoteForError(c.input); }

class RejectedTest : public ::testing::TestWithParam<Rejected> {};

TEST_P(RejectedTest, IsAnErrorNamingTheInput) {
  const Rejected& c = GetParam();
  // The input in a heap block of exactly its size, so that under ASan a read past its end fails
  // the test (a string literal or std::string has a readable NUL after it): the fuzzer found the
  // suffix "e" read one byte past "1.1e".
  std::unique_ptr<char[]> exact(new char[c.input.size()]);
  std::copy(c.input.begin(), c.input.end(), exact.get());
  const std::string_view input(exact.get(), c.input.size());
  absl::StatusOr<Quantity> q = ParseQuantity(input);
  ASSERT_FALSE(q.ok()) << "accepted " << QuoteForError(c.input) << " as " << q->ToString();
  EXPECT_THAT(q.status().message(), HasSubstr(c.reason)) << q.status();
  EXPECT_THAT(q.status().message(), HasSubstr(QuoteForError(c.input)));
}

INSTANTIATE_TEST_SUITE_P(
    Quantities, RejectedTest,
    ::testing::Values(
        Rejected{"", "empty"}, Rejected{" ", "no digits"}, Rejected{" 1", "no digits"},
        Rejected{"1 ", "unknown suffix \" \""}, Rejected{"1 Gi", "unknown suffix"},
        Rejected{"1.5.3", "unknown suffix \".3\""}, Rejected{"1.1.M", "unknown suffix"},
        Rejected{"Gi", "no digits"}, Rejected{"m", "no digits"}, Rejected{".", "no digits"},
        Rejected{"+", "no digits"}, Rejected{"-", "no digits"}, Rejected{"-Gi", "no digits"},
        Rejected{"--1", "no digits"}, Rejected{"+-1", "no digits"},
        Rejected{"1+1.0M", "unknown suffix"}, Rejected{"e3", "no digits"},
        Rejected{"1e", "malformed exponent"}, Rejected{"1E+", "malformed exponent"},
        Rejected{"1e-", "malformed exponent"}, Rejected{"-3.01e-", "malformed exponent"},
        Rejected{"1e1.5", "malformed exponent"}, Rejected{"1e3e", "malformed exponent"},
        Rejected{"1e99999999999999999999", "malformed exponent"}, Rejected{"1K", "unknown suffix"},
        Rejected{"1ki", "unknown suffix"}, Rejected{"1Gb", "unknown suffix"},
        Rejected{"1i", "unknown suffix"}, Rejected{".5i", "unknown suffix"},
        Rejected{"0.1mi", "unknown suffix"}, Rejected{"0.1am", "unknown suffix"},
        Rejected{"aoeu", "no digits"}, Rejected{"1Mi5", "unknown suffix"},
        Rejected{"0x10", "unknown suffix"}, Rejected{"1,5", "unknown suffix"},
        Rejected{"1\n", "unknown suffix \"\\x0a\""},
        Rejected{std::string("1\0", 2), "unknown suffix \"\\x00\""},
        Rejected{"\xef\xbc\x91", "no digits"},  // a full-width digit one
        // Out of range: magnitude above 2^63-1.
        Rejected{"9223372036854775808", "out of range"},
        Rejected{"-9223372036854775808", "out of range"},
        Rejected{"9223372036854775807.5", "out of range"}, Rejected{"8Ei", "out of range"},
        Rejected{"10E", "out of range"}, Rejected{"1e19", "out of range"},
        Rejected{"1e4294967296", "out of range"},
        Rejected{"123456789012345678901234567890", "out of range"}));

TEST(QuantityTest, OutOfRangeHasItsOwnCode) {
  EXPECT_EQ(ParseQuantity("1e30").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ParseQuantity("1x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantityTest, EqualityIsByValueNotSpelling) {
  EXPECT_EQ(*ParseQuantity("1Ki"), *ParseQuantity("1024"));
  EXPECT_EQ(*ParseQuantity("1024"), *ParseQuantity("1.024k"));
  EXPECT_EQ(*ParseQuantity("1e3"), *ParseQuantity("1k"));
  EXPECT_EQ(*ParseQuantity("0.5"), *ParseQuantity("500m"));
  EXPECT_EQ(*ParseQuantity("-0"), *ParseQuantity("0Gi"));
  EXPECT_FALSE(*ParseQuantity("1") == *ParseQuantity("-1"));
  EXPECT_FALSE(*ParseQuantity("1") == *ParseQuantity("1.000000001"));
}

TEST(QuantityTest, FineDigitsThatBinaryScalingMakesWholeAreExact) {
  // 5e-10 * 1024 = 512e-9 exactly: no rounding although digits below 1n were written.
  EXPECT_EQ(*ParseQuantity("0.0000000005Ki"), *ParseQuantity("512n"));
  EXPECT_EQ(*ParseQuantity("0.00000000050000000000000000000Ki"), *ParseQuantity("512n"));
  EXPECT_EQ(*ParseQuantity("0.0000000015Ki"), *ParseQuantity("1536n"));
  EXPECT_EQ(*ParseQuantity("1234567890123456789012e-3"), *ParseQuantity("1234567890123456789.012"));
}

TEST(QuantityTest, MilliValueRoundsUp) {
  EXPECT_EQ(*ParseQuantity("1.5")->MilliValue(), 1500);
  EXPECT_EQ(*ParseQuantity("500m")->MilliValue(), 500);
  EXPECT_EQ(*ParseQuantity("1n")->MilliValue(), 1);
  EXPECT_EQ(*ParseQuantity("1.0001m")->MilliValue(), 2);
  EXPECT_EQ(*ParseQuantity("-1.5m")->MilliValue(), -1);
  EXPECT_EQ(*ParseQuantity("9223372036854775")->MilliValue(), 9223372036854775000);
  absl::StatusOr<int64_t> big = ParseQuantity("9223372036854776")->MilliValue();
  EXPECT_EQ(big.status().code(), absl::StatusCode::kOutOfRange);
}

TEST(QuantityTest, FromInt64) {
  Quantity q = Quantity::FromInt64(1073741824, QuantityFormat::kBinarySI);
  EXPECT_EQ(q.ToString(), "1Gi");
  EXPECT_EQ(*q.AsInt64(), 1073741824);
  EXPECT_EQ(Quantity::FromInt64(-2000).ToString(), "-2k");
  EXPECT_TRUE(Quantity::FromInt64(0).IsZero());
  EXPECT_EQ(*Quantity::FromInt64(std::numeric_limits<int64_t>::min()).AsInt64(),
            -std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Quantity(), Quantity::FromInt64(0));
}

TEST(QuantityTest, FormatFollowsTheSuffix) {
  EXPECT_EQ(ParseQuantity("1Gi")->format(), QuantityFormat::kBinarySI);
  EXPECT_EQ(ParseQuantity("1G")->format(), QuantityFormat::kDecimalSI);
  EXPECT_EQ(ParseQuantity("1")->format(), QuantityFormat::kDecimalSI);
  EXPECT_EQ(ParseQuantity("1e9")->format(), QuantityFormat::kDecimalExponent);
  EXPECT_TRUE(ParseQuantity("-5")->IsNegative());
  EXPECT_FALSE(ParseQuantity("-0")->IsNegative());
}

TEST(QuantityTest, LongInputsAreShortenedInErrors) {
  std::string input(1000, 'x');
  absl::StatusOr<Quantity> q = ParseQuantity(input);
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("(1000 bytes)"));
  EXPECT_LT(q.status().message().size(), 400u);
}

TEST(QuantityTest, ManyDigitsWithSmallExponentStayExact) {
  // 40 significant digits, most of them below the nano-unit: rounds up at 1n resolution.
  absl::StatusOr<Quantity> q = ParseQuantity("1.234567890123456789012345678901234567890");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->ToString(), "1234567891n");
  // Exactly representable: 19 integer digits and 9 fraction digits.
  q = ParseQuantity("1234567890123456789.123456789");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->ToString(), "1234567890123456789123456789n");
}

}  // namespace
}  // namespace tessera::device
