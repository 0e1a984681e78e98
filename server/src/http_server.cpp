// The HTTP front of rotary_server/http_server.h on cpp-httplib.
#include "rotary_server/http_server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "rotary/error.h"

namespace rotary::server {

void ServerOptions::validate() const {
  check(port >= 0 && port <= 65535, "--port", port, "in [0, 65535] (0: any free port)");
  check(!host.empty(), "--host", host, "an address to listen on (127.0.0.1: this machine only)");
  check(!model_id.empty(), "--alias", model_id, "a non-empty model id");
  check(timeout_s > 0, "--timeout", timeout_s, "> 0 seconds");
  check(drain_s >= 0, "--drain", drain_s, ">= 0 seconds");
  check(limits.max_body_bytes >= 1024, "--max-body", limits.max_body_bytes, ">= 1024 bytes");
}

namespace {

using Clock = std::chrono::steady_clock;

// JSON text for the wire. A model's bytes need not be UTF-8 (a byte token whose character never completes): they are
// sent as U+FFFD, as Hugging Face's decode(errors="replace") shows them, never as invalid JSON or an error.
std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// The socket of a request's connection, found by its two ends (cpp-httplib 0.11, Debian 12's, gives a handler no
// socket and no "connection closed" test: a non-streamed answer would otherwise run to its end for a client long
// gone). -1 when none matches (an address family or form not compared here: the answer then runs to its end).
int connection_socket(const httplib::Request& req) {
  const auto same_end = [](const sockaddr_storage& a, const std::string& addr, int port) {
    char text[INET6_ADDRSTRLEN] = {};
    int p = -1;
    if (a.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
      inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text), p = ntohs(v4.sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
      inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text), p = ntohs(v6.sin6_port);
    } else {
      return false;
    }
    return p == port && addr == text;
  };
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(fds)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof peer, local_len = sizeof local;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;  // not a connected socket
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (same_end(peer, req.remote_addr, req.remote_port) && same_end(local, req.local_addr, req.local_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(fds);
  return found;
}

// Whether the client closed its end of `fd` (an end of stream waits to be read, or the connection is gone). An HTTP
// client does not half-close a connection it awaits an answer on, so this is a client that left. A pipelined next
// request (bytes waiting) is not a close.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  char byte;
  return (p.revents & POLLIN) && recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(json_text(e.to_json()), "application/json");
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Resident memory of this process (/proc/self/statm), for /metrics; -1 where unknown.
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return -1;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

// What the handlers share.
struct Front {
  Front(const ServerOptions& o, const ServedModel& m, const PromptSetup& p, Scheduler& s)
      : options(o), model(m), prompts(p), scheduler(s) {}
  const ServerOptions& options;
  const ServedModel& model;
  const PromptSetup& prompts;
  Scheduler& scheduler;
  int64_t started = unix_seconds();
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};  // completion requests whose reply is not yet fully written
  std::mutex mutex;
  std::mt19937_64 ids{std::random_device{}()};
  std::map<int, int64_t> errors_by_status;  // answers other than 200, for /metrics

  std::string new_id(Endpoint e) {
    std::lock_guard<std::mutex> lock(mutex);
    char hex[25];
    std::snprintf(hex, sizeof hex, "%016llx%08llx", (unsigned long long)ids(), (unsigned long long)(ids() >> 32));
    return std::string(e == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + hex;
  }
  uint64_t new_seed() {
    std::lock_guard<std::mutex> lock(mutex);
    return ids();
  }
  void count_error(int status) {
    std::lock_guard<std::mutex> lock(mutex);
    ++errors_by_status[status];
  }
};

// Counts a completion request in flight until its reply is written (a stream hands it to its releaser).
struct InFlight {
  explicit InFlight(std::atomic<int64_t>& n) : count(&n) { ++*count; }
  ~InFlight() {
    if (count) --*count;
  }
  std::atomic<int64_t>* count;
};

// The request's prompt tokens: the chat template's rendering, or the prompt's text or ids.
std::vector<int64_t> prompt_tokens(const Front& f, const CompletionRequest& r, std::string& param) {
  const tokenizers::Tokenizer& tok = *f.model.tokenizer;
  if (r.endpoint == Endpoint::ChatCompletions) {
    param = "messages";
    if (!f.prompts.chat_template)
      throw ApiError(400, "invalid_request_error", "messages", "unsupported_field",
                     "this model has no chat template (tokenizer_config.json chat_template, chat_template.jinja): "
                     "start the server with --template FILE, or send a prompt to /v1/completions");
    chat::ChatRequest c;
    c.messages = r.messages, c.add_generation_prompt = true, c.tools = r.tools;
    // Text parts (OpenAI's content arrays) are one string to the template, joined by newlines as vLLM and llama.cpp
    // join them: chat templates print a content, they do not walk parts.
    for (auto& m : c.messages)
      if (m.contains("content") && m["content"].is_array()) {
        std::string joined;
        for (size_t i = 0; i < m["content"].size(); ++i)
          joined += (i ? "\n" : "") + m["content"][i]["text"].get<std::string>();
        m["content"] = joined;
      }
    std::string text;
    try {
      text = chat::render_chat(*f.prompts.chat_template, c);
    } catch (const Error& e) {  // the template's own refusal (raise_exception), or messages it cannot render
      throw ApiError(400, "invalid_request_error", "messages", "invalid_value",
                     std::string("the model's chat template refused the conversation: ") + e.what());
    }
    return tok.encode(text);  // as transformers' apply_chat_template(tokenize=True): the template writes any BOS
  }
  param = "prompt";
  if (r.prompt_text) return tok.encode_for_model(*r.prompt_text);
  const int64_t vocab = f.prompts.sample_vocab > 0 ? f.prompts.sample_vocab : f.model.model->arch().vocab_size;
  const std::vector<int64_t>& ids = *r.prompt_ids;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab)
      throw ApiError(400, "invalid_request_error", "prompt[" + std::to_string(i) + "]", "invalid_value",
                     "prompt[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + ": allowed a token id in [0, " +
                         std::to_string(vocab) + ")");
  return ids;
}

void write_event(httplib::DataSink& sink, bool& ok, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  if (ok) ok = sink.write(event.data(), event.size());
}

void complete(Front& f, const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  auto in_flight = std::make_shared<InFlight>(f.in_flight);
  if (f.draining) throw ApiError(503, "server_error", "", "shutting_down", "the server is shutting down; retry elsewhere");
  const CompletionRequest r = parse_completion_request(req.body, endpoint, f.options.limits);
  if (!r.model.empty() && r.model != f.options.model_id)
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   "model = \"" + r.model.substr(0, 200) + "\": this server serves \"" + f.options.model_id + "\" only");
  auto job = std::make_shared<Job>();
  std::string param;
  job->prompt = prompt_tokens(f, r, param);
  job->sampling.max_new = r.max_tokens.value_or(0);  // 0: to the context's end
  job->sampling.temperature = r.temperature, job->sampling.top_p = r.top_p;
  job->sampling.seed = r.seed ? *r.seed : f.new_seed();
  job->sampling.stop_ids = f.prompts.end_of_turn, job->sampling.sample_vocab = f.prompts.sample_vocab;
  job->stop_strings = r.stop;
  if (r.positions.any()) {  // rotary's extension: the request's position method over the server's
    engine::PositionMethod p = f.model.positions;
    if (r.positions.mode)
      p.mode = *r.positions.mode == "rerope"         ? PositionMode::Rerope
               : *r.positions.mode == "leaky_rerope" ? PositionMode::LeakyRerope
                                                     : PositionMode::Rope;
    if (r.positions.window) p.window = *r.positions.window;
    if (r.positions.leaky_k) p.leaky_k = *r.positions.leaky_k;
    job->positions = p;
  }
  job->memory = r.memory;  // (the memory's settings over the server's --memory flags: the session factory's)
  job->deadline = arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(f.options.timeout_s));
  f.scheduler.submit(job, param);

