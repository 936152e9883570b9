// autoshard: plan, explain, show, shard and verify sharding from the command line.
// Exit codes: 0 success, 1 user error (one message on stderr), 2 usage error.
#include "common.hpp"

#include <filesystem>
#include <iostream>
#include <new>

int main(int argc, char** argv) {
  using namespace autoshard::tool;
  CLI::App app{"autoshard: split a neural network over a mesh of GPUs", "autoshard"};
  app.set_version_flag("--version", std::string("autoshard ") + AUTOSHARD_TOOL_VERSION);
  app.require_subcommand(1);
  action run;
  register_explain(app, run);
  register_show(app, run);
#if defined(AUTOSHARD_TOOL_CMD_PLAN)
  register_plan(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_SOLVE)
  register_solve(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_SHARD)
  register_shard(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_VERIFY)
  register_verify(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_SYNTH)
  register_synth(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_CALIBRATE)
  register_calibrate(app, run);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }
  try {
    return run ? run() : exit_usage;
  } catch (const autoshard::error& e) {  // what() is "<kind> error: ...": the tool names itself
    std::cerr << "autoshard: " << e.what() << "\n";
    return exit_user_error;
  } catch (const std::bad_alloc&) {  // a size no check caught: say what happened, not "std::bad_alloc"
    std::cerr << "autoshard: resource error: out of memory (an allocation failed); the input asks for more "
                 "memory than this machine lets the process have\n";
    return exit_user_error;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "autoshard: io error: " << e.code().message() << ": '" << e.path1().string() << "'"
              << (e.path2().empty() ? "" : " and '" + e.path2().string() + "'") << "\n";
    return exit_user_error;
  } catch (const std::exception& e) {  // a bug: still one line with a kind
    std::cerr << "autoshard: internal error: " << e.what() << "\n";
    return exit_user_error;
  }
}
