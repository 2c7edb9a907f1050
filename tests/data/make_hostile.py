"""Build the hostile-input corpus: tests/data/hostile.jsonl and tests/data/hostile.expected.jsonl.

    .venv/bin/python tests/data/make_hostile.py          # rewrite both files
    .venv/bin/python tests/data/make_hostile.py --check  # exit 1 if they are out of date

The corpus mixes valid requests with bad lines of many kinds (broken JSON, wrong types, absurd
values, hostile ids, ...). Every non-blank line of hostile.jsonl has one line in
hostile.expected.jsonl saying what batchrun must make of it:

- ``{"line", "kind", "valid": true, "custom_id", "answer"}``: the request runs; the echo engine's
  answer is ``answer``;
- ``{"line", "kind", "valid": false, "code", "message", "custom_id"}``: one error record for that
  line, with that code and a message containing ``message``.

Cases too big to commit (a 50 MB line, 200,000 levels of nesting) are built by
tests/test_hostile_input.py at test time. tests/test_hostile_input.py checks that the committed
files are what this script writes, so edit the cases here and run it again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "hostile.jsonl"
EXPECTED = HERE / "hostile.expected.jsonl"

CHAT = "/v1/chat/completions"
BOM = b"\xef\xbb\xbf"


def req(cid: Any, text: str = "hello", **body: Any) -> dict[str, Any]:
    """A chat request line (as a dict) whose echo answer is `text`."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": text}], **body},
    }