  const ReplyHeader h{f.new_id(endpoint), f.options.model_id, unix_seconds(), endpoint};
  if (!r.stream) {
    // A client gone before its answer frees its slot within a step or two, as a stream's does.
    const int socket = connection_socket(req);
    std::string text;
    Job::Update u;
    do {
      u = job->next(std::chrono::milliseconds(100));
      text += u.text;
      if (!u.finished && peer_closed(socket)) job->cancel();
    } while (!u.finished);
    if (u.error) throw *u.error;
    res.set_content(json_text(completion_json(h, text, u.finish, u.usage)), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // a proxy in front (nginx) passes each event on as it comes
  const bool include_usage = r.include_usage, chat = endpoint == Endpoint::ChatCompletions;
  auto first = std::make_shared<bool>(true);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, h, include_usage, chat, first](size_t, httplib::DataSink& sink) {
        bool ok = true;
        if (*first && chat) write_event(sink, ok, json_text(chunk_json(h, "", true, std::nullopt, include_usage)));
        const bool opening = *first;
        *first = false;
        const Job::Update u = job->next(std::chrono::milliseconds(100));
        if (!u.text.empty()) write_event(sink, ok, json_text(chunk_json(h, u.text, opening && !chat, std::nullopt, include_usage)));
        if (u.finished) {
          if (u.error) {
            write_event(sink, ok, json_text(u.error->to_json()));
          } else {
            write_event(sink, ok, json_text(chunk_json(h, "", false, u.finish, include_usage)));
            if (include_usage) write_event(sink, ok, json_text(usage_chunk_json(h, u.usage)));
          }
          write_event(sink, ok, "[DONE]");
          if (ok) sink.done();
        } else if (ok && u.text.empty() && !sink.is_writable()) {
          ok = false;
        }
        if (!ok) job->cancel();  // the client is gone: its slot is freed at the next step
        return ok;
      },
      [job, in_flight](bool success) {
        if (!success) job->cancel();
      });
}

std::string metrics_text(Front& f) {
  const SchedulerStats s = f.scheduler.stats();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& value_lines) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << value_lines;
  };
  auto line = [](const std::string& name, int64_t v) { return name + ' ' + std::to_string(v) + '\n'; };
  metric("rotary_requests_total", "counter", "Completion requests that ended, by outcome.",
         line("rotary_requests_total{outcome=\"finished\"}", s.requests_finished) +
             line("rotary_requests_total{outcome=\"failed\"}", s.requests_failed) +
             line("rotary_requests_total{outcome=\"cancelled\"}", s.requests_cancelled));
  std::string errors;
  {
    std::lock_guard<std::mutex> lock(f.mutex);
    for (const auto& [status, n] : f.errors_by_status)
      errors += line("rotary_http_errors_total{status=\"" + std::to_string(status) + "\"}", n);
  }
  metric("rotary_http_errors_total", "counter", "Answers other than 200, by status.", errors);
  metric("rotary_prompt_tokens_total", "counter", "Prompt tokens read.", line("rotary_prompt_tokens_total", s.prompt_tokens));
  metric("rotary_completion_tokens_total", "counter", "Tokens generated.",
         line("rotary_completion_tokens_total", s.completion_tokens));
  metric("rotary_queue_length", "gauge", "Requests waiting for a slot.", line("rotary_queue_length", s.queued));
  metric("rotary_slots_busy", "gauge", "Slots running a request.", line("rotary_slots_busy", s.slots_busy));
  metric("rotary_slots", "gauge", "Slots (--parallel).", line("rotary_slots", s.slots));
  metric("rotary_kv_cache_bytes", "gauge", "Bytes of the busy slots' KV caches (or memories) and scratch.",
         line("rotary_kv_cache_bytes", s.kv_bytes));
  metric("rotary_prefix_cache_bytes", "gauge", "Bytes of cached rows the prefix cache keeps (--prefix-cache-mib).",
         line("rotary_prefix_cache_bytes", s.prefix_cache_bytes));
  metric("rotary_prefix_cache_entries", "gauge", "Sessions the prefix cache keeps.",
         line("rotary_prefix_cache_entries", s.prefix_cache_entries));
  metric("rotary_prefix_cache_hits_total", "counter", "Requests that went on from a prefix the cache held.",
         line("rotary_prefix_cache_hits_total", s.prefix_cache_hits));
  metric("rotary_cached_prompt_tokens_total", "counter", "Prompt tokens not read again: the prefix cache held them.",
         line("rotary_cached_prompt_tokens_total", s.cached_prompt_tokens));
  metric("rotary_resident_memory_bytes", "gauge", "Resident memory of the server process.",
         line("rotary_resident_memory_bytes", resident_bytes()));
  metric("rotary_steps_total", "counter", "Batched forward steps run.", line("rotary_steps_total", s.steps));
  metric("rotary_prompt_layer_steps_total", "counter",
         "Steps that ran a part of a prompt piece beside decoding slots, not its end (--prompt-share).",
         line("rotary_prompt_layer_steps_total", s.prompt_layer_steps));
  return o.str();
}

}  // namespace

