"""JSON bodies are UTF-8 (RFC 8259 section 8.1): UTF-16 and UTF-32 bodies, which Python's JSON parser would
take, a byte order mark, a declared other charset and bytes that are not UTF-8 are each refused with a 422
that names the encoding, and nothing is written."""

from __future__ import annotations

import json

from jt_server import WRITE, LiveServer, count, record

BODY = json.dumps(record())
LATIN1 = BODY.replace("ag_gemm-8192", "caf\u00e9")
#: (body, Content-Type, the 422's loc, what its message says)
NOT_UTF8 = [
    (BODY.encode("utf-16"), "application/json", ["body", 0], "byte order mark of UTF-16"),
    (BODY.encode("utf-16-le"), "application/json", ["body", 1], "NUL bytes, as UTF-16 and UTF-32"),
    (BODY.encode("utf-16-be"), "application/json", ["body", 0], "NUL bytes, as UTF-16 and UTF-32"),
    (BODY.encode("utf-32"), "application/json", ["body", 0], "byte order mark of UTF-32"),
    (BODY.encode("utf-8-sig"), "application/json", ["body", 0], "byte order mark of UTF-8"),
    (LATIN1.encode("latin-1"), "application/json", ["body", LATIN1.index("\u00e9")], "not UTF-8 (byte 0xe9)"),
    (BODY.encode(), "application/json; charset=utf-16", ["header", "content-type"], "charset='utf-16'"),
]


def test_a_body_that_is_not_utf8_is_refused_by_name(sqlite_server: LiveServer) -> None:
    with sqlite_server.client(WRITE) as http:
        for content, content_type, loc, says in NOT_UTF8:
            for path in ("/v1/configs", "/v1/bundles"):
                response = http.post(path, content=content, headers={"content-type": content_type})
                assert response.status_code == 422, (path, says, response.text)
                (problem,) = response.json()["detail"]
                assert problem["type"] == "encoding" and problem["loc"] == loc, (path, problem)
                assert says in problem["msg"] and "send JSON as UTF-8" in problem["msg"], problem
        assert count(sqlite_server.db_url) == 0
        utf8 = {"content-type": "application/json; charset=UTF-8"}
        assert http.post("/v1/configs", content=BODY.encode(), headers=utf8).status_code == 200
    assert count(sqlite_server.db_url) == 1