def enc(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def with_body(cid: str, body: Any) -> bytes:
    return enc({"custom_id": cid, "method": "POST", "url": CHAT, "body": body})


# Each case: (kind, raw line bytes without the newline, expectation).
# Expectation: ("ok", custom_id, answer) or ("bad", code, message substring, custom_id or None).
Case = tuple[str, bytes, tuple[Any, ...]]


def cases() -> list[Case]:
    """Every line of the corpus, in order (blank lines are added around them in `build`)."""
    long_id = "x" * 10_240
    ok = "ok"
    bad = "bad"
    c: list[Case] = [
        # -- line 1 carries a UTF-8 BOM: fine ------------------------------------------------
        ("valid after a BOM", BOM + enc(req("v-bom", "first line")), (ok, "v-bom", "first line")),
        # -- broken JSON ---------------------------------------------------------------------
        (
            "truncated JSON",
            enc(req("t-cut", "never finished"))[:45],
            (bad, "invalid_json", "cut off?", None),
        ),
        ("plain text", b"hello, this is not JSON", (bad, "invalid_json", "not valid JSON", None)),
        (
            "single quotes",
            b"{'custom_id': 'sq', 'method': 'POST'}",
            (bad, "invalid_json", "Expecting property name", None),
        ),
        (
            "trailing comma",
            b'{"custom_id": "tc", "method": "POST",}',
            (bad, "invalid_json", "not valid JSON", None),
        ),
        (
            "garbage after the object",
            enc(req("extra")) + b" trailing words",
            (bad, "invalid_json", "Extra data", None),
        ),
        (
            "two objects on one line",
            enc(req("two-a")) + enc(req("two-b")),
            (bad, "invalid_json", "Extra data", None),
        ),
        (
            "lone CR joining two requests",
            enc(req("cr-a")) + b"\r" + enc(req("cr-b")),
            (bad, "invalid_json", "Extra data", None),
        ),
        (
            "NaN",
            b'{"custom_id": "nan", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"messages": [{"role": "user", "content": "x"}], "temperature": NaN}}',
            (bad, "invalid_json", "NaN is not a valid JSON number", "nan"),
        ),
        (
            "Infinity",
            b'{"custom_id": "inf", "body": {"max_tokens": -Infinity}}',
            (bad, "invalid_json", "Infinity is not a valid JSON number", "inf"),
        ),
        (
            "non-UTF-8 bytes (Latin-1)",
            b'{"custom_id": "caf\xe9", "method": "POST"}',
            (bad, "invalid_json", "not valid UTF-8 (byte 0xe9", None),
        ),
        (
            "UTF-16 text",
            '{"custom_id": "u16"}'.encode("utf-16-le"),
            (bad, "invalid_json", "not valid", None),
        ),
        (
            "UTF-8-encoded surrogate",
            b'{"custom_id": "sur\xed\xa0\x80"}',
            (bad, "invalid_json", "not valid UTF-8", None),
        ),
        (
            "raw control character in a string",
            b'{"custom_id": "ctl\x01", "method": "POST"}',
            (bad, "invalid_json", "Invalid control character", None),
        ),
        (
            "NUL bytes",
            b"\x00\x00\x00\x00",
            (bad, "invalid_json", "not valid JSON", None),
        ),
        (
            "BOM in the middle of the file",
            BOM + enc(req("bom-mid")),
            (bad, "invalid_json", "not valid JSON", None),
        ),
        (
            "nested 3,000 levels deep",
            b'{"custom_id": "deep", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
            (bad, "invalid_json", "nested too deeply", None),
        ),
        (
            "integer of 5,000 digits",
            b'{"custom_id": "bigint", "seed": ' + b"9" * 5000 + b"}",
            (bad, "invalid_json", "not valid JSON", None),
        ),
        # -- a line that is JSON but not a request object -----------------------------------
        ("JSON array", b'[{"custom_id": "arr"}]', (bad, "invalid_request", "JSON array", None)),
        ("JSON string", b'"just a string"', (bad, "invalid_request", "JSON string", None)),
        ("JSON number", b"42", (bad, "invalid_request", "JSON number", None)),
        ("JSON null", b"null", (bad, "invalid_request", "JSON null", None)),
        ("empty object", b"{}", (bad, "missing_custom_id", "custom_id is missing", None)),
        # a valid line in between
        ("valid", enc(req("v-1", "plain question")), (ok, "v-1", "plain question")),
        # -- custom_id -------------------------------------------------------------------------
        (
            "custom_id missing",
            enc({k: v for k, v in req("gone").items() if k != "custom_id"}),
            (bad, "missing_custom_id", "custom_id is missing", None),
        ),
        (
            "custom_id a number",
            enc(req(12345)),
            (bad, "invalid_custom_id", "custom_id must be a string, got a number 12345", None),
        ),
        (
            "custom_id null",
            enc(req(None)),
            (bad, "invalid_custom_id", "custom_id must be a string, got null", None),
        ),
        (
            "custom_id an object",
            enc(req({"id": 1})),
            (bad, "invalid_custom_id", "custom_id must be a string", None),
        ),
        ("custom_id empty", enc(req("")), (bad, "invalid_custom_id", "must not be empty", None)),
        (
            "custom_id of 10 KB",
            enc(req(long_id)),
            (
                bad,
                "invalid_custom_id",
                "custom_id is 10240 characters long, the limit is 512",
                None,
            ),
        ),
        (
            "duplicate custom_id",
            enc(req("v-1", "second copy")),
            (bad, "duplicate_custom_id", "already appeared on line", "v-1"),
        ),
        # -- method, url -----------------------------------------------------------------------
        (
            "method GET",
            enc({**req("get"), "method": "GET"}),
            (bad, "invalid_method", "method must be \"POST\", got 'GET'", "get"),
        ),
        (
            "method missing",
            enc({k: v for k, v in req("nometh").items() if k != "method"}),
            (bad, "invalid_method", "method is missing", "nometh"),
        ),
        (
            "unknown url",
            enc({**req("emb"), "url": "/v2/chat/completions"}),
            (bad, "invalid_url", "url must be one of", "emb"),
        ),
        (
            "url with a path traversal",
            enc({**req("urltrav"), "url": "/v1/../../etc/passwd"}),
            (bad, "invalid_url", "url must be one of", "urltrav"),
        ),
        (
            "url different from the file's",
            enc(
                {
                    "custom_id": "mixed",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"prompt": "x"},
                }
            ),
            (bad, "mixed_urls", "every line of a batch must use the same url", "mixed"),
        ),
        # -- body ------------------------------------------------------------------------------
        (
            "body missing",
            enc({k: v for k, v in req("nobody").items() if k != "body"}),
            (bad, "invalid_body", "body is missing", "nobody"),
        ),
        (
            "body a string",
            with_body("strbody", "messages: hi"),
            (bad, "invalid_body", "body must be a JSON object, got a string", "strbody"),
        ),
        (
            "messages missing (a completions body on the chat url)",
            with_body("prompt-on-chat", {"prompt": "hi"}),
            (bad, "invalid_request", "body.messages is missing", "prompt-on-chat"),
        ),
        (
            "empty messages",
            with_body("nomsg", {"messages": []}),
            (bad, "invalid_request", "body.messages must not be empty", "nomsg"),
        ),
        (
            "messages a string",
            with_body("msgstr", {"messages": "hello"}),
            (bad, "invalid_request", "body.messages must be an array", "msgstr"),
        ),
        (
            "message not an object",
            with_body("msgitem", {"messages": ["hello"]}),
            (bad, "invalid_request", "body.messages[0] must be an object", "msgitem"),
        ),
        (
            "a role that does not exist",
            with_body("wizard", {"messages": [{"role": "wizard", "content": "abracadabra"}]}),
            (bad, "invalid_request", "role must be one of", "wizard"),
        ),
        (
            "role missing",
            with_body("norole", {"messages": [{"content": "hi"}]}),
            (bad, "invalid_request", "role must be one of", "norole"),
        ),
        (
            "content a number",
            with_body("num-content", {"messages": [{"role": "user", "content": 42}]}),
            (bad, "invalid_request", "content must be a string or an array", "num-content"),
        ),
        (
            "content an empty array",
            with_body("empty-parts", {"messages": [{"role": "user", "content": []}]}),
            (bad, "invalid_request", "must not be an empty array", "empty-parts"),
        ),
        (
            "content part without a type",
            with_body("notype", {"messages": [{"role": "user", "content": [{"text": "x"}]}]}),
            (bad, "invalid_request", "type must be a string", "notype"),
        ),
        (
            "model a number",
            enc(req("model-num", model=7)),
            (bad, "invalid_request", "body.model must be a string", "model-num"),
        ),
        # -- sampling fields -------------------------------------------------------------------
        (
            "negative max_tokens",
            enc(req("mt-neg", max_tokens=-5)),
            (bad, "invalid_request", "body.max_tokens must be between 1 and", "mt-neg"),
        ),
        (
            "zero max_tokens",
            enc(req("mt-zero", max_tokens=0)),
            (bad, "invalid_request", "body.max_tokens must be between 1 and", "mt-zero"),
        ),
        (
            "absurd max_tokens",
            enc(req("mt-huge", max_tokens=10**15)),
            (bad, "invalid_request", "body.max_tokens must be between 1 and", "mt-huge"),
        ),
        (
            "max_tokens a string",
            enc(req("mt-str", max_tokens="100")),
            (bad, "invalid_request", "body.max_tokens must be a whole number", "mt-str"),
        ),
        (
            "max_tokens a fraction",
            enc(req("mt-frac", max_tokens=10.5)),
            (bad, "invalid_request", "body.max_tokens must be a whole number", "mt-frac"),
        ),
        (
            "max_tokens a boolean",
            enc(req("mt-bool", max_tokens=True)),
            (bad, "invalid_request", "body.max_tokens must be a whole number", "mt-bool"),
        ),
        (
            "max_completion_tokens negative",
            enc(req("mct-neg", max_completion_tokens=-1)),
            (bad, "invalid_request", "body.max_completion_tokens must be between", "mct-neg"),
        ),
        (
            "n of 10,000",
            enc(req("n-huge", n=10_000)),
            (bad, "invalid_request", "body.n must be between 1 and 128", "n-huge"),
        ),
        (
            "temperature out of range",
            enc(req("temp", temperature=5)),
            (bad, "invalid_request", "body.temperature must be at least 0 and at most 2", "temp"),
        ),
        (
            "temperature a string",
            enc(req("temp-str", temperature="hot")),
            (bad, "invalid_request", "body.temperature must be a number", "temp-str"),
        ),
        (
            "top_p zero",
            enc(req("topp", top_p=0)),
            (bad, "invalid_request", "body.top_p must be greater than 0", "topp"),
        ),
        (
            "presence_penalty out of range",
            enc(req("pp", presence_penalty=3)),
            (bad, "invalid_request", "body.presence_penalty must be", "pp"),
        ),
        (
            "seed a string",
            enc(req("seed-str", seed="42")),
            (bad, "invalid_request", "body.seed must be a whole number", "seed-str"),
        ),
        (
            "stream true",
            enc(req("stream", stream=True)),
            (bad, "invalid_request", "stream is not supported in a batch", "stream"),
        ),
        (
            "stream a string",
            enc(req("stream-str", stream="yes")),
            (bad, "invalid_request", "body.stream must be true or false", "stream-str"),
        ),
        (
            "stop of 5 sequences",
            enc(req("stop5", stop=["a", "b", "c", "d", "e"])),
            (bad, "invalid_request", "body.stop may hold at most 4 strings", "stop5"),
        ),
        (
            "stop holding a number",
            enc(req("stopnum", stop=["a", 1])),
            (bad, "invalid_request", "body.stop[1] must be a string", "stopnum"),
        ),
        # -- valid lines that look hostile: data, not paths, not commands ----------------------
        (
            "id that is a path traversal",
            enc(req("../../etc/passwd", "traversal is data")),
            (ok, "../../etc/passwd", "traversal is data"),
        ),
        ("absolute path id", enc(req("/etc/shadow", "abs")), (ok, "/etc/shadow", "abs")),
        ("id '..'", enc(req("..", "dotdot")), (ok, "..", "dotdot")),
        ("id '.'", enc(req(".", "dot")), (ok, ".", "dot")),
        (
            "id with shell syntax",
            enc(req("$(touch pwned); `touch pwned2` | rm -rf ~", "shell")),
            (ok, "$(touch pwned); `touch pwned2` | rm -rf ~", "shell"),
        ),
        (
            "id with a NUL, a newline and a tab",
            enc(req("nul\u0000new\nline\ttab", "escapes")),
            (ok, "nul\u0000new\nline\ttab", "escapes"),
        ),
        (
            "id with a Windows path and percent-encoding",
            enc(req("C:\\Windows\\..\\%2e%2e%2f", "win")),
            (ok, "C:\\Windows\\..\\%2e%2e%2f", "win"),
        ),
        (
            "id of exactly 512 characters",
            enc(req("../" * 170 + "ab", "long but allowed")),
            (ok, "../" * 170 + "ab", "long but allowed"),
        ),
        (
            "non-ASCII id and content",
            enc(req("café-☕-日本", "Grüß dich 👋")),
            (ok, "café-☕-日本", "Grüß dich 👋"),
        ),
        (
            "ASCII-escaped unicode",
            json.dumps(req("esc-\u00e9", "\u2603 snow")).encode(),
            (ok, "esc-\u00e9", "\u2603 snow"),
        ),
        (
            "leading and trailing whitespace",
            b"   \t" + enc(req("v-ws", "spaced")) + b" \t ",
            (ok, "v-ws", "spaced"),
        ),
        (
            "content parts, null optionals, unknown fields",
            enc(
                {
                    "custom_id": "v-parts",
                    "method": "POST",
                    "url": CHAT,
                    "extra_top_level": {"ignored": True},
                    "body": {
                        "messages": [
                            {"role": "system", "content": "be brief"},
                            {
                                "role": "user",
                                "content": [
                                    {"type": "text", "text": "part "},
                                    {"type": "text", "text": "two"},
                                ],
                            },
                        ],
                        "max_tokens": None,
                        "temperature": None,
                        "some_future_field": [1, 2, 3],
                    },
                }
            ),
            # The echo engine joins text parts with a newline, as vLLM's server does.
            (ok, "v-parts", "part \ntwo"),
        ),
        (
            "duplicate keys (JSON parsers keep the last silently: which was meant?)",
            b'{"custom_id": "dupkey-first", "custom_id": "dupkey-last", "method": "POST", '
            b'"url": "/v1/chat/completions", "body": {"messages": '
            b'[{"role": "user", "content": "dup keys"}]}}',
            (bad, "duplicate_key", "the key 'custom_id' is given twice on this line", None),
        ),
        (
            "JSON-special characters in content",
            enc(req("v-quotes", 'quote " backslash \\ slash / {"json": [1]}')),
            (ok, "v-quotes", 'quote " backslash \\ slash / {"json": [1]}'),
        ),
        # -- text that is not Unicode, numbers the engine cannot hold ----------------------------
        (
            "a lone surrogate escape in a message (an emoji cut in half)",
            rb'{"custom_id": "sur", "method": "POST", "url": "/v1/chat/completions", "body": '
            rb'{"messages": [{"role": "user", "content": "truncated emoji \ud83d end"}], '
            rb'"max_tokens": 4}}',
            (bad, "invalid_request", "body.messages[0].content contains a lone surrogate", "sur"),
        ),
        (
            "a lone low surrogate in a stop sequence",
            enc(req("sur-stop", stop=["ok", "STOP"])).replace(b"STOP", rb"\uDE00"),
            (
                bad,
                "invalid_request",
                "body.stop[1] contains a lone surrogate (\\ude00)",
                "sur-stop",
            ),
        ),
        (
            "a lone surrogate in the custom_id",
            enc(req("sur-id-X", "id")).replace(b"-X", rb"-\udbff"),
            (bad, "invalid_custom_id", "contains a lone surrogate (\\udbff)", None),
        ),
        (
            "a surrogate pair written as escapes: one emoji",
            enc(req("pair", "EMOJI pair")).replace(b"EMOJI", rb"\ud83d\ude00"),
            (ok, "pair", "\U0001f600 pair"),
        ),
        (
            "seed 2**70",
            enc(req("seed-huge", seed=2**70)),
            (
                bad,
                "invalid_request",
                "body.seed must be between -9223372036854775808 and",
                "seed-huge",
            ),
        ),
        (
            "seed 2**63 - 1, the largest",
            enc(req("seed-max", "big seed", seed=2**63 - 1)),
            (ok, "seed-max", "big seed"),
        ),
        ("valid, last", enc(req("v-last", "the end")), (ok, "v-last", "the end")),
    ]
    return c


