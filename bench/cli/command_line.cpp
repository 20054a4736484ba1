#include "command_line.h"

#include <algorithm>
#include <cctype>

namespace moekit_bench {
namespace {

// Quotes a word for a POSIX shell unless it is plainly safe.
std::string shell_word(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string("_./=+-:,").find(c) != std::string::npos;
  });
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

const char* usage_text() {
  return "usage: moekit-bench CONFIG.json [--out results.json] [--check] [--backend auto|cuda|reference]\n"
         "                    [--filter REGEX] [--breakdown] [--validate] [--threads N]\n"
         "  --out FILE       write the results as JSON (a meta block and one record per case)\n"
         "  --check          also run each case at a small shape against the reference backend; print the errors\n"
         "  --backend B      auto (default): CUDA when a usable GPU is present, else the reference (CPU) backend\n"
         "  --filter REGEX   only the cases whose name contains a match (ECMAScript regex)\n"
         "  --breakdown      CUDA backend: per-kernel GPU times of each case (CUPTI), into the JSON and the output\n"
         "  --validate       the handle under test checks tensor values (MOEKIT_HANDLE_VALIDATE): its cost\n"
         "  --threads N      reference backend worker threads (default: all hardware threads)\n"
         "The schema of CONFIG.json and every reported figure are described in docs/benchmark.md.\n";
}

Options parse_command_line(int argc, char** argv) {
  Options o;
  o.program = argc > 0 ? argv[0] : "moekit-bench";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (arg == "--out") {
      o.out = value();
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--breakdown") {
      o.breakdown = true;
    } else if (arg == "--validate") {
      o.validate = true;
    } else if (arg == "--filter") {
      o.filter = value();
    } else if (arg == "--backend") {
      const std::string b = value();
      if (b == "auto") o.backend = BackendChoice::automatic;
      else if (b == "cuda") o.backend = BackendChoice::cuda;
      else if (b == "reference") o.backend = BackendChoice::reference;
      else throw UsageError("--backend: expected auto, cuda or reference, got \"" + b + "\"");
    } else if (arg == "--threads") {
      const std::string t = value();
      if (t.empty() || !std::all_of(t.begin(), t.end(), ::isdigit)) throw UsageError("--threads: expected a number");
      o.threads = std::stoi(t);
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError("unknown option " + arg);
    } else if (o.config.empty()) {
      o.config = arg;
    } else {
      throw UsageError("one config file only (got \"" + o.config + "\" and \"" + arg + "\")");
    }
  }
  if (o.config.empty() && !o.help) throw UsageError("no config file given");
  return o;
}

std::string reproduce_command(const Options& o, const std::string& backend, const std::string& case_name) {
  std::string pattern = "^";
  for (char c : case_name) pattern += (c == '.' || c == '+' ? "\\" : "") + std::string(1, c);
  std::string command = shell_word(o.program) + " " + shell_word(o.config) + " --backend " + backend +
                        " --filter " + shell_word(pattern + "$");
  if (o.check) command += " --check";
  if (o.breakdown) command += " --breakdown";
  if (o.validate) command += " --validate";
  if (o.threads > 0) command += " --threads " + std::to_string(o.threads);
  return command;
}

}  // namespace moekit_bench
