"""Raw HTTP against berth-envd: the Connect protocol and the HTTP routes, good and bad input.

Every bad request must get the right Connect code (or HTTP status) and a clear message,
and envd must keep answering afterwards (the autouse `envd_still_alive` check).
"""

from __future__ import annotations

import base64
import json
import shlex
import struct
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from helpers import poll, wait_until_running

NO_SUCH_PID = 4_000_000_000
END_STREAM = 0x02

# Connect code → HTTP status for unary errors (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


@pytest.fixture()
def http(envd) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=envd.url, timeout=60.0) as client:
        yield client


def basic_auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def json_envelope(message: dict) -> bytes:
    return envelope(json.dumps(message).encode())


def parse_frames(body: bytes) -> list[tuple[int, bytes]]:
    frames = []
    offset = 0
    while offset < len(body):
        assert len(body) - offset >= 5, f"truncated frame header in response: {body[offset:]!r}"
        flags, size = struct.unpack(">BI", body[offset : offset + 5])
        payload = body[offset + 5 : offset + 5 + size]
        assert len(payload) == size, "truncated frame payload in response"
        frames.append((flags, payload))
        offset += 5 + size
    return frames


class FrameReader:
    """Reads Connect stream frames from a streaming httpx response as they arrive."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.iter_raw()
        self._buffer = b""

    def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                return False
        return True

    def next_frame(self) -> Optional[tuple[int, dict]]:
        if not self._fill(5):
            assert self._buffer == b"", f"stream ended inside a frame header: {self._buffer!r}"
            return None
        flags, size = struct.unpack(">BI", self._buffer[:5])
        assert self._fill(5 + size), "stream ended inside a frame"
        payload, self._buffer = self._buffer[5 : 5 + size], self._buffer[5 + size :]
        return flags, json.loads(payload or b"{}")


def connect_error(response: httpx.Response) -> dict:
    """The Connect error of a failed call, whether sent as a unary error or an end-of-stream frame."""
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("application/connect+"):
        assert response.status_code == 200, f"stream answered HTTP {response.status_code}"
        frames = parse_frames(response.content)
        assert frames, "empty stream response"
        flags, payload = frames[-1]
        assert flags & END_STREAM, f"last frame is not end-of-stream: {frames[-1]!r}"
        end = json.loads(payload or b"{}")
        assert "error" in end, f"stream ended without an error: {end!r}"
        return end["error"]
    assert content_type.startswith("application/json"), (
        f"error answered with content-type {content_type!r}: {response.status_code} {response.text[:300]!r}"
    )
    error = response.json()
    assert HTTP_STATUS.get(error.get("code")) == response.status_code, (
        f"HTTP {response.status_code} does not match Connect code {error.get('code')!r}"
    )
    return error


def assert_connect_error(response: httpx.Response, *codes: str, mentions: Optional[str] = None) -> dict:
    error = connect_error(response)
    assert error.get("code") in codes, f"expected {codes}, got {error!r}"
    message = error.get("message", "")
    assert message.strip(), f"error without a message: {error!r}"
    if mentions is not None:
        assert mentions in message, f"message {message!r} should mention {mentions!r}"
    return error


def unary(http: httpx.Client, procedure: str, message: dict, headers: Optional[dict] = None) -> httpx.Response:
    return http.post(
        f"/{procedure}",
        content=json.dumps(message).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def server_stream(http: httpx.Client, procedure: str, body: bytes, headers: Optional[dict] = None) -> httpx.Response:
    return http.post(
        f"/{procedure}",
        content=body,
        headers={"Content-Type": "application/connect+json", **(headers or {})},
    )


def proto_string_field(number: int, value: bytes) -> bytes:
    assert len(value) < 128
    return bytes([number << 3 | 2, len(value)]) + value


def start_message(command: str, tag: Optional[str] = None) -> dict:
    message: dict = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": False}
    if tag is not None:
        message["tag"] = tag
    return message


def kill(http: httpx.Client, pid: int, program: str) -> None:
    """SIGKILL `pid` once it runs `program` (see helpers.wait_until_running)."""
    wait_until_running(pid, program)
    unary(http, "process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})


# --- the protocol working ---------------------------------------------------------------


def test_health(http):
    response = http.get("/health")
    assert response.status_code == 204
    assert response.content == b""


def test_unary_json(http):
    response = unary(http, "process.Process/List", {})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert isinstance(response.json(), dict)


def test_unary_binary_proto(http, scratch: Path):
    target = scratch / "p"
    target.write_text("proto")
    response = http.post(
        "/filesystem.Filesystem/Stat",
        content=proto_string_field(1, str(target).encode()),
        headers={"Content-Type": "application/proto"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/proto")
    assert str(target).encode() in response.content


def test_server_stream_json_frames(http):
    response = server_stream(http, "process.Process/Start", json_envelope(start_message("echo hi; echo oops >&2; exit 2")))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/connect+json")
    frames = parse_frames(response.content)
    assert frames[-1][0] & END_STREAM
    assert "error" not in json.loads(frames[-1][1] or b"{}")
    events = [json.loads(payload)["event"] for flags, payload in frames[:-1]]
    assert int(events[0]["start"]["pid"]) > 0
    stdout = b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "data" in e and "stdout" in e["data"])
    stderr = b"".join(base64.b64decode(e["data"]["stderr"]) for e in events if "data" in e and "stderr" in e["data"])
    assert (stdout, stderr) == (b"hi\n", b"oops\n")
    assert events[-1]["end"]["exitCode"] == 2


def test_unknown_json_fields_are_ignored(http, scratch: Path):
    """Connect's JSON codec discards unknown fields (forward compatibility)."""
    response = unary(http, "filesystem.Filesystem/Stat", {"path": str(scratch), "berthFieldFromTheFuture": 1})
    assert response.status_code == 200, response.text
    assert response.json()["entry"]["path"] == str(scratch)


