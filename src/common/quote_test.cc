#include "vramscope/common/quote.h"

#include <gtest/gtest.h>

#include <string>

namespace vramscope::common {
namespace {

TEST(QuoteForMessage, OrdinaryTextIsQuotedAsIs) {
  EXPECT_EQ(QuoteForMessage("gelu_new"), "\"gelu_new\"");
  EXPECT_EQ(QuoteForMessage("b200", 64, '\''), "'b200'");
  EXPECT_EQ(QuoteForMessage(""), "\"\"");
  EXPECT_EQ(QuoteForMessage("model.layers.0.mlp.up_proj.weight", 120),
            "\"model.layers.0.mlp.up_proj.weight\"");
  // The other quote character needs no escape.
  EXPECT_EQ(QuoteForMessage("it's", 40, '"'), "\"it's\"");
}

TEST(QuoteForMessage, BackslashAndTheQuoteCharacterAreEscaped) {
  EXPECT_EQ(QuoteForMessage("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(QuoteForMessage("it's", 40, '\''), "'it\\'s'");
  // A literal "\x1b" in the input cannot be mistaken for an escape.
  EXPECT_EQ(QuoteForMessage("\\x1b"), "\"\\\\x1b\"");
}

TEST(QuoteForMessage, ControlCharactersBecomeHexEscapes) {
  EXPECT_EQ(QuoteForMessage("w\x1b[2J\n"), "\"w\\x1b[2J\\x0a\"");
  EXPECT_EQ(QuoteForMessage(std::string("a\0b", 3)), "\"a\\x00b\"");
  EXPECT_EQ(QuoteForMessage("\t\r\x7f"), "\"\\x09\\x0d\\x7f\"");
  for (int c = 0; c < 256; ++c) {
    const std::string quoted = QuoteForMessage(std::string(1, static_cast<char>(c)));
    for (char q : quoted) {
      const auto byte = static_cast<unsigned char>(q);
      EXPECT_TRUE(byte >= 0x20 && byte < 0x7f) << "byte " << c << " gave " << quoted;
    }
  }
}

TEST(QuoteForMessage, NonAsciiAndInvalidUtf8AreHexEscapes) {
  EXPECT_EQ(QuoteForMessage("caf\xC3\xA9"), "\"caf\\xc3\\xa9\"");
  EXPECT_EQ(QuoteForMessage("ab\xFF"), "\"ab\\xff\"");
  EXPECT_EQ(QuoteForMessage("\xC0\x80"), "\"\\xc0\\x80\"");                        // overlong NUL
  EXPECT_EQ(QuoteForMessage(std::string("\xC2\x9B") + "1m"), "\"\\xc2\\x9b1m\"");  // C1 CSI
  EXPECT_EQ(QuoteForMessage("\xE2\x80\xAE"), "\"\\xe2\\x80\\xae\"");               // U+202E RLO
}

TEST(QuoteForMessage, WithoutQuoteCharacters) {
  EXPECT_EQ(QuoteForMessage("knobs.batch", 100, '\0'), "knobs.batch");
  EXPECT_EQ(QuoteForMessage(std::string("a\0b\"'\\", 6), 100, '\0'), "a\\x00b\"'\\\\");
  EXPECT_EQ(QuoteForMessage("evil\x1b[2J\nkkk", 7, '\0'), "evil\\x1b[2...");
}

TEST(QuoteForMessage, LengthIsBounded) {
  const std::string forty(40, 'x');
  EXPECT_EQ(QuoteForMessage(forty), "\"" + forty + "\"");
  EXPECT_EQ(QuoteForMessage(forty + "y"), "\"" + forty + "\"...");
  EXPECT_EQ(QuoteForMessage("abcdef", 3, '\''), "'abc'...");
  EXPECT_EQ(QuoteForMessage("abc", 0), "\"\"...");
  // The worst case: every byte escaped.
  const std::string hostile(100'000, '\x1b');
  EXPECT_EQ(QuoteForMessage(hostile, 120).size(), 4u * 120 + 5);
  EXPECT_EQ(QuoteForMessage(hostile).size(), 4u * kQuotedBytes + 5);
}

// C0, DEL and C1 (U+009B is a terminal's CSI, UTF-8 0xc2 0x9b); other
// non-ASCII text is not control (a nested config's path may be "données.json").
TEST(HasControlCharacters, C0DelAndC1) {
  EXPECT_FALSE(HasControlCharacters("ds_config.json"));
  EXPECT_FALSE(
      HasControlCharacters("donn\xc3\xa9"
                           "es.json"));
  EXPECT_FALSE(HasControlCharacters("\xc2\xa0nbsp"));  // U+00A0 is printable
  EXPECT_TRUE(HasControlCharacters("a\nb"));
  EXPECT_TRUE(HasControlCharacters("a\x7f"));
  EXPECT_TRUE(HasControlCharacters(std::string("a\0b", 3)));
  EXPECT_TRUE(
      HasControlCharacters("ds\xc2\x9b"
                           "2J.json"));
  EXPECT_TRUE(HasControlCharacters("\xc2\x85"));  // NEL
  EXPECT_FALSE(HasControlCharacters("\xc2"));     // cut short: not a C1 character
}

}  // namespace
}  // namespace vramscope::common
