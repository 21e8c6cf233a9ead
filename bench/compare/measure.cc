#include "bench/compare/measure.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace brisk::bench {
namespace {

std::string variable_name(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// getenv returns a name's first entry, so a set variable must replace, not follow, an earlier one.
void set_variable(std::vector<std::string>& env, const std::string& entry) {
  const std::string name = variable_name(entry);
  for (std::string& existing : env) {
    if (variable_name(existing) == name) {
      existing = entry;
      return;
    }
  }
  env.push_back(entry);
}

std::vector<std::string> child_environment(const RunOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0) continue;
    env.emplace_back(*e);
  }
  if (!options.preload.empty()) env.push_back("LD_PRELOAD=" + options.preload);
  for (const std::string& extra : options.environment) set_variable(env, extra);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

void keep_last_line(std::string& pending, std::string& last_line, const char* data, std::size_t size) {
  pending.append(data, size);
  std::size_t newline;
  while ((newline = pending.find('\n')) != std::string::npos) {
    std::string line = pending.substr(0, newline);
    if (line.find_first_not_of(" \t\r") != std::string::npos) last_line = line;
    pending.erase(0, newline + 1);
  }
  // Keep a partial line bounded: a command that writes megabytes without a newline is not
  // printing a metric.
  if (pending.size() > 4096) pending.erase(0, pending.size() - 4096);
}

}  // namespace

RunResult run_measured(const std::vector<std::string>& argv, const RunOptions& options) {
  RunResult result;
  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<std::string> env_strings = child_environment(options);
  std::vector<std::string> arg_strings = argv;
  std::vector<char*> env = c_strings(env_strings);
  std::vector<char*> args = c_strings(arg_strings);
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    result.exec_failed = true;
    result.exit_code = 127;
    result.stderr_tail = std::string("pipe: ") + std::strerror(errno);
    return result;
  }

  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(args[0], args.data(), env.data());
    const int error = errno;
    ssize_t ignored = write(exec_pipe[1], &error, sizeof error);
    (void)ignored;
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(exec_pipe[0]);
    result.exec_failed = true;
    result.exit_code = 127;
    result.stderr_tail = std::string("fork: ") + std::strerror(errno);
    return result;
  }

  // Drain both pipes until the child closes them, so a chatty command never blocks on a full
  // pipe (which would be measured as allocator time).
  std::string pending;
  std::string err;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_count = 2;
  char buffer[65536];
  while (open_count > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
        continue;
      }
      if (i == 0) {
        keep_last_line(pending, result.last_line, buffer, static_cast<std::size_t>(n));
        if (options.echo_output) (void)!write(STDOUT_FILENO, buffer, static_cast<std::size_t>(n));
      } else {
        err.append(buffer, static_cast<std::size_t>(n));
        if (err.size() > 8192) err.erase(0, err.size() - 2048);
        if (options.echo_output) (void)!write(STDERR_FILENO, buffer, static_cast<std::size_t>(n));
      }
    }
  }
  if (pending.find_first_not_of(" \t\r") != std::string::npos) result.last_line = pending;

  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  const auto end = std::chrono::steady_clock::now();

  int exec_error = 0;
  if (read(exec_pipe[0], &exec_error, sizeof exec_error) == static_cast<ssize_t>(sizeof exec_error)) {
    result.exec_failed = true;
    err = "cannot run " + argv[0] + ": " + std::strerror(exec_error);
  }
  close(exec_pipe[0]);

  result.wall_seconds = std::chrono::duration<double>(end - start).count();
  result.user_seconds = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6;
  result.system_seconds = usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  result.peak_rss_kib = usage.ru_maxrss;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  result.stderr_tail = err.size() > 2048 ? err.substr(err.size() - 2048) : err;
  return result;
}

std::optional<Metric> parse_metric_line(const std::string& line) {
  const std::size_t equals = line.find('=');
  if (equals == std::string::npos) return std::nullopt;
  const std::size_t name_begin = line.find_first_not_of(" \t");
  if (name_begin == std::string::npos || name_begin >= equals) return std::nullopt;
  std::size_t name_end = line.find_last_not_of(" \t", equals - 1) + 1;
  Metric metric;
  metric.name = line.substr(name_begin, name_end - name_begin);
  for (char c : metric.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return std::nullopt;
  }
  const std::string rest = line.substr(equals + 1);
  char* end = nullptr;
  errno = 0;
  metric.value = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str() || errno == ERANGE) return std::nullopt;
  while (*end == ' ' || *end == '\t' || *end == '\r') ++end;
  if (*end != '\0') return std::nullopt;
  return metric;
}

}  // namespace brisk::bench