def test_unknown_binary_fields_are_ignored(http, scratch: Path):
    unknown_varint_field_99 = b"\x98\x06\x2a"  # key (99 << 3 | varint) = 792 as a varint, then 42
    response = http.post(
        "/filesystem.Filesystem/Stat",
        content=proto_string_field(1, str(scratch).encode()) + unknown_varint_field_99,
        headers={"Content-Type": "application/proto"},
    )
    assert response.status_code == 200


def test_h2c_prior_knowledge(envd):
    with httpx.Client(base_url=envd.url, http1=False, http2=True, timeout=60.0) as client:
        health = client.get("/health")
        assert health.http_version == "HTTP/2"
        assert health.status_code == 204
        listed = unary(client, "process.Process/List", {})
        assert listed.status_code == 200
        streamed = server_stream(client, "process.Process/Start", json_envelope(start_message("echo over-h2")))
        events = [json.loads(p)["event"] for f, p in parse_frames(streamed.content) if not f & END_STREAM]
        out = b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "data" in e)
        assert out == b"over-h2\n"


def test_tag_start_list_and_connect(http, scratch: Path):
    flag = scratch / "flag"
    tag = "berth-tag-test"
    command = f"echo tagged; for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done"
    with http.stream(
        "POST", "/process.Process/Start", content=json_envelope(start_message(command, tag=tag)),
        headers={"Content-Type": "application/connect+json"},
    ) as started:
        reader = FrameReader(started)
        first = reader.next_frame()
        assert first is not None
        pid = int(first[1]["event"]["start"]["pid"])
        try:
            listed = unary(http, "process.Process/List", {}).json()["processes"]
            assert any(p.get("tag") == tag and p["pid"] == pid for p in listed)
            with http.stream(
                "POST", "/process.Process/Connect", content=json_envelope({"process": {"tag": tag}}),
                headers={"Content-Type": "application/connect+json"},
            ) as connected:
                connect_reader = FrameReader(connected)
                first_connected = connect_reader.next_frame()
                assert first_connected is not None
                assert int(first_connected[1]["event"]["start"]["pid"]) == pid
                flag.touch()
                frames = []
                while (frame := connect_reader.next_frame()) is not None:
                    frames.append(frame)
                assert frames[-1][0] & END_STREAM
                assert any("end" in payload.get("event", {}) for flags, payload in frames[:-1])
        finally:
            kill(http, pid, "sleep")


