// autoshard: plan, explain, show, shard and verify sharding from the command line.
// Exit codes: 0 success, 1 user error (one message on stderr), 2 usage error.
#include "common.hpp"

#include <autoshard/io/atomic_file.hpp>  // remove_live_temporaries

#include <signal.h>
#include <unistd.h>  // write

#include <cerrno>     // errno
#include <cstdio>     // std::fflush, std::ferror
#include <cstdlib>    // std::_Exit
#include <algorithm>  // std::min
#include <cstring>    // std::strlen, std::strerror
#include <exception>  // std::set_terminate, std::current_exception
#include <filesystem>
#include <iostream>
#include <new>

namespace {
/// Every signal whose default action ends the process (SIGINT, SIGTERM, SIGHUP, SIGQUIT,
/// SIGPIPE, SIGALRM, SIGUSR1/2, SIGXCPU, SIGVTALRM, and the crashes SIGSEGV, SIGBUS, SIGFPE,
/// SIGILL, SIGABRT): remove the temporaries this process is writing (async-signal-safe: unlink
/// only, over the live-temporaries table of any size), then die of the signal as before (the
/// default action, re-raised), so the exit status still says which signal it was. A signal
/// with another action at start (ignored under nohup, or a sanitizer's handler) keeps it.
/// SIGXFSZ (the file-size limit, ulimit -f) is ignored instead: the write then fails with
/// EFBIG, a clear io_error, and the temporaries go as the error unwinds. Only SIGKILL leaves
/// temporaries; the next writer of the same file removes them (io/atomic_file.hpp).
void remove_temporaries_and_die(int sig) {
  autoshard::remove_live_temporaries();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
void clean_up_on_signals() {
  static char alt_stack[1 << 16];  // a stack overflow's SIGSEGV needs a stack of its own
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  ::sigaltstack(&ss, nullptr);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU, SIGVTALRM, SIGSEGV, SIGBUS,
                  SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction a {};
    a.sa_handler = &remove_temporaries_and_die;
    sigemptyset(&a.sa_mask);
    a.sa_flags = SA_RESETHAND | SA_ONSTACK;
    ::sigaction(sig, &a, nullptr);
  }
  struct sigaction old {};
  if (::sigaction(SIGXFSZ, nullptr, &old) == 0 && (old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_DFL)
    ::signal(SIGXFSZ, SIG_IGN);
}

/// What the command printed reached its readers: stdout and stderr flushed and checked
/// (`plan --json > /dev/full` used to exit 0 having written nothing). A failed write turns a
/// success into exit 1 with a message (on stderr, when it can still be written).
int checked_exit(int rc) {
  std::cout.flush();
  int err = std::fflush(stdout) != 0 ? errno : 0;
  const bool out_failed = err != 0 || std::ferror(stdout) || std::cout.fail();
  std::cerr.flush();
  const bool err_failed = std::fflush(stderr) != 0 || std::ferror(stderr) || std::cerr.fail();
  if (!out_failed && !err_failed) return rc;
  if (err == 0 && out_failed) err = EIO;
  std::cerr.clear();
  std::clearerr(stderr);
  std::cerr << "autoshard: io error: cannot write to standard " << (out_failed ? "output" : "error")
            << (out_failed ? std::string(": ") + std::strerror(err) : std::string()) << "; what the command printed is incomplete\n";
  return rc == autoshard::tool::exit_usage ? rc : autoshard::tool::exit_user_error;
}

/// Checks every option of every subcommand gets before its own (CLI11 runs a transform first):
/// - integers are decimal: CLI11 reads them with strtoll(..., 0), so `--layers 010` was 8 and
///   `--tp 0x2` was 2; now digits with an optional sign (leading zeros dropped: 010 is 10);
/// - a text value is never empty: `plan --out ''` wrote hidden `.dot` files and no plan,
///   `export --out ''` wrote to stdout, `solve --solution-out ''` wrote nothing, exit 0.
void strict_values(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    for (CLI::Option* opt : sub->get_options()) {
      const std::string type = opt->get_type_name();
      if (type.rfind("TEXT", 0) == 0)
        opt->transform(CLI::Validator(
            [](std::string& in) -> std::string { return in.empty() ? "the value is empty: give one, or leave the option out" : ""; },
            ""));
      if (type.rfind("INT", 0) != 0 && type.rfind("UINT", 0) != 0) continue;
      opt->transform(CLI::Validator(
          [](std::string& in) -> std::string {
            std::size_t digits = in.size() > 0 && (in[0] == '-' || in[0] == '+') ? 1 : 0;
            if (digits == in.size() || in.find_first_not_of("0123456789", digits) != std::string::npos)
              return "'" + in + "' is not a decimal integer";
            const std::size_t first = std::min(in.find_first_not_of('0', digits), in.size() - 1);
            in = in.substr(0, digits) + in.substr(first);
            return {};
          },
          ""));
    }
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
  strict_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return checked_exit(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return checked_exit(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return checked_exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return checked_exit(exit_usage);
  }
  try {
    return checked_exit(run ? run() : exit_usage);
  } catch (const CLI::ParseError& e) {  // a usage error found after parsing (a value's form, options that conflict)
    app.exit(e);
    return checked_exit(exit_usage);
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
