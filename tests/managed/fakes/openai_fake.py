"""A minimal OpenAI-compatible server for the fake vllm / sglang / trtllm-serve executables.

Each fake parses its command line like the real program (exactly the flags it
knows; anything else exits 2 with a message), records what it was started with,
then serves /health, /v1/models, /v1/chat/completions (streamed or not),
/v1/embeddings, /v1/rerank, /v1/audio/transcriptions and /translations, and /v1/files (upload,
list, delete) on the host and port it was given.

Knobs, all from the environment (the model definition's ``*_env``):

- ``FAKE_RECORD``: a file to append one JSON line to at start: argv, pid, the
  ``FAKE_*`` variables, LD_LIBRARY_PATH and (trtllm) the parsed YAML;
- ``FAKE_REQUEST_LOG``: a file to append every chat request body to;
- ``FAKE_READY_AFTER``: seconds /health answers 503 first (a loading model);
- ``FAKE_READY_LINE``: a line to print when /health turns 200 (llama-server's "model loaded");
- ``FAKE_HEALTH_LOG``: a file to append one JSON line to per /health request: when it came
  (``time.monotonic()``, the same clock in every process), the status answered and ``ready_at``;
- ``FAKE_EXIT_AT_START``: print a fatal line and exit with this code before serving;
- ``FAKE_TOKEN_DELAY_MS``: delay before each streamed token (a non-streamed answer waits for all of them);
- ``FAKE_DROP_REQUESTS``: close the connection of this many first chat requests without answering;
- ``FAKE_IGNORE_SIGTERM``: ignore SIGTERM (a server that hangs on shutdown);
- ``FAKE_CHILD``: start a worker process in the same process group (it outlives
  the leader unless someone kills the group);
- ``FAKE_CONTROL_LOG``: a file to append every sleep-mode call to (method, path, query), and
  every call of a fake's own ``post_routes`` (theirs to log: vLLM's runtime LoRA routes).

A fake's settings may add POST routes (``settings["post_routes"]``: path -> ``handler(request
handler, body)``), and name the LoRA adapters it serves as models (``settings["adapters"]``; the
set ``state["adapters"]``, which such a route may change).

Sleep mode (vLLM's, ``settings["sleep_mode"]``: ``--enable-sleep-mode``): with
``VLLM_SERVER_DEV_MODE=1`` in the environment too, ``POST /sleep?level=1|2`` (``mode`` too),
``POST /wake_up`` (``tags`` repeated, optional) and ``GET /is_sleeping`` (``{"is_sleeping": b}``)
are served as vLLM's dev endpoints are; any other query parameter or method is refused (400,
405), and without both they are 404 as in vLLM.  A sleeping fake answers chat completions 503.

The reply to a chat is ``echo: <last user text>``, word by word; a json_schema
``response_format`` gets ``{"echo": "<text>"}``.  The user texts
``__error_400__`` / ``__error_500__`` / ``__context__`` get those errors.

Tools (``_tool_calls``): a chat that offers tools, with a tool_choice other than "none", to a
server started for them (``settings["tools"]``; any other answers with text) is answered with a call of the named function,
else of the first tool, with the arguments ``{"text": <last user text>}``; the user text
``__parallel__ ...`` calls every tool (one unless parallel_tool_calls is false).  Streamed, each
call is a header fragment (index, id, name) and its arguments in 8-character fragments, the
calls' fragments interleaved.  A conversation that ends with a tool result is answered
``result <tool_call_id>: <its content>``.  Earlier calls and results must have the chat shape
(a 400 otherwise, as a strict server answers).
"""
from __future__ import annotations

import email.parser
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class UsageError(Exception):
    """A command line the real program would refuse."""


