// autoshard: plan, explain, show, shard and verify sharding from the command line.
// Exit codes: 0 success, 1 user error (one message on stderr), 2 usage error.
#include "common.hpp"

#include <autoshard/io/atomic_file.hpp>  // remove_live_temporaries

#include <malloc.h>        // mallopt, M_ARENA_MAX (glibc)
#include <signal.h>
#include <sys/resource.h>  // getrlimit, RLIMIT_AS
#include <unistd.h>        // write, isatty

#include <cerrno>     // errno
#include <cstdio>     // std::fflush, std::ferror
#include <algorithm>  // std::min
#include <cstdlib>    // std::_Exit
#include <cstring>    // std::strlen, std::strerror, std::memcpy, std::memchr
#include <exception>  // std::set_terminate, std::current_exception
#include <filesystem>
#include <iostream>
#include <new>
#include <streambuf>
#include <string_view>  // std::string_view

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

/// std::cout's buffer: 64 KiB written to file descriptor 1 (each line as it ends when that is
/// a terminal), keeping the first write error (stdio keeps only a flag, so a failure found at
/// exit could not say why). std::cerr is tied to std::cout: what was printed before a
/// message still comes out before it.
class stdout_buffer : public std::streambuf {
 public:
  stdout_buffer() : lines_(::isatty(1) == 1) { setp(buf_, buf_ + sizeof buf_); }
  ~stdout_buffer() override { (void)drain(); }
  int error() const noexcept { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
      if (lines_ && traits_type::to_char_type(c) == '\n' && !drain()) return traits_type::eof();
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n <= epptr() - pptr()) {
      std::memcpy(pptr(), s, static_cast<std::size_t>(n));
      pbump(static_cast<int>(n));
      return !lines_ || std::memchr(s, '\n', static_cast<std::size_t>(n)) == nullptr || drain() ? n : 0;
    }
    return drain() && write_all(s, static_cast<std::size_t>(n)) ? n : 0;
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const bool ok = write_all(pbase(), static_cast<std::size_t>(pptr() - pbase()));
    setp(buf_, buf_ + sizeof buf_);
    return ok;
  }
  bool write_all(const char* p, std::size_t n) {
    while (n > 0 && error_ == 0) {
      const ssize_t k = ::write(1, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) error_ = k < 0 ? errno : EIO;
      else p += k, n -= static_cast<std::size_t>(k);
    }
    return error_ == 0;
  }
  char buf_[1 << 16];
  int error_ = 0;
  bool lines_ = false;  ///< a terminal: written line by line
};
/// Never destroyed: std::cout flushes into it after main returns.
stdout_buffer& cout_buffer() {
  static stdout_buffer* const b = new stdout_buffer;
  return *b;
}

/// What the command printed reached its readers: stdout and stderr flushed and checked
/// (`plan --json > /dev/full` used to exit 0 having written nothing). A failed write turns a
/// success into exit 1 with a message naming the error (on stderr, when it can still be written).
int checked_exit(int rc) {
  std::cout.flush();
  const int out_error = cout_buffer().error() != 0 ? cout_buffer().error() : std::cout.fail() ? EIO : 0;
  std::cerr.flush();
  const bool err_failed = std::fflush(stderr) != 0 || std::ferror(stderr) || std::cerr.fail();
  if (out_error == 0 && !err_failed) return rc;
  std::cerr.clear();
  std::clearerr(stderr);
  if (out_error != 0)
    std::cerr << "autoshard: io error: cannot write to standard output: " << std::strerror(out_error)
              << "; what the command printed is incomplete\n";
  else
    std::cerr << "autoshard: io error: cannot write to standard error; what the command said is incomplete\n";
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
              return autoshard::quoted_text(in) + " is not a decimal integer";
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

/// Under an address-space limit (ulimit -v) each thread's malloc arena reserves 64 MiB of
/// address space it may never use: `verify` of a 738 MB heap peaked at 1.33 GB of it and ran
/// out under `ulimit -v 1000000`, though every up-front check had passed. With a limit set the
/// threads share two arenas (the same run: 10.5 s either way, and it fits); without one, and
/// when MALLOC_ARENA_MAX is set, glibc's choice stands.
void share_malloc_arenas_under_address_limit() {
#if defined(M_ARENA_MAX)
  rlimit r{};
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr && ::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    (void)::mallopt(M_ARENA_MAX, 2);
#endif
}
}  // namespace

int main(int argc, char** argv) {
  using namespace autoshard::tool;
  share_malloc_arenas_under_address_limit();  // before any thread starts
  clean_up_on_signals();
  std::cout.rdbuf(&cout_buffer());  // every result goes through std::cout: its write errors are kept
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
  // CLI11's own messages (a value not in a set, out of range, not a number) hold the value raw:
  // escaped as quoted_text escapes, so none moves the cursor or recolours the terminal.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    const std::string plain = CLI::FailureMessage::simple(a, e);
    const std::string_view what = e.what();
    std::string out;
    autoshard::detail::append_escaped(out, what, 0, what.size());
    return out + plain.substr(std::min(plain.size(), what.size()));
  });
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
    std::cerr << "autoshard: io error: " << e.code().message() << ": " << autoshard::quoted_path(e.path1().string())
              << (e.path2().empty() ? "" : " and " + autoshard::quoted_path(e.path2().string())) << "\n";
    return exit_user_error;
  } catch (const std::exception& e) {  // a bug: still one line with a kind
    std::cerr << "autoshard: internal error: " << e.what() << "\n";
    return exit_user_error;
  }
}