def build() -> tuple[bytes, list[dict[str, Any]]]:
    """The corpus bytes and its expectations (line numbers counted as batchrun counts them)."""
    out = bytearray()
    expected: list[dict[str, Any]] = []
    line = 0

    def emit(raw: bytes, eol: bytes = b"\n") -> None:
        nonlocal line
        out.extend(raw + eol)
        line += 1

    for i, (kind, raw, exp) in enumerate(cases()):
        # Framing that must not matter: CRLF on every third line, blank and whitespace-only
        # lines every fifth (they count for line numbers but are not errors).
        eol = b"\r\n" if i % 3 == 1 else b"\n"
        emit(raw, eol)
        if exp[0] == "ok":
            expected.append(
                {"line": line, "kind": kind, "valid": True, "custom_id": exp[1], "answer": exp[2]}
            )
        else:
            expected.append(
                {
                    "line": line,
                    "kind": kind,
                    "valid": False,
                    "code": exp[1],
                    "message": exp[2],
                    "custom_id": exp[3],
                }
            )
        if i % 5 == 4:
            emit(b"" if i % 2 else b" \t ", b"\r\n" if i % 10 == 9 else b"\n")
    return bytes(out), expected


def render_expected(expected: list[dict[str, Any]]) -> bytes:
    return b"".join(enc(e) + b"\n" for e in expected)


def main(argv: list[str]) -> int:
    corpus, expected = build()
    exp_bytes = render_expected(expected)
    if "--check" in argv:
        same = CORPUS.read_bytes() == corpus and EXPECTED.read_bytes() == exp_bytes
        print("up to date" if same else "out of date: run tests/data/make_hostile.py")
        return 0 if same else 1
    CORPUS.write_bytes(corpus)
    EXPECTED.write_bytes(exp_bytes)
    bad = sum(1 for e in expected if not e["valid"])
    print(f"wrote {CORPUS} ({len(corpus):,} bytes, {bad} bad lines, {len(expected) - bad} valid)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
