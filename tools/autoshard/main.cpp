// autoshard: plan, explain, show, shard and verify sharding from the command line.
// Exit codes: 0 success, 1 user error (one message on stderr), 2 usage error.
#include "common.hpp"

#include <autoshard/io/atomic_file.hpp>  // remove_live_temporaries

#include <signal.h>
#include <unistd.h>  // write

#include <cstdlib>    // std::_Exit
#include <cstring>    // std::strlen
#include <exception>  // std::set_terminate, std::current_exception
#include <filesystem>
#include <iostream>
#include <new>

namespace {
/// SIGINT, SIGTERM, SIGHUP: remove the temporaries this process is writing (async-signal-safe:
/// unlink only), then die of the signal as before (the default action, re-raised), so the
/// exit status still says which signal it was. A signal ignored at start (nohup, a background
/// job of a non-interactive shell) stays ignored.
void remove_temporaries_and_die(int sig) {
  autoshard::remove_live_temporaries();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
void clean_up_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction a {};
    a.sa_handler = &remove_temporaries_and_die;
    sigemptyset(&a.sa_mask);
    a.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &a, nullptr);
  }
}

/// The last net under every check: an exception that reaches std::terminate (one thrown
/// while another unwinds, or from a noexcept function: a JSON tree's destructor allocates as
/// it unwinds from an allocation that failed) ends in the same one line with a kind as any
/// error, exit 1, and the temporaries this process was writing removed, never SIGABRT.
[[noreturn]] void fail_on_terminate() {
  const char* line = "autoshard: internal error: terminated without an exception\n";
  try {
    if (const std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    line = "autoshard: resource error: out of memory (an allocation failed while another was being undone); "
           "the input asks for more memory than this machine lets the process have\n";
  } catch (...) {
    line = "autoshard: internal error: an exception escaped where none may (std::terminate)\n";
  }
  autoshard::remove_live_temporaries();
  (void)!::write(2, line, std::strlen(line));
  std::_Exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace autoshard::tool;
  clean_up_on_signals();
  std::set_terminate(&fail_on_terminate);
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
#if defined(AUTOSHARD_TOOL_CMD_EXPORT)
  register_export(app, run);
#endif
#if defined(AUTOSHARD_TOOL_CMD_CALIBRATE)
  register_calibrate(app, run);
#endif
  register_completion(app, run);
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
