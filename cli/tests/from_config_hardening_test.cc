// The --from readers and the CLI's message filter against the hostile inputs
// of issue 42 (round 3): each case crashed, hung, misread or misreported
// before its fix (docs/hardening.md).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "from_config.h"
#include "knobs.h"
#include "output.h"
#include "yaml_json.h"

namespace vramscope::cli {
namespace {

// The error of parsing `text` as the --from file `name` (nested files: none).
std::string ErrorOf(const std::string& name, const std::string& text) {
  const ConfigFileReader none = [](const std::string& path) -> Result<std::string> {
    return MakeError(path + ": not in this test");
  };
  FromConfig out;
  const Status st = ParseConfigText(name, text, 5, none, &out);
  EXPECT_FALSE(st.ok()) << text.substr(0, 200);
  return st.ok() ? "" : st.error().message;
}

FromConfig Parsed(const std::string& name, const std::string& text) {
  const ConfigFileReader none = [](const std::string& path) -> Result<std::string> {
    return MakeError(path + ": not in this test");
  };
  FromConfig out;
  const Status st = ParseConfigText(name, text, 5, none, &out);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return out;
}

bool Printable(const std::string& line) {
  for (unsigned char c : line) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return line.find("\xc2\x9b") == std::string::npos;
}

// micro x accumulation x ranks: 2^32 x 2^32 wrapped to 0 and was then a
// divisor (SIGFPE, also in the Python interpreter).
TEST(FromConfigHardening, DeepSpeedBatchProductIsChecked) {
  const std::string m = ErrorOf("ds.json",
                                R"({"train_micro_batch_size_per_gpu": 4294967296,
                                    "gradient_accumulation_steps": 4294967296,
                                    "train_batch_size": 1048576})");
  EXPECT_EQ(m.rfind("ds.json: train_batch_size: ", 0), 0u) << m;
  // Not wrapped to 0, nor to a small plausible product.
  EXPECT_NE(ErrorOf("ds.json", R"({"train_micro_batch_size_per_gpu": 4294967296,
                                   "gradient_accumulation_steps": 4294967295,
                                   "train_batch_size": 1099511627776})")
                .find("train_batch_size"),
            std::string::npos);
}

// A number the reader accepted reaches the setup as the number, never as text
// parsed back: 1e-320 is a valid dropout that std::stod refuses ("internal
// error: stod", exit 1; IndexError in Python).
TEST(FromConfigHardening, NumbersReachTheSetupTyped) {
  FromConfig config = Parsed("sft.json", R"({"use_peft": true, "lora_dropout": 1e-320,
                                             "per_device_train_batch_size": 3, "lora_r": 4,
                                             "packing": false})");
  KnobArgs knobs;
  const KnobArgs merged = knobs.WithConfig(std::move(config), nullptr);
  EXPECT_EQ(merged.lora_dropout, 1e-320);
  EXPECT_EQ(merged.batch, 3u);
  EXPECT_EQ(merged.lora_rank, 4u);
  auto setup = merged.ToSetup();
  ASSERT_TRUE(setup.ok()) << setup.error().message;
  EXPECT_EQ(setup->lora_dropout, 1e-320);
  // Where each came from, for messages about them.
  bool named = false;
  for (const auto& [flag, source] : setup->knob_sources)
    named = named || (flag == "--batch" && source == "sft.json: per_device_train_batch_size");
  EXPECT_TRUE(named);
}

// JSON inside a string value (TRL's model_init_kwargs) had no depth limit, and
// the message quoting it was built recursively: a stack overflow.
TEST(FromConfigHardening, JsonInsideAStringHasTheDepthLimit) {
  const int n = 100000;
  std::string kwargs = "{\\\"dtype\\\": " + std::string(n, '[') + std::string(n, ']') + "}";
  const std::string m =
      ErrorOf("sft.json", R"({"use_peft": true, "model_init_kwargs": ")" + kwargs + "\"}");
  EXPECT_NE(m.find("sft.json: model_init_kwargs: "), std::string::npos) << m;
  EXPECT_NE(m.find("nested deeper than 64"), std::string::npos) << m;
  // Deep, but within the limit: the value is quoted briefly, not dumped whole.
  std::string shallow = "{\\\"dtype\\\": " + std::string(60, '[') + std::string(60, ']') + "}";
  const std::string q =
      ErrorOf("sft.json", R"({"use_peft": true, "model_init_kwargs": ")" + shallow + "\"}");
  EXPECT_NE(q.find("model_init_kwargs.dtype: '[[[[[[[[[...]]]]]]]]]' is not a string"),
            std::string::npos)
      << q;
}

