// moekit-bench's command line:
//   moekit-bench CONFIG.json [--out results.json] [--check] [--backend auto|cuda|reference] [--filter REGEX]
//                [--breakdown] [--validate] [--threads N]
#pragma once

#include <stdexcept>
#include <string>

namespace moekit_bench {

enum class BackendChoice { automatic, cuda, reference };

struct Options {
  std::string program;  // argv[0], for the reproduce commands
  std::string config;
  std::string out;      // "" = no JSON file
  bool check = false;
  bool breakdown = false;
  bool validate = false;  // --validate: the handle under test has MOEKIT_HANDLE_VALIDATE
  bool help = false;
  BackendChoice backend = BackendChoice::automatic;
  std::string filter;   // ECMAScript regex searched in case names; "" = every case
  int threads = 0;      // reference backend worker threads; 0 = hardware concurrency
};

// A command line that cannot be used; moekit-bench prints the message and the usage and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

Options parse_command_line(int argc, char** argv);
const char* usage_text();

// The one-line command that measures just `case_name` again as this run did.
std::string reproduce_command(const Options& options, const std::string& backend, const std::string& case_name);

}  // namespace moekit_bench