def test_keepalive_events_on_idle_stream(http, scratch: Path):
    flag = scratch / "flag"
    command = f"for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done; echo end"
    with http.stream(
        "POST", "/process.Process/Start", content=json_envelope(start_message(command)),
        headers={"Content-Type": "application/connect+json", "Keepalive-Ping-Interval": "1"},
    ) as response:
        reader = FrameReader(response)
        pid = int(reader.next_frame()[1]["event"]["start"]["pid"])
        try:
            while True:
                frame = reader.next_frame()
                assert frame is not None and not frame[0] & END_STREAM, f"stream ended before a keepalive: {frame!r}"
                if "keepalive" in frame[1].get("event", {}):
                    break
            flag.touch()
        finally:
            kill(http, pid, "sleep")


def test_connect_timeout_ms_ends_the_stream_with_deadline_exceeded(http, test_user):
    # As the test user: envd may end the process at the deadline, possibly while its login
    # shell still reads the profile; the test user's profile is harmless to cut short.
    headers = {"Content-Type": "application/connect+json", "Connect-Timeout-Ms": "300", **test_user.basic_auth()}
    with http.stream(
        "POST", "/process.Process/Start", content=json_envelope(start_message("sleep 120")), headers=headers
    ) as response:
        reader = FrameReader(response)
        pid = int(reader.next_frame()[1]["event"]["start"]["pid"])
        try:
            frames = []
            while (frame := reader.next_frame()) is not None:
                frames.append(frame)
            flags, end = frames[-1]
            assert flags & END_STREAM
            assert end.get("error", {}).get("code") == "deadline_exceeded", end
        finally:
            kill(http, pid, "sleep")


# --- bad Connect input ------------------------------------------------------------------