// YAML's .inf and .nan were quoted as JSON's null.
TEST(FromConfigHardening, NonFiniteNumbersAreQuotedAsWritten) {
  if (!YamlSupported()) GTEST_SKIP() << "built without libyaml";
  const std::string m = ErrorOf("ax.yml",
                                "base_model: x\nadapter: lora\nmicro_batch_size: 1\n"
                                "lora_dropout: .inf\n");
  EXPECT_NE(m.find("lora_dropout: '.inf' is outside [0, 1)"), std::string::npos) << m;
  EXPECT_EQ(m.find("null"), std::string::npos) << m;
  const std::string n = ErrorOf("sft.yaml", "use_peft: true\nlora_dropout: -.Inf\n");
  EXPECT_NE(n.find("'-.inf'"), std::string::npos) << n;
  const std::string nan = ErrorOf("sft.yaml", "use_peft: true\nlora_dropout: .nan\n");
  EXPECT_NE(nan.find("'.nan'"), std::string::npos) << nan;
}

// A path a config names is checked as a command-line path is: no C1 control
// characters (CSI) echoed in every message about the nested file.
TEST(FromConfigHardening, NestedPathsWithControlCharactersAreRefused) {
  for (const char* path : {"ds\\u009b2J.json", "ds\\u0085.json", "ds\\u001b[2J.json"}) {
    const std::string m =
        ErrorOf("args.json",
                std::string(R"({"per_device_train_batch_size": 1, "deepspeed": ")") + path + "\"}");
    EXPECT_NE(m.find("args.json: deepspeed: the path"), std::string::npos) << m;
    EXPECT_TRUE(Printable(m)) << m;
  }
}

// A path a config names that is the caller's stream (/dev/stdin, /dev/fd/N)
// is not read: it waited until that stream closed.
TEST(FromConfigHardening, NestedPathsAreRegularFilesOnly) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // a writer that never writes nor closes
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::filesystem::path file = dir / ("vs_nested_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << R"({"per_device_train_batch_size": 1, "deepspeed": "/dev/fd/)" << fds[0]
                      << "\"}";
  const auto start = std::chrono::steady_clock::now();
  auto config = ReadConfigFiles({file.string()}, 5);
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().message.find("expected a regular file"), std::string::npos)
      << config.error().message;
  EXPECT_LT(seconds.count(), 2.0);
  std::filesystem::remove(file);
  ::close(fds[0]);
  ::close(fds[1]);
}

// Lists read from files are short; millions of names were millions of
// warnings (12 s, 3 GiB).
TEST(FromConfigHardening, ListsAreCappedAndWarningsCounted) {
  std::string names;
  for (int i = 0; i < 2000; ++i)
    names += std::string(i ? "," : "") + "\"x" + std::to_string(i) + "\"";
  const std::string m =
      ErrorOf("sft.json", R"({"use_peft": true, "lora_target_modules": [)" + names + "]}");
  EXPECT_NE(m.find("sft.json: lora_target_modules: a list of 2000 items"), std::string::npos) << m;
  std::string options;
  for (int i = 0; i < 1000; ++i) options += "hybrid_shard_zero2 ";
  FromConfig out = Parsed("args.json", R"({"output_dir": "o", "fsdp": ")" + options + "\"}");
  EXPECT_EQ(out.not_modelled.size(), 1u);
  // A config of a quarter million values is not a config.
  std::string many = "[" + std::string(300000 * 2 - 1, ',') + "]";
  for (size_t i = 1; i < many.size(); i += 2) many[i] = '1';
  EXPECT_NE(ErrorOf("big.json", R"({"output_dir": "o", "x": )" + many + "}").find("values"),
            std::string::npos);
  if (YamlSupported()) {
    std::string yaml = "base_model: x\nmicro_batch_size: 1\nlora_target_modules:\n";
    for (int i = 0; i < 300000; ++i) yaml += "- q\n";
    EXPECT_NE(ErrorOf("ax.yml", yaml).find("more values than a config holds"), std::string::npos);
  }
}

// The last filter of every message line: C1 controls and bytes that are not
// UTF-8 become '?', like C0 ones; UTF-8 text stays.
TEST(OneLine, C1AndInvalidUtf8) {
  EXPECT_EQ(OneLine("a\xc2\x9b"
                    "2Jb"),
            "a?2Jb");
  EXPECT_EQ(OneLine("a\x9b"
                    "b\xff"),
            "a?b?");
  EXPECT_EQ(OneLine("caf\xc3\xa9 \xe2\x80\x94 x"), "caf\xc3\xa9 \xe2\x80\x94 x");
  EXPECT_EQ(OneLine("a\nb\x1b"), "a b?");
  EXPECT_EQ(OneLine("\xed\xa0\x80"), "???");  // a UTF-16 surrogate, not UTF-8
  EXPECT_EQ(OneLine(std::string(2000, 'x')).size(), 1003u);
}

}  // namespace
}  // namespace vramscope::cli