def parse_flags(args: list[str], valued: set[str], switches: set[str], *, dashes: bool) -> tuple[dict, list[str]]:
    """``--flag value`` / ``--flag=value`` / ``--switch`` and positionals; unknown flags raise UsageError.

    ``dashes``: underscores in a long flag read as dashes (vLLM's parser does this).
    """
    options: dict[str, str | bool] = {}
    positionals: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("-"):
            positionals.append(arg)
            continue
        name, has_value, value = arg.partition("=")
        if dashes and name.startswith("--"):
            name = name.replace("_", "-")
        if name in switches and not has_value:
            options[name] = True
        elif name in valued:
            if not has_value:
                if index >= len(args):
                    raise UsageError(f"argument {name}: expected one argument")
                value = args[index]
                index += 1
            options[name] = value
        else:
            raise UsageError(f"unrecognized arguments: {arg}")
    return options, positionals


def require_int(options: dict, name: str, minimum: int | None = None) -> None:
    if name in options:
        try:
            value = int(options[name])
        except ValueError:
            raise UsageError(f"argument {name}: invalid int value: {options[name]!r}") from None
        if minimum is not None and value < minimum:
            raise UsageError(f"argument {name}: must be at least {minimum}")


def require_float(options: dict, name: str) -> None:
    if name in options:
        try:
            float(options[name])
        except ValueError:
            raise UsageError(f"argument {name}: invalid float value: {options[name]!r}") from None


def require_choice(options: dict, name: str, choices) -> None:
    if name in options and options[name] not in choices:
        raise UsageError(f"argument {name}: invalid choice: {options[name]!r} (choose from {', '.join(choices)})")


def require_json(options: dict, name: str, keys: set[str]) -> dict | None:
    if name not in options:
        return None
    try:
        value = json.loads(options[name])
    except ValueError:
        raise UsageError(f"argument {name}: invalid JSON: {options[name]!r}") from None
    if not isinstance(value, dict) or not set(value) <= keys:
        raise UsageError(f"argument {name}: unknown keys {sorted(set(value) - keys)}")
    return value


def record_start(program: str, argv: list[str], **extra) -> None:
    path = os.environ.get("FAKE_RECORD")
    if not path:
        return
    entry = {
        "program": program,
        "argv": argv,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
        "fake_env": {key: value for key, value in os.environ.items() if key.startswith("FAKE_")},
        **extra,
    }
    with open(path, "a", encoding="utf-8") as target:
        target.write(json.dumps(entry) + "\n")