def test_malformed_json_is_invalid_argument(http):
    response = http.post("/process.Process/List", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert_connect_error(response, "invalid_argument")


def test_wrong_json_type_is_invalid_argument(http):
    response = unary(http, "filesystem.Filesystem/Stat", {"path": 123})
    assert_connect_error(response, "invalid_argument")


def test_malformed_binary_proto_is_invalid_argument(http):
    # Field 1 claims 100 bytes of string, 3 follow.
    response = http.post(
        "/filesystem.Filesystem/Stat", content=b"\x0a\x64abc", headers={"Content-Type": "application/proto"}
    )
    assert_connect_error(response, "invalid_argument")


def test_unsupported_content_type_is_415(http):
    response = http.post("/process.Process/List", content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415


def test_unary_content_type_on_a_stream_procedure_is_415(http):
    response = unary(http, "process.Process/Start", start_message("true"))
    assert response.status_code == 415


def test_get_on_a_post_procedure_is_405(http):
    response = http.get("/process.Process/List")
    assert response.status_code == 405


def test_unknown_procedure_is_404(http):
    assert unary(http, "process.Process/Teleport", {}).status_code == 404
    assert unary(http, "nowhere.Service/List", {}).status_code == 404


def test_truncated_envelope_is_invalid_argument(http):
    body = struct.pack(">BI", 0, 100) + b'{"process":'
    response = server_stream(http, "process.Process/Start", body)
    assert_connect_error(response, "invalid_argument")


def test_truncated_envelope_header_is_invalid_argument(http):
    response = server_stream(http, "process.Process/Start", b"\x00\x00\x00")
    assert_connect_error(response, "invalid_argument")


def test_oversized_envelope_is_refused(http):
    """A frame claiming 4 GiB must be refused, not buffered."""
    body = struct.pack(">BI", 0, 0xFFFFFFFF) + b"{}" * 512
    response = server_stream(http, "process.Process/Start", body)
    assert_connect_error(response, "resource_exhausted", "invalid_argument")


def test_garbage_in_envelope_is_invalid_argument(http):
    response = server_stream(http, "process.Process/Start", envelope(b"\xff\xfe not json"))
    assert_connect_error(response, "invalid_argument")


def test_empty_stream_request_is_invalid_argument(http):
    response = server_stream(http, "process.Process/Start", b"")
    assert_connect_error(response, "invalid_argument")


def test_truncated_client_stream_is_invalid_argument(http):
    body = struct.pack(">BI", 0, 50) + b'{"start":'
    response = server_stream(http, "process.Process/StreamInput", body)
    assert_connect_error(response, "invalid_argument")


# --- unknown pids, tags, watchers -------------------------------------------------------


@pytest.mark.parametrize(
    "procedure, message",
    [
        ("process.Process/SendSignal", {"process": {"pid": NO_SUCH_PID}, "signal": "SIGNAL_SIGKILL"}),
        ("process.Process/SendInput", {"process": {"pid": NO_SUCH_PID}, "input": {"stdin": "eA=="}}),
        ("process.Process/CloseStdin", {"process": {"pid": NO_SUCH_PID}}),
        ("process.Process/Update", {"process": {"pid": NO_SUCH_PID}, "pty": {"size": {"cols": 10, "rows": 10}}}),
        ("process.Process/SendSignal", {"process": {"tag": "no-such-tag"}, "signal": "SIGNAL_SIGTERM"}),
    ],
)
def test_unknown_process_is_not_found(http, procedure, message):
    response = unary(http, procedure, message)
    assert response.status_code == 404
    selector = message["process"]
    assert_connect_error(response, "not_found", mentions=str(selector.get("pid", selector.get("tag"))))


def test_connect_to_unknown_pid_is_not_found(http):
    response = server_stream(http, "process.Process/Connect", json_envelope({"process": {"pid": NO_SUCH_PID}}))
    assert_connect_error(response, "not_found", mentions=str(NO_SUCH_PID))


def test_connect_to_unknown_tag_is_not_found(http):
    response = server_stream(http, "process.Process/Connect", json_envelope({"process": {"tag": "no-such-tag"}}))
    assert_connect_error(response, "not_found", mentions="no-such-tag")


def test_stream_input_to_unknown_pid_is_not_found(http):
    body = json_envelope({"start": {"process": {"pid": NO_SUCH_PID}}}) + json_envelope(
        {"data": {"input": {"stdin": "eA=="}}}
    )
    response = server_stream(http, "process.Process/StreamInput", body)
    assert_connect_error(response, "not_found")


@pytest.mark.parametrize("procedure", ["filesystem.Filesystem/GetWatcherEvents", "filesystem.Filesystem/RemoveWatcher"])
def test_unknown_watcher_is_not_found(http, procedure):
    response = unary(http, procedure, {"watcherId": "no-such-watcher"})
    assert_connect_error(response, "not_found")


def test_process_selector_missing_is_invalid(http):
    response = unary(http, "process.Process/SendSignal", {"signal": "SIGNAL_SIGKILL"})
    assert_connect_error(response, "invalid_argument", "unimplemented")


# --- filesystem RPC errors --------------------------------------------------------------


def test_stat_missing_is_not_found(http, scratch: Path):
    missing = scratch / "missing"
    response = unary(http, "filesystem.Filesystem/Stat", {"path": str(missing)})
    assert_connect_error(response, "not_found", mentions=str(missing))


def test_list_dir_missing_is_not_found(http, scratch: Path):
    response = unary(http, "filesystem.Filesystem/ListDir", {"path": str(scratch / "missing"), "depth": 1})
    assert_connect_error(response, "not_found")


def test_move_missing_source_is_not_found(http, scratch: Path):
    response = unary(
        http, "filesystem.Filesystem/Move", {"source": str(scratch / "a"), "destination": str(scratch / "b")}
    )
    assert_connect_error(response, "not_found")


def test_path_with_nul_byte_is_invalid_argument(http, scratch: Path):
    response = unary(http, "filesystem.Filesystem/Stat", {"path": f"{scratch}/bad\u0000name"})
    assert_connect_error(response, "invalid_argument")


def test_tilde_other_user_is_invalid_argument(http):
    response = unary(http, "filesystem.Filesystem/Stat", {"path": "~someoneelse/file"})
    assert_connect_error(response, "invalid_argument")


def test_unknown_user_is_unauthenticated(http, scratch: Path):
    response = unary(http, "filesystem.Filesystem/Stat", {"path": str(scratch)}, headers=basic_auth("no-such-user-berth"))
    assert response.status_code == 401
    assert_connect_error(response, "unauthenticated", mentions="no-such-user-berth")


def test_watch_dir_stream_on_missing_dir_is_not_found(http, scratch: Path):
    response = server_stream(http, "filesystem.Filesystem/WatchDir", json_envelope({"path": str(scratch / "missing")}))
    assert_connect_error(response, "not_found")


# --- /files -----------------------------------------------------------------------------


def json_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, f"expected HTTP {status}, got {response.status_code}: {response.text[:300]!r}"
    body = response.json()
    assert body.get("code") == status
    assert str(body.get("message", "")).strip(), f"error without a message: {body!r}"
    return body


def test_files_download_missing_is_404(http, scratch: Path):
    missing = scratch / "missing.txt"
    body = json_error(http.get("/files", params={"path": str(missing)}), 404)
    assert str(missing) in body["message"]


def test_files_download_directory_is_400(http, scratch: Path):
    json_error(http.get("/files", params={"path": str(scratch)}), 400)


def test_files_download_unknown_user_is_401(http, scratch: Path):
    (scratch / "f").write_text("x")
    json_error(http.get("/files", params={"path": str(scratch / "f"), "username": "no-such-user-berth"}), 401)


def test_files_download_gzip_when_asked(http, scratch: Path):
    (scratch / "g.txt").write_text("zip me " * 1000)
    response = http.get("/files", params={"path": str(scratch / "g.txt")}, headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers.get("content-encoding") == "gzip"
    assert response.text == "zip me " * 1000


def test_files_upload_wrong_content_type(http, scratch: Path):
    response = http.post(
        "/files", params={"path": str(scratch / "t")}, content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert response.status_code in (400, 415), response.text
    assert not (scratch / "t").exists()


def test_files_upload_multipart_without_file_part(http, scratch: Path):
    """No part named `file`: nothing is written (a 400, or an empty list of written files)."""
    response = http.post("/files", params={"path": str(scratch / "nofile")}, data={"notfile": "x"}, files={"other": ("o", b"y")})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 200:
        assert response.json() == []
    assert not (scratch / "nofile").exists()


def test_files_upload_truncated_multipart(http, scratch: Path):
    boundary = "berthboundary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"cut.txt\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\nthis part never ends"
    ).encode()
    response = http.post(
        "/files",
        params={"path": str(scratch / "cut.txt")},
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert response.status_code == 400, response.text


def test_files_upload_multipart_without_boundary(http, scratch: Path):
    response = http.post(
        "/files", params={"path": str(scratch / "nb")}, content=b"data", headers={"Content-Type": "multipart/form-data"}
    )
    assert response.status_code == 400, response.text


def test_files_octet_stream_without_path(http):
    response = http.post("/files", content=b"data", headers={"Content-Type": "application/octet-stream"})
    assert response.status_code == 400, response.text


def test_files_upload_under_a_regular_file(http, scratch: Path):
    (scratch / "plain").write_text("p")
    response = http.post(
        "/files",
        params={"path": str(scratch / "plain" / "child.txt")},
        content=b"x",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.json().get("message")


def test_files_bad_gzip_body(http, scratch: Path):
    response = http.post(
        "/files",
        params={"path": str(scratch / "z")},
        content=b"this is not gzip",
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 400, response.text


def test_files_upload_response_shape(http, scratch: Path):
    target = scratch / "shape.txt"
    response = http.post(
        "/files", params={"path": str(target)}, content=b"abc", headers={"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 200, response.text
    entries = response.json()
    assert len(entries) == 1
    assert (entries[0]["name"], entries[0]["type"], entries[0]["path"]) == ("shape.txt", "file", str(target))
    assert target.read_bytes() == b"abc"


def test_unknown_route_is_404(http):
    assert http.get("/definitely/not/a/route").status_code == 404


def test_server_still_works_after_abuse(http):
    """A last end-to-end check after all the bad input above."""
    poll(lambda: http.get("/health").status_code == 204, what="/health")
    response = server_stream(http, "process.Process/Start", json_envelope(start_message("echo still-alive")))
    events = [json.loads(p)["event"] for f, p in parse_frames(response.content) if not f & END_STREAM]
    assert b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "data" in e) == b"still-alive\n"