int serve(const ServerOptions& options, const ServedModel& model, const PromptSetup& prompts, Scheduler& scheduler,
          const std::atomic<bool>& stop, const std::function<void(int port)>& on_listening) {
  options.validate();
  Front f(options, model, prompts, scheduler);
  httplib::Server svr;
  // cpp-httplib holds a thread per connection, an idle keep-alive one too (up to its keep-alive timeout): one for
  // every slot's stream and every queued request, and 64 more, so idle clients do not starve /health and /metrics.
  const size_t threads = size_t(scheduler.options().slots + scheduler.options().queue_limit + 64);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(10);
  svr.set_payload_max_length(size_t(options.limits.max_body_bytes));
  // SO_REUSEADDR (a restart binds at once) but not httplib's default SO_REUSEPORT, which lets a second server bind
  // the same port and silently take half its connections: a port in use is an error.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    f.count_error(401);
    send_error(res, ApiError(401, "authentication_error", "", "invalid_api_key",
                             "a missing or wrong API key: send the header \"Authorization: Bearer KEY\" with the "
                             "server's --api-key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (no such route, a body past --max-body) as OpenAI errors.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    f.count_error(res.status);
    if (res.status == 413)
      send_error(res, ApiError(413, "invalid_request_error", "", "body_too_large",
                               "the request body is larger than " + std::to_string(options.limits.max_body_bytes) +
                                   " bytes (--max-body)"));
    else if (res.status == 404)
      send_error(res, ApiError(404, "not_found_error", "", "unknown_url",
                               req.method + " " + req.path.substr(0, 200) +
                                   " is not served: allowed POST /v1/chat/completions, POST /v1/completions, GET "
                                   "/v1/models, GET /health, GET /metrics"));
    else
      send_error(res, ApiError(res.status, "invalid_request_error", "", "http_error",
                               "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path.substr(0, 200)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  auto endpoint = [&](Endpoint e) {
    return [&f, e](const httplib::Request& req, httplib::Response& res) {
      try {
        complete(f, req, res, e);
      } catch (const ApiError& err) {
        f.count_error(err.status);
        send_error(res, err);
      } catch (const std::exception& err) {
        f.count_error(500);
        send_error(res, ApiError(500, "server_error", "", "internal_error", err.what()));
      }
    };
  };
  svr.Post("/v1/chat/completions", endpoint(Endpoint::ChatCompletions));
  svr.Post("/v1/completions", endpoint(Endpoint::Completions));
  auto model_json = [&] {
    return nlohmann::ordered_json{{"id", options.model_id}, {"object", "model"}, {"created", f.started},
                                  {"owned_by", "rotary"}};
  };
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text(nlohmann::ordered_json{{"object", "list"}, {"data", {model_json()}}}), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", [&](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != options.model_id) {
      f.count_error(404);
      send_error(res, ApiError(404, "invalid_request_error", "model", "model_not_found",
                               "model \"" + std::string(req.matches[1]).substr(0, 200) + "\": this server serves \"" +
                                   options.model_id + "\" only"));
      return;
    }
    res.set_content(json_text(model_json()), "application/json");
  });
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const SchedulerStats s = scheduler.stats();
    const bool draining = f.draining;
    res.status = draining ? 503 : 200;
    res.set_content(nlohmann::ordered_json{{"status", draining ? "draining" : "ok"},
                                           {"slots", s.slots},
                                           {"slots_busy", s.slots_busy},
                                           {"queued", s.queued}}
                        .dump(),
                    "application/json");
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(f), "text/plain; version=0.0.4");
  });

  int port = options.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options.host);
  } else if (!svr.bind_to_port(options.host, port)) {
    port = -1;
  }
  check(port > 0, "--host / --port", options.host + ":" + std::to_string(options.port),
        "an address this machine can listen on (is the port in use? is the host one of this machine's addresses?)");
  std::thread listener([&] { svr.listen_after_bind(); });
  if (on_listening) on_listening(port);
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Drain: refuse new work, let the running requests finish (or fail them cleanly at the deadline), then let their
  // replies finish writing before the listener closes.
  f.draining = true;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.drain_s));
  scheduler.drain(deadline);
  const Clock::time_point written = Clock::now() + std::chrono::seconds(5);
  while (f.in_flight > 0 && Clock::now() < written) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  svr.stop();
  listener.join();
  return 0;
}

}  // namespace rotary::server