def run(program: str, parse) -> int:
    """Parse the command line with ``parse(argv) -> (settings, record extras)`` and serve."""
    argv = sys.argv[1:]
    try:
        settings, extras = parse(argv)
    except UsageError as exc:
        print(f"{program}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    extras = dict(extras)
    if os.environ.get("FAKE_CHILD"):
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        extras["child_pid"] = worker.pid
    record_start(program, argv, **extras)
    print(f"INFO fake {program} starting {settings['model']} on {settings['host']}:{settings['port']}", flush=True)
    exit_code = os.environ.get("FAKE_EXIT_AT_START")
    if exit_code:
        print(f"FATAL fake {program}: cannot load {settings['model']} (FAKE_EXIT_AT_START)", flush=True)
        return int(exit_code)
    if os.environ.get("FAKE_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _shutdown)
    serve(settings)
    return 0


def _shutdown(signum, frame):
    print("INFO shutting down on SIGTERM", flush=True)
    raise SystemExit(0)


def log_control(entry: dict) -> None:
    """Append a control call to ``FAKE_CONTROL_LOG``, where it is set."""
    log = os.environ.get("FAKE_CONTROL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as target:
            target.write(json.dumps(entry) + "\n")


# ---- the HTTP side ---------------------------------------------------------------------------


def serve(settings: dict) -> None:
    state = {
        "settings": settings,
        "ready_at": time.monotonic() + float(os.environ.get("FAKE_READY_AFTER", "0")),
        "token_delay": float(os.environ.get("FAKE_TOKEN_DELAY_MS", "0")) / 1000,
        "files": {},
        "drop": int(os.environ.get("FAKE_DROP_REQUESTS", "0")),
        "lock": threading.Lock(),
        # vLLM registers its sleep endpoints only with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1.
        "sleep_endpoints": bool(settings.get("sleep_mode")) and os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
        "sleeping": False,
        "adapters": set(settings.get("adapters", ())),
    }
    handler = type("Handler", (_Handler,), {"state": state})
    ready_line = os.environ.get("FAKE_READY_LINE")
    if ready_line:
        delay = max(0.0, state["ready_at"] - time.monotonic())
        announce = threading.Timer(delay, lambda: print(ready_line, flush=True))
        announce.daemon = True
        announce.start()
    server = ThreadingHTTPServer((settings["host"], int(settings["port"])), handler)
    server.daemon_threads = True
    print(f"INFO listening on {settings['host']}:{settings['port']}", flush=True)
    server.serve_forever()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: dict

    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        if self.path != "/health":  # llama-server leaves its health checks out of its log too
            print("HTTP " + format % args, flush=True)

    # -- helpers --
    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _authorized(self) -> bool:
        key = self.state["settings"].get("api_key")
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._error(401, "invalid API key", "AuthenticationError")
            return False
        return True

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    # -- sleep mode (vLLM's dev endpoints) --
    SLEEP_ROUTES = {"/sleep": "POST", "/wake_up": "POST", "/is_sleeping": "GET"}
    SLEEP_QUERY = {"/sleep": {"level", "mode"}, "/wake_up": {"tags"}, "/is_sleeping": set()}

    def _sleep_route(self, method: str) -> bool:
        """Serve a sleep-mode call; False when the path is none of them (or they are not served)."""
        url = urlsplit(self.path)
        if url.path not in self.SLEEP_ROUTES or not self.state["sleep_endpoints"]:
            return False
        query = parse_qs(url.query, keep_blank_values=True)
        log_control({"method": method, "path": url.path, "query": query})
        if method != self.SLEEP_ROUTES[url.path]:
            self._error(405, "Method Not Allowed", "MethodNotAllowed")
        elif set(query) - self.SLEEP_QUERY[url.path]:
            self._error(400, f"unexpected query parameters {sorted(set(query) - self.SLEEP_QUERY[url.path])}")
        elif url.path == "/is_sleeping":
            self._json(200, {"is_sleeping": self.state["sleeping"]})
        elif url.path == "/sleep" and query.get("level", ["1"]) not in (["1"], ["2"]):
            self._error(400, f"invalid sleep level {query['level']}")
        else:
            self.state["sleeping"] = url.path == "/sleep"
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        return True

    # -- routes --
    def do_GET(self):  # noqa: N802
        if self._sleep_route("GET"):
            return
        if self.path == "/health":
            now = time.monotonic()
            ready = now >= self.state["ready_at"]
            log = os.environ.get("FAKE_HEALTH_LOG")
            if log:
                with open(log, "a", encoding="utf-8") as target:
                    target.write(json.dumps({"at": now, "status": 200 if ready else 503,
                                             "ready_at": self.state["ready_at"]}) + "\n")
            if ready:
                self._json(200, {"status": "ok"})
            else:
                self._error(503, "Loading model", "unavailable_error")
        elif self.path == "/v1/models" and self._authorized():
            self._json(200, {"object": "list", "data": [{"id": self.state["settings"]["model"], "object": "model"}]})
        elif self.path == "/v1/files" and self._authorized():
            with self.state["lock"]:
                files = list(self.state["files"].items())
            stored = [{"id": key, "object": "file", "bytes": len(data)} for key, data in files]
            self._json(200, {"object": "list", "data": stored})
        elif not self.path.startswith(("/v1/models", "/v1/files")):
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_DELETE(self):  # noqa: N802
        if not self._authorized():
            return
        file_id = self.path.rsplit("/", 1)[-1]
        with self.state["lock"]:
            found = self.state["files"].pop(file_id, None) is not None
        self._json(200 if found else 404, {"id": file_id, "object": "file", "deleted": found})

    def do_POST(self):  # noqa: N802
        body = self._body()
        if not self._authorized() or self._sleep_route("POST"):
            return
        route = self.state["settings"].get("post_routes", {}).get(self.path)
        if route is not None:
            route(self, body)
            return
        if self.path == "/v1/files":
            self._upload(body)
        elif self.path == "/v1/chat/completions":
            if self.state["sleeping"]:
                self._error(503, "The model is sleeping; wake it up first", "ServiceUnavailableError")
                return
            if self.state["settings"].get("runner") == "pooling":
                self._error(400, "The model does not support Chat Completions API")
                return
            self._chat(json.loads(body))
        elif self.path == "/v1/embeddings":
            self._embeddings(json.loads(body))
        elif self.path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            self._transcription(body)
        elif self.path == "/v1/rerank":
            self._rerank(json.loads(body))
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def _embeddings(self, request: dict) -> None:
        """Input ``i`` (a string, or a token array as its ids joined by spaces) gets the vector
        ``[len(text), i, 0.5, 0.5, ...]`` of ``dimensions`` values (default 4); its tokens are its
        words (or ids).  Only a server started with ``--runner pooling`` (vLLM) or any other
        program serves it; ``__error_400__`` as an input gets a 400."""
        log = os.environ.get("FAKE_REQUEST_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as target:
                target.write(json.dumps(request) + "\n")
        if self.state["settings"].get("runner") not in (None, "pooling"):
            self._error(400, "The model does not support Embeddings API")
            return
        if request.get("model") != self.state["settings"]["model"]:
            self._error(404, f"The model `{request.get('model')}` does not exist.", "NotFoundError")
            return
        if request.get("encoding_format", "float") != "float":
            self._error(400, "this fake answers floats only")
            return
        given = request["input"]
        inputs = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else given
        if "__error_400__" in inputs:
            self._error(400, "input refused (__error_400__)")
            return
        texts = [item if isinstance(item, str) else " ".join(str(token) for token in item) for item in inputs]
        size = request.get("dimensions") or 4
        data = [
            {"object": "embedding", "index": index, "embedding": [float(len(text)), float(index)] + [0.5] * (size - 2)}
            for index, text in enumerate(texts)
        ]
        tokens = sum(len(text.split()) for text in texts)
        self._json(200, {"object": "list", "data": data, "model": request["model"],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _rerank(self, request: dict) -> None:
        """vLLM's rerank answer: document ``i`` scores how many of its words are words of the query,
        the results sorted (highest first) and cut to ``top_n``; the usage's tokens are the words of
        the query with each document, reported as ``total_tokens`` only.  Only a server started with
        ``--runner pooling`` serves it; ``__error_400__`` as the query gets a 400.  The request is
        logged as an embeddings request is."""
        log = os.environ.get("FAKE_REQUEST_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as target:
                target.write(json.dumps(request) + "\n")
        if self.state["settings"].get("runner") != "pooling":
            self._error(400, "The model does not support Rerank (Score) API")
            return
        if request.get("model") != self.state["settings"]["model"]:
            self._error(404, f"The model `{request.get('model')}` does not exist.", "NotFoundError")
            return
        if request["query"] == "__error_400__":
            self._error(400, "query refused (__error_400__)")
            return
        words = set(request["query"].split())
        results = sorted(
            ({"index": index, "document": {"text": text}, "relevance_score": float(len(words & set(text.split())))}
             for index, text in enumerate(request["documents"])),
            key=lambda item: -item["relevance_score"],
        )[: request.get("top_n") or len(request["documents"])]
        tokens = sum(len(request["query"].split()) + len(text.split()) for text in request["documents"])
        self._json(200, {"id": "rerank-fake", "model": request["model"], "results": results,
                         "usage": {"total_tokens": tokens}})

    def _upload(self, body: bytes) -> None:
        header = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser().parsebytes(header + body)
        fields = {part.get_param("name", header="content-disposition"): part for part in message.get_payload()}
        upload = fields["file"]
        with self.state["lock"]:
            file_id = f"file-{len(self.state['files']) + 1}"
            self.state["files"][file_id] = upload.get_payload(decode=True)
        self._json(200, {"id": file_id, "object": "file", "filename": upload.get_filename(), "purpose": "user_data"})

    def _transcription(self, body: bytes) -> None:
        """OpenAI's audio form: the fields logged (``FAKE_REQUEST_LOG``: path, fields, the file's name and
        size); the answer (verbose_json only) is ``heard <size> bytes`` in two segments, with words
        when ``timestamp_granularities[]`` asks for them; a file that is ``__error_400__`` gets a 400."""
        header = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser().parsebytes(header + body)
        fields: dict[str, list[str]] = {}
        upload = None
        for part in message.get_payload():
            name = part.get_param("name", header="content-disposition")
            if name == "file":
                upload = part
            else:
                fields.setdefault(name, []).append(part.get_payload(decode=True).decode())
        data = upload.get_payload(decode=True)
        log = os.environ.get("FAKE_REQUEST_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as target:
                target.write(json.dumps({"path": self.path, "fields": fields, "filename": upload.get_filename(),
                                         "size": len(data)}) + "\n")
        if fields.get("model") != [self.state["settings"]["model"]]:
            self._error(404, f"The model `{fields.get('model')}` does not exist.", "NotFoundError")
            return
        if data == b"__error_400__" or fields.get("response_format") != ["verbose_json"]:
            self._error(400, "Invalid or unsupported audio file")
            return
        answer = {"task": "translate" if self.path.endswith("translations") else "transcribe", "language": "en",
                  "duration": 2.5, "text": f"heard {len(data)} bytes",
                  "segments": [{"id": 0, "seek": 0, "start": 0.0, "end": 1.0, "text": " heard", "tokens": [1, 2]},
                               {"id": 1, "seek": 0, "start": 1.0, "end": 2.5, "text": f" {len(data)} bytes",
                                "tokens": [3]}]}
        if "word" in fields.get("timestamp_granularities[]", []):
            answer["words"] = [{"word": "heard", "start": 0.0, "end": 1.0},
                               {"word": str(len(data)), "start": 1.0, "end": 2.0},
                               {"word": "bytes", "start": 2.0, "end": 2.5}]
        self._json(200, answer)

    def _chat(self, request: dict) -> None:
        log = os.environ.get("FAKE_REQUEST_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as target:
                target.write(json.dumps(request) + "\n")
        with self.state["lock"]:
            drop, self.state["drop"] = self.state["drop"] > 0, max(0, self.state["drop"] - 1)
        if drop:
            self.close_connection = True
            return
        with self.state["lock"]:
            served = (self.state["settings"]["model"], *self.state["adapters"])
        if request.get("model") not in served:
            self._error(404, f"The model `{request.get('model')}` does not exist.", "NotFoundError")
            return
        try:
            calls = self._tool_calls(request)
        except UsageError as refusal:
            self._error(400, str(refusal))
            return
        text = self._last_user_text(request["messages"])
        if text in ("__error_400__", "__context__", "__error_500__"):
            status = 500 if text == "__error_500__" else 400
            message = {
                "__error_400__": "bad request for the fake",
                "__context__": "This model's maximum context length is 16 tokens",
                "__error_500__": "the fake broke",
            }[text]
            self._error(status, message, "InternalServerError" if status == 500 else "BadRequestError")
            return
        if calls:
            self._answer_calls(request, calls)
            return
        reply = f"echo: {text}"
        last = request["messages"][-1]
        if last["role"] == "tool":
            reply = f"result {last['tool_call_id']}: {_text(last['content'])}"
        elif (request.get("response_format") or {}).get("type") == "json_schema":
            reply = json.dumps({"echo": text})
        words = reply.split(" ")
        tokens = [word if index == 0 else " " + word for index, word in enumerate(words)]
        limit = request.get("max_tokens") or len(tokens)
        finish = "length" if len(tokens) > limit else "stop"
        tokens = tokens[:limit]
        usage = {
            "prompt_tokens": sum(len(_text(m["content"]).split()) for m in request["messages"]),
            "completion_tokens": len(tokens),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if request.get("stream"):
            include_usage = (request.get("stream_options") or {}).get("include_usage")
            deltas = [{"content": token} for token in tokens]
            self._stream(request["model"], deltas, finish, usage if include_usage else None)
        else:
            if self.state["token_delay"]:  # the same compute time as a streamed answer, all before the answer
                time.sleep(self.state["token_delay"] * len(tokens))
            message = {"role": "assistant", "content": "".join(tokens)}
            self._json(200, {
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": request["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage,
            })

    def _tool_calls(self, request: dict) -> list[dict]:
        """The calls this chat is answered with ({"id", "name", "arguments"}), or []; raise
        UsageError for what the server refuses (400)."""
        _check_tool_turns(request["messages"])
        tools = [tool["function"] for tool in request.get("tools") or () if tool.get("type") == "function"]
        choice = request.get("tool_choice", "auto" if tools else "none")
        mode = self.state["settings"].get("tools")
        if not tools or choice == "none" or request["messages"][-1]["role"] == "tool" or mode is None:
            return []
        text = self._last_user_text(request["messages"])
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            if name not in [tool["name"] for tool in tools]:
                raise UsageError(f"Tool '{name}' has not been passed in `tools`.")
            chosen = [tool for tool in tools if tool["name"] == name]
        elif text.startswith("__parallel__") and request.get("parallel_tool_calls") is not False:
            chosen = tools
        else:
            chosen = tools[:1]
        arguments = json.dumps({"text": text})
        return [{"id": f"call_fake_{index}", "name": tool["name"], "arguments": arguments}
                for index, tool in enumerate(chosen)]

    def _answer_calls(self, request: dict, calls: list[dict]) -> None:
        pieces = [[call["arguments"][at: at + 8] for at in range(0, len(call["arguments"]), 8)] for call in calls]
        usage = {"prompt_tokens": sum(len(_text(m["content"]).split()) for m in request["messages"]),
                 "completion_tokens": sum(len(parts) + 1 for parts in pieces)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if not request.get("stream"):
            tool_calls = [
                {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
                for call in calls
            ]
            message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            self._json(200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                             "model": request["model"], "choices": [choice], "usage": usage})
            return
        deltas = [
            {"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                             "function": {"name": call["name"], "arguments": ""}}]}
            for index, call in enumerate(calls)
        ]
        for step in range(max(len(parts) for parts in pieces)):
            for index, parts in enumerate(pieces):
                if step < len(parts):
                    deltas.append({"tool_calls": [{"index": index, "function": {"arguments": parts[step]}}]})
        include_usage = (request.get("stream_options") or {}).get("include_usage")
        self._stream(request["model"], deltas, "tool_calls", usage if include_usage else None)

    def _last_user_text(self, messages: list[dict]) -> str:
        for message in reversed(messages):
            if message["role"] == "user":
                return self._describe(message["content"])
        return ""

    def _describe(self, content) -> str:
        if isinstance(content, str):
            return content
        pieces = []
        for part in content:
            if part["type"] == "text":
                pieces.append(part["text"])
            elif part["type"] == "file":
                file = part["file"]
                if "file_id" in file:
                    with self.state["lock"]:
                        size = len(self.state["files"].get(file["file_id"], b""))
                    pieces.append(f"[{file['file_id']} {size} bytes]")
                else:
                    pieces.append(f"[inline {file.get('filename', 'file')}]")
            else:
                pieces.append(f"[{part['type']}]")
        return " ".join(pieces)

    def _stream(self, model: str, deltas: list[dict], finish: str, usage: dict | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(payload) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        created = int(time.time())

        def chunk(delta: dict, finish_reason=None) -> dict:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [choice]}

        event(chunk({"role": "assistant", "content": ""}))
        for delta in deltas:
            if self.state["token_delay"]:
                time.sleep(self.state["token_delay"])
            event(chunk(delta))
        event(chunk({}, finish))
        if usage is not None:
            event({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": usage})
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _check_tool_turns(messages: list[dict]) -> None:
    """Refuse earlier calls and results that are not in the chat shape (UsageError)."""
    called = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if call.get("type") != "function" or not call.get("id") or not isinstance(function.get("arguments"), str):
                raise UsageError(f"a tool call must be {{id, type: function, function: {{name, arguments}}}}: {call}")
            called.add(call["id"])
        if message["role"] == "tool" and message.get("tool_call_id") not in called:
            raise UsageError(f"tool message answers no earlier call: {message.get('tool_call_id')!r}")


def _text(content) -> str:
    if isinstance(content, str) or content is None:  # an assistant's tool calls have no content
        return content or ""
    return " ".join(part.get("text", "") for part in content if part.get("type") == "text")
